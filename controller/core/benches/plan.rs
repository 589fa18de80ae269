//! Plans a cluster of 5 control-plane hosts and 5,000 (then 20,000) workers with 2% of workers
//! unhealthy (target: median under 5 ms at 5,000; at 20,000, no more than 4 times that). Run
//! with `cargo bench -p metalguard-core`.

#![allow(missing_docs, clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::hint::black_box;
use std::time::Duration;

use criterion::{Criterion, criterion_group, criterion_main};
use metalguard_api::duration::Timestamp;
use metalguard_api::policy::{
    HealthCheck, MaxUnhealthy, Policy, RemediationSettings, Selector, UnhealthyCondition,
};
use metalguard_api::snapshot::{
    AgentReport, ConditionStatus, ControlPlaneSpec, EtcdMember, Host, NodeCondition, NodeStatus,
    QUORUM_HOOK, Role, Snapshot,
};

const NOW: Timestamp = Timestamp(1_000_000_000);

fn host(name: String, role: Role, domain: &str, ready: bool) -> Host {
    let status = if ready {
        ConditionStatus::True
    } else {
        ConditionStatus::False
    };
    let mut labels = BTreeMap::new();
    labels.insert("pool".to_owned(), "main".to_owned());
    Host {
        name,
        role,
        failure_domain: Some(domain.to_owned()),
        created_at: Timestamp(0),
        labels,
        annotations: BTreeMap::new(),
        externally_provisioned: false,
        bmc_configured: true,
        up_to_date: true,
        deletion_requested_at: None,
        pre_drain_hooks: BTreeSet::new(),
        fence_request: None,
        retirement: None,
        phase_failed: false,
        node: Some(NodeStatus {
            created_at: Timestamp(0),
            conditions: vec![NodeCondition {
                type_: "Ready".into(),
                status,
                last_transition: Timestamp(NOW.0 - 3_600_000),
            }],
            labels: BTreeMap::new(),
            annotations: BTreeMap::new(),
            out_of_service: false,
        }),
        node_seen: true,
        agent: ready.then_some(AgentReport {
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

fn snapshot(workers: usize) -> Snapshot {
    let domains = ["a", "b", "c"];
    let mut hosts = Vec::new();
    for i in 0..5u64 {
        let mut h = host(
            format!("cp-{i}"),
            Role::ControlPlane,
            domains[i as usize % 3],
            true,
        );
        h.etcd = Some(EtcdMember {
            id: i + 1,
            name: format!("cp-{i}"),
            learner: false,
            healthy: true,
            leader: i == 0,
            progress_permille: 1000,
        });
        h.pre_drain_hooks.insert(QUORUM_HOOK.to_owned());
        hosts.push(h);
    }
    for i in 0..workers {
        // Every 50th worker is unhealthy: 2%.
        hosts.push(host(
            format!("worker-{i:05}"),
            Role::Worker,
            domains[i % 3],
            i % 50 != 7,
        ));
    }
    Snapshot {
        observed_at: NOW,
        control_plane: ControlPlaneSpec {
            desired_replicas: 5,
            failure_domains: domains.iter().map(|d| (*d).to_owned()).collect(),
        },
        hosts,
        orphan_members: Vec::new(),
        remediations: Vec::new(),
    }
}

fn policy() -> Policy {
    let check = |name: &str, role: Role, max: Option<MaxUnhealthy>| HealthCheck {
        name: name.to_owned(),
        selector: Selector {
            match_labels: [("pool".to_owned(), "main".to_owned())]
                .into_iter()
                .collect(),
            role: Some(role),
        },
        unhealthy_conditions: [ConditionStatus::False, ConditionStatus::Unknown]
            .into_iter()
            .map(|status| UnhealthyCondition {
                type_: "Ready".into(),
                status,
                timeout: Duration::from_secs(300),
            })
            .collect(),
        max_unhealthy: max,
        node_startup_timeout: None,
        agent_heartbeat_timeout: Some(Duration::from_secs(120)),
    };
    Policy {
        health_checks: vec![
            check("control-plane", Role::ControlPlane, None),
            check(
                "workers",
                Role::Worker,
                Some(MaxUnhealthy::Text("40%".into())),
            ),
        ],
        remediation: RemediationSettings {
            max_concurrent: 10,
            ..RemediationSettings::default()
        },
    }
}

fn bench(c: &mut Criterion) {
    let pol = policy();
    for workers in [5_000, 20_000] {
        let snap = snapshot(workers);
        let plan = metalguard_core::plan(&snap, &pol, NOW);
        assert_eq!(plan.health[1].unhealthy.len(), workers / 50);
        assert_eq!(plan.actions.len(), 10, "{plan}");
        c.bench_function(
            &format!("plan 5 control-plane + {workers} workers, 2% unhealthy"),
            |b| {
                b.iter(|| metalguard_core::plan(black_box(&snap), black_box(&pol), black_box(NOW)));
            },
        );
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
