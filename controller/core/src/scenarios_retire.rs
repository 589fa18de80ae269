//! Table tests for retiring a control-plane host without a Machine API (the standalone
//! stand-in for seed 001's "a Control Plane Machine is marked for deletion and a new one is
//! created"): the retired host is powered off only once nothing of etcd is left on it.

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::{ActionKind, Plan};
use metalguard_api::snapshot::{QUORUM_HOOK, Retirement, Snapshot};

use crate::retire::decommission_id;
use crate::scenarios::{kinds, refused};
use crate::sim::World;
use crate::testkit::{NOW, cluster, find, policy};

fn retirement() -> Retirement {
    Retirement {
        requested_at: NOW,
        requested_by: Some("alice".into()),
        reason: "disk replacement".into(),
    }
}

fn retire(s: &mut Snapshot, host: &str) {
    find(s, host).retirement = Some(retirement());
}

fn power_offs(p: &Plan) -> Vec<(&str, &str)> {
    p.actions
        .iter()
        .filter_map(|a| match &a.kind {
            ActionKind::DecommissionHost { host, executor } => {
                Some((host.as_str(), executor.as_str()))
            }
            _ => None,
        })
        .collect()
}

/// The brief's sequence, step by step: the leaving host leads, so leadership moves first.
#[test]
fn retiring_the_leader_replaces_it_moves_leadership_removes_it_and_powers_it_off_last() {
    let mut s = cluster(3, 1);
    retire(&mut s, "cp-2"); // cp-2 leads
    let mut w = World::new(s, policy(), NOW);
    // 0. Nothing to join yet: a host is asked for (the operator adds it to the inventory).
    let p = w.step().unwrap();
    assert!(
        matches!(kinds(&p)[..], [ActionKind::RequestHost { .. }]),
        "{p}"
    );
    assert!(refused(&p, "cp-2", "still in the cluster"), "{p}");
    let newcomer = w.snap.hosts.last().unwrap().name.clone();
    let mut seen = Vec::new();
    for _ in 0..10 {
        w.advance(5);
        let p = w.step().unwrap();
        seen.extend(p.actions.iter().map(|a| a.kind.clone()));
    }
    let expected = [
        ActionKind::AddLearner {
            host: newcomer.clone(),
        },
        ActionKind::AddQuorumHook {
            host: newcomer.clone(),
        },
        ActionKind::PromoteLearner {
            host: newcomer.clone(),
            member_id: 4,
        },
        ActionKind::MoveLeader {
            from_member: 3,
            to_member: 1,
        },
        ActionKind::RemoveMember {
            host: Some("cp-2".into()),
            member_id: 3,
        },
        ActionKind::RemoveQuorumHook {
            host: "cp-2".into(),
        },
        ActionKind::DecommissionHost {
            host: "cp-2".into(),
            executor: "cp-0".into(),
        },
    ];
    assert_eq!(seen, expected, "{:?}", w.log);
    assert!(w.power_off.contains("cp-2"));
}

#[test]
fn a_retired_host_is_never_powered_off_while_it_has_a_member() {
    let mut s = cluster(3, 1);
    retire(&mut s, "cp-0");
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(power_offs(&p), [], "{p}");
    assert!(
        refused(
            &p,
            "cp-0",
            "its etcd voter 1 is still in the cluster (waiting for its replacement and removal)"
        ),
        "{p}"
    );
    assert!(
        refused(&p, "etcd", "keeping cp-0 (member 1) until its replacement"),
        "{p}"
    );
    // Also not when its hook is gone (the escape hatch) while the member stays.
    find(&mut s, "cp-0").pre_drain_hooks.clear();
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(power_offs(&p), [], "{p}");
}

#[test]
fn a_retired_host_is_never_powered_off_while_any_hook_is_left() {
    let mut s = cluster(3, 1);
    retire(&mut s, "cp-0");
    let h = find(&mut s, "cp-0");
    h.etcd = None;
    h.pre_drain_hooks.insert("other.example/backup".into());
    let p = crate::plan(&s, &policy(), NOW);
    // metalguard's own hook is released first; the other owner's hook keeps the power on.
    assert!(
        kinds(&p)
            .iter()
            .any(|k| matches!(k, ActionKind::RemoveQuorumHook { host } if host == "cp-0")),
        "{p}"
    );
    assert_eq!(power_offs(&p), [], "{p}");
    find(&mut s, "cp-0").pre_drain_hooks.remove(QUORUM_HOOK);
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(power_offs(&p), [], "{p}");
    assert!(
        refused(&p, "cp-0", "preDrain hooks are left: other.example/backup"),
        "{p}"
    );
}

/// One authority over power: while another actor holds the host's node lease, the
/// retirement's power-off waits and says who holds it.
#[test]
fn a_retired_host_is_not_powered_off_while_another_actor_holds_its_node_lease() {
    let mut s = cluster(3, 1);
    retire(&mut s, "cp-0");
    let h = find(&mut s, "cp-0");
    h.etcd = None;
    h.pre_drain_hooks.clear();
    h.lease_held_by = Some("node-maintenance".into());
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(power_offs(&p), [], "{p}");
    assert!(
        refused(
            &p,
            "cp-0",
            "its node lease medik8s-leases/node-cp-0 is held by node-maintenance"
        ),
        "{p}"
    );
    find(&mut s, "cp-0").lease_held_by = None;
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(power_offs(&p).len(), 1, "{p}");
}

#[test]
fn only_retiring_hosts_are_powered_off() {
    let mut s = cluster(3, 1);
    // A Machine-API deletion with nothing of etcd left: the Machine API deprovisions it.
    let h = find(&mut s, "cp-0");
    h.deletion_requested_at = Some(NOW);
    h.etcd = None;
    h.pre_drain_hooks.clear();
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(power_offs(&p), [], "{p}");
    // Retired, memberless and unhooked: powered off by the first healthy other agent.
    retire(&mut s, "cp-0");
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(power_offs(&p), [("cp-0", "cp-1")], "{p}");
    let a = p
        .actions
        .iter()
        .find(|a| matches!(a.kind, ActionKind::DecommissionHost { .. }))
        .unwrap();
    assert_eq!(a.id, decommission_id("cp-0", NOW));
    assert_eq!(a.id.0, format!("retire/cp-0/{}/power-off", NOW.0));
    assert!(
        a.reason.contains("retired (disk replacement)"),
        "{}",
        a.reason
    );
}

#[test]
fn the_power_off_id_depends_only_on_the_host_and_its_request() {
    let mut s = cluster(3, 1);
    retire(&mut s, "cp-0");
    let h = find(&mut s, "cp-0");
    h.etcd = None;
    h.pre_drain_hooks.clear();
    let first = crate::plan(&s, &policy(), NOW);
    // cp-1's agent goes silent: another executor, the same operation id.
    find(&mut s, "cp-1").agent.as_mut().unwrap().last_heartbeat = Timestamp(0);
    let later = NOW.after(std::time::Duration::from_secs(30));
    let second = crate::plan(&s, &policy(), later);
    let ids = |p: &Plan| {
        p.actions
            .iter()
            .filter(|a| matches!(a.kind, ActionKind::DecommissionHost { .. }))
            .map(|a| a.id.clone())
            .collect::<Vec<_>>()
    };
    assert_eq!(power_offs(&first), [("cp-0", "cp-1")]);
    assert_ne!(power_offs(&second)[0].1, "cp-1", "{second}");
    assert_eq!(ids(&first), ids(&second));
    // Told apart from every other operation (the node lease is taken for it).
    assert!(ids(&first).iter().all(crate::retire::is_decommission));
    for other in [
        "cp-0/1/power-off",
        "retire/1/power-off",
        "retire/cp-0/x/power-off",
    ] {
        let id = metalguard_api::plan::OperationId(other.into());
        assert!(!crate::retire::is_decommission(&id), "{other}");
    }
    // A new retirement request is a new operation.
    find(&mut s, "cp-0")
        .retirement
        .as_mut()
        .unwrap()
        .requested_at = later;
    let third = crate::plan(&s, &policy(), later);
    assert_ne!(ids(&third), ids(&first));
}

#[test]
fn no_power_off_without_a_bmc_another_agent_or_a_trustworthy_etcd_view() {
    let mut base = cluster(3, 0);
    retire(&mut base, "cp-0");
    let h = find(&mut base, "cp-0");
    h.etcd = None;
    h.pre_drain_hooks.clear();

    let mut s = base.clone();
    find(&mut s, "cp-0").bmc_configured = false;
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(power_offs(&p), [], "{p}");
    assert!(refused(&p, "cp-0", "no BMC: power it off by hand"), "{p}");

    let mut s = base.clone();
    for h in s.hosts.iter_mut().filter(|h| h.name != "cp-0") {
        h.agent.as_mut().unwrap().can_fence = false;
    }
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(power_offs(&p), [], "{p}");
    assert!(
        refused(&p, "cp-0", "no healthy agent other than the target"),
        "{p}"
    );

    let mut s = base;
    find(&mut s, "cp-1").etcd.as_mut().unwrap().healthy = false;
    find(&mut s, "cp-2").etcd.as_mut().unwrap().healthy = false;
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(power_offs(&p), [], "{p}");
    assert!(refused(&p, "cp-0", "cannot be trusted"), "{p}");
}

#[test]
fn the_power_off_goes_to_an_agent_that_has_not_said_it_cannot_reach_the_bmc() {
    let mut s = cluster(3, 0);
    retire(&mut s, "cp-0");
    let h = find(&mut s, "cp-0");
    h.etcd = None;
    h.pre_drain_hooks.clear();
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(power_offs(&p), [("cp-0", "cp-1")], "{p}");
    let cp1 = find(&mut s, "cp-1").agent.as_mut().unwrap();
    cp1.bmc_reachable.insert("cp-0".into(), false);
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(power_offs(&p), [("cp-0", "cp-2")], "{p}");
    let cp2 = find(&mut s, "cp-2").agent.as_mut().unwrap();
    cp2.bmc_reachable.insert("cp-0".into(), false);
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(power_offs(&p), [], "nobody can: nothing is sent; {p}");
    assert!(refused(&p, "cp-0", "cannot reach cp-0's BMC"), "{p}");
}
