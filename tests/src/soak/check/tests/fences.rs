//! The fence rules: unjustified-power-off (here for power-offs with no decision behind them,
//! judged by themselves; see [`decisions`](super::decisions)), two-hosts-off and quorum-cut.

use super::{HistoryBuilder, found, quiet, s, verdict};
use crate::soak::check::{Params, Rule};
use crate::soak::history::FaultKind::{AgentKill, BmcLying, ControllerPause, EtcdHang, HostHang};
use crate::soak::history::Power::{Off, On};

#[test]
fn powering_off_a_host_with_no_fault_is_unjustified_and_names_it() {
    let mut b = quiet(100);
    b.fault(s(10), 1, HostHang, "cp-2")
        .power(s(20), "cp-3", Off);
    let msgs = found(&b, Rule::UnjustifiedPowerOff);
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(msgs[0].starts_with("cp-3 was powered off"), "{msgs:?}");
}

#[test]
fn powering_off_the_host_that_has_the_fault_is_justified() {
    let mut b = quiet(100);
    b.fault(s(10), 1, HostHang, "cp-2")
        .power(s(20), "cp-2", Off);
    assert_eq!(found(&b, Rule::UnjustifiedPowerOff), Vec::<String>::new());
}

#[test]
fn a_power_off_is_justified_up_to_the_grace_after_the_fault_ended_and_not_a_millisecond_later() {
    let grace = Params::default().fault_grace.as_secs();
    let mut within = quiet(100);
    within
        .fault(s(10), 1, EtcdHang, "cp-4")
        .heal(s(20), 1)
        .power(s(20 + grace), "cp-4", Off);
    assert_eq!(
        found(&within, Rule::UnjustifiedPowerOff),
        Vec::<String>::new()
    );

    let mut after = quiet(100);
    after
        .fault(s(10), 1, EtcdHang, "cp-4")
        .heal(s(20), 1)
        .power(s(20 + grace) + 1, "cp-4", Off);
    let msgs = found(&after, Rule::UnjustifiedPowerOff);
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(msgs[0].contains("cp-4"), "{msgs:?}");
}

#[test]
fn a_lying_bmc_does_not_justify_the_power_off_it_records_but_a_hang_under_it_does() {
    let mut lying = quiet(100);
    lying
        .fault(s(10), 1, BmcLying, "cp-5")
        .power(s(20), "cp-5", Off);
    let msgs = found(&lying, Rule::UnjustifiedPowerOff);
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(msgs[0].contains("cp-5"), "{msgs:?}");

    let mut hung = quiet(100);
    hung.fault(s(10), 1, BmcLying, "cp-5")
        .fault(s(10), 2, HostHang, "cp-5")
        .power(s(20), "cp-5", Off);
    assert_eq!(
        found(&hung, Rule::UnjustifiedPowerOff),
        Vec::<String>::new()
    );
}

#[test]
fn a_controller_fault_justifies_no_power_off() {
    let mut b = quiet(100);
    b.fault(s(10), 1, ControllerPause, "ctl-1")
        .power(s(20), "cp-1", Off);
    assert_eq!(found(&b, Rule::UnjustifiedPowerOff).len(), 1);
}

#[test]
fn two_hosts_off_at_once_is_found_with_both_named() {
    let mut b = quiet(100);
    b.fault(s(10), 1, HostHang, "cp-1")
        .fault(s(10), 2, HostHang, "cp-2")
        .power(s(20), "cp-1", Off)
        .power(s(25), "cp-2", Off)
        .power(s(30), "cp-1", On)
        .power(s(35), "cp-2", On);
    let msgs = found(&b, Rule::TwoHostsOff);
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(
        msgs[0].contains("cp-1 since 0:20.000") && msgs[0].contains("cp-2 since 0:25.000"),
        "{msgs:?}"
    );
}

#[test]
fn one_host_off_after_the_other_is_on_again_is_not_two_hosts_off() {
    let mut b = quiet(100);
    b.fault(s(10), 1, HostHang, "cp-1")
        .fault(s(10), 2, HostHang, "cp-2")
        .power(s(20), "cp-1", Off)
        .power(s(30), "cp-1", On)
        .power(s(30), "cp-2", Off)
        .power(s(35), "cp-2", On);
    assert_eq!(found(&b, Rule::TwoHostsOff), Vec::<String>::new());
}

#[test]
fn a_host_back_on_in_the_millisecond_another_goes_off_is_not_two_hosts_off_in_either_order() {
    for on_first in [true, false] {
        let mut b = quiet(100);
        b.fault(s(10), 1, HostHang, "cp-1")
            .fault(s(10), 2, HostHang, "cp-2")
            .power(s(20), "cp-1", Off);
        if on_first {
            b.power(s(30), "cp-1", On).power(s(30), "cp-2", Off);
        } else {
            b.power(s(30), "cp-2", Off).power(s(30), "cp-1", On);
        }
        b.power(s(35), "cp-2", On);
        assert_eq!(
            found(&b, Rule::TwoHostsOff),
            Vec::<String>::new(),
            "on first: {on_first}"
        );
    }
}

#[test]
fn a_power_off_leaving_too_few_healthy_voters_cuts_quorum() {
    // cp-1 and cp-2 unhealthy: besides cp-3, 2 healthy voters of 5 (quorum 3).
    let mut b = HistoryBuilder::new();
    b.samples(0, s(100), &["cp-1", "cp-2"], true)
        .fault(s(10), 1, HostHang, "cp-3")
        .power(s(20), "cp-3", Off);
    let msgs = found(&b, Rule::QuorumCut);
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(
        msgs[0].starts_with("cp-3 was powered off") && msgs[0].contains("showed 2 healthy"),
        "{msgs:?}"
    );
}

#[test]
fn a_power_off_leaving_exactly_a_quorum_of_healthy_voters_does_not_cut_it() {
    let mut b = HistoryBuilder::new();
    b.samples(0, s(100), &["cp-1"], true)
        .fault(s(10), 1, HostHang, "cp-3")
        .power(s(20), "cp-3", Off);
    assert_eq!(found(&b, Rule::QuorumCut), Vec::<String>::new());
}

#[test]
fn the_target_s_own_unhealthy_member_does_not_count_against_the_quorum() {
    let mut b = HistoryBuilder::new();
    b.samples(0, s(100), &["cp-1", "cp-3"], true)
        .fault(s(10), 1, HostHang, "cp-3")
        .power(s(20), "cp-3", Off);
    assert_eq!(found(&b, Rule::QuorumCut), Vec::<String>::new());
}

#[test]
fn the_latest_sample_in_the_window_judges_the_power_off() {
    let mut healed = HistoryBuilder::new();
    healed
        .sample(s(18), &["cp-1", "cp-2"], true)
        .sample(s(19), &["cp-1"], true)
        .fault(s(10), 1, HostHang, "cp-3")
        .power(s(20), "cp-3", Off);
    assert_eq!(found(&healed, Rule::QuorumCut), Vec::<String>::new());

    let mut worse = HistoryBuilder::new();
    worse
        .sample(s(18), &["cp-1"], true)
        .sample(s(19), &["cp-1", "cp-2"], true)
        .fault(s(10), 1, HostHang, "cp-3")
        .power(s(20), "cp-3", Off);
    assert_eq!(found(&worse, Rule::QuorumCut).len(), 1);
}

#[test]
fn a_power_off_during_an_election_is_judged_by_the_sample_after_it() {
    let all = ["cp-1", "cp-2", "cp-3", "cp-4", "cp-5"];
    // The soak's case: the leader's member hung, a sample in the election shows nobody
    // healthy, the next one four; cp-3's cut left three healthy voters of five.
    let mut election = HistoryBuilder::new();
    election
        .sample(s(19), &[], true)
        .sample(s(19) + 500, &all, false)
        .sample(s(20) + 500, &["cp-3", "cp-5"], true)
        .fault(s(10), 1, AgentKill, "cp-3")
        .power(s(20), "cp-3", Off);
    assert_eq!(found(&election, Rule::QuorumCut), Vec::<String>::new());
    // Leaderless after the cut too: a cut into a quorum loss.
    let mut lost = HistoryBuilder::new();
    lost.sample(s(19) + 500, &all, false)
        .sample(s(20) + 500, &all, false)
        .fault(s(10), 1, AgentKill, "cp-3")
        .power(s(20), "cp-3", Off);
    assert_eq!(found(&lost, Rule::QuorumCut).len(), 1);
    // A sample with a leader before the cut still judges it, whatever comes after.
    let mut too_few = HistoryBuilder::new();
    too_few
        .sample(s(19) + 500, &["cp-1", "cp-2"], true)
        .sample(s(20) + 500, &[], true)
        .fault(s(10), 1, AgentKill, "cp-3")
        .power(s(20), "cp-3", Off);
    assert_eq!(found(&too_few, Rule::QuorumCut).len(), 1);
}

#[test]
fn a_power_off_with_no_sample_in_the_window_is_not_judged_and_says_so() {
    let mut b = HistoryBuilder::new();
    b.sample(s(10), &["cp-1", "cp-2"], true)
        .fault(s(10), 1, HostHang, "cp-3")
        .power(s(20), "cp-3", Off);
    let v = verdict(&b);
    assert_eq!(v.of_rule(Rule::QuorumCut).count(), 0);
    assert!(
        v.unjudged
            .iter()
            .any(|n| n.starts_with("power-off of cp-3 at 0:20.000: no etcd sample")),
        "{:?}",
        v.unjudged
    );
}
