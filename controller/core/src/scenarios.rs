//! Table tests named after the scenarios the seeds spell out.

use std::time::Duration;

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::{ActionKind, Plan, RemediationStep};
use metalguard_api::policy::MaxUnhealthy;
use metalguard_api::snapshot::{QUORUM_HOOK, Role};

use crate::sim::World;
use crate::testkit::{NOW, break_host, cluster, find, policy};

fn kinds(p: &Plan) -> Vec<&ActionKind> {
    p.actions.iter().map(|a| &a.kind).collect()
}

fn starts(p: &Plan) -> Vec<String> {
    p.actions
        .iter()
        .filter_map(|a| match &a.kind {
            ActionKind::StartRemediation { remediation } => Some(remediation.target.clone()),
            _ => None,
        })
        .collect()
}

fn refused(p: &Plan, subject: &str, needle: &str) -> bool {
    p.refusals
        .iter()
        .any(|r| r.subject == subject && r.reason.contains(needle))
}

fn ten_minutes_ago() -> Timestamp {
    Timestamp(NOW.0 - 600_000)
}

// ---- seed 004 (KCP) remediation scenarios -------------------------------------------------

#[test]
fn seed_004_scenario_1_three_replicas_one_machine_marked_for_remediation() {
    let mut s = cluster(3, 1);
    break_host(find(&mut s, "cp-0"), ten_minutes_ago());
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(starts(&p), ["cp-0"], "{p}");
    // Also when its etcd member still answers: the other two keep quorum.
    find(&mut s, "cp-0").etcd.as_mut().unwrap().healthy = true;
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(starts(&p), ["cp-0"], "{p}");
}

#[test]
fn seed_004_scenario_2_three_replicas_two_machines_marked_one_at_a_time() {
    let mut pol = policy();
    pol.health_checks[0].max_unhealthy = Some(MaxUnhealthy::Count(2));
    let mut s = cluster(3, 1);
    break_host(find(&mut s, "cp-0"), ten_minutes_ago());
    break_host(find(&mut s, "cp-1"), ten_minutes_ago());
    find(&mut s, "cp-1").etcd.as_mut().unwrap().healthy = true;
    let p = crate::plan(&s, &pol, NOW);
    assert_eq!(starts(&p), ["cp-0"], "{p}");
    assert!(
        refused(&p, "cp-1", "one control-plane remediation at a time"),
        "{p}"
    );
    // More than one unhealthy etcd member: no remediation, a person must act.
    find(&mut s, "cp-1").etcd.as_mut().unwrap().healthy = false;
    let p = crate::plan(&s, &pol, NOW);
    assert!(starts(&p).is_empty(), "{p}");
    assert!(
        p.degraded.as_deref().unwrap().contains("quorum lost"),
        "{p}"
    );
}

#[test]
fn seed_004_scenario_3_unresponsive_member_elsewhere_blocks_remediation() {
    let mut s = cluster(3, 1);
    break_host(find(&mut s, "cp-0"), ten_minutes_ago());
    find(&mut s, "cp-0").etcd.as_mut().unwrap().healthy = true;
    find(&mut s, "cp-2").etcd.as_mut().unwrap().healthy = false; // hung, node still Ready
    let p = crate::plan(&s, &policy(), NOW);
    assert!(starts(&p).is_empty(), "{p}");
    assert!(
        refused(&p, "cp-0", "would leave 1 of 3 voters healthy"),
        "{p}"
    );
}

#[test]
fn seed_004_scenario_4_unhealthy_machines_combined_with_rollout() {
    let mut s = cluster(3, 1);
    find(&mut s, "cp-1").up_to_date = false;
    let mut w = World::new(s, policy(), ten_minutes_ago());
    w.broken.insert("cp-0".into());
    w.refresh();
    w.advance(600);
    let p = w.step().unwrap();
    assert_eq!(starts(&p), ["cp-0"], "{p}");
    assert!(
        !kinds(&p)
            .iter()
            .any(|k| matches!(k, ActionKind::RequestHost { .. })),
        "{p}"
    );
    // Run until the remediation is done, then the rollout replaces the outdated host.
    let mut rolled = false;
    for _ in 0..40 {
        w.advance(30);
        let p = w.step().unwrap();
        if kinds(&p)
            .iter()
            .any(|k| matches!(k, ActionKind::RequestHost { .. }))
        {
            assert!(
                w.snap.remediations.iter().all(|r| !r.phase.is_active()),
                "{p}"
            );
            rolled = true;
            break;
        }
    }
    assert!(rolled, "rollout never started: {:?}", w.log);
    for _ in 0..40 {
        w.advance(30);
        w.step().unwrap();
    }
    assert!(
        w.snap.hosts.iter().all(|h| h.name != "cp-1"),
        "outdated cp-1 not replaced: {:?}",
        w.log
    );
    assert_eq!(EtcdVoters::of(&w), 3);
}

struct EtcdVoters;
impl EtcdVoters {
    fn of(w: &World) -> usize {
        crate::quorum::EtcdView::from_snapshot(&w.snap).voter_count()
    }
}

// ---- seed 001 operational flow --------------------------------------------------------------

#[test]
fn seed_001_replacement_flow_learner_promoted_old_removed_hook_released() {
    let mut s = cluster(3, 1);
    s.hosts[0].deletion_requested_at = Some(NOW);
    let mut w = World::new(s, policy(), NOW);
    let newcomer = w.add_cp_host(None);
    w.refresh();
    // 1. The old voter stays until its replacement votes; the newcomer joins as a learner.
    let p = w.step().unwrap();
    assert!(
        matches!(kinds(&p)[..], [ActionKind::AddLearner { host }] if *host == newcomer),
        "{p}"
    );
    assert!(
        refused(
            &p,
            "etcd",
            "keeping cp-0 (member 1) until its replacement is promoted"
        ),
        "{p}"
    );
    // 2. The learner gets the hook first and catches up; no promotion before both.
    let p = w.step().unwrap();
    assert!(
        matches!(kinds(&p)[..], [ActionKind::AddQuorumHook { host }] if *host == newcomer),
        "{p}"
    );
    assert!(refused(&p, "etcd", "catching up"), "{p}");
    w.advance(5);
    // 3. Promoted.
    let p = w.step().unwrap();
    assert!(
        matches!(kinds(&p)[..], [ActionKind::PromoteLearner { .. }]),
        "{p}"
    );
    // 4. The old member is removed (4 voters > 3).
    let p = w.step().unwrap();
    assert!(
        matches!(
            kinds(&p)[..],
            [ActionKind::RemoveMember { member_id: 1, .. }]
        ),
        "{p}"
    );
    assert!(w.snap.hosts[0].has_quorum_hook());
    // 5. The hook is released; the Machine API then removes the host.
    let p = w.step().unwrap();
    assert!(
        matches!(kinds(&p)[..], [ActionKind::RemoveQuorumHook { host }] if host == "cp-0"),
        "{p}"
    );
    assert!(w.snap.hosts.iter().all(|h| h.name != "cp-0"));
    assert_eq!(w.snap.orphan_members, []);
}

#[test]
fn seed_001_leader_is_moved_before_its_member_is_removed() {
    let mut s = cluster(3, 0);
    s.hosts[2].deletion_requested_at = Some(NOW); // cp-2 leads
    let mut w = World::new(s, policy(), NOW);
    w.add_cp_host(None);
    for _ in 0..3 {
        w.step().unwrap();
        w.advance(5);
    }
    let p = w.step().unwrap();
    assert!(
        matches!(
            kinds(&p)[..],
            [ActionKind::MoveLeader { from_member: 3, .. }]
        ),
        "{p}"
    );
    let p = w.step().unwrap();
    assert!(
        matches!(
            kinds(&p)[..],
            [ActionKind::RemoveMember { member_id: 3, .. }]
        ),
        "{p}"
    );
}

#[test]
fn seed_001_machine_deleted_before_promotion_learner_removed_and_hook_released() {
    let mut s = cluster(3, 0);
    s.hosts[0].deletion_requested_at = Some(NOW);
    let mut w = World::new(s, policy(), NOW);
    let newcomer = w.add_cp_host(None);
    w.step().unwrap(); // learner added
    w.step().unwrap(); // hook added
    w.host_mut(&newcomer).unwrap().deletion_requested_at = Some(w.now);
    w.advance(5);
    let p = w.step().unwrap();
    assert!(
        matches!(kinds(&p)[..], [ActionKind::RemoveMember { .. }]),
        "{p}"
    );
    let p = w.step().unwrap();
    assert!(
        matches!(kinds(&p)[0], ActionKind::RemoveQuorumHook { host } if *host == newcomer),
        "{p}"
    );
}

#[test]
fn seed_001_hook_removed_by_someone_else_is_never_re_added() {
    let mut s = cluster(3, 0);
    s.hosts[0].deletion_requested_at = Some(NOW);
    s.hosts[0].pre_drain_hooks.insert("other/hook".into());
    s.hosts[0].pre_drain_hooks.remove(QUORUM_HOOK);
    let p = crate::plan(&s, &policy(), NOW);
    assert!(
        !kinds(&p)
            .iter()
            .any(|k| matches!(k, ActionKind::AddQuorumHook { .. })),
        "{p}"
    );
    // Without deletion the hook is (re-)added.
    s.hosts[0].deletion_requested_at = None;
    let p = crate::plan(&s, &policy(), NOW);
    assert!(
        matches!(kinds(&p)[..], [ActionKind::AddQuorumHook { host }] if host == "cp-0"),
        "{p}"
    );
}

#[test]
fn seed_001_dead_voter_is_removed_before_its_replacement_is_added() {
    let mut s = cluster(3, 0);
    s.hosts[0].deletion_requested_at = Some(NOW);
    s.hosts[0].etcd.as_mut().unwrap().healthy = false;
    let mut w = World::new(s, policy(), NOW);
    w.broken.insert("cp-0".into());
    w.add_cp_host(None);
    w.refresh();
    let p = w.step().unwrap();
    assert!(
        matches!(
            kinds(&p)[..],
            [ActionKind::RemoveMember { member_id: 1, .. }]
        ),
        "{p}"
    );
    let p = w.step().unwrap();
    assert!(
        kinds(&p)
            .iter()
            .any(|k| matches!(k, ActionKind::AddLearner { .. })),
        "{p}"
    );
}

#[test]
fn seed_001_degraded_cluster_is_reported_and_left_alone() {
    let mut s = cluster(3, 0);
    s.hosts[0].etcd.as_mut().unwrap().healthy = false;
    s.hosts[1].etcd.as_mut().unwrap().healthy = false;
    s.hosts[0].deletion_requested_at = Some(NOW);
    let p = crate::plan(&s, &policy(), NOW);
    assert!(p.actions.is_empty(), "{p}");
    assert!(p.degraded.is_some());
    assert!(
        p.to_string()
            .contains("DEGRADED: etcd quorum lost: 1 of 3 voters healthy"),
        "{p}"
    );
}

#[test]
fn seed_001_disruption_budget_is_voters_minus_one() {
    let p = crate::plan(&cluster(5, 0), &policy(), NOW);
    assert_eq!(p.min_available_members, Some(4));
}

// ---- seed 002 scaling ------------------------------------------------------------------------

fn domains(w: &mut World, names: &[&str]) {
    w.snap.control_plane.failure_domains = names.iter().map(|s| (*s).to_owned()).collect();
}

#[test]
fn seed_002_scale_from_3_to_5_one_host_at_a_time_spread_over_domains() {
    let mut s = cluster(3, 0);
    for (h, d) in s.hosts.iter_mut().zip(["a", "b", "c"]) {
        h.failure_domain = Some(d.into());
    }
    s.control_plane.desired_replicas = 5;
    let mut w = World::new(s, policy(), NOW);
    domains(&mut w, &["a", "b", "c"]);
    let p = w.step().unwrap();
    assert!(
        matches!(kinds(&p)[..], [ActionKind::RequestHost { failure_domain: Some(d) }] if d == "a"),
        "{p}"
    );
    for _ in 0..20 {
        w.advance(5);
        let p = w.step().unwrap();
        let hosts_requested = kinds(&p)
            .iter()
            .filter(|k| matches!(k, ActionKind::RequestHost { .. }))
            .count();
        assert!(hosts_requested <= 1);
    }
    let v = crate::quorum::EtcdView::from_snapshot(&w.snap);
    assert_eq!(
        (v.voter_count(), v.healthy_voter_count()),
        (5, 5),
        "{:?}",
        w.log
    );
    let mut ds: Vec<_> = w
        .snap
        .hosts
        .iter()
        .filter_map(|h| h.failure_domain.clone())
        .collect();
    ds.sort();
    assert_eq!(ds, ["a", "a", "b", "b", "c"]);
}

#[test]
fn seed_002_scenario_1_scale_out_short_circuits_with_an_unhealthy_member() {
    let mut s = cluster(3, 0);
    s.control_plane.desired_replicas = 5;
    s.hosts[1].etcd.as_mut().unwrap().healthy = false;
    let p = crate::plan(&s, &policy(), NOW);
    assert!(p.actions.is_empty(), "{p}");
    assert!(
        refused(&p, "control-plane", "scale-up short-circuited"),
        "{p}"
    );
}

#[test]
fn seed_002_scale_from_5_to_3_removes_oldest_in_most_populated_domain() {
    let mut s = cluster(5, 0);
    for (h, d) in s.hosts.iter_mut().zip(["a", "b", "c", "a", "b"]) {
        h.failure_domain = Some(d.into());
    }
    s.control_plane.desired_replicas = 3;
    let mut w = World::new(s, policy(), NOW);
    domains(&mut w, &["a", "b", "c"]);
    let p = w.step().unwrap();
    assert!(
        matches!(kinds(&p)[..], [ActionKind::RequestHostDeletion { host }] if host == "cp-0"),
        "{p}"
    );
    for _ in 0..12 {
        w.advance(5);
        w.step().unwrap();
    }
    let v = crate::quorum::EtcdView::from_snapshot(&w.snap);
    assert_eq!(
        (v.voter_count(), v.healthy_voter_count()),
        (3, 3),
        "{:?}",
        w.log
    );
    let left: Vec<_> = w.names(Role::ControlPlane);
    assert_eq!(left, ["cp-2", "cp-3", "cp-4"], "{:?}", w.log);
}

#[test]
fn seed_002_scenario_2_scale_in_short_circuits_with_an_unhealthy_member() {
    let mut s = cluster(5, 0);
    s.control_plane.desired_replicas = 3;
    s.hosts[3].etcd.as_mut().unwrap().healthy = false;
    let p = crate::plan(&s, &policy(), NOW);
    assert!(
        refused(&p, "control-plane", "scale-down short-circuited"),
        "{p}"
    );
    assert!(
        !p.actions.iter().any(|a| a.kind.is_membership_change()),
        "{p}"
    );
}

#[test]
fn even_desired_replicas_are_rejected() {
    let mut s = cluster(3, 0);
    s.control_plane.desired_replicas = 4;
    let p = crate::plan(&s, &policy(), NOW);
    assert!(p.degraded.unwrap().contains("not an odd number"));
}

// ---- seed 000 and seed 003 maxUnhealthy ------------------------------------------------------

#[test]
fn seed_000_control_plane_max_unhealthy_1_takes_no_action_with_two_unhealthy() {
    let mut s = cluster(3, 0);
    break_host(find(&mut s, "cp-0"), ten_minutes_ago());
    break_host(find(&mut s, "cp-1"), ten_minutes_ago());
    for h in &mut s.hosts[..2] {
        h.etcd.as_mut().unwrap().healthy = true;
    }
    let p = crate::plan(&s, &policy(), NOW);
    assert!(starts(&p).is_empty(), "{p}");
    let text = p.to_string();
    assert!(
        text.contains("cp-0: not remediating: check control-plane short-circuited: 2 unhealthy > maxUnhealthy 1 (cp-0, cp-1)"),
        "{text}"
    );
}

fn workers_with_unhealthy(total: usize, unhealthy: usize) -> Plan {
    let mut s = cluster(3, total);
    for i in 0..unhealthy {
        break_host(find(&mut s, &format!("w-{i}")), ten_minutes_ago());
    }
    let mut pol = policy();
    pol.health_checks[1].max_unhealthy = Some(MaxUnhealthy::Text("40%".into()));
    crate::plan(&s, &pol, NOW)
}

#[test]
fn seed_003_40_percent_of_25_remediates_10_unhealthy_not_11() {
    let p = workers_with_unhealthy(25, 10);
    assert_eq!(starts(&p).len(), 1, "{p}"); // one at a time (maxConcurrent 1)
    let p = workers_with_unhealthy(25, 11);
    assert!(starts(&p).is_empty(), "{p}");
    assert!(
        p.health[1]
            .short_circuit
            .as_deref()
            .unwrap()
            .starts_with("11 unhealthy > maxUnhealthy 10")
    );
}

#[test]
fn seed_003_40_percent_of_6_remediates_2_unhealthy_not_3() {
    assert_eq!(starts(&workers_with_unhealthy(6, 2)).len(), 1);
    assert!(starts(&workers_with_unhealthy(6, 3)).is_empty());
}

#[test]
fn seed_003_invalid_max_unhealthy_blocks_remediation() {
    let mut s = cluster(3, 4);
    break_host(find(&mut s, "w-0"), ten_minutes_ago());
    let mut pol = policy();
    pol.health_checks[1].max_unhealthy = Some(MaxUnhealthy::Text("lots".into()));
    let p = crate::plan(&s, &pol, NOW);
    assert!(starts(&p).is_empty(), "{p}");
    assert!(
        refused(&p, "w-0", "neither an integer nor a percentage"),
        "{p}"
    );
}

#[test]
fn seed_003_requeue_at_earliest_timeout() {
    let mut s = cluster(3, 2);
    break_host(find(&mut s, "w-0"), Timestamp(NOW.0 - 100_000)); // 100 s of a 300 s timeout
    let p = crate::plan(&s, &policy(), NOW);
    assert!(starts(&p).is_empty());
    assert_eq!(p.requeue_at, Some(Timestamp(NOW.0 + 200_000)));
}

#[test]
fn seed_003_node_startup_timeout_and_zero_disables() {
    let mut s = cluster(3, 2);
    let w0 = find(&mut s, "w-0");
    w0.node = None;
    w0.node_seen = false;
    w0.created_at = Timestamp(NOW.0 - Duration::from_secs(601).as_millis() as u64);
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(starts(&p), ["w-0"], "{p}");
    let mut pol = policy();
    pol.health_checks[1].node_startup_timeout = Some(Duration::ZERO);
    assert!(starts(&crate::plan(&s, &pol, NOW)).is_empty());
    // A node that existed and vanished is unhealthy at once.
    find(&mut s, "w-0").node_seen = true;
    assert_eq!(starts(&crate::plan(&s, &pol, NOW)), ["w-0"]);
}

#[test]
fn step_names_are_stable_operation_ids() {
    let mut s = cluster(3, 2);
    break_host(find(&mut s, "w-1"), ten_minutes_ago());
    let p1 = crate::plan(&s, &policy(), NOW);
    let p2 = crate::plan(&s, &policy(), Timestamp(NOW.0 + 1_000));
    let ids = |p: &Plan| p.actions.iter().map(|a| a.id.0.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&p1), ["remediation/w-1/1/start"]);
    assert_eq!(ids(&p1), ids(&p2));
    let _ = RemediationStep::PowerOff;
}
