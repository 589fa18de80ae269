//! The rules over the cluster: quorum-lost and schedule-exceeded, older-term-executed,
//! no-recovery, acked-lost and controller-crashed.

use super::{HistoryBuilder, found, quiet, s, verdict};
use crate::soak::check::Rule;
use crate::soak::history::Event;
use crate::soak::history::FaultKind::{AgentKill, EtcdHang, HostHang, Partition};

#[test]
fn quorum_lost_longer_than_the_grace_within_tolerance_is_metalguard_s() {
    let mut b = HistoryBuilder::new();
    b.samples(0, s(9), &[], true)
        .fault(s(9), 1, EtcdHang, "cp-2")
        .samples(s(10), s(16), &["cp-2"], false)
        .samples(s(17), s(30), &["cp-2"], true);
    let msgs = found(&b, Rule::QuorumLost);
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(
        msgs[0].contains("from 0:10.000 to 0:16.000") && msgs[0].contains("1 members away"),
        "{msgs:?}"
    );
    assert_eq!(found(&b, Rule::ScheduleExceeded), Vec::<String>::new());
}

#[test]
fn quorum_lost_for_just_the_grace_is_no_violation() {
    let mut b = HistoryBuilder::new();
    b.samples(0, s(9), &[], true)
        .fault(s(9), 1, EtcdHang, "cp-2")
        .samples(s(10), s(15), &["cp-2"], false)
        .samples(s(16), s(30), &["cp-2"], true);
    assert_eq!(found(&b, Rule::QuorumLost), Vec::<String>::new());
}

#[test]
fn quorum_lost_while_the_nemesis_took_more_than_tolerated_is_the_schedule_s() {
    let down = ["cp-1", "cp-2", "cp-3"];
    let mut b = HistoryBuilder::new();
    b.samples(0, s(9), &[], true)
        .fault(s(9), 1, HostHang, "cp-1")
        .fault(s(9), 2, EtcdHang, "cp-2")
        .fault(s(9), 3, Partition, "cp-3")
        .samples(s(10), s(20), &down, false);
    let msgs = found(&b, Rule::ScheduleExceeded);
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(
        msgs[0].contains("3 members away (cp-1, cp-2, cp-3)"),
        "{msgs:?}"
    );
    assert_eq!(found(&b, Rule::QuorumLost), Vec::<String>::new());
}

#[test]
fn an_agent_kill_takes_no_member_so_quorum_lost_with_it_is_metalguard_s() {
    let mut b = HistoryBuilder::new();
    b.samples(0, s(9), &[], true)
        .fault(s(9), 1, HostHang, "cp-1")
        .fault(s(9), 2, EtcdHang, "cp-2")
        .fault(s(9), 3, AgentKill, "cp-3")
        .samples(s(10), s(20), &["cp-1", "cp-2", "cp-3"], false);
    assert_eq!(found(&b, Rule::QuorumLost).len(), 1);
    assert_eq!(found(&b, Rule::ScheduleExceeded), Vec::<String>::new());
}

#[test]
fn an_agent_executing_a_command_older_than_a_term_it_saw_is_found_with_both_terms() {
    let mut b = quiet(100);
    b.leader(s(1), "ctl-1", 2)
        .leader(s(5), "ctl-2", 3)
        .term_seen(s(6), "cp-1", 3)
        .executed(s(7), "cp-1", "op-9", 2, "cp-4");
    let msgs = found(&b, Rule::OlderTermExecuted);
    assert_eq!(
        msgs,
        vec!["agent cp-1 executed op op-9 (fence cp-4 off) of term 2 after it had seen term 3"]
    );
}

#[test]
fn an_agent_executing_a_command_of_the_term_it_saw_breaks_no_term_rule() {
    let mut b = quiet(100);
    b.leader(s(1), "ctl-1", 2)
        .leader(s(5), "ctl-2", 3)
        .term_seen(s(6), "cp-1", 3)
        .executed(s(7), "cp-1", "op-9", 3, "cp-4");
    assert_eq!(found(&b, Rule::OlderTermExecuted), Vec::<String>::new());
}

#[test]
fn a_refusal_and_an_earlier_execution_raise_the_term_an_agent_has_seen() {
    let mut refused = quiet(100);
    refused
        .refused(s(6), "cp-1", "op-8", 3, 4)
        .executed(s(7), "cp-1", "op-9", 3, "cp-4");
    let msgs = found(&refused, Rule::OlderTermExecuted);
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(
        msgs[0].contains("of term 3 after it had seen term 4"),
        "{msgs:?}"
    );

    let mut executed = quiet(100);
    executed
        .executed(s(6), "cp-1", "op-8", 4, "cp-2")
        .executed(s(7), "cp-1", "op-9", 3, "cp-4");
    assert_eq!(found(&executed, Rule::OlderTermExecuted).len(), 1);
}

#[test]
fn a_term_another_agent_saw_does_not_bind_this_one() {
    let mut b = quiet(100);
    b.term_seen(s(6), "cp-2", 5)
        .executed(s(7), "cp-1", "op-9", 3, "cp-4");
    assert_eq!(found(&b, Rule::OlderTermExecuted), Vec::<String>::new());
}

#[test]
fn a_hung_host_that_never_comes_back_within_the_bound_is_found() {
    let mut b = quiet(400);
    b.fault(s(10), 1, HostHang, "cp-2")
        .health(s(10), "cp-2", false)
        .heal(s(40), 1)
        .health(s(311), "cp-2", true);
    let msgs = found(&b, Rule::NoRecovery);
    assert_eq!(msgs.len(), 1, "{msgs:?}");
    assert!(
        msgs[0].starts_with("fault 1 (host-hang on cp-2, began 0:10.000, ended 0:40.000)")
            && msgs[0].contains("cp-2 was not healthy"),
        "{msgs:?}"
    );
    assert_eq!(
        verdict(&b).of_rule(Rule::NoRecovery).next().map(|v| v.t),
        Some(s(310))
    );
}

#[test]
fn a_hung_host_healthy_again_at_the_bound_has_recovered() {
    let mut b = quiet(400);
    b.fault(s(10), 1, HostHang, "cp-2")
        .health(s(10), "cp-2", false)
        .heal(s(40), 1)
        .health(s(310), "cp-2", true);
    assert_eq!(found(&b, Rule::NoRecovery), Vec::<String>::new());
}

#[test]
fn a_host_handed_to_a_person_within_the_bound_needs_no_recovery() {
    let mut b = quiet(400);
    b.fault(s(10), 1, HostHang, "cp-2")
        .health(s(10), "cp-2", false)
        .heal(s(40), 1)
        .remediation(s(100), "r-1", "cp-2", "needs-person");
    assert_eq!(found(&b, Rule::NoRecovery), Vec::<String>::new());
}

#[test]
fn a_short_fault_the_health_judge_never_saw_has_recovered_when_it_ends() {
    let mut b = quiet(400);
    b.fault(s(10), 1, AgentKill, "cp-2").heal(s(12), 1);
    assert_eq!(found(&b, Rule::NoRecovery), Vec::<String>::new());
}

#[test]
fn a_fault_the_history_stops_watching_before_the_bound_is_not_judged_and_says_so() {
    let mut b = quiet(100);
    b.fault(s(10), 1, HostHang, "cp-2")
        .health(s(10), "cp-2", false);
    let v = verdict(&b);
    assert_eq!(v.of_rule(Rule::NoRecovery).count(), 0);
    assert!(
        v.unjudged
            .iter()
            .any(|n| n.starts_with("fault 1 (host-hang on cp-2") && n.contains("ends before")),
        "{:?}",
        v.unjudged
    );
}

#[test]
fn an_acknowledged_key_not_read_back_is_lost_and_named() {
    let mut b = quiet(10);
    b.workload(s(10), 500, 3, &["k/17"]);
    assert_eq!(
        found(&b, Rule::AckedLost),
        vec!["acknowledged key k/17 was not found by the final read"]
    );
}

#[test]
fn failed_writes_with_nothing_acknowledged_lost_are_no_violation() {
    let mut b = quiet(10);
    b.workload(s(10), 500, 3, &[]);
    assert_eq!(found(&b, Rule::AckedLost), Vec::<String>::new());
    assert_eq!(verdict(&b).stats.workload.map(|w| w.failed), Some(3));
}

fn controller_exit(code: Option<i32>, signal: Option<i32>) -> Event {
    Event::ControllerExit {
        controller: "ctl-2".into(),
        code,
        signal,
        restart_in_ms: 10_000,
        last_line: "error: the API server could not be reached".into(),
    }
}

#[test]
fn a_controller_that_panicked_or_died_of_a_signal_crashed_and_one_that_gave_up_did_not() {
    let mut b = quiet(10);
    b.push(s(2), controller_exit(Some(1), None))
        .push(s(4), controller_exit(Some(101), None))
        .push(s(6), controller_exit(None, Some(6)));
    assert_eq!(
        found(&b, Rule::ControllerCrashed),
        vec![
            "ctl-2 panicked (exit code 101); its log ends: error: the API server could not be reached",
            "ctl-2 was ended by signal 6; its log ends: error: the API server could not be reached",
        ]
    );
    assert_eq!(verdict(&b).stats.controller_exits, 3);
}
