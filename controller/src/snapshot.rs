//! Builds the decision [`Snapshot`] of the standalone backend from the inventory and the
//! persisted state. There are no Node objects without Kubernetes: an agent's report stands in
//! for its Node (its conditions become Node conditions, its receive time the heartbeat).

use metalguard_api::duration::Timestamp;
use metalguard_api::protocol::EtcdView;
use metalguard_api::snapshot::{
    AgentReport, ConditionStatus, EtcdMember, Host, NodeCondition, NodeStatus, Snapshot,
};

/// The Node condition the core reads for readiness.
const READY: &str = "Ready";

use crate::backend::State;
use crate::inventory::Inventory;

/// The snapshot the core plans from. `known_since` (when this controller started leading)
/// stands for every host's creation time: a host whose agent has never reported is given the
/// health checks' node startup timeout from then, instead of being judged missing at once.
pub fn build(
    inventory: &Inventory,
    state: &State,
    known_since: Timestamp,
    now: Timestamp,
) -> Snapshot {
    let views: Vec<&EtcdView> = state
        .reports
        .values()
        .filter_map(|r| r.report.etcd.as_ref())
        .collect();
    let hosts = inventory
        .hosts
        .iter()
        .map(|h| {
            let stored = state.reports.get(&h.name);
            Host {
                name: h.name.clone(),
                role: h.role,
                failure_domain: h.failure_domain.clone(),
                created_at: known_since,
                labels: h.labels.clone(),
                annotations: std::collections::BTreeMap::new(),
                externally_provisioned: true,
                bmc_configured: h.bmc.is_some(),
                up_to_date: true,
                deletion_requested_at: None,
                pre_drain_hooks: state.hooks.get(&h.name).cloned().unwrap_or_default(),
                fence_request: state.fence_requests.get(&h.name).cloned(),
                retirement: None,
                phase_failed: false,
                node: stored.map(|s| node_of(&s.report, known_since)),
                node_seen: stored.is_some(),
                agent: stored.map(|s| AgentReport {
                    last_heartbeat: s.received_at,
                    can_fence: true,
                }),
                etcd: member_of(&h.name, &views),
            }
        })
        .collect();
    Snapshot {
        observed_at: now,
        control_plane: inventory.control_plane.clone(),
        hosts,
        orphan_members: Vec::new(),
        remediations: state.remediations.values().cloned().collect(),
    }
}

/// The Node a report stands for: the report's conditions, plus a synthesized `Ready` (unless
/// the agent reports one) that is `True` when no reported condition is `False`, with the
/// latest transition among them.
fn node_of(report: &metalguard_api::protocol::AgentReport, known_since: Timestamp) -> NodeStatus {
    let mut conditions: Vec<NodeCondition> = report
        .conditions
        .iter()
        .map(|c| NodeCondition {
            type_: c.type_.clone(),
            status: c.status,
            last_transition: c.last_transition,
        })
        .collect();
    if !conditions.iter().any(|c| c.type_ == READY) {
        let failing = conditions
            .iter()
            .any(|c| c.status == ConditionStatus::False);
        conditions.push(NodeCondition {
            type_: READY.to_owned(),
            status: if failing {
                ConditionStatus::False
            } else {
                ConditionStatus::True
            },
            last_transition: conditions
                .iter()
                .map(|c| c.last_transition)
                .max()
                .unwrap_or(Timestamp(0)),
        });
    }
    NodeStatus {
        created_at: known_since,
        conditions,
        ..NodeStatus::default()
    }
}

/// The member named `host`, as the agents see it: healthy if any agent saw it healthy.
fn member_of(host: &str, views: &[&EtcdView]) -> Option<EtcdMember> {
    let mut found: Option<EtcdMember> = None;
    for view in views {
        let leader_index = view
            .members
            .iter()
            .find(|m| Some(m.id) == view.leader_id)
            .and_then(|m| m.raft_applied_index);
        for m in view.members.iter().filter(|m| m.name == host) {
            let progress = match (m.raft_applied_index, leader_index) {
                (Some(mine), Some(lead)) if lead > 0 => {
                    u16::try_from((mine.min(lead) * 1000) / lead).unwrap_or(1000)
                }
                _ => 0,
            };
            let seen = EtcdMember {
                id: m.id,
                name: m.name.clone(),
                learner: m.learner,
                healthy: m.healthy,
                leader: view.leader_id == Some(m.id),
                progress_permille: if m.learner { progress } else { 1000 },
            };
            found = Some(match found {
                Some(prev) => EtcdMember {
                    healthy: prev.healthy || seen.healthy,
                    leader: prev.leader || seen.leader,
                    progress_permille: prev.progress_permille.max(seen.progress_permille),
                    ..prev
                },
                None => seen,
            });
        }
    }
    found
}
