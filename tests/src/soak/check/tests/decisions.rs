//! Rule unjustified-power-off judged by the decision behind the power-off: the intent of the
//! latest fence of the host executed before it.

use super::{HistoryBuilder, found, quiet, s, verdict};
use crate::soak::check::{Params, Rule};
use crate::soak::history::FaultKind::{EtcdHang, HostHang};
use crate::soak::history::Power::Off;

const OP: &str = "remediation/cp-3/1/power-off";

/// `ctl-1` decides to fence cp-3 at `decided` (op [`OP`]), cp-1 executes the fence at
/// `executed` and cp-3's BMC powers it off at `off`.
fn fence_cp3(b: &mut HistoryBuilder, decided: u64, executed: u64, off: u64) {
    b.intent(decided, "ctl-1", OP)
        .executed(executed, "cp-1", OP, 1, "cp-3")
        .power(off, "cp-3", Off);
}

#[test]
fn a_fence_decided_after_the_host_recovered_is_unjustified_though_it_lands_within_the_grace() {
    // Issue 24: the hang ended at 10 s, the controller decided from a stale view at 15.5 s.
    let mut b = quiet(100);
    b.fault(s(5), 1, HostHang, "cp-3").heal(s(10), 1);
    fence_cp3(&mut b, 15_500, 15_600, s(17));
    let msgs = found(&b, Rule::UnjustifiedPowerOff);
    assert_eq!(
        msgs,
        vec![format!(
            "cp-3 was powered off for op {OP} that ctl-1 decided at 0:15.500, with no host \
             fault on it in place then or ended within 5 s before (measured against fault 1 \
             (host-hang), ended at 0:10.000)"
        )]
    );

    // The old rule, judging the power-off 7 s after the end, let it pass.
    let mut undecided = quiet(100);
    undecided
        .fault(s(5), 1, HostHang, "cp-3")
        .heal(s(10), 1)
        .power(s(17), "cp-3", Off);
    assert_eq!(
        found(&undecided, Rule::UnjustifiedPowerOff),
        Vec::<String>::new()
    );
}

#[test]
fn a_fence_decided_during_the_fault_is_justified_though_it_lands_after_the_fault_ended() {
    let mut b = quiet(100);
    b.fault(s(5), 1, HostHang, "cp-3").heal(s(12), 1);
    fence_cp3(&mut b, s(10), s(11), s(30));
    let v = verdict(&b);
    assert_eq!(v.violations, vec![], "{v:#?}");
    assert_eq!(v.unjudged, Vec::<String>::new());
}

#[test]
fn a_decision_is_justified_up_to_the_decision_grace_after_the_fault_ended_and_not_a_millisecond_later()
 {
    let grace = Params::default().decision_grace.as_secs();
    for (decided, violations) in [(s(10 + grace), 0), (s(10 + grace) + 1, 1)] {
        let mut b = quiet(100);
        b.fault(s(5), 1, EtcdHang, "cp-3").heal(s(10), 1);
        fence_cp3(&mut b, decided, decided + 100, decided + 1000);
        let msgs = found(&b, Rule::UnjustifiedPowerOff);
        assert_eq!(msgs.len(), violations, "decided at {decided}: {msgs:?}");
    }
}

#[test]
fn a_power_off_whose_decision_is_not_found_is_judged_by_itself_and_noted() {
    // No fence executed at all (a person's fence), or one whose intent line was lost.
    for with_fence in [false, true] {
        let mut b = quiet(100);
        b.fault(s(5), 1, HostHang, "cp-3")
            .heal(s(10), 1)
            .power(s(30), "cp-3", Off);
        if with_fence {
            b.executed(s(29), "cp-1", OP, 1, "cp-3");
        }
        let v = verdict(&b);
        assert_eq!(v.violations, vec![], "with fence: {with_fence}: {v:#?}");
        let why = if with_fence {
            format!("no intent of op {OP} persisted before cp-1 executed it at 0:29.000")
        } else {
            "no fence of it executed in the 30 s before it".to_owned()
        };
        assert_eq!(
            v.unjudged,
            vec![format!(
                "power-off of cp-3 at 0:30.000: the decision behind it could not be found \
                 ({why}); judged by the faults at the power-off instead"
            )]
        );
    }
}

#[test]
fn a_decision_during_a_fault_on_another_host_is_unjustified() {
    let mut b = quiet(100);
    b.fault(s(5), 1, HostHang, "cp-2");
    fence_cp3(&mut b, s(10), s(11), s(12));
    let msgs = found(&b, Rule::UnjustifiedPowerOff);
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(
        msgs[0].contains("ctl-1 decided at 0:10.000") && msgs[0].ends_with("against no fault)"),
        "{msgs:?}"
    );
}

#[test]
fn a_fault_that_starts_after_the_decision_does_not_justify_it() {
    let mut b = quiet(100);
    b.fault(s(11), 1, HostHang, "cp-3");
    fence_cp3(&mut b, s(10), s(11), s(12));
    assert_eq!(found(&b, Rule::UnjustifiedPowerOff).len(), 1);
}

#[test]
fn the_latest_fence_and_the_latest_intent_before_it_are_the_decision() {
    // An earlier fence of cp-3 decided during the fault; the later one, from a stale view,
    // is the one that lands.
    let mut later_fence = quiet(100);
    later_fence
        .fault(s(5), 1, HostHang, "cp-3")
        .heal(s(10), 1)
        .intent(s(8), "ctl-1", "op-early")
        .executed(s(9), "cp-1", "op-early", 1, "cp-3");
    fence_cp3(&mut later_fence, s(20), s(21), s(22));
    let msgs = found(&later_fence, Rule::UnjustifiedPowerOff);
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(msgs[0].contains(&format!("op {OP} that")), "{msgs:?}");

    // The same op persisted again after the recovery, but after the fence was executed: the
    // intent before the execution is the decision.
    let mut later_intent = quiet(100);
    later_intent.fault(s(5), 1, HostHang, "cp-3").heal(s(10), 1);
    fence_cp3(&mut later_intent, s(8), s(9), s(20));
    later_intent.intent(s(16), "ctl-2", OP);
    assert_eq!(
        found(&later_intent, Rule::UnjustifiedPowerOff),
        Vec::<String>::new()
    );
}

#[test]
fn a_fence_executed_longer_than_the_fault_grace_before_is_not_the_decision() {
    let grace = Params::default().fault_grace.as_secs();
    let mut b = quiet(100);
    b.fault(s(5), 1, HostHang, "cp-3");
    fence_cp3(&mut b, s(6), s(7), s(7 + grace) + 1);
    let v = verdict(&b);
    assert_eq!(v.violations, vec![]);
    assert!(
        v.unjudged
            .iter()
            .any(|n| n.contains("no fence of it executed in the 30 s before it")),
        "{:?}",
        v.unjudged
    );
}

#[test]
fn fences_of_one_millisecond_are_judged_together_in_either_order() {
    // Their order is unknown: the power-off is justified if either decision justifies it.
    for stale_first in [true, false] {
        let mut b = quiet(100);
        b.fault(s(5), 1, HostHang, "cp-3")
            .heal(s(10), 1)
            .intent(s(8), "ctl-1", "op-fresh")
            .intent(s(20), "ctl-2", "op-stale");
        let mut fences = [("cp-1", "op-fresh"), ("cp-2", "op-stale")];
        if stale_first {
            fences.reverse();
        }
        for (agent, op) in fences {
            b.executed(s(21), agent, op, 1, "cp-3");
        }
        b.power(s(22), "cp-3", Off);
        assert_eq!(
            found(&b, Rule::UnjustifiedPowerOff),
            Vec::<String>::new(),
            "stale first: {stale_first}"
        );
    }
}
