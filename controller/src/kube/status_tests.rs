use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use metalguard_api::duration::Timestamp;
use metalguard_api::k8s::control_plane::GuardedControlPlaneStatus;
use metalguard_api::k8s::host::{GuardedHostStatus, PowerState};
use metalguard_api::plan::OperationId;
use metalguard_api::plan::{CheckSummary, Plan};
use metalguard_api::policy::{HealthCheck, Policy, Selector};
use metalguard_api::protocol::{CommandResult, Outcome, PowerAction};
use metalguard_api::snapshot::{AgentReport, EtcdMember, Host, Role, Snapshot};

use super::*;
use crate::backend::{OperationKind, State, StoredOperation};
use crate::testkit::stored_report;

const NOW: u64 = 1_000_000;

fn host(name: &str, role: Role, member: Option<(u64, bool, bool)>) -> Host {
    Host {
        name: name.into(),
        role,
        failure_domain: None,
        created_at: Timestamp(0),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        externally_provisioned: true,
        bmc_configured: true,
        up_to_date: true,
        deletion_requested_at: None,
        pre_drain_hooks: BTreeSet::new(),
        fence_request: None,
        retirement: None,
        phase_failed: false,
        node: None,
        node_seen: true,
        agent: Some(AgentReport {
            last_heartbeat: Timestamp(NOW),
            can_fence: true,
            bmc_reachable: BTreeMap::new(),
            boot_id: None,
            boot_reported_at: None,
        }),
        etcd: member.map(|(id, healthy, leader)| EtcdMember {
            id,
            name: name.into(),
            learner: false,
            healthy,
            leader,
            progress_permille: 1000,
        }),
        hold: None,
        lease_held_by: None,
    }
}

fn fence(target: &str, action: PowerAction, outcome: Outcome, at: u64) -> StoredOperation {
    let id = OperationId(format!("remediation/{target}/1/{at}"));
    StoredOperation {
        id: id.clone(),
        agent: "other".into(),
        kind: OperationKind::Fence {
            target: target.into(),
            action,
        },
        remediation_id: None,
        step: None,
        created_at: Timestamp(at - 10),
        requested_by: None,
        executed_by: None,
        result: Some(CommandResult {
            operation_id: id,
            outcome,
            started_at: Timestamp(at - 5),
            finished_at: Timestamp(at),
            timeline: vec![],
            error: None,
            promoted_by: None,
            term: 0,
        }),
        term: 0,
    }
}

fn policy(heartbeat: Option<Duration>) -> Policy {
    let mut policy = Policy::default();
    policy.health_checks.push(HealthCheck {
        name: "workers".into(),
        selector: Selector {
            match_labels: BTreeMap::new(),
            role: Some(Role::Worker),
        },
        unhealthy_conditions: vec![],
        max_unhealthy: None,
        node_startup_timeout: None,
        agent_heartbeat_timeout: heartbeat,
    });
    policy
}

fn snapshot(hosts: Vec<Host>) -> Snapshot {
    Snapshot {
        observed_at: Timestamp(NOW),
        hosts,
        ..Snapshot::default()
    }
}

/// Written and read back through JSON, as the API server would return it.
fn round_trip(status: &GuardedHostStatus) -> GuardedHostStatus {
    serde_json::from_value(serde_json::to_value(status).unwrap()).unwrap()
}

#[test]
fn power_follows_the_latest_verified_command_then_the_hosts_own_agent() {
    let mut state = State::default();
    let (snap, plan, pol) = (snapshot(vec![]), Plan::default(), Policy::default());
    let judged = |state: &State| {
        power_of(
            &Judged {
                state,
                snapshot: &snap,
                plan: &plan,
                policy: &pol,
            },
            "w-1",
        )
    };
    assert_eq!(judged(&state), None, "nothing observed");
    let off = fence("w-1", PowerAction::Off, Outcome::Succeeded, 500_000);
    state.operations.insert(off.id.clone(), off);
    // A report received before the power-off was verified says nothing about now.
    state
        .reports
        .insert("w-1".into(), stored_report("w-1", 400_000, None));
    assert_eq!(judged(&state), Some((PowerState::Off, Timestamp(500_000))));
    let rejected = fence("w-1", PowerAction::On, Outcome::Rejected, 600_000);
    state.operations.insert(rejected.id.clone(), rejected);
    assert_eq!(judged(&state).unwrap().0, PowerState::Off, "not attempted");
    let failed = fence("w-1", PowerAction::On, Outcome::Failed, 700_000);
    state.operations.insert(failed.id.clone(), failed);
    assert_eq!(
        judged(&state),
        Some((PowerState::Unknown, Timestamp(700_000)))
    );
    state
        .reports
        .insert("w-1".into(), stored_report("w-1", 800_000, None));
    assert_eq!(judged(&state), Some((PowerState::On, Timestamp(800_000))));
    // Another host's fence is not this host's power.
    let other = fence("w-2", PowerAction::Off, Outcome::Succeeded, 900_000);
    state.operations.insert(other.id.clone(), other);
    assert_eq!(judged(&state).unwrap().0, PowerState::On);
}

#[test]
fn an_unchanged_observation_equals_the_status_it_was_read_from() {
    let mut state = State::default();
    state
        .reports
        .insert("w-1".into(), stored_report("w-1", NOW - 1_500, None));
    let mut snap = snapshot(vec![host("w-1", Role::Worker, None)]);
    let plan = Plan::default();
    let pol = policy(Some(Duration::from_secs(10)));
    let judged = Judged {
        state: &state,
        snapshot: &snap,
        plan: &plan,
        policy: &pol,
    };
    let first = observe_host(
        &RoundIndex::of(&judged, Timestamp(NOW), None),
        &judged,
        &GuardedHostStatus::default(),
        Some(2),
        &snap.hosts[0],
        Timestamp(NOW),
    );
    assert_eq!(first.power, Some(PowerState::On));
    assert_eq!(first.observed_generation, Some(2));
    let agent = first.agent.clone().unwrap();
    assert_eq!((agent.version.as_str(), agent.can_fence), ("t", true));
    assert_eq!(
        first
            .conditions
            .iter()
            .map(|c| (c.type_.as_str(), c.status.as_str()))
            .collect::<Vec<_>>(),
        [
            ("Healthy", "True"),
            ("Fenceable", "False"),
            ("Remediating", "False"),
            ("NeedsPerson", "False"),
            ("FencingReady", "Unknown")
        ]
    );
    let written = round_trip(&first);
    // A later round, a newer heartbeat within half the timeout: nothing to write.
    let mut later = state.clone();
    later
        .reports
        .insert("w-1".into(), stored_report("w-1", NOW + 2_000, None));
    snap.observed_at = Timestamp(NOW + 4_000);
    let judged = Judged {
        state: &later,
        snapshot: &snap,
        plan: &plan,
        policy: &pol,
    };
    let again = observe_host(
        &RoundIndex::of(&judged, Timestamp(NOW + 4_000), None),
        &judged,
        &written,
        Some(2),
        &snap.hosts[0],
        Timestamp(NOW + 4_000),
    );
    assert_eq!(again, written);
    // Past half the timeout the heartbeat time is refreshed, and only it.
    later
        .reports
        .insert("w-1".into(), stored_report("w-1", NOW + 6_000, None));
    let judged = Judged {
        state: &later,
        snapshot: &snap,
        plan: &plan,
        policy: &pol,
    };
    let refreshed = observe_host(
        &RoundIndex::of(&judged, Timestamp(NOW + 6_000), None),
        &judged,
        &written,
        Some(2),
        &snap.hosts[0],
        Timestamp(NOW + 6_000),
    );
    assert_ne!(refreshed, written);
    assert_eq!(
        refreshed.agent.as_ref().unwrap().last_heartbeat_time,
        second(Timestamp(NOW + 6_000))
    );
    assert_eq!(refreshed.power_observed_time, written.power_observed_time);
    assert_eq!(refreshed.conditions, written.conditions);
    // Unhealthy in a check: the condition turns, with a new transition time.
    let plan = Plan {
        health: vec![CheckSummary {
            name: "workers".into(),
            targets: 1,
            unhealthy: vec!["w-1".into()],
            max_unhealthy: Some(1),
            short_circuit: None,
        }],
        ..Plan::default()
    };
    let judged = Judged {
        state: &later,
        snapshot: &snap,
        plan: &plan,
        policy: &pol,
    };
    let sick = observe_host(
        &RoundIndex::of(&judged, Timestamp(NOW + 6_000), None),
        &judged,
        &written,
        Some(2),
        &snap.hosts[0],
        Timestamp(NOW + 6_000),
    );
    assert_eq!(sick.conditions[0].status, "False");
    assert_eq!(
        sick.conditions[0].message,
        "unhealthy in HostHealthCheck workers"
    );
    assert_eq!(
        sick.conditions[0].last_transition_time,
        second(Timestamp(NOW + 6_000))
    );
    assert_eq!(
        sick.conditions[1], written.conditions[1],
        "unchanged keeps its time"
    );
}

#[test]
fn an_agent_is_silent_after_the_shortest_heartbeat_timeout_of_its_checks() {
    let pol = policy(Some(Duration::from_secs(5)));
    let worker = host("w-1", Role::Worker, None);
    let cp = host("cp-1", Role::ControlPlane, None);
    assert_eq!(heartbeat_timeout(&pol, &worker), Duration::from_secs(5));
    assert_eq!(
        heartbeat_timeout(&pol, &cp),
        pol.remediation.executor_heartbeat_timeout,
        "no check selects it"
    );
    assert!(!agent_silent(
        &worker,
        Duration::from_secs(5),
        Timestamp(NOW + 5_000)
    ));
    assert!(agent_silent(
        &worker,
        Duration::from_secs(5),
        Timestamp(NOW + 5_001)
    ));
    let mut never = worker.clone();
    never.agent = None;
    never.created_at = Timestamp(NOW);
    assert!(!agent_silent(
        &never,
        Duration::from_secs(5),
        Timestamp(NOW + 5_000)
    ));
    assert!(agent_silent(
        &never,
        Duration::from_secs(5),
        Timestamp(NOW + 5_001)
    ));
}

#[test]
fn the_control_plane_status_is_the_judged_snapshot_with_the_cores_tolerance() {
    let mut snap = snapshot(vec![
        host("cp-1", Role::ControlPlane, Some((0xa1, true, true))),
        host("cp-2", Role::ControlPlane, Some((0xb2, true, false))),
        host("cp-3", Role::ControlPlane, Some((0xc3, false, false))),
        host("w-1", Role::Worker, None),
    ]);
    snap.control_plane.desired_replicas = 3;
    let state = State::default();
    let plan = Plan {
        min_available_members: Some(2),
        ..Plan::default()
    };
    let pol = Policy::default();
    let judged = Judged {
        state: &state,
        snapshot: &snap,
        plan: &plan,
        policy: &pol,
    };
    let status = observe_control_plane(
        &judged,
        &GuardedControlPlaneStatus::default(),
        Some(4),
        Timestamp(NOW),
    );
    assert_eq!(
        (
            status.replicas,
            status.ready_replicas,
            status.etcd_voters,
            status.etcd_learners
        ),
        (3, 0, 3, 0),
        "no Node is Ready in this snapshot"
    );
    assert_eq!(status.etcd_leader.as_deref(), Some("cp-1"));
    assert_eq!(
        (status.quorum_tolerance, status.min_available),
        (Some(1), Some(2))
    );
    assert_eq!(status.observed_generation, Some(4));
    let quorum_safe = &status.conditions[0];
    assert_eq!(
        (
            quorum_safe.type_.as_str(),
            quorum_safe.status.as_str(),
            quorum_safe.reason.as_str()
        ),
        ("QuorumSafe", "False", "QuorumAtRisk"),
        "{quorum_safe:?}"
    );
    assert_eq!(
        (
            status.conditions[1].type_.as_str(),
            status.conditions[1].status.as_str()
        ),
        ("Scaling", "False")
    );
    let written = serde_json::from_value(serde_json::to_value(&status).unwrap()).unwrap();
    let again = observe_control_plane(&judged, &written, Some(4), Timestamp(NOW + 9_000));
    assert_eq!(again, written, "nothing changed, nothing to write");
    // Quorum lost: two of three voters unhealthy.
    snap.hosts[1].etcd.as_mut().unwrap().healthy = false;
    let judged = Judged {
        state: &state,
        snapshot: &snap,
        plan: &plan,
        policy: &pol,
    };
    let lost = observe_control_plane(&judged, &written, Some(4), Timestamp(NOW + 9_000));
    assert_eq!(lost.conditions[0].reason, "QuorumLost");
    assert_eq!(
        lost.conditions[0].last_transition_time, written.conditions[0].last_transition_time,
        "still False"
    );
}

#[test]
fn the_round_index_names_the_fresh_agents_that_reach_a_bmc_and_the_checks_that_find_a_host_unhealthy()
 {
    let mut reacher = host("cp-1", Role::ControlPlane, None);
    let mut silent = host("cp-2", Role::ControlPlane, None);
    let mut blind = host("cp-3", Role::ControlPlane, None);
    for (agent, reaches) in [
        (&mut reacher, true),
        (&mut silent, true),
        (&mut blind, false),
    ] {
        let report = agent.agent.as_mut().unwrap();
        report.bmc_reachable.insert("w-1".into(), reaches);
        report.bmc_reachable.insert("w-2".into(), reaches);
    }
    silent.agent.as_mut().unwrap().last_heartbeat = Timestamp(NOW - 600_000);
    let snap = snapshot(vec![
        reacher,
        silent,
        blind,
        host("w-1", Role::Worker, None),
        host("w-2", Role::Worker, None),
    ]);
    let summary = |name: &str, unhealthy: &[&str]| CheckSummary {
        name: name.into(),
        targets: 2,
        unhealthy: unhealthy.iter().map(|h| (*h).to_owned()).collect(),
        max_unhealthy: None,
        short_circuit: None,
    };
    let plan = Plan {
        health: vec![
            summary("workers", &["w-1"]),
            summary("all", &["w-1", "w-2"]),
        ],
        ..Plan::default()
    };
    let (state, pol) = (State::default(), policy(Some(Duration::from_secs(10))));
    let judged = Judged {
        state: &state,
        snapshot: &snap,
        plan: &plan,
        policy: &pol,
    };
    let index = RoundIndex::of(&judged, Timestamp(NOW), None);
    assert_eq!(index.reached_by("w-1"), ["cp-1"]);
    assert_eq!(index.reached_by("cp-1"), [] as [&str; 0]);
    assert_eq!(index.unhealthy_in("w-1"), ["workers", "all"]);
    assert_eq!(index.unhealthy_in("w-2"), ["all"]);
    let observed = observe_host(
        &index,
        &judged,
        &GuardedHostStatus::default(),
        None,
        &snap.hosts[3],
        Timestamp(NOW),
    );
    let fenceable = &observed.conditions[1];
    assert_eq!(
        (fenceable.type_.as_str(), fenceable.status.as_str()),
        ("Fenceable", "True")
    );
    assert_eq!(
        fenceable.message,
        "its BMC is reachable by the agent of cp-1"
    );
    assert_eq!(
        observed.conditions[0].message,
        "unhealthy in HostHealthCheck workers, all"
    );
}

#[test]
fn fencing_ready_is_the_would_be_executors_check_and_unknown_without_one() {
    use metalguard_api::bmc::CheckFailure;
    use metalguard_api::protocol::{BmcCheck, BmcReachability};
    let checked = |failure: Option<CheckFailure>| BmcReachability {
        host: "w-1".into(),
        reachable: true,
        checked_at: Timestamp(NOW - 2_000),
        error: None,
        check: Some(BmcCheck {
            failure,
            power_state: Some("on".into()),
            identity: None,
            detail: "the BMC refused the login (401)".into(),
            credentials_id: None,
            request: None,
        }),
    };
    let mut state = State::default();
    for (agent, failure) in [
        ("cp-1", Some(CheckFailure::CredentialsRefused)),
        ("cp-2", None),
    ] {
        let mut stored = stored_report(agent, NOW - 1_000, None);
        stored.report.bmc_reachability = vec![checked(failure)];
        state.reports.insert(agent.into(), stored);
    }
    let snap = snapshot(vec![
        host("w-1", Role::Worker, None),
        host("w-2", Role::Worker, None),
    ]);
    let pol = policy(Some(Duration::from_secs(10)));
    let fencing_ready = |executor: &str, host: usize| {
        let plan = Plan {
            fence_executors: BTreeMap::from([("w-1".to_owned(), executor.to_owned())]),
            ..Plan::default()
        };
        let judged = Judged {
            state: &state,
            snapshot: &snap,
            plan: &plan,
            policy: &pol,
        };
        let status = observe_host(
            &RoundIndex::of(&judged, Timestamp(NOW), None),
            &judged,
            &GuardedHostStatus::default(),
            None,
            &snap.hosts[host],
            Timestamp(NOW),
        );
        let c = status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "FencingReady")
            .expect("FencingReady");
        (c.status, c.reason, c.message)
    };
    // cp-1 would fence w-1: its refused login decides, whatever cp-2 says.
    let (status, reason, message) = fencing_ready("cp-1", 0);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "CredentialsRefused")
    );
    assert!(
        message.contains("cp-1") && message.contains("refused the login"),
        "{message}"
    );
    let (status, reason, _) = fencing_ready("cp-2", 0);
    assert_eq!((status.as_str(), reason.as_str()), ("True", "CheckPassed"));
    // Nobody checked w-2.
    let (status, reason, _) = fencing_ready("cp-1", 1);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("Unknown", "NotChecked")
    );
}

#[test]
fn the_control_plane_is_fencing_ready_only_when_every_control_plane_hosts_check_passed() {
    use metalguard_api::bmc::CheckFailure;
    use metalguard_api::protocol::{BmcCheck, BmcReachability};
    let mut snap = snapshot(vec![
        host("cp-1", Role::ControlPlane, Some((0xa1, true, true))),
        host("cp-2", Role::ControlPlane, Some((0xb2, true, false))),
        host("w-1", Role::Worker, None),
    ]);
    let checks = |cp2: Option<Option<CheckFailure>>| {
        let probe = |host: &str, failure: Option<CheckFailure>| BmcReachability {
            host: host.into(),
            reachable: true,
            checked_at: Timestamp(NOW),
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
        let mut state = State::default();
        let mut w1 = stored_report("w-1", NOW, None);
        w1.report.bmc_reachability = std::iter::once(probe("cp-1", None))
            .chain(cp2.map(|f| probe("cp-2", f)))
            .collect();
        state.reports.insert("w-1".into(), w1);
        state
    };
    let plan = Plan {
        fence_executors: BTreeMap::from([
            ("cp-1".to_owned(), "w-1".to_owned()),
            ("cp-2".to_owned(), "w-1".to_owned()),
        ]),
        ..Plan::default()
    };
    let pol = Policy::default();
    let fencing = |state: &State, snap: &Snapshot| {
        let judged = Judged {
            state,
            snapshot: snap,
            plan: &plan,
            policy: &pol,
        };
        let status = observe_control_plane(
            &judged,
            &GuardedControlPlaneStatus::default(),
            None,
            Timestamp(NOW),
        );
        let c = status
            .conditions
            .into_iter()
            .find(|c| c.type_ == "FencingReady")
            .unwrap();
        (c.status, c.reason, c.message)
    };
    let (status, reason, _) = fencing(&checks(Some(None)), &snap);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("True", "AllChecksPassed")
    );
    let (status, reason, message) = fencing(&checks(None), &snap);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("Unknown", "NotChecked")
    );
    assert!(message.contains("cp-2"), "{message}");
    let refused = checks(Some(Some(CheckFailure::CredentialsRefused)));
    let (status, reason, message) = fencing(&refused, &snap);
    assert_eq!(
        (status.as_str(), reason.as_str()),
        ("False", "HostCannotBeFenced")
    );
    assert!(message.contains("cp-2 (credentials-refused)"), "{message}");
    snap.hosts[0].bmc_configured = false;
    let (_, _, message) = fencing(&checks(Some(None)), &snap);
    assert!(message.contains("cp-1 (no BMC)"), "{message}");
}
