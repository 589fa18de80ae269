//! A Node's `Ready` posted before its host's power-off was verified says nothing about the
//! host now. While a host is off nothing updates its Node: a node-lifecycle controller marks
//! it `Unknown` only after its grace period (40 s by default), and never when no controller
//! manager runs. A remediation that powers the host on again within that time would see the
//! old `Ready=True`, take the host for back, lift the out-of-service taint and finish while
//! it still boots (found on a real API server: the out-of-service test finished before its
//! kubelet came back). So, as the standalone backend drops agent reports received before the
//! verified power-off (`crate::control::snapshot`), a `Ready` whose `lastHeartbeatTime` predates the
//! verified power-off of an active remediation reads as `Unknown` until the kubelet posts
//! again; a Node registered after it (deleted and re-created) is fresh by construction.

use k8s_openapi::api::core::v1::Node;
use metalguard_api::duration::Timestamp;
use metalguard_api::snapshot::ConditionStatus;

use super::record;
use crate::backend::State;

/// When the `Ready` condition of `node` was last posted (its `lastHeartbeatTime`).
fn ready_heartbeat(node: &Node) -> Option<Timestamp> {
    node.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready")?
        .last_heartbeat_time
        .as_ref()
        .map(record::timestamp)
}

/// Turns every `Ready` of `state.nodes` that was posted before its host's verified power-off
/// into `Unknown` since that power-off. `node_of` gives each host's Node as watched.
pub fn discount_stale_ready<'a>(
    state: &mut State,
    node_of: impl Fn(&str) -> Option<std::sync::Arc<Node>> + 'a,
) {
    let Some(nodes) = &state.nodes else {
        return;
    };
    // Only a target of an active remediation has a verified power-off: those, not every Node.
    let targets: std::collections::BTreeSet<&String> = state
        .remediations
        .values()
        .filter(|r| r.phase.is_active())
        .map(|r| &r.target)
        .filter(|host| nodes.contains_key(*host))
        .collect();
    let outdated: Vec<(String, Timestamp)> = targets
        .into_iter()
        .filter_map(|host| {
            let off = crate::control::snapshot::verified_off_at(state, host)?;
            let posted = node_of(host).and_then(|n| ready_heartbeat(&n));
            posted
                .is_none_or(|at| at < off)
                .then(|| (host.clone(), off))
        })
        .collect();
    let Some(nodes) = state.nodes.as_mut() else {
        return;
    };
    for (host, off) in outdated {
        if let Some(node) = nodes.get_mut(&host) {
            for c in node.conditions.iter_mut().filter(|c| c.type_ == "Ready") {
                if c.status != ConditionStatus::Unknown {
                    c.status = ConditionStatus::Unknown;
                    c.last_transition = off;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use metalguard_api::plan::OperationId;
    use metalguard_api::policy::{NodeHandling, Strategy};
    use metalguard_api::protocol::{CommandResult, Outcome, PowerAction};
    use metalguard_api::remediation::{Remediation, RemediationPhase};
    use metalguard_api::snapshot::NodeStatus;
    use serde_json::json;

    use super::*;
    use crate::backend::{OperationKind, StoredOperation};

    const OFF: u64 = 1_700_000_100_000;

    fn node(heartbeat: &str) -> Node {
        serde_json::from_value(
            json!({"metadata": {"name": "w-2"}, "status": {"conditions": [
            {"type": "Ready", "status": "True", "lastHeartbeatTime": heartbeat,
             "lastTransitionTime": "2023-11-14T22:00:00Z"}]}}),
        )
        .unwrap()
    }

    fn state(phase: RemediationPhase) -> State {
        let r = Remediation {
            strategy: Strategy::ExternalBaremetal,
            node_handling: NodeHandling::OutOfServiceTaint,
            started_at: Timestamp(OFF - 10_000),
            phase_since: Timestamp(OFF),
            ..crate::testkit::remediation("w-2", "w-1", phase)
        };
        let op = StoredOperation {
            id: OperationId("remediation/w-2/1/power-off".into()),
            agent: "w-1".into(),
            kind: OperationKind::Fence {
                target: "w-2".into(),
                action: PowerAction::Off,
            },
            remediation_id: Some(r.id.clone()),
            step: Some("power-off".into()),
            created_at: Timestamp(OFF - 5_000),
            requested_by: None,
            executed_by: None,
            result: Some(CommandResult {
                operation_id: OperationId("remediation/w-2/1/power-off".into()),
                outcome: Outcome::Succeeded,
                started_at: Timestamp(OFF - 1_000),
                finished_at: Timestamp(OFF),
                timeline: Vec::new(),
                error: None,
                promoted_by: None,
                term: 0,
            }),
            term: 0,
        };
        let ready = crate::kube::world::node_status(&node("2023-11-14T22:13:00Z"));
        State {
            remediations: BTreeMap::from([(r.id.clone(), r)]),
            operations: BTreeMap::from([(op.id.clone(), op)]),
            nodes: Some(imbl::OrdMap::unit("w-2".to_owned(), ready)),
            ..State::default()
        }
    }

    fn ready_of(state: &State) -> (ConditionStatus, Timestamp) {
        let node: &NodeStatus = &state.nodes.as_ref().unwrap()["w-2"];
        let c = node.conditions.iter().find(|c| c.type_ == "Ready").unwrap();
        (c.status, c.last_transition)
    }

    #[test]
    fn a_ready_posted_before_the_verified_power_off_reads_unknown_until_posted_again() {
        // OFF is 2023-11-14T22:15:00Z: posted at 22:13, before it.
        let mut before = state(RemediationPhase::WaitingForNode);
        discount_stale_ready(&mut before, |_| {
            Some(std::sync::Arc::new(node("2023-11-14T22:13:00Z")))
        });
        assert_eq!(
            ready_of(&before),
            (ConditionStatus::Unknown, Timestamp(OFF))
        );
        // The kubelet posted after the host came back.
        let mut after = state(RemediationPhase::WaitingForNode);
        discount_stale_ready(&mut after, |_| {
            Some(std::sync::Arc::new(node("2023-11-14T22:16:00Z")))
        });
        assert_eq!(ready_of(&after).0, ConditionStatus::True);
    }

    #[test]
    fn a_finished_remediation_discounts_nothing() {
        let mut done = state(RemediationPhase::Done);
        discount_stale_ready(&mut done, |_| {
            Some(std::sync::Arc::new(node("2023-11-14T22:13:00Z")))
        });
        assert_eq!(ready_of(&done).0, ConditionStatus::True);
    }
}
