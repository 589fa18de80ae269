//! Scenario tests for the safety rules of issue 15, each naming its seed or its reason: the
//! planner's own decisions on states it may never have produced itself (records written by
//! someone else, a restarted controller's view, a person's break-glass fence).

use std::time::Duration;

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::{ActionKind, Plan, ReasonKind, RemediationStep};
use metalguard_api::policy::MaxUnhealthy;
use metalguard_api::remediation::RemediationPhase as P;
use metalguard_api::snapshot::{ConditionStatus, NodeCondition, Role};

use crate::scenarios::{refused, starts, ten_minutes_ago};
use crate::testkit::{NOW, break_host, cluster, find, hold, member, policy, remediation};

fn power_offs(p: &Plan) -> Vec<String> {
    steps(p, &RemediationStep::PowerOff)
}

fn steps(p: &Plan, which: &RemediationStep) -> Vec<String> {
    p.actions
        .iter()
        .filter_map(|a| match &a.kind {
            ActionKind::Remediate { target, step, .. } if step == which => Some(target.clone()),
            _ => None,
        })
        .collect()
}

fn refused_kind(p: &Plan, subject: &str, kind: ReasonKind) -> bool {
    p.refusals
        .iter()
        .any(|r| r.subject == subject && r.kind == kind)
}

/// Marks a host's Node NotReady ten minutes ago and its agent silent, keeping its etcd member
/// as it is (a host whose etcd still answers).
fn node_down(s: &mut metalguard_api::snapshot::Snapshot, name: &str) {
    let h = find(s, name);
    let healthy = h.etcd.as_ref().map(|m| m.healthy);
    break_host(h, ten_minutes_ago());
    if let (Some(m), Some(healthy)) = (h.etcd.as_mut(), healthy) {
        m.healthy = healthy;
    }
}

/// Moves every agent that reported at NOW to `t` (planning later, with agents alive).
fn agents_alive_at(s: &mut metalguard_api::snapshot::Snapshot, t: Timestamp) {
    for a in s.hosts.iter_mut().filter_map(|h| h.agent.as_mut()) {
        if a.last_heartbeat == NOW {
            a.last_heartbeat = t;
        }
    }
}

// ---- the plan as a whole ---------------------------------------------------------------

/// Seed 004 ("remediation MUST preserve etcd quorum", "the previous remediation MUST have
/// completed"): two control-plane remediations waiting to power off — a state two
/// controllers or an older version could leave — get one power-off, not two (3 voters → 1).
#[test]
fn seed_004_two_waiting_control_plane_remediations_get_one_power_off_not_two() {
    let mut s = cluster(3, 1);
    node_down(&mut s, "cp-0");
    node_down(&mut s, "cp-1");
    s.remediations = vec![
        remediation("cp-0", 1, P::Gated, "w-0", true),
        remediation("cp-1", 1, P::Gated, "w-0", true),
    ];
    let mut pol = policy();
    // Forced past the short-circuit (2 unhealthy > 1): only the safety rules speak.
    for r in &mut s.remediations {
        r.forced = Some("test".into());
    }
    pol.health_checks[0].max_unhealthy = Some(MaxUnhealthy::Count(3));
    let p = crate::plan(&s, &pol, NOW);
    assert_eq!(power_offs(&p), ["cp-0"], "{p}");
    assert!(
        refused_kind(&p, "cp-1", ReasonKind::ControlPlaneBusy),
        "{p}"
    );
}

/// Seed 003: "remediation is not performed if the number of unhealthy machines exceeds the
/// maxUnhealthy limit" — also for a remediation that was started before the check
/// short-circuited and still waits to power off; workers and control-plane alike. A person's
/// forced fence still goes (deviation 7).
#[test]
fn seed_003_a_remediation_waiting_to_power_off_stops_when_its_check_short_circuits() {
    let mut pol = policy();
    pol.health_checks[1].max_unhealthy = Some(MaxUnhealthy::Count(1));
    let mut s = cluster(3, 3);
    node_down(&mut s, "w-0");
    node_down(&mut s, "w-1");
    s.remediations = vec![remediation("w-0", 1, P::Gated, "cp-0", false)];
    let p = crate::plan(&s, &pol, NOW);
    assert!(power_offs(&p).is_empty(), "{p}");
    assert!(refused_kind(&p, "w-0", ReasonKind::ShortCircuit), "{p}");
    s.remediations[0].forced = Some("rack power test".into());
    let p = crate::plan(&s, &pol, NOW);
    assert_eq!(power_offs(&p), ["w-0"], "{p}");

    // Control plane of five (tolerance 2): cp-0 waits, cp-1 and cp-2 also fail → 3 > 2.
    let mut s = cluster(5, 1);
    for h in ["cp-0", "cp-1", "cp-2"] {
        node_down(&mut s, h);
    }
    s.remediations = vec![remediation("cp-0", 1, P::Gated, "w-0", true)];
    let p = crate::plan(&s, &policy(), NOW);
    assert!(power_offs(&p).is_empty(), "{p}");
    assert!(refused_kind(&p, "cp-0", ReasonKind::ShortCircuit), "{p}");
}

/// Seed 004: "previous remediation MUST have been completed". A failed control-plane
/// remediation awaiting its retry is not completed (its host may still be off): no other
/// control-plane host is remediated meanwhile; its own retry goes when retryPeriod is over.
#[test]
fn seed_004_a_failed_control_plane_remediation_awaiting_retry_blocks_the_next() {
    let mut s = cluster(5, 1);
    node_down(&mut s, "cp-0");
    node_down(&mut s, "cp-1");
    let mut failed = remediation(
        "cp-0",
        1,
        P::Failed {
            reason: "power-off failed".into(),
        },
        "w-0",
        true,
    );
    failed.phase_since = Timestamp(NOW.0 - 10_000);
    s.remediations = vec![failed];
    let mut pol = policy();
    pol.health_checks[0].max_unhealthy = Some(MaxUnhealthy::Count(2));
    let p = crate::plan(&s, &pol, NOW);
    assert!(starts(&p).is_empty(), "{p}");
    assert!(refused(&p, "cp-1", "awaits its retry"), "{p}");
    assert!(refused(&p, "cp-0", "waits for retryPeriod"), "{p}");
    let later = NOW.after(Duration::from_secs(300));
    agents_alive_at(&mut s, later);
    let p = crate::plan(&s, &pol, later);
    assert_eq!(starts(&p), ["cp-0"], "the retry of cp-0 itself goes: {p}");
}

/// Seed 004's rule is about the replacement ("prevents KCP to remediate more machines while
/// the replacement for the previous machine is not yet created"); here the host is its own
/// replacement. A failed attempt whose host came back (healthy by every check, its node
/// ready, its member healthy) holds nothing back: it is never retried (nothing to retry), and
/// before this it blocked every other control-plane host until a person acted (the soak:
/// the executor restarted during a power-on, the host recovered by itself).
#[test]
fn seed_004_a_failed_control_plane_remediation_whose_host_is_back_does_not_block_the_next() {
    let mut s = cluster(5, 1);
    node_down(&mut s, "cp-1");
    let mut failed = remediation(
        "cp-0",
        1,
        P::Failed {
            reason: "the power-on was interrupted by an agent restart".into(),
        },
        "w-0",
        true,
    );
    failed.phase_since = Timestamp(NOW.0 - 600_000);
    s.remediations = vec![failed];
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(starts(&p), ["cp-1"], "{p}");
    // Its member still unhealthy: not back, still blocking.
    s.hosts
        .iter_mut()
        .find(|h| h.name == "cp-0")
        .and_then(|h| h.etcd.as_mut())
        .unwrap()
        .healthy = false;
    let p = crate::plan(&s, &policy(), NOW);
    assert!(refused(&p, "cp-1", "awaits its retry"), "{p}");
}

/// Seed 002: the controller sets the control-plane maxUnhealthy to "1 for cluster with 3
/// members or 2 for a cluster with 5 members": that is the default, following the member
/// count, and the short-circuit says so. A value the administrator writes is honoured as
/// written — not capped (issue 24; issue 15's cap was wrong): "100%" of three lets two
/// NotReady hosts be remediated one at a time, each only while the quorum guard allows it.
#[test]
fn seed_002_control_plane_max_unhealthy_defaults_to_etcds_tolerance_and_a_written_value_is_honoured()
 {
    let mut s = cluster(5, 1);
    node_down(&mut s, "cp-0");
    node_down(&mut s, "cp-1");
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(p.health[0].max_unhealthy, Some(2), "{p}");
    assert!(p.health[0].short_circuit.is_none(), "{p}");
    node_down(&mut s, "cp-2");
    let p = crate::plan(&s, &policy(), NOW);
    let sc = p.health[0].short_circuit.as_deref().unwrap_or_default();
    assert!(
        sc.contains("2 is the control-plane default for 5 etcd voters (seed 002:"),
        "the default names its seed: {p}"
    );

    let mut pol = policy();
    pol.health_checks[0].max_unhealthy = Some(MaxUnhealthy::Text("100%".into()));
    let mut s = cluster(3, 1);
    node_down(&mut s, "cp-0");
    node_down(&mut s, "cp-1");
    let p = crate::plan(&s, &pol, NOW);
    assert_eq!(p.health[0].max_unhealthy, Some(3), "{p}");
    assert!(p.health[0].short_circuit.is_none(), "{p}");
    assert_eq!(starts(&p), ["cp-0"], "{p}");
    assert!(
        refused(&p, "cp-1", "one control-plane remediation at a time"),
        "{p}"
    );
    // The quorum guard, not the threshold, protects quorum: with cp-2's etcd hung, fencing
    // cp-0 (whose member answers) would leave 1 of 3.
    find(&mut s, "cp-2").etcd.as_mut().unwrap().healthy = false;
    let p = crate::plan(&s, &pol, NOW);
    assert!(starts(&p).is_empty(), "{p}");
    assert!(refused_kind(&p, "cp-0", ReasonKind::Quorum), "{p}");
}

/// Seed 001: the quorum guard's PDB has `minAvailable: control-plane machines − 1`; during a
/// replacement (one machine more, its member not yet healthy) that keeps every old member.
#[test]
fn seed_001_disruption_budget_is_control_plane_machines_minus_one() {
    let mut s = cluster(3, 2);
    assert_eq!(
        crate::plan(&s, &policy(), NOW).min_available_members,
        Some(2)
    );
    let mut spare = crate::testkit::cp_host("cp-3", None, 50);
    spare.node = None;
    spare.node_seen = false;
    s.hosts.push(spare);
    assert_eq!(
        crate::plan(&s, &policy(), NOW).min_available_members,
        Some(3)
    );
}

/// Seed 004 preflight ("an equal number of control plane Machines and members"): no scaling
/// while a host that is not control-plane runs a member.
#[test]
fn seed_004_scaling_waits_while_machines_and_members_disagree() {
    let mut s = cluster(3, 1);
    find(&mut s, "cp-1").up_to_date = false;
    let p = crate::plan(&s, &policy(), NOW);
    assert!(
        p.actions
            .iter()
            .any(|a| matches!(a.kind, ActionKind::RequestHost { .. })),
        "the rollout goes when they agree: {p}"
    );
    find(&mut s, "w-0").etcd = Some(member(9, false, true));
    let p = crate::plan(&s, &policy(), NOW);
    assert!(
        !p.actions.iter().any(|a| matches!(
            a.kind,
            ActionKind::RequestHost { .. } | ActionKind::RequestHostDeletion { .. }
        )),
        "{p}"
    );
    assert!(
        refused(&p, "control-plane", "w-0 runs an etcd member"),
        "{p}"
    );
}

/// Guard by membership, not by label: a host labelled worker that holds a healthy voter is
/// fenced only if quorum allows it (seed 004: remediation MUST preserve etcd quorum).
#[test]
fn a_worker_labelled_host_with_a_voter_is_guarded_like_a_control_plane_host() {
    let mut s = cluster(3, 1);
    // cp-2 runs a voter but is labelled worker; cp-0's etcd hangs (its node stays Ready).
    find(&mut s, "cp-2").role = Role::Worker;
    find(&mut s, "cp-0").etcd.as_mut().unwrap().healthy = false;
    node_down(&mut s, "cp-2");
    let p = crate::plan(&s, &policy(), NOW);
    assert!(starts(&p).is_empty(), "{p}");
    assert!(refused_kind(&p, "cp-2", ReasonKind::Quorum), "{p}");
    // With cp-0's member healthy again, cp-2 may go, recorded as guarding quorum.
    find(&mut s, "cp-0").etcd.as_mut().unwrap().healthy = true;
    let p = crate::plan(&s, &policy(), NOW);
    let started = p.actions.iter().find_map(|a| match &a.kind {
        ActionKind::StartRemediation { remediation } => Some(remediation.clone()),
        _ => None,
    });
    let r = started.unwrap_or_else(|| panic!("{p}"));
    assert!(r.target == "cp-2" && r.control_plane, "{p}");
}

/// The host's role wins over a record's flag: a control-plane host's remediation recorded
/// with `control_plane: false` (an older version, a hand edit) still counts as the one
/// control-plane remediation in progress.
#[test]
fn a_records_control_plane_flag_does_not_hide_a_control_plane_remediation() {
    let mut s = cluster(5, 1);
    node_down(&mut s, "cp-0");
    node_down(&mut s, "cp-1");
    s.remediations = vec![remediation("cp-0", 1, P::PoweringOff, "w-0", false)];
    let mut pol = policy();
    pol.health_checks[0].max_unhealthy = Some(MaxUnhealthy::Count(2));
    let p = crate::plan(&s, &pol, NOW);
    assert!(starts(&p).is_empty(), "{p}");
    assert!(
        refused(&p, "cp-1", "one control-plane remediation at a time"),
        "{p}"
    );
}

// ---- a grace after every fence ---------------------------------------------------------

/// MHC nodeStartupTimeout semantics from the boot: a host powered on by a remediation is
/// starting; a condition that last changed before the boot is not evidence until
/// nodeStartupTimeout after it. Once it is, a new remediation is the last one's retry.
#[test]
fn a_rebooted_host_is_not_judged_by_conditions_from_before_its_boot() {
    let mut s = cluster(3, 1);
    let boot = Timestamp(NOW.0 - 20_000);
    let mut done = remediation("w-0", 1, P::Done, "cp-0", false);
    done.powered_on_at = Some(boot);
    done.phase_since = Timestamp(NOW.0 - 10_000);
    s.remediations = vec![done];
    // The Node still says Ready=False since an hour ago (its agent's view from before the
    // fence, as a restarted controller or a lagging watch can show it).
    find(&mut s, "w-0").node.as_mut().unwrap().conditions = vec![NodeCondition {
        type_: "Ready".into(),
        status: ConditionStatus::False,
        last_transition: Timestamp(NOW.0 - 3_600_000),
    }];
    let p = crate::plan(&s, &policy(), NOW);
    assert!(starts(&p).is_empty(), "{p}");
    assert_eq!(p.health[1].unhealthy, Vec::<String>::new(), "{p}");
    // The grace runs from the remediation's end (10 s ago), when it saw the host Ready.
    let startup_over = Timestamp(NOW.0 - 10_000).after(Duration::from_secs(600));
    assert!(p.requeue_at.is_some_and(|t| t <= startup_over), "{p}");
    // Still NotReady when the startup grace is over: unhealthy, and the start is a retry.
    let mut later = s.clone();
    agents_alive_at(&mut later, startup_over);
    let p = crate::plan(&later, &policy(), startup_over);
    assert_eq!(p.health[1].unhealthy, ["w-0"], "{p}");
    let attempt = p.actions.iter().find_map(|a| match &a.kind {
        ActionKind::StartRemediation { remediation } => Some(remediation.attempt),
        _ => None,
    });
    assert_eq!(
        attempt,
        Some(2),
        "a relapse within minHealthyPeriod is the retry, not a fresh start: {p}"
    );
    // A Node missing since before the boot is starting too.
    let h = find(&mut s, "w-0");
    h.node = None;
    h.node_seen = true;
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(p.health[1].unhealthy, Vec::<String>::new(), "{p}");
}

/// A report older than the end of the last remediation (which saw the host Ready) is stale:
/// a new leader that reads it again does not fence the host a second time at once — the
/// `lab_partition` double fence (the rebooted host's boot-time `Ready=False`, read again
/// after a leadership lapse). Evidence newer than the end counts as usual.
#[test]
fn a_report_older_than_the_last_remediations_end_is_not_evidence() {
    let mut s = cluster(3, 1);
    let mut done = remediation("cp-0", 1, P::Done, "w-0", true);
    done.powered_on_at = Some(Timestamp(NOW.0 - 30_000));
    done.phase_since = Timestamp(NOW.0 - 12_000);
    s.remediations = vec![done];
    // Ready=False since just after the boot, 25 s ago: older than the end (12 s ago).
    find(&mut s, "cp-0").node.as_mut().unwrap().conditions = vec![NodeCondition {
        type_: "Ready".into(),
        status: ConditionStatus::False,
        last_transition: Timestamp(NOW.0 - 25_000),
    }];
    let mut pol = policy();
    pol.health_checks[0].unhealthy_conditions[0].timeout = Duration::from_secs(5);
    pol.health_checks[0].node_startup_timeout = Some(Duration::from_secs(60));
    let p = crate::plan(&s, &pol, NOW);
    assert!(starts(&p).is_empty(), "{p}");
    assert_eq!(p.health[0].unhealthy, Vec::<String>::new(), "{p}");
    // A failure that began after the end is judged by its own timeout.
    find(&mut s, "cp-0").node.as_mut().unwrap().conditions[0].last_transition =
        Timestamp(NOW.0 - 6_000);
    let p = crate::plan(&s, &pol, NOW);
    assert_eq!(p.health[0].unhealthy, ["cp-0"], "{p}");
}

/// A new remediation within retryPeriod of the last one is its retry, never a fresh start,
/// even when minHealthyPeriod is shorter than retryPeriod.
#[test]
fn a_new_remediation_within_retry_period_of_the_last_is_its_retry() {
    let mut pol = policy();
    pol.remediation.min_healthy_period = Duration::from_secs(1);
    pol.remediation.retry_period = Duration::from_secs(300);
    let mut s = cluster(3, 1);
    node_down(&mut s, "w-0");
    let mut done = remediation("w-0", 1, P::Done, "cp-0", false);
    done.phase_since = Timestamp(NOW.0 - 60_000);
    s.remediations = vec![done];
    let p = crate::plan(&s, &pol, NOW);
    assert!(starts(&p).is_empty(), "{p}");
    assert!(refused(&p, "w-0", "attempt 2 waits for retryPeriod"), "{p}");
}

// ---- break-glass holds ------------------------------------------------------------------

/// A person's break-glass fence is not undone: a held host is not remediated, a remediation
/// that has not touched power is cancelled, one that has waits, and the host drives nobody
/// else's BMC.
#[test]
fn a_held_host_is_left_alone_until_released() {
    let mut s = cluster(3, 2);
    node_down(&mut s, "w-0");
    find(&mut s, "w-0").hold = Some(hold("w-0", "alice on cp-1"));
    let p = crate::plan(&s, &policy(), NOW);
    assert!(starts(&p).is_empty(), "{p}");
    assert!(refused_kind(&p, "w-0", ReasonKind::Hold), "{p}");
    assert!(refused(&p, "w-0", "alice on cp-1"), "{p}");

    s.remediations = vec![remediation("w-0", 1, P::Gated, "cp-0", false)];
    let p = crate::plan(&s, &policy(), NOW);
    assert!(
        p.actions.iter().any(|a| matches!(
            &a.kind,
            ActionKind::Remediate {
                step: RemediationStep::Cancel { .. },
                ..
            }
        )),
        "{p}"
    );

    s.remediations = vec![remediation("w-0", 1, P::NodeRemoved, "cp-0", false)];
    let p = crate::plan(&s, &policy(), NOW);
    assert!(steps(&p, &RemediationStep::PowerOn).is_empty(), "{p}");
    assert!(
        refused(&p, "w-0", "metalguard-controller release w-0"),
        "{p}"
    );

    // A held host is nobody's executor.
    let mut s = cluster(3, 2);
    node_down(&mut s, "w-1");
    for h in ["cp-0", "cp-1", "cp-2"] {
        find(&mut s, h).hold = Some(hold(h, "bob"));
    }
    let p = crate::plan(&s, &policy(), NOW);
    let started: Vec<String> = p
        .actions
        .iter()
        .filter_map(|a| match &a.kind {
            ActionKind::StartRemediation { remediation } => Some(remediation.executor.clone()),
            _ => None,
        })
        .collect();
    assert_eq!(started, ["w-0"], "{p}");
}

/// A held control-plane host's member counts as down whatever its last report says: fencing
/// another voter would leave 1 of 3.
#[test]
fn a_held_control_plane_hosts_member_counts_as_down() {
    let mut s = cluster(3, 1);
    find(&mut s, "cp-2").hold = Some(hold("cp-2", "carol"));
    node_down(&mut s, "cp-0");
    let p = crate::plan(&s, &policy(), NOW);
    assert!(starts(&p).is_empty(), "{p}");
    assert!(refused_kind(&p, "cp-0", ReasonKind::Quorum), "{p}");
}
