//! The executor: turns a plan into leader-guarded writes, intent first.
//!
//! A destructive action (a power-off or power-on) becomes a [`StoredOperation`] written in
//! the same transaction that moves its remediation forward, and only operations that are
//! persisted and still without a result are offered to agents ([`pending_commands`]). An
//! operation id is created once: re-planning after a restart finds it in the store and
//! re-offers the same command (the agent executes each id at most once) instead of creating
//! a second fence.

use std::collections::BTreeMap;

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::{Action, ActionKind, Plan, RemediationStep};
use metalguard_api::protocol::{
    Command, CommandKind, CommandResult, FenceCommand, Outcome, PowerAction, ResultAck,
};
use metalguard_api::remediation::{Remediation, RemediationPhase};
use metalguard_api::snapshot::QUORUM_HOOK;

use crate::backend::{OperationKind, State, StoredOperation, Write};
use crate::inventory::Inventory;

/// The writes of one action (applied as one atomic batch), or `None` when there is nothing
/// to do now (already done, waiting for a result, or not carried out by this backend).
pub fn writes_for(action: &Action, state: &State, now: Timestamp) -> Option<Vec<Write>> {
    match &action.kind {
        ActionKind::StartRemediation { remediation } => {
            if state.remediations.contains_key(&remediation.id) {
                return None;
            }
            let mut writes = vec![Write::PutRemediation(remediation.clone())];
            if state.fence_requests.contains_key(&remediation.target) {
                writes.push(Write::DeleteFenceRequest(remediation.target.clone()));
            }
            Some(writes)
        }
        ActionKind::Remediate {
            remediation_id,
            target,
            executor,
            step,
        } => {
            let remediation = state.remediations.get(remediation_id)?;
            remediate(action, remediation, target, executor, step, state, now)
        }
        ActionKind::AddQuorumHook { host } | ActionKind::RemoveQuorumHook { host } => {
            let mut hooks = state.hooks.get(host).cloned().unwrap_or_default();
            let changed = if matches!(action.kind, ActionKind::AddQuorumHook { .. }) {
                hooks.insert(QUORUM_HOOK.to_owned())
            } else {
                hooks.remove(QUORUM_HOOK)
            };
            changed.then(|| vec![Write::PutHooks(host.clone(), hooks)])
        }
        _ => None,
    }
}

fn advance(remediation: &Remediation, next: RemediationPhase, now: Timestamp) -> Option<Write> {
    let mut next_record = remediation.clone();
    match next_record.advance(next, now) {
        Ok(()) => Some(Write::PutRemediation(next_record)),
        Err(error) => {
            tracing::warn!(remediation = %remediation.id, %error, "illegal remediation transition planned");
            None
        }
    }
}

fn remediate(
    action: &Action,
    remediation: &Remediation,
    target: &str,
    executor: &str,
    step: &RemediationStep,
    state: &State,
    now: Timestamp,
) -> Option<Vec<Write>> {
    match step {
        RemediationStep::PowerOff | RemediationStep::PowerOn => {
            if state.operations.contains_key(&action.id)
                || state.operation_of(&remediation.id, step.name()).is_some()
            {
                return None;
            }
            let power = if *step == RemediationStep::PowerOff {
                PowerAction::Off
            } else {
                PowerAction::On
            };
            let op = StoredOperation {
                id: action.id.clone(),
                agent: executor.to_owned(),
                kind: OperationKind::Fence {
                    target: target.to_owned(),
                    action: power,
                },
                remediation_id: Some(remediation.id.clone()),
                step: Some(step.name().to_owned()),
                created_at: now,
                result: None,
            };
            let phase = advance(remediation, step.resulting_phase(), now)?;
            Some(vec![Write::CreateOperation(op), phase])
        }
        RemediationStep::VerifyPowerOff | RemediationStep::VerifyPowerOn => {
            let of = if *step == RemediationStep::VerifyPowerOff {
                RemediationStep::PowerOff.name()
            } else {
                RemediationStep::PowerOn.name()
            };
            let result = state.operation_of(&remediation.id, of)?.result.as_ref()?;
            let next = if result.outcome == Outcome::Succeeded {
                step.resulting_phase()
            } else {
                RemediationPhase::Failed {
                    reason: format!(
                        "{of} {}: {}",
                        result.outcome.name(),
                        result.error.as_deref().unwrap_or("no detail")
                    ),
                }
            };
            Some(vec![advance(remediation, next, now)?])
        }
        // Standalone has no Node objects: node steps complete at once; terminal steps record.
        _ => Some(vec![advance(remediation, step.resulting_phase(), now)?]),
    }
}

/// Every persisted operation without a result, as commands per agent host. Credentials are
/// read from the inventory's files now; an operation whose BMC cannot be described is left
/// out (and logged) rather than sent half-built.
pub fn pending_commands(inventory: &Inventory, state: &State) -> BTreeMap<String, Vec<Command>> {
    let mut pending: BTreeMap<String, Vec<Command>> = BTreeMap::new();
    for op in state.operations.values().filter(|op| op.in_flight()) {
        let kind = match &op.kind {
            OperationKind::Fence { target, action } => {
                let Some(bmc) = inventory.host(target).and_then(|h| h.bmc.as_ref()) else {
                    tracing::warn!(operation = %op.id, %target, "fence target has no bmc in the inventory");
                    continue;
                };
                let built = bmc
                    .credentials(target)
                    .and_then(|credentials| Ok((credentials, bmc.trust(target)?)));
                match built {
                    Ok((credentials, tls)) => CommandKind::Fence(FenceCommand {
                        target: target.clone(),
                        action: *action,
                        bmc_address: bmc.address.clone(),
                        tls,
                        credentials,
                    }),
                    Err(error) => {
                        tracing::warn!(operation = %op.id, %error, "fence command could not be built");
                        continue;
                    }
                }
            }
            OperationKind::EtcdPromote { member_id } => CommandKind::EtcdPromote {
                member_id: *member_id,
            },
            OperationKind::EtcdRemove { member_id } => CommandKind::EtcdRemove {
                member_id: *member_id,
            },
        };
        pending.entry(op.agent.clone()).or_default().push(Command {
            operation_id: op.id.clone(),
            issued_at: op.created_at,
            kind,
        });
    }
    pending
}

/// What to persist for a result from `host`, and the answer: `Ok((None, ack))` for a retry of
/// an already recorded result.
pub fn record_result(
    state: &State,
    host: &str,
    result: CommandResult,
) -> Result<(Option<Write>, ResultAck), String> {
    let Some(op) = state.operations.get(&result.operation_id) else {
        return Err(format!("operation {} is unknown", result.operation_id));
    };
    if op.agent != host {
        return Err(format!(
            "operation {} was sent to host {}, not {host}",
            op.id, op.agent
        ));
    }
    let ack = ResultAck {
        operation_id: op.id.clone(),
        first: op.result.is_none(),
    };
    if op.result.is_some() {
        return Ok((None, ack));
    }
    let mut done = op.clone();
    done.result = Some(result);
    Ok((Some(Write::PutOperation(done)), ack))
}

/// The actions of `plan` in order, for the loop.
pub fn actions(plan: &Plan) -> impl Iterator<Item = &Action> {
    plan.actions.iter()
}
