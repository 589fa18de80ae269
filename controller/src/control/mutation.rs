//! The controller's test-only switch (`metalguard_api::mutation`, debug builds only):
//! `withdraw-inherited`.
//!
//! A new leadership calls off every power cut an older leadership persisted that no agent
//! has answered: it records the operation as rejected ("withdrawn") before it offers
//! anything, so the remediation fails and is judged again (retried after its retry period
//! while the host is still unhealthy). That is not a bug by itself; a fencing token exists so
//! that a leader may change its predecessor's mind. It is what lets the soak show the agents'
//! term check (docs/design-soak.md, "The mutation check"): the predecessor's command, late in
//! the network, now names an operation nobody offers again, and only the term check stops it.

use metalguard_api::duration::Timestamp;
use metalguard_api::protocol::PowerAction;

use crate::backend::{OperationKind, State, StoredOperation, Write};

/// The switch's name in `METALGUARD_TEST_MUTATE`.
pub const WITHDRAW_INHERITED: &str = "withdraw-inherited";

/// Whether `op` is a power cut that a leadership older than `term` persisted and no agent
/// answered.
fn inherited_cut(op: &StoredOperation, term: u64) -> bool {
    op.in_flight()
        && op.term != 0
        && op.term < term
        && matches!(
            op.kind,
            OperationKind::Fence {
                action: PowerAction::Off | PowerAction::Reboot,
                ..
            }
        )
}

/// The writes that withdraw every inherited power cut in `state` when `switched` (the
/// switch, read by the caller), each logged at error level; empty otherwise.
pub fn withdrawals(state: &State, term: u64, now: Timestamp, switched: bool) -> Vec<Write> {
    if !switched {
        return Vec::new();
    }
    state
        .operations
        .values()
        .filter(|op| inherited_cut(op, term))
        .map(|op| {
            tracing::error!(
                operation = %op.id,
                persisted_in = op.term,
                term,
                "MUTATION: a power cut of an older leadership withdrawn ({}={WITHDRAW_INHERITED}; test builds only)",
                metalguard_api::mutation::VARIABLE
            );
            Write::PutOperation(crate::control::revalidate::withdrawn(
                op,
                &format!("withdrawn by leadership {term} (test mutation {WITHDRAW_INHERITED})"),
                (term, now),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use metalguard_api::plan::OperationId;
    use metalguard_api::protocol::Outcome;

    fn op(id: &str, term: u64, action: PowerAction) -> StoredOperation {
        StoredOperation {
            id: OperationId(id.to_owned()),
            agent: "cp-1".to_owned(),
            kind: OperationKind::Fence {
                target: "cp-2".to_owned(),
                action,
            },
            remediation_id: Some("r".to_owned()),
            step: Some("power-off".to_owned()),
            created_at: Timestamp(1),
            requested_by: None,
            executed_by: None,
            result: None,
            term,
        }
    }

    fn state(ops: Vec<StoredOperation>) -> State {
        let mut state = State::default();
        for op in ops {
            state.operations.insert(op.id.clone(), op);
        }
        state
    }

    #[test]
    fn withdraws_only_unanswered_power_cuts_of_older_leaderships_and_only_when_switched() {
        let mut answered = op("answered", 3, PowerAction::Off);
        answered.result = withdrawals(
            &state(vec![op("x", 3, PowerAction::Off)]),
            7,
            Timestamp(9),
            true,
        )
        .into_iter()
        .find_map(|w| match w {
            Write::PutOperation(op) => op.result,
            _ => None,
        });
        let all = state(vec![
            op("older-off", 3, PowerAction::Off),
            op("older-reboot", 3, PowerAction::Reboot),
            op("older-on", 3, PowerAction::On),
            op("current-off", 7, PowerAction::Off),
            op("before-terms", 0, PowerAction::Off),
            answered,
        ]);
        assert!(withdrawals(&all, 7, Timestamp(9), false).is_empty());
        let withdrawn: Vec<(String, Outcome, u64)> = withdrawals(&all, 7, Timestamp(9), true)
            .into_iter()
            .filter_map(|w| match w {
                Write::PutOperation(op) => {
                    let result = op.result?;
                    Some((op.id.0, result.outcome, result.term))
                }
                _ => None,
            })
            .collect();
        assert_eq!(
            withdrawn,
            vec![
                ("older-off".to_owned(), Outcome::Rejected, 7),
                ("older-reboot".to_owned(), Outcome::Rejected, 7),
            ]
        );
    }
}
