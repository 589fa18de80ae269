//! The executor: turns a plan into leader-guarded writes, intent first.
//!
//! A destructive action (a power-off or power-on) becomes a [`StoredOperation`] written in
//! the same transaction that moves its remediation forward, and only operations that are
//! persisted and still without a result are offered to agents ([`pending_commands`]). An
//! operation id is created once: re-planning after a restart finds it in the store and
//! re-offers the same command (the agent executes each id at most once) instead of creating
//! a second fence.
//!
//! A retired host's power-off (`DecommissionHost`) takes the same path: one persisted fence
//! operation, id derived from the retirement request, offered to the agent the core chose.

use std::collections::BTreeMap;

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::{Action, ActionKind, Plan, RemediationStep};
use metalguard_api::protocol::{
    Command, CommandKind, CommandResult, FenceCommand, ForcedBy, Outcome, PowerAction, ResultAck,
};
use metalguard_api::remediation::{NodeBackup, Remediation, RemediationPhase};
use metalguard_api::snapshot::QUORUM_HOOK;

use crate::backend::{NodeWrite, OperationKind, State, StoredOperation, Write};
use crate::inventory::Inventory;

/// The step name of a retired host's power-off operation.
pub const DECOMMISSION_STEP: &str = "decommission";

/// The writes of one action (applied as one atomic batch), or `None` when there is nothing
/// to do now (already done, waiting for a result, or not carried out by this backend).
pub fn writes_for(action: &Action, state: &State, now: Timestamp) -> Option<Vec<Write>> {
    match &action.kind {
        ActionKind::StartRemediation { remediation } => {
            if state.remediations.contains_key(&remediation.id) {
                return None;
            }
            let mut writes = vec![Write::PutRemediation(remediation.clone())];
            if let Some(request) = state.fence_requests.get(&remediation.target) {
                writes.push(Write::DeleteFenceRequest(remediation.target.clone()));
                if let Some(nonce) = &request.nonce {
                    writes.push(Write::ConsumeFenceRequest(
                        crate::backend::ConsumedFenceRequest {
                            nonce: nonce.clone(),
                            host: remediation.target.clone(),
                            at: now,
                        },
                    ));
                }
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
        ActionKind::DecommissionHost { host, executor } => {
            if state.operations.contains_key(&action.id) {
                return None;
            }
            Some(vec![Write::CreateOperation(StoredOperation {
                id: action.id.clone(),
                agent: executor.clone(),
                kind: OperationKind::Fence {
                    target: host.clone(),
                    action: PowerAction::Off,
                },
                remediation_id: None,
                step: Some(DECOMMISSION_STEP.to_owned()),
                created_at: now,
                requested_by: state.retirements.get(host).map(|r| {
                    let who = r.requested_by.as_deref().unwrap_or("an administrator");
                    format!("retirement requested by {who}: {}", r.reason)
                }),
                executed_by: None,
                result: None,
                term: 0,
            })])
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
                requested_by: Some(remediation.cause.clone()),
                executed_by: None,
                result: None,
                term: 0,
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
        RemediationStep::BackupNodeMetadata
        | RemediationStep::DeleteNode
        | RemediationStep::TaintOutOfService
        | RemediationStep::RestoreNodeMetadata
            if state.nodes.is_some() =>
        {
            node_step(remediation, target, step, state, now)
        }
        // Standalone has no Node objects: node steps complete at once; terminal steps record.
        _ => Some(vec![advance(remediation, step.resulting_phase(), now)?]),
    }
}

/// A Node step of the Kubernetes backend: the Node request first, then the phase that records
/// it, so a restart in between repeats the (idempotent) request instead of skipping it.
/// The backup is taken from the Node as last seen, and persisted before the Node is touched.
fn node_step(
    remediation: &Remediation,
    target: &str,
    step: &RemediationStep,
    state: &State,
    now: Timestamp,
) -> Option<Vec<Write>> {
    let host = target.to_owned();
    let phase = advance(remediation, step.resulting_phase(), now)?;
    let node_write = match step {
        RemediationStep::BackupNodeMetadata => {
            let node = state.nodes.as_ref().and_then(|nodes| nodes.get(target));
            let Write::PutRemediation(mut record) = phase else {
                return None;
            };
            record.backup = Some(NodeBackup {
                labels: node.map(|n| n.labels.clone()).unwrap_or_default(),
                annotations: node.map(|n| n.annotations.clone()).unwrap_or_default(),
            });
            return Some(vec![Write::PutRemediation(record)]);
        }
        RemediationStep::DeleteNode => NodeWrite::Delete { host },
        RemediationStep::TaintOutOfService => NodeWrite::TaintOutOfService { host },
        _ => NodeWrite::Restore {
            host,
            backup: remediation.backup.clone().unwrap_or_default(),
        },
    };
    let phase = match phase {
        // The backup has done its work once merged back.
        Write::PutRemediation(mut record) if *step == RemediationStep::RestoreNodeMetadata => {
            record.backup = None;
            Write::PutRemediation(record)
        }
        other => other,
    };
    Some(vec![Write::Node(node_write), phase])
}

/// Why an in-flight operation is not offered now, if it is not:
/// - its agent or its fence target is not an inventory host, so no command (and no BMC
///   password) goes to a host nobody configured. Operations reach the [`State`] only if a
///   controller sealed them (the etcd backend) or wrote them into `GuardedHost` status (the
///   Kubernetes backend); this is the second check, against the inventory in force;
/// - a fence of a held host (the hold may have arrived after its intent was persisted, and a
///   person now owns its power), or a fence sent to an agent whose latest report still
///   carries a hold of the target that a person has released (it refuses power commands for
///   hosts it holds; it drops the record at its next report and reports again at once).
///   Offered again when that clears.
pub fn withheld(inventory: &Inventory, state: &State, op: &StoredOperation) -> Option<String> {
    if inventory.host(&op.agent).is_none() {
        return Some(format!("its agent {} is not in the inventory", op.agent));
    }
    let OperationKind::Fence { target, .. } = &op.kind else {
        return None;
    };
    if inventory.host(target).is_none() {
        return Some(format!("its fence target {target} is not in the inventory"));
    }
    if let Some(hold) = state.holds.get(target) {
        return Some(format!(
            "{target} is held (hold {} by {}): offered again once released",
            hold.id, hold.by
        ));
    }
    let still_carried = state
        .reports
        .get(&op.agent)
        .is_some_and(|r| r.report.holds.iter().any(|h| h.target == *target));
    still_carried.then(|| {
        format!(
            "{}'s agent still carries a released hold of {target}: offered once it reports without it",
            op.agent
        )
    })
}

/// Every persisted operation without a result, as commands per agent host. Credentials are
/// read from the inventory's files now (during a rotation a fence carries those in use,
/// `book`); an operation whose BMC cannot be described is left
/// out (and logged) rather than sent half-built. An operation [`withheld`] is left out too
/// (`status` says why).
///
/// Every command carries `term`, the leadership offering it. A fence carries what the
/// executing agent needs for its own quorum check: the target's etcd member as the target's
/// own agent last reported it, and, for a person's forced fence, who forced it and why; and
/// for its identity check, the identity the target's agent last reported.
pub fn pending_commands(
    inventory: &Inventory,
    state: &State,
    term: u64,
    book: &crate::control::credentials::CredentialBook,
) -> BTreeMap<String, Vec<Command>> {
    let mut pending: BTreeMap<String, Vec<Command>> = BTreeMap::new();
    for op in state.operations.values().filter(|op| op.in_flight()) {
        if let Some(why) = withheld(inventory, state, op) {
            tracing::debug!(operation = %op.id, reason = %why, "operation withheld");
            continue;
        }
        let kind = match &op.kind {
            OperationKind::Fence { target, action } => {
                let Some(bmc) = inventory.host(target).and_then(|h| h.bmc.as_ref()) else {
                    tracing::warn!(operation = %op.id, %target, "fence target has no bmc in the inventory");
                    continue;
                };
                // Read now, so an unreadable source still stops the fence; during a
                // rotation the credentials in use, until the new ones pass a check.
                let built = bmc
                    .credentials(target)
                    .map(|fresh| book.for_fence(target, &bmc.address, fresh))
                    .and_then(|credentials| Ok((credentials, bmc.trust(target)?)));
                match built {
                    Ok((credentials, tls)) => CommandKind::Fence(FenceCommand {
                        target: target.clone(),
                        action: *action,
                        bmc_address: bmc.address.clone(),
                        tls,
                        credentials,
                        etcd_member: reported_member(state, target),
                        forced: forced_by(state, op),
                        expected_identity: reported_identity(state, target).map(Box::new),
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
            OperationKind::EtcdJoin {} => CommandKind::EtcdJoinGoAhead {},
            OperationKind::EtcdMoveLeader { to_member } => CommandKind::EtcdMoveLeader {
                to_member: *to_member,
            },
        };
        pending.entry(op.agent.clone()).or_default().push(Command {
            operation_id: op.id.clone(),
            issued_at: op.created_at,
            kind,
            term,
        });
    }
    pending
}

/// The etcd member `host`'s own agent last reported as its local member.
fn reported_member(state: &State, host: &str) -> Option<u64> {
    state
        .reports
        .get(host)?
        .report
        .etcd
        .as_ref()?
        .local_member_id
}

/// The identity `host`'s own agent last reported (its firmware's UUID and serial number).
fn reported_identity(
    state: &State,
    host: &str,
) -> Option<metalguard_api::identity::SystemIdentity> {
    state.reports.get(host)?.report.host_identity.clone()
}

/// Who forced the fence `op` belongs to, and why: a forced remediation's recorded reason and
/// the requester recorded with the operation.
fn forced_by(state: &State, op: &StoredOperation) -> Option<ForcedBy> {
    let remediation = state.remediations.get(op.remediation_id.as_ref()?)?;
    let reason = remediation.forced.clone()?;
    Some(ForcedBy {
        by: op
            .requested_by
            .clone()
            .unwrap_or_else(|| "an administrator".to_owned()),
        reason,
    })
}

/// What to persist for a result from `host` (whose client certificate `certificate`
/// describes, recorded as who executed it), and the answer: `Ok((None, ack))` for a retry of
/// an already recorded result, and for an agent's refusal of a command offered by a
/// leadership older than `term` (the current one): nothing was done, and the current
/// leadership's offer of the same operation stands. A result of any other kind is a fact
/// about the hosts and is recorded whatever term offered its command.
pub fn record_result(
    state: &State,
    host: &str,
    certificate: &str,
    result: CommandResult,
    term: u64,
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
    if let Some(recorded) = &op.result {
        if recorded.outcome != result.outcome {
            // A withdrawn power cut carried out anyway by an agent that took it before the
            // withdrawal: the record stands, the host's silence is judged as any other.
            tracing::warn!(operation = %op.id, recorded = recorded.outcome.name(), reported = result.outcome.name(), "a result arrived for an operation already recorded otherwise; the record stands");
        }
        return Ok((None, ack));
    }
    if result.outcome == Outcome::Rejected && result.term != 0 && result.term < term {
        tracing::info!(operation = %op.id, offered = result.term, term, "an agent refused this operation as offered by an older leadership; the current offer stands");
        return Ok((
            None,
            ResultAck {
                first: false,
                ..ack
            },
        ));
    }
    let mut done = op.clone();
    done.result = Some(result);
    done.executed_by = Some(certificate.to_owned());
    Ok((Some(Write::PutOperation(done)), ack))
}

/// The actions of `plan` in order, for the loop.
pub fn actions(plan: &Plan) -> impl Iterator<Item = &Action> {
    plan.actions.iter()
}

#[cfg(test)]
#[path = "executor_tests.rs"]
mod tests;
