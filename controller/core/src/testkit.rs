//! Builders for tests: healthy hosts, clusters and a default policy.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use metalguard_api::duration::Timestamp;
use metalguard_api::policy::{HealthCheck, Policy, Selector, UnhealthyCondition};
use metalguard_api::snapshot::{
    AgentReport, ConditionStatus, ControlPlaneSpec, EtcdMember, Host, NodeCondition, NodeStatus,
    QUORUM_HOOK, Role, Snapshot,
};

/// "Now" in tests: well after every host was created.
pub(crate) const NOW: Timestamp = Timestamp(100_000_000);

pub(crate) fn ready_node(since: Timestamp) -> NodeStatus {
    NodeStatus {
        created_at: since,
        conditions: vec![NodeCondition {
            type_: "Ready".into(),
            status: ConditionStatus::True,
            last_transition: since,
        }],
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        out_of_service: false,
    }
}

pub(crate) fn host(name: &str, role: Role, domain: Option<&str>, created: u64) -> Host {
    Host {
        name: name.to_owned(),
        role,
        failure_domain: domain.map(str::to_owned),
        created_at: Timestamp(created),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        externally_provisioned: false,
        bmc_configured: true,
        up_to_date: true,
        deletion_requested_at: None,
        pre_drain_hooks: BTreeSet::new(),
        fence_request: None,
        retirement: None,
        phase_failed: false,
        node: Some(ready_node(Timestamp(created))),
        node_seen: true,
        agent: Some(AgentReport {
            last_heartbeat: NOW,
            can_fence: true,
            bmc_reachable: BTreeMap::new(),
            boot_id: None,
            boot_reported_at: None,
        }),
        etcd: None,
        hold: None,
        lease_held_by: None,
    }
}

pub(crate) fn cp_host(name: &str, domain: Option<&str>, created: u64) -> Host {
    host(name, Role::ControlPlane, domain, created)
}

pub(crate) fn worker(name: &str, created: u64) -> Host {
    host(name, Role::Worker, None, created)
}

pub(crate) fn member(id: u64, learner: bool, healthy: bool) -> EtcdMember {
    EtcdMember {
        id,
        name: format!("m{id}"),
        learner,
        healthy,
        leader: false,
        progress_permille: if learner { 0 } else { 1000 },
    }
}

/// `cp` control-plane hosts `cp-0..` with healthy voters (ids 1..; the last one leads) and
/// hooks, plus `workers` workers `w-0..`; desired = `cp`.
pub(crate) fn cluster(cp: usize, workers: usize) -> Snapshot {
    let mut hosts = Vec::new();
    for i in 0..cp {
        let mut h = cp_host(&format!("cp-{i}"), None, i as u64);
        let mut m = member(i as u64 + 1, false, true);
        m.leader = i + 1 == cp;
        h.etcd = Some(m);
        h.pre_drain_hooks.insert(QUORUM_HOOK.to_owned());
        hosts.push(h);
    }
    for i in 0..workers {
        hosts.push(worker(&format!("w-{i}"), 100 + i as u64));
    }
    Snapshot {
        observed_at: NOW,
        control_plane: ControlPlaneSpec {
            desired_replicas: cp as u32,
            failure_domains: Vec::new(),
        },
        hosts,
        orphan_members: Vec::new(),
        remediations: Vec::new(),
    }
}

pub(crate) fn ready_check(name: &str, role: Role) -> HealthCheck {
    let cond = |status| UnhealthyCondition {
        type_: "Ready".into(),
        status,
        timeout: Duration::from_secs(300),
    };
    HealthCheck {
        name: name.to_owned(),
        selector: Selector {
            match_labels: BTreeMap::new(),
            role: Some(role),
        },
        unhealthy_conditions: vec![cond(ConditionStatus::False), cond(ConditionStatus::Unknown)],
        max_unhealthy: None,
        node_startup_timeout: None,
        agent_heartbeat_timeout: None,
    }
}

/// Control-plane check (default maxUnhealthy 1) and worker check (default 100%).
pub(crate) fn policy() -> Policy {
    Policy {
        health_checks: vec![
            ready_check("control-plane", Role::ControlPlane),
            ready_check("workers", Role::Worker),
        ],
        remediation: metalguard_api::policy::RemediationSettings::default(),
    }
}

/// Marks a host NotReady since `since` (agent silent, etcd member unhealthy).
pub(crate) fn break_host(h: &mut Host, since: Timestamp) {
    if let Some(n) = h.node.as_mut() {
        n.conditions = vec![NodeCondition {
            type_: "Ready".into(),
            status: ConditionStatus::False,
            last_transition: since,
        }];
    }
    if let Some(a) = h.agent.as_mut() {
        a.last_heartbeat = since;
    }
    if let Some(m) = h.etcd.as_mut() {
        m.healthy = false;
    }
}

/// Finds a host by name.
pub(crate) fn find<'a>(s: &'a mut Snapshot, name: &str) -> &'a mut Host {
    s.hosts.iter_mut().find(|h| h.name == name).unwrap()
}

/// A remediation record of `target` (sequence `seq`) in `phase`, driven by `executor`,
/// started and in its phase for ten minutes.
pub(crate) fn remediation(
    target: &str,
    seq: u32,
    phase: metalguard_api::remediation::RemediationPhase,
    executor: &str,
    control_plane: bool,
) -> metalguard_api::remediation::Remediation {
    metalguard_api::remediation::Remediation {
        id: metalguard_api::remediation::remediation_id(target, seq),
        target: target.to_owned(),
        seq,
        attempt: 1,
        executor: executor.to_owned(),
        strategy: metalguard_api::policy::Strategy::ExternalBaremetal,
        node_handling: metalguard_api::policy::NodeHandling::Delete,
        phase,
        started_at: Timestamp(NOW.0 - 600_000),
        phase_since: Timestamp(NOW.0 - 600_000),
        control_plane,
        cause: "test".to_owned(),
        forced: None,
        cancel_requested: None,
        backup: None,
        powered_on_at: None,
        stay_off: false,
        boot_before: None,
    }
}

/// A break-glass hold of `target` by `by`.
pub(crate) fn hold(target: &str, by: &str) -> metalguard_api::snapshot::Hold {
    metalguard_api::snapshot::Hold {
        id: format!("cp-1/{}", NOW.0 - 60_000),
        target: target.to_owned(),
        since: Timestamp(NOW.0 - 60_000),
        by: by.to_owned(),
        reason: "disk replacement".to_owned(),
        action: "off".to_owned(),
    }
}
