//! Table tests for seed 001 (quorum protection flow) and seed 002 (scaling).

use metalguard_api::plan::ActionKind;
use metalguard_api::snapshot::{QUORUM_HOOK, Role};

use crate::scenarios::{kinds, refused};
use crate::sim::World;
use crate::testkit::{NOW, cluster, policy};

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

/// `kubeadm join --control-plane` in its learner mode added the newcomer's learner itself:
/// metalguard adds none, and its own promotion waits for the same gates (the hook, catch-up);
/// when kubeadm promotes first, the replacement goes on from the voter it finds.
#[test]
fn seed_001_a_learner_added_outside_metalguard_is_the_joining_member_not_a_reason_to_add() {
    let mut s = cluster(3, 1);
    s.hosts[0].deletion_requested_at = Some(NOW);
    let mut w = World::new(s, policy(), NOW);
    let newcomer = w.add_cp_host(None);
    let kubeadms = w.next_member;
    w.next_member += 1;
    let mut learner = crate::testkit::member(kubeadms, true, true);
    learner.progress_permille = 0;
    w.host_mut(&newcomer).unwrap().etcd = Some(learner);
    w.refresh();
    // No second learner: the hook first, and promotion waits for catch-up.
    let p = w.step().unwrap();
    assert!(
        matches!(kinds(&p)[..], [ActionKind::AddQuorumHook { host }] if *host == newcomer),
        "{p}"
    );
    assert!(refused(&p, "etcd", "catching up"), "{p}");
    w.advance(5);
    let p = w.step().unwrap();
    assert!(
        matches!(kinds(&p)[..], [ActionKind::PromoteLearner { member_id, .. }] if *member_id == kubeadms),
        "{p}"
    );

    // Again, but kubeadm promotes before metalguard does: the old member goes next.
    let mut s = cluster(3, 1);
    s.hosts[0].deletion_requested_at = Some(NOW);
    let mut w = World::new(s, policy(), NOW);
    let newcomer = w.add_cp_host(None);
    w.host_mut(&newcomer).unwrap().etcd = Some(crate::testkit::member(9, false, true));
    w.host_mut(&newcomer)
        .unwrap()
        .pre_drain_hooks
        .insert(QUORUM_HOOK.to_owned());
    w.refresh();
    let p = w.step().unwrap();
    assert!(
        matches!(
            kinds(&p)[..],
            [ActionKind::RemoveMember { member_id: 1, .. }]
        ),
        "{p}"
    );
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
