//! A fence request the planner refused is answered `Rejected`, with an `Accepted=False`
//! condition naming the kind of rule and its reason, so `metalguard-controller fence
//! --kubeconfig` (and `kubectl get fencerequests`) can say why nothing was done. Only
//! requests the round's state put before the planner are answered: one created after the
//! round loaded its state waits for the next round.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt as _;
use metalguard_api::k8s::FenceRequest;
use metalguard_api::k8s::fence::{FencePhase, FenceRequestStatus, TimelineEntry};
use metalguard_api::plan::{Plan, Refusal};

use super::{KubeBackend, record, world};
use crate::backend::State;

/// The verb of the remediation planner's refusals (`metalguard_core`'s `refuse`).
const REFUSED_REMEDIATING: &str = "remediating";

impl KubeBackend {
    /// The pending requests in `state` (one per target, the oldest): target → request name.
    pub(super) fn considered_fences(&self, state: &State) -> BTreeMap<String, String> {
        let mut requests: Vec<FenceRequest> = self
            .world
            .fences
            .state()
            .iter()
            .filter_map(|f| self.fence_request(&f.name_any()))
            .filter(world::pending_fence)
            .collect();
        requests.sort_by_key(|r| (r.creation_timestamp().map(|t| t.0), r.name_any()));
        let mut considered = BTreeMap::new();
        for request in requests {
            let target = &request.spec.target;
            let asked_at = request.creation_timestamp().as_ref().map(record::timestamp);
            let in_state = state
                .fence_requests
                .get(target)
                .is_some_and(|r| Some(r.requested_at) == asked_at);
            if in_state && !considered.contains_key(target) {
                considered.insert(target.clone(), request.name_any());
            }
        }
        considered
    }

    /// Answers `Rejected` every considered request whose target the plan refused to remediate.
    pub(super) async fn reject_refused_fences(&mut self, plan: &Plan) {
        let considered = std::mem::take(&mut self.considered_fences);
        for (target, name) in considered {
            let Some(refusal) = plan
                .refusals
                .iter()
                .find(|r| r.subject == target && r.refused == REFUSED_REMEDIATING)
            else {
                continue;
            };
            let status = rejected(&self.settings.identity, refusal, crate::clock::now());
            if let Err(error) = self.put_fence_status(&name, &status).await {
                tracing::warn!(request = %name, error = %crate::error::chain(&error), "fence request not answered; retried next round");
            }
        }
    }
}

/// The status of a request `refusal` refused, answered by `identity` at `now`.
fn rejected(
    identity: &str,
    refusal: &Refusal,
    now: metalguard_api::duration::Timestamp,
) -> FenceRequestStatus {
    let time = record::time(now);
    let message = format!("refused by {identity}: {}", refusal.reason);
    FenceRequestStatus {
        phase: Some(FencePhase::Rejected),
        remediation_id: None,
        remediation_phase: None,
        timeline: vec![TimelineEntry {
            time: time.clone(),
            phase: FencePhase::Rejected,
            remediation_phase: None,
            message: message.clone(),
        }],
        conditions: vec![Condition {
            type_: "Accepted".to_owned(),
            status: "False".to_owned(),
            reason: format!("{:?}", refusal.kind),
            message,
            last_transition_time: time,
            observed_generation: None,
        }],
    }
}

#[cfg(test)]
mod tests {
    use metalguard_api::duration::Timestamp;
    use metalguard_api::plan::ReasonKind;

    use super::*;

    #[test]
    fn a_refusal_becomes_rejected_with_the_rule_kind_and_reason() {
        let refusal = Refusal {
            refused: REFUSED_REMEDIATING.to_owned(),
            subject: "w-2".to_owned(),
            reason: "check workers short-circuited: 2 unhealthy > maxUnhealthy 1".to_owned(),
            kind: ReasonKind::ShortCircuit,
        };
        let status = rejected("controller-0", &refusal, Timestamp(1_000));
        assert_eq!(status.phase, Some(FencePhase::Rejected));
        let condition = &status.conditions[0];
        assert_eq!(
            (condition.type_.as_str(), condition.status.as_str()),
            ("Accepted", "False")
        );
        assert_eq!(condition.reason, "ShortCircuit");
        assert_eq!(
            condition.message,
            "refused by controller-0: check workers short-circuited: 2 unhealthy > maxUnhealthy 1"
        );
        assert_eq!(status.timeline.len(), 1);
    }
}
