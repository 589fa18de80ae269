//! Re-validation of a power cut an older leadership decided (issue 24: "results are taken
//! only for the term that issued the command, or re-validated"; here the command itself).
//!
//! An operation persisted by an older leadership and answered by nobody is offered again by
//! the new one, under the new term, so the agents' term check cannot stop it. The 2-hour
//! standalone soak showed why it must not be offered as it is: a leader whose own paused
//! process held back its answers judged cp-4 silent and persisted its power-off, lost the
//! lease, and the next leader offered that power-off while cp-4 was reporting healthy to it.
//! So a power cut (off or reboot) of a health remediation, inherited from an older term, is
//! offered only once this leadership judges the target unhealthy itself
//! ([`metalguard_core::health::evidence_of`] on a snapshot that counts what it heard before
//! it began from when it began). Until then it is held back, and the leader's notes say so.
//! When the target's agent reports to this leadership and its report holds none of the
//! unhealthy conditions, the power cut is withdrawn: recorded as rejected with the reason,
//! and its remediation cancelled (its power was never touched; a new one starts if the host
//! fails again, as the same attempt).
//!
//! A person's decision is not second-guessed: a forced remediation, an administrator's fence
//! request and a retirement's power-off are offered as persisted.

use std::collections::{BTreeMap, BTreeSet};

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::OperationId;
use metalguard_api::policy::Policy;
use metalguard_api::protocol::{Command, CommandResult, Outcome, PowerAction};
use metalguard_api::remediation::RemediationPhase;
use metalguard_api::snapshot::Snapshot;
use metalguard_core::health::{Evidence, evidence_of};

use crate::backend::{OperationKind, State, StoredOperation, Write};

/// What this leadership does with the inherited power cuts of one round.
#[derive(Debug, Default)]
pub struct Revalidation {
    /// Withdrawals to persist before anything is offered.
    pub writes: Vec<Write>,
    /// Operations not offered this round, each with why.
    pub held_back: BTreeMap<OperationId, String>,
}

#[cfg(test)]
impl Revalidation {
    /// True when every inherited power cut is offered as persisted.
    pub fn offers_all(&self) -> bool {
        self.writes.is_empty() && self.held_back.is_empty()
    }
}

/// The target of `op` when it is a power cut of a health remediation persisted by a
/// leadership older than `term` (term 0: before terms) and still unanswered.
fn inherited_cut<'a>(state: &'a State, op: &'a StoredOperation, term: u64) -> Option<&'a str> {
    let OperationKind::Fence {
        target,
        action: PowerAction::Off | PowerAction::Reboot,
    } = &op.kind
    else {
        return None;
    };
    if !op.in_flight() || op.term >= term {
        return None;
    }
    let remediation = state.remediations.get(op.remediation_id.as_ref()?)?;
    let a_persons = remediation.forced.is_some()
        || metalguard_core::remediation::requested_by_a_person(&remediation.cause);
    (!a_persons).then_some(target.as_str())
}

/// Judges every inherited power cut of `state` for leadership `term`, which began at
/// `leader_since`, on this round's `snapshot`.
pub fn revalidate(
    state: &State,
    (snapshot, policy): (&Snapshot, &Policy),
    (term, leader_since): (u64, Timestamp),
    now: Timestamp,
) -> Revalidation {
    let mut out = Revalidation::default();
    for op in state.operations.values() {
        let Some(target) = inherited_cut(state, op, term) else {
            continue;
        };
        let heard_by_us = state
            .reports
            .get(target)
            .is_some_and(|r| r.received_at >= leader_since);
        // The executor may have carried it out while nobody led: its result waits in its
        // journal. Withdrawn only once the executor has reported to this leadership, seen
        // its term (it refuses the older offer from then on), and holds no result for it.
        let executor_clear = state.reports.get(&op.agent).is_some_and(|r| {
            r.received_at >= leader_since
                && r.report.seen_term >= term
                && !r.report.unacknowledged_results.contains(&op.id)
        });
        match evidence_of(policy, snapshot, target, now) {
            Evidence::Unhealthy(why) => {
                tracing::debug!(operation = %op.id, %target, %why, persisted_in = op.term, term, "inherited power cut re-validated: offered");
            }
            Evidence::Healthy if heard_by_us && executor_clear => {
                let why = format!(
                    "withdrawn by leadership {term}: {target}'s agent reported healthy to it after leadership {} decided this power cut, which nobody answered",
                    op.term
                );
                tracing::warn!(operation = %op.id, %target, persisted_in = op.term, term, "inherited power cut withdrawn: its target reported healthy to this leadership");
                out.writes.extend(withdrawal(state, op, &why, (term, now)));
            }
            _ => {
                out.held_back.insert(
                    op.id.clone(),
                    format!(
                        "{}: power cut of {target} decided by leadership {}; offered once leadership {term} judges {target} unhealthy itself, withdrawn if its agent reports healthy",
                        op.id, op.term
                    ),
                );
            }
        }
    }
    out
}

/// `op` recorded as rejected by leadership `term` at `now`, with `why`: nothing was done.
pub fn withdrawn(
    op: &StoredOperation,
    why: &str,
    (term, now): (u64, Timestamp),
) -> StoredOperation {
    let mut withdrawn = op.clone();
    withdrawn.result = Some(CommandResult {
        operation_id: op.id.clone(),
        outcome: Outcome::Rejected,
        started_at: now,
        finished_at: now,
        timeline: Vec::new(),
        error: Some(why.to_owned()),
        promoted_by: None,
        term,
    });
    withdrawn
}

/// The operation recorded as rejected with `why`, and its remediation cancelled.
fn withdrawal(
    state: &State,
    op: &StoredOperation,
    why: &str,
    (term, now): (u64, Timestamp),
) -> Vec<Write> {
    let mut writes = vec![Write::PutOperation(withdrawn(op, why, (term, now)))];
    let remediation = op
        .remediation_id
        .as_ref()
        .and_then(|id| state.remediations.get(id));
    if let Some(r) = remediation.filter(|r| r.phase == RemediationPhase::PoweringOff) {
        let mut cancelled = r.clone();
        match cancelled.advance(
            RemediationPhase::Cancelled {
                reason: why.to_owned(),
            },
            now,
        ) {
            Ok(()) => writes.push(Write::PutRemediation(cancelled)),
            Err(error) => {
                tracing::warn!(remediation = %r.id, %error, "remediation of a withdrawn power cut not cancelled");
            }
        }
    }
    writes
}

/// `pending` without the commands of `held_back`.
pub fn hold_back(pending: &mut BTreeMap<String, Vec<Command>>, held_back: &BTreeSet<OperationId>) {
    for commands in pending.values_mut() {
        commands.retain(|c| !held_back.contains(&c.operation_id));
    }
    pending.retain(|_, commands| !commands.is_empty());
}

#[cfg(test)]
#[path = "revalidate_tests.rs"]
mod tests;
