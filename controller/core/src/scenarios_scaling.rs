//! Table tests for seed 004's scaling rules (KCP "Scale Up", "Scale Down", "Preflight
//! checks"), each quoting the seed it follows; the plan's text carries the same quote.

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::{ActionKind, Plan};
use metalguard_api::snapshot::{ConditionStatus, NodeCondition, Retirement, Snapshot};

use crate::domains::DELETE_MACHINE_ANNOTATION;
use crate::scenarios::{kinds, refused, ten_minutes_ago};
use crate::sim::World;
use crate::testkit::{NOW, cluster, cp_host, find, policy};

fn requested_hosts(p: &Plan) -> usize {
    kinds(p)
        .iter()
        .filter(|k| matches!(k, ActionKind::RequestHost { .. }))
        .count()
}

fn deletions(p: &Plan) -> Vec<&str> {
    p.actions
        .iter()
        .filter_map(|a| match &a.kind {
            ActionKind::RequestHostDeletion { host } => Some(host.as_str()),
            _ => None,
        })
        .collect()
}

/// A control-plane host still provisioning: no Node yet, no etcd member.
fn provisioning(s: &mut Snapshot, name: &str) {
    let mut h = cp_host(name, None, NOW.0 - 60_000);
    h.node = None;
    h.node_seen = false;
    s.hosts.push(h);
}

fn retire(s: &mut Snapshot, host: &str) {
    find(s, host).retirement = Some(Retirement {
        requested_at: NOW,
        requested_by: Some("alice".into()),
        reason: "disk replacement".into(),
    });
}

/// Seed 004, Scale Down: "Scale down operations are blocked based on Etcd and control plane
/// preflight checks", and the stacked-etcd check is "There are an equal number of control
/// plane Machines and members in the etcd cluster". Four control-plane hosts for three
/// desired, one of them still without a member: nothing is removed until it has one.
#[test]
fn seed_004_scale_down_is_blocked_while_a_control_plane_host_has_no_etcd_member() {
    let mut s = cluster(3, 0);
    provisioning(&mut s, "cp-3");
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(deletions(&p), Vec::<&str>::new(), "{p}");
    assert!(
        refused(
            &p,
            "control-plane",
            "scaling waits until control-plane machines and etcd members agree: control-plane host cp-3 has no etcd member yet (seed 004: \"Scale down operations are blocked based on Etcd and control plane preflight checks\": \"There are an equal number of control plane Machines and members in the etcd cluster\")"
        ),
        "{p}"
    );
    // Its Node ready, it gets its member first (a learner), still before any removal.
    let h = find(&mut s, "cp-3");
    h.node = Some(crate::testkit::ready_node(NOW));
    h.node_seen = true;
    let p = crate::plan(&s, &policy(), NOW);
    assert!(
        matches!(kinds(&p)[..], [ActionKind::AddLearner { host }] if host == "cp-3"),
        "{p}"
    );
    // Once it has its member, machines and members agree and the scale-down goes.
    find(&mut s, "cp-3").etcd = Some(crate::testkit::member(4, false, true));
    find(&mut s, "cp-3")
        .pre_drain_hooks
        .insert(metalguard_api::snapshot::QUORUM_HOOK.to_owned());
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(deletions(&p), ["cp-0"], "{p}");
}

/// Seed 004's rolling update with `MaxSurge` 1: "Scale up control plane creating a machine
/// with the new spec", then "Scale down control plane by removing one of the machine that
/// needs rollout" — and the scale-down is blocked unless machines and members are equal in
/// number, so the surge host's member joins (learner, caught up, promoted: seed 001) before
/// the outdated host is asked to go; voters go 3 → 4 → 3.
#[test]
fn seed_004_rollout_the_surge_host_gets_its_member_before_the_outdated_host_is_removed() {
    let mut s = cluster(3, 0);
    find(&mut s, "cp-1").up_to_date = false;
    let mut w = World::new(s, policy(), NOW);
    let mut seen = Vec::new();
    for _ in 0..12 {
        let p = w.step().unwrap();
        seen.extend(p.actions.iter().map(|a| a.kind.clone()));
        w.advance(5);
    }
    let expected = [
        ActionKind::RequestHost {
            failure_domain: None,
        },
        ActionKind::AddLearner {
            host: "cp-3".into(),
        },
        ActionKind::AddQuorumHook {
            host: "cp-3".into(),
        },
        ActionKind::PromoteLearner {
            host: "cp-3".into(),
            member_id: 4,
        },
        ActionKind::RequestHostDeletion {
            host: "cp-1".into(),
        },
        ActionKind::RemoveMember {
            host: Some("cp-1".into()),
            member_id: 2,
        },
        ActionKind::RemoveQuorumHook {
            host: "cp-1".into(),
        },
    ];
    assert_eq!(seen, expected, "{:?}", w.log);
    let v = crate::quorum::EtcdView::from_snapshot(&w.snap);
    assert_eq!((v.voter_count(), v.healthy_voter_count()), (3, 3));
    assert_eq!(
        w.names(metalguard_api::snapshot::Role::ControlPlane),
        ["cp-0", "cp-2", "cp-3"]
    );
}

/// Seed 004, Scale Up: "Scale up operations are blocked based on Etcd and control plane
/// preflight checks"; seed 002's scale out, step 6: "If (NOT all etcd members are healthy
/// OR NOT all owned machines have a backed ready node) then controller short circuits here".
/// A replacement is a scale-up too: a retired host's replacement is not requested while
/// another member is unhealthy or a staying machine has no ready node. The leaving host
/// itself is not judged (it is on its way out).
#[test]
fn seed_004_a_replacement_is_not_requested_while_an_etcd_member_is_unhealthy() {
    let mut s = cluster(3, 0);
    retire(&mut s, "cp-0");
    find(&mut s, "cp-1").etcd.as_mut().unwrap().healthy = false; // hung, its Node Ready
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(requested_hosts(&p), 0, "{p}");
    assert!(
        refused(
            &p,
            "control-plane",
            "replacement short-circuited: etcd member cp-1 (member 2) is unhealthy (seed 004: \"Scale up operations are blocked based on Etcd and control plane preflight checks\"; seed 002 scale out step 6: \"If (NOT all etcd members are healthy OR NOT all owned machines have a backed ready node) then controller short circuits here\")"
        ),
        "{p}"
    );
    // A staying machine without a ready Node (NotReady for a minute, not yet unhealthy).
    find(&mut s, "cp-1").etcd.as_mut().unwrap().healthy = true;
    find(&mut s, "cp-2").node.as_mut().unwrap().conditions = vec![NodeCondition {
        type_: "Ready".into(),
        status: ConditionStatus::False,
        last_transition: Timestamp(NOW.0 - 60_000),
    }];
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(requested_hosts(&p), 0, "{p}");
    assert!(
        refused(
            &p,
            "control-plane",
            "replacement short-circuited: cp-2 has no ready node (seed 004:"
        ),
        "{p}"
    );
    // All healthy and ready — the retired host NotReady for long does not count: requested.
    find(&mut s, "cp-2").node = Some(crate::testkit::ready_node(Timestamp(2)));
    find(&mut s, "cp-0").node.as_mut().unwrap().conditions = vec![NodeCondition {
        type_: "Ready".into(),
        status: ConditionStatus::False,
        last_transition: ten_minutes_ago(),
    }];
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(requested_hosts(&p), 1, "{p}");
    assert!(
        p.actions[0]
            .reason
            .starts_with("2 hosts stay, desired 3 (replacement)"),
        "{p}"
    );
}

/// Seed 004, Scale Down: "Allow scaling down of KCP with the possibility of marking specific
/// control plane machine(s) to be deleted with delete annotation key", in the order
/// "outdated machines with the delete annotation", "machines with the delete annotation",
/// "outdated machines", "all machines". Cluster API's key, `cluster.x-k8s.io/delete-machine`,
/// on a host's annotations chooses the host a scale-down removes, and the reason says so.
#[test]
fn seed_004_scale_down_removes_the_host_marked_with_the_delete_annotation_first() {
    let mut s = cluster(5, 0);
    s.control_plane.desired_replicas = 3;
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(deletions(&p), ["cp-0"], "unmarked: the oldest: {p}");
    find(&mut s, "cp-1").up_to_date = false;
    find(&mut s, "cp-3")
        .annotations
        .insert(DELETE_MACHINE_ANNOTATION.into(), String::new());
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(deletions(&p), ["cp-3"], "marked beats outdated: {p}");
    assert!(
        p.to_string().contains(
            "5 hosts, desired 3: remove cp-3: it is marked with cluster.x-k8s.io/delete-machine (seed 004 scale down: \"outdated machines with the delete annotation\", then \"machines with the delete annotation\""
        ),
        "{p}"
    );
    // Among marked hosts the existing order decides: outdated first, then the oldest.
    find(&mut s, "cp-4")
        .annotations
        .insert(DELETE_MACHINE_ANNOTATION.into(), "yes".into());
    assert_eq!(deletions(&crate::plan(&s, &policy(), NOW)), ["cp-3"]);
    find(&mut s, "cp-4").up_to_date = false;
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(deletions(&p), ["cp-4"], "{p}");
    assert!(
        p.actions[0].reason.contains(
            "remove cp-4: it is outdated and marked with cluster.x-k8s.io/delete-machine"
        ),
        "{p}"
    );
}
