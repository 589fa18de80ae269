//! Tests of the snapshot the core plans from (`snapshot.rs`).

use metalguard_api::plan::OperationId;
use metalguard_api::protocol::{AgentReport as Report, CommandResult};
use metalguard_api::snapshot::Retirement;

use super::*;
use crate::backend::StoredReport;

const INVENTORY: &str = r#"
[etcd]
endpoints = ["http://127.0.0.1:2379"]

[control_plane]
desired_replicas = 1

[[hosts]]
name = "cp-1"
role = "control-plane"

[[hosts]]
name = "cp-2"
role = "control-plane"
"#;

/// The two-host inventory of these tests.
fn inventory() -> Inventory {
    Inventory::parse(std::path::Path::new("i.toml"), INVENTORY).unwrap()
}

fn report(host: &str, members: &[(u64, &str, bool)]) -> StoredReport {
    let members = members
        .iter()
        .map(|&(id, name, learner)| crate::testkit::member(id, name, learner, true))
        .collect();
    let etcd = EtcdView {
        local_member_id: None,
        leader_id: Some(2),
        members,
    };
    crate::testkit::stored_report(host, 9, Some(etcd))
}

fn condition(type_: &str, status: ConditionStatus) -> metalguard_api::protocol::Condition {
    metalguard_api::protocol::Condition {
        type_: type_.into(),
        status,
        reason: "r".into(),
        message: String::new(),
        last_transition: Timestamp(3),
    }
}

fn ready(report: &Report) -> ConditionStatus {
    node_of(report, Timestamp(1), Timestamp(0))
        .conditions
        .iter()
        .find(|c| c.type_ == READY)
        .unwrap()
        .status
}

#[test]
fn a_nospace_alarm_keeps_the_host_ready_and_its_member_a_healthy_voter() {
    use ConditionStatus::{False, True};
    let inventory = inventory();
    let mut stored = report("cp-1", &[(1, "cp-1", false), (2, "cp-2", false)]);
    let r = &mut stored.report;
    r.conditions = vec![
        condition("EtcdMemberHealthy", True),
        condition("EtcdNoSpace", False),
    ];
    assert_eq!(ready(r), True, "no alarm: the pressure condition is False");
    r.conditions[1].status = True;
    assert_eq!(
        ready(r),
        True,
        "the alarm is reported, the host stays ready"
    );
    r.conditions[0].status = False;
    assert_eq!(
        ready(r),
        False,
        "a failing member still makes the host unready"
    );
    // The agent reports a NOSPACE member healthy (it votes) and lists the alarm.
    for m in &mut r.etcd.as_mut().unwrap().members {
        m.alarms = vec!["NOSPACE".into()];
    }
    let mut state = State::default();
    state.reports.insert("cp-1".into(), stored);
    let s = build(&inventory, &state, Timestamp(1), Timestamp(10));
    assert!(s.hosts.iter().all(|h| h.etcd.as_ref().unwrap().healthy));
}

#[test]
fn a_round_counts_only_the_views_received_since_its_leadership_began() {
    let inventory = inventory();
    let mut state = State::default();
    // Taken at t=9 (received_at 9): both members healthy then.
    state.reports.insert(
        "cp-1".into(),
        report("cp-1", &[(1, "cp-1", false), (2, "cp-2", false)]),
    );
    let received = state.reports["cp-1"].received_at;
    let members = |s: &Snapshot| s.hosts.iter().filter(|h| h.etcd.is_some()).count();
    // status, retire --cancel, notes: the stored views as they are.
    assert_eq!(
        members(&build(
            &inventory,
            &state,
            received.after(std::time::Duration::from_secs(1)),
            received.after(std::time::Duration::from_secs(2))
        )),
        2
    );
    // A leadership that began after the view was received does not count it...
    let later = received.after(std::time::Duration::from_secs(1));
    let now = received.after(std::time::Duration::from_secs(2));
    assert_eq!(
        members(&build_for_round(
            &inventory,
            &state,
            (later, &Hearing::default()),
            now
        )),
        0
    );
    // ...one that began before does.
    assert_eq!(
        members(&build_for_round(
            &inventory,
            &state,
            (received, &Hearing::default()),
            now
        )),
        2
    );
}

#[test]
fn a_round_counts_a_condition_of_a_report_from_before_its_leadership_only_from_when_it_began() {
    use std::time::Duration;
    let inventory = inventory();
    let mut state = State::default();
    let mut stored = report("cp-1", &[(1, "cp-1", false)]);
    // Unhealthy since t=3, received at t=9.
    stored.report.conditions = vec![condition("EtcdMemberHealthy", ConditionStatus::False)];
    state.reports.insert("cp-1".into(), stored);
    let received = state.reports["cp-1"].received_at;
    let ready_since = |s: &Snapshot| {
        let host = s.hosts.iter().find(|h| h.name == "cp-1").unwrap();
        let ready = host.node.as_ref().unwrap().conditions.iter();
        let ready = ready.clone().find(|c| c.type_ == READY).unwrap();
        (ready.status, ready.last_transition)
    };
    let began = received.after(Duration::from_secs(20));
    let now = began.after(Duration::from_secs(2));
    // status: the report as it is.
    assert_eq!(
        ready_since(&build(&inventory, &state, began, now)),
        (ConditionStatus::False, Timestamp(3))
    );
    // A leadership that began after the report was received: from when it began.
    assert_eq!(
        ready_since(&build_for_round(
            &inventory,
            &state,
            (began, &Hearing::default()),
            now
        )),
        (ConditionStatus::False, began)
    );
    // One that began before: the agent's own time.
    assert_eq!(
        ready_since(&build_for_round(
            &inventory,
            &state,
            (received, &Hearing::default()),
            now
        )),
        (ConditionStatus::False, Timestamp(3))
    );
}

#[test]
fn a_view_stops_counting_once_its_agent_is_silent_past_its_heartbeat_timeout() {
    use std::time::Duration;
    // cp-1's check: its agent is silent after 5 s; cp-2 has no check (the executor
    // timeout, 60 s by default, bounds its view alone).
    let text = INVENTORY.replace(
        "name = \"cp-1\"\nrole = \"control-plane\"",
        "name = \"cp-1\"\nrole = \"control-plane\"\nlabels = { pool = \"one\" }",
    ) + "\n[[policy.health_checks]]\nname = \"one\"\n\
         selector = { match_labels = { pool = \"one\" } }\n\
         agent_heartbeat_timeout = \"5s\"\n";
    let inventory = Inventory::parse(std::path::Path::new("i.toml"), &text).unwrap();
    let mut state = State::default();
    let both = [(1, "cp-1", false), (2, "cp-2", false)];
    state.reports.insert("cp-1".into(), report("cp-1", &both));
    let received = state.reports["cp-1"].received_at;
    let members = |s: &Snapshot| s.hosts.iter().filter(|h| h.etcd.is_some()).count();
    let at = |secs| received.after(Duration::from_secs(secs));
    // Fresh: cp-1's view lists both members.
    assert_eq!(
        members(&build_for_round(
            &inventory,
            &state,
            (received, &Hearing::default()),
            at(5)
        )),
        2
    );
    // cp-1's agent silent past its 5 s: its view is history, though younger than 60 s.
    assert_eq!(
        members(&build_for_round(
            &inventory,
            &state,
            (received, &Hearing::default()),
            at(6)
        )),
        0
    );
    // The same view from cp-2, which no check bounds below the executor timeout, counts
    // up to that timeout and no longer.
    state.reports.clear();
    state.reports.insert("cp-2".into(), report("cp-2", &both));
    assert_eq!(
        members(&build_for_round(
            &inventory,
            &state,
            (received, &Hearing::default()),
            at(60)
        )),
        2
    );
    assert_eq!(
        members(&build_for_round(
            &inventory,
            &state,
            (received, &Hearing::default()),
            at(61)
        )),
        0
    );
}

#[test]
fn a_report_accepted_but_not_yet_handled_and_deaf_time_are_not_silence_yet_views_stay_as_old_as_their_reports()
 {
    use std::time::Duration;
    let inventory = inventory();
    let mut state = State::default();
    let both = [(1, "cp-1", false), (2, "cp-2", false)];
    state.reports.insert("cp-1".into(), report("cp-1", &both));
    let received = state.reports["cp-1"].received_at;
    let at = |secs| received.after(Duration::from_secs(secs));
    let heartbeat = |s: &Snapshot| s.hosts[0].agent.as_ref().map(|a| a.last_heartbeat);
    let members = |s: &Snapshot| s.hosts.iter().filter(|h| h.etcd.is_some()).count();
    let mut hearing = Hearing::default();
    let plain = build_for_round(&inventory, &state, (received, &hearing), at(70));
    assert_eq!(heartbeat(&plain), Some(received));
    // Its next report was accepted at 69 s and waits in the inbox: cp-1 is not silent...
    hearing.accepted("cp-1", at(69));
    let heard = build_for_round(&inventory, &state, (received, &hearing), at(70));
    assert_eq!(heartbeat(&heard), Some(at(69)));
    // ...but the view the quorum guard counts is still the handled one (70 s old: out).
    assert_eq!(members(&heard), 0);
    // This process could not hear from 69 s to 70 s: that second is not cp-1's silence.
    hearing.deaf(at(69), at(70));
    let deaf = build_for_round(&inventory, &state, (received, &hearing), at(71));
    assert_eq!(heartbeat(&deaf), Some(at(70)));
}

#[test]
fn pending_probes_make_the_host_ready_unknown_not_ready() {
    use ConditionStatus::{False, True, Unknown};
    let mut stored = report("cp-1", &[(1, "cp-1", false)]);
    let r = &mut stored.report;
    r.conditions = vec![
        condition("EtcdMemberHealthy", Unknown),
        condition("KubeletHealthy", True),
    ];
    assert_eq!(ready(r), Unknown, "a probe has not answered yet");
    r.conditions[1].status = False;
    assert_eq!(ready(r), False, "a failing probe wins over a pending one");
    r.conditions = vec![condition("EtcdNoSpace", Unknown)];
    assert_eq!(ready(r), True, "pressure conditions do not count");
}

#[test]
fn an_agent_reporting_ready_true_with_a_failing_condition_is_judged_not_ready() {
    use ConditionStatus::{False, True};
    let inventory = inventory();
    let mut stored = report("cp-1", &[(1, "cp-1", false)]);
    stored.report.conditions = vec![
        condition("Ready", True),
        condition("MemoryPressure", False),
        condition("EtcdMemberHealthy", False),
    ];
    let node = node_of(&stored.report, Timestamp(1), Timestamp(0));
    let types: Vec<&str> = node.conditions.iter().map(|c| c.type_.as_str()).collect();
    assert_eq!(
        types,
        ["EtcdMemberHealthy", "Ready"],
        "reserved types dropped, Ready synthesized"
    );
    assert_eq!(ready(&stored.report), False);
    let mut state = State::default();
    state.reports.insert("cp-1".into(), stored.clone());
    let s = build(&inventory, &state, Timestamp(1), Timestamp(10));
    let cp1 = s.hosts.iter().find(|h| h.name == "cp-1").unwrap();
    assert!(!cp1.node_ready(), "{:?}", cp1.node);
    // With every other condition healthy, the host is ready whatever it says itself.
    stored.report.conditions = vec![
        condition("Ready", False),
        condition("EtcdMemberHealthy", True),
    ];
    assert_eq!(ready(&stored.report), True);
}

/// Seed 004: "machines with the delete annotation" go first on scale-down; in standalone
/// mode the inventory host's annotations are the Machine's.
#[test]
fn an_inventory_hosts_annotations_reach_the_snapshot() {
    let text = INVENTORY.replace(
        "name = \"cp-2\"\n",
        "name = \"cp-2\"\nannotations = { \"cluster.x-k8s.io/delete-machine\" = \"\" }\n",
    );
    let inventory = Inventory::parse(std::path::Path::new("i.toml"), &text).unwrap();
    let s = build(&inventory, &State::default(), Timestamp(1), Timestamp(10));
    let marked: Vec<&str> = s
        .hosts
        .iter()
        .filter(|h| metalguard_core::domains::marked_for_deletion(h))
        .map(|h| h.name.as_str())
        .collect();
    assert_eq!(marked, ["cp-2"]);
}

#[test]
fn a_retirement_marks_its_host_and_a_verified_power_off_removes_it() {
    let inventory = inventory();
    let mut state = State::default();
    let retirement = Retirement {
        requested_at: Timestamp(5),
        requested_by: Some("alice (cli)".into()),
        reason: "disk".into(),
    };
    state.retirements.insert("cp-1".into(), retirement.clone());
    // cp-1's own (last) view still lists its removed member; cp-2's does not.
    state.reports.insert(
        "cp-1".into(),
        report("cp-1", &[(1, "cp-1", false), (2, "cp-2", false)]),
    );
    state
        .reports
        .insert("cp-2".into(), report("cp-2", &[(2, "cp-2", false)]));
    let s = build(&inventory, &state, Timestamp(1), Timestamp(10));
    let cp1 = s.hosts.iter().find(|h| h.name == "cp-1").unwrap();
    assert_eq!(cp1.retirement.as_ref(), Some(&retirement));
    assert_eq!(cp1.deletion_requested_at, Some(Timestamp(5)));
    assert!(cp1.is_deleting() && cp1.etcd.is_some());
    assert!(
        !s.hosts
            .iter()
            .find(|h| h.name == "cp-2")
            .unwrap()
            .is_deleting()
    );

    let mut op = crate::testkit::decommission_op("cp-1", "cp-2", Timestamp(5), Timestamp(6));
    let id = op.id.clone();
    state.operations.insert(id.clone(), op.clone());
    let s = build(&inventory, &state, Timestamp(1), Timestamp(10));
    assert!(s.hosts.iter().any(|h| h.name == "cp-1"), "not verified yet");
    op.result = Some(CommandResult {
        operation_id: OperationId(id.0.clone()),
        outcome: Outcome::Succeeded,
        started_at: Timestamp(7),
        finished_at: Timestamp(8),
        timeline: vec![],
        error: None,
        promoted_by: None,
        term: 0,
    });
    state.operations.insert(id, op);
    let s = build(&inventory, &state, Timestamp(1), Timestamp(10));
    assert_eq!(
        s.hosts.iter().map(|h| h.name.as_str()).collect::<Vec<_>>(),
        ["cp-2"]
    );
    assert!(powered_off_for_retirement(&state, "cp-1"));
    assert!(!powered_off_for_retirement(&state, "cp-2"));
}

#[test]
fn a_node_condition_not_the_kubelets_counts_only_from_when_the_leadership_began() {
    let inventory = inventory();
    let cond = |type_: &str, status, since| NodeCondition {
        type_: type_.into(),
        status,
        last_transition: Timestamp(since),
    };
    let mut state = State::default();
    let node = NodeStatus {
        conditions: vec![
            cond(READY, ConditionStatus::True, 100),
            cond("MemoryPressure", ConditionStatus::False, 100),
            cond("EtcdMemberHealthy", ConditionStatus::False, 200),
            cond("EtcdNoSpace", ConditionStatus::False, 5_000),
        ],
        ..NodeStatus::default()
    };
    state.nodes = Some(imbl::OrdMap::unit("cp-1".to_owned(), node));
    let times = |s: &Snapshot| -> Vec<(String, u64)> {
        let host = s.hosts.iter().find(|h| h.name == "cp-1").unwrap();
        let node = host.node.as_ref().unwrap();
        node.conditions
            .iter()
            .map(|c| (c.type_.clone(), c.last_transition.0))
            .collect()
    };
    // Leading since 1,000: the mirrored EtcdMemberHealthy=False (written at 200, maybe by
    // the previous leader) counts from 1,000; the kubelet's keep their times; a later one
    // is untouched.
    let s = build_for_round(
        &inventory,
        &state,
        (Timestamp(1_000), &Hearing::default()),
        Timestamp(2_000),
    );
    assert_eq!(
        times(&s),
        vec![
            (READY.to_owned(), 100),
            ("MemoryPressure".to_owned(), 100),
            ("EtcdMemberHealthy".to_owned(), 1_000),
            ("EtcdNoSpace".to_owned(), 5_000),
        ]
    );
}

#[test]
fn a_check_that_failed_on_the_agents_own_path_counts_as_not_reaching_the_bmc() {
    use metalguard_api::bmc::CheckFailure;
    use metalguard_api::protocol::{BmcCheck, BmcReachability};
    let inventory = inventory();
    let probe = |failure: Option<CheckFailure>| BmcReachability {
        host: "cp-2".into(),
        reachable: true,
        checked_at: Timestamp(5),
        error: None,
        check: Some(BmcCheck {
            failure,
            power_state: None,
            identity: None,
            detail: "d".into(),
            credentials_id: None,
            request: None,
        }),
    };
    let reaches = |p: BmcReachability| {
        let mut state = State::default();
        let mut cp1 = report("cp-1", &[]);
        cp1.report.bmc_reachability = vec![p];
        state.reports.insert("cp-1".into(), cp1);
        let s = build(&inventory, &state, Timestamp(1), Timestamp(10));
        s.hosts[0].agent.as_ref().unwrap().bmc_reachable["cp-2"]
    };
    assert!(reaches(probe(None)), "passed");
    assert!(
        !reaches(probe(Some(CheckFailure::Unreachable))),
        "its own path"
    );
    assert!(!reaches(probe(Some(CheckFailure::Tls))), "its own path");
    for anyone in [
        CheckFailure::CredentialsRefused,
        CheckFailure::AccountLocked,
        CheckFailure::IdentityMismatch,
    ] {
        assert!(
            reaches(probe(Some(anyone))),
            "{anyone:?}: any agent would fail"
        );
    }
    let mut plain = probe(None);
    plain.check = None;
    assert!(
        reaches(plain),
        "no check: the credential-free probe decides"
    );
}
