//! What people must be told: plan actions the standalone backend cannot carry out (it cannot
//! create or delete hosts) and how far each retirement has come.

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::{ActionKind, Plan};
use metalguard_api::protocol::Outcome;
use metalguard_api::snapshot::Retirement;

use crate::backend::State;
use crate::inventory::Inventory;

/// The plan's actions that only a person can carry out here, as instructions.
pub fn needs(plan: &Plan) -> Vec<String> {
    plan.actions
        .iter()
        .filter_map(|a| match &a.kind {
            ActionKind::RequestHost { failure_domain } => {
                let domain = failure_domain
                    .as_ref()
                    .map_or_else(String::new, |d| format!(" (failure domain {d})"));
                Some(format!(
                    "add a control-plane host to the inventory{domain}: {}",
                    a.reason
                ))
            }
            ActionKind::RequestHostDeletion { host } => Some(format!(
                "retire {host} (metalguard-controller retire {host} --reason ...): {}",
                a.reason
            )),
            ActionKind::Rebalance { host, .. } => Some(format!(
                "consider replacing {host} (proposal only): {}",
                a.reason
            )),
            _ => None,
        })
        .collect()
}

/// A line for people when a failed control-plane remediation holds the one-at-a-time slot
/// while other control-plane hosts wait behind it (`status`, under "needs a person").
pub fn control_plane_blocked(state: &State, plan: &Plan) -> Option<String> {
    let (failed, waiting) = crate::control::service::gauges::control_plane_blocked(state, plan)?;
    Some(format!(
        "failed control-plane remediation {} blocks every other control-plane remediation ({waiting} host(s) wait): one runs at a time until it is retried or a person acts; look at why it failed, then cancel it or fix the cause (docs/runbooks.md, MetalguardControlPlaneRemediationBlocked)",
        failed.join(", ")
    ))
}

/// How far the retirement of `host` has come, in one line.
pub fn retirement_progress(
    inventory: &Inventory,
    state: &State,
    host: &str,
    retirement: &Retirement,
    now: Timestamp,
) -> String {
    let id = metalguard_core::retire::decommission_id(host, retirement.requested_at);
    if let Some(op) = state.operations.get(&id) {
        return match &op.result {
            Some(r) if r.outcome == Outcome::Succeeded => format!(
                "powered off (verified by {}'s agent); remove {host} from the inventory",
                op.agent
            ),
            Some(r) => format!(
                "member removed; power-off through {}'s agent {}: {}; power it off by hand, then remove {host} from the inventory",
                op.agent,
                r.outcome.name(),
                r.error.as_deref().unwrap_or("no detail")
            ),
            None => format!("member removed; powering off through {}'s agent", op.agent),
        };
    }
    let snapshot = crate::control::snapshot::build(inventory, state, now, now);
    let Some(h) = snapshot.hosts.iter().find(|h| h.name == host) else {
        return format!("{host} is not in the inventory any more");
    };
    let voters = snapshot
        .hosts
        .iter()
        .filter_map(|h| h.etcd.as_ref())
        .filter(|m| m.is_voter())
        .count();
    let desired = snapshot.control_plane.desired_replicas as usize;
    match &h.etcd {
        Some(m) if m.is_voter() && voters > desired => format!(
            "replacement votes ({voters} voters, desired {desired}); removing member {:x}",
            m.id
        ),
        Some(m) => {
            let learning = snapshot
                .hosts
                .iter()
                .find(|o| o.name != host && o.etcd.as_ref().is_some_and(|e| e.learner))
                .map_or_else(String::new, |o| {
                    format!("; {} is joining as a learner", o.name)
                });
            format!(
                "retired: waiting for replacement (member {:x} stays until a replacement votes{learning})",
                m.id
            )
        }
        None if !h.pre_drain_hooks.is_empty() => {
            let hooks: Vec<&str> = h.pre_drain_hooks.iter().map(String::as_str).collect();
            format!(
                "member removed; waiting for hooks to be released: {}",
                hooks.join(", ")
            )
        }
        None => "member removed; waiting for power-off".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use metalguard_api::plan::{Action, OperationId};
    use metalguard_api::protocol::CommandResult;

    use super::*;

    fn action(kind: ActionKind) -> Action {
        Action {
            id: OperationId("x".into()),
            kind,
            reason: "2 hosts stay, desired 3 (replacement)".into(),
        }
    }

    #[test]
    fn a_failed_control_plane_remediation_that_blocks_the_others_is_said_and_counted() {
        use metalguard_api::plan::{ReasonKind, Refusal};
        use metalguard_api::remediation::{Remediation, RemediationPhase};
        // cp-1's remediation failed (its host then recovered, so it is never retried); cp-2
        // and cp-3 are unhealthy and refused: one control-plane remediation at a time.
        let failed = Remediation {
            control_plane: true,
            cause: "unhealthy".into(),
            ..crate::testkit::remediation(
                "cp-1",
                "cp-2",
                RemediationPhase::Failed {
                    reason: "bmc refused the password".into(),
                },
            )
        };
        let mut state = State::default();
        state.remediations.insert(failed.id.clone(), failed);
        let busy = |host: &str| {
            Refusal {
            refused: "remediating".into(),
            subject: host.into(),
            reason: "one control-plane remediation at a time (cp-1's is in progress or awaits its retry)".into(),
            kind: ReasonKind::ControlPlaneBusy,
        }
        };
        let plan = Plan {
            refusals: vec![busy("cp-2"), busy("cp-3")],
            ..Plan::default()
        };
        let line = control_plane_blocked(&state, &plan).unwrap();
        assert!(
            line.starts_with("failed control-plane remediation remediation/cp-1/1 blocks every other control-plane remediation (2 host(s) wait)"),
            "{line}"
        );
        let (blockers, waiting) =
            crate::control::service::gauges::control_plane_blocked(&state, &plan).unwrap();
        assert_eq!(
            (blockers, waiting),
            (vec!["remediation/cp-1/1".to_owned()], 2)
        );
        // Nothing waits: nothing to say.
        assert!(control_plane_blocked(&state, &Plan::default()).is_none());
    }

    #[test]
    fn host_requests_become_plain_instructions() {
        let plan = Plan {
            actions: vec![
                action(ActionKind::RequestHost {
                    failure_domain: Some("b".into()),
                }),
                action(ActionKind::AddQuorumHook {
                    host: "cp-1".into(),
                }),
            ],
            ..Plan::default()
        };
        assert_eq!(
            needs(&plan),
            [
                "add a control-plane host to the inventory (failure domain b): 2 hosts stay, desired 3 (replacement)"
            ]
        );
    }

    const INVENTORY: &str = r#"
[etcd]
endpoints = ["http://127.0.0.1:2379"]

[control_plane]
desired_replicas = 1

[[hosts]]
name = "cp-1"
role = "control-plane"
"#;

    #[test]
    fn progress_follows_member_hooks_and_power_off() {
        let inventory = Inventory::parse(std::path::Path::new("i.toml"), INVENTORY).unwrap();
        let retirement = Retirement {
            requested_at: Timestamp(5),
            requested_by: None,
            reason: "disk".into(),
        };
        let mut state = State::default();
        state.retirements.insert("cp-1".into(), retirement.clone());
        let line = |state: &State| {
            retirement_progress(&inventory, state, "cp-1", &retirement, Timestamp(10))
        };
        state.hooks.insert(
            "cp-1".into(),
            [metalguard_api::snapshot::QUORUM_HOOK.to_owned()].into(),
        );
        assert_eq!(
            line(&state),
            "member removed; waiting for hooks to be released: metalguard.io/etcd-quorum"
        );
        state.hooks.clear();
        assert_eq!(line(&state), "member removed; waiting for power-off");
        let mut op = crate::testkit::decommission_op("cp-1", "cp-2", Timestamp(5), Timestamp(6));
        let id = op.id.clone();
        state.operations.insert(id.clone(), op.clone());
        assert_eq!(
            line(&state),
            "member removed; powering off through cp-2's agent"
        );
        op.result = Some(CommandResult {
            operation_id: id.clone(),
            outcome: Outcome::Succeeded,
            started_at: Timestamp(7),
            finished_at: Timestamp(8),
            timeline: Vec::new(),
            error: None,
            promoted_by: None,
            term: 0,
        });
        state.operations.insert(id, op);
        assert_eq!(
            line(&state),
            "powered off (verified by cp-2's agent); remove cp-1 from the inventory"
        );
    }
}
