//! Table tests for seed 004's scaling rules (KCP "Scale Up", "Scale Down", "Preflight
//! checks"), each quoting the seed it follows; the plan's text carries the same quote.

use metalguard_api::plan::{ActionKind, Plan};
use metalguard_api::snapshot::Snapshot;

use crate::scenarios::{kinds, refused};
use crate::sim::World;
use crate::testkit::{NOW, cluster, cp_host, find, policy};

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
