//! etcd membership actions carried out by agents: promote a learner, remove a member.
//!
//! Like fences, each attempt is an operation persisted before it is offered. The command goes
//! to the agent of a healthy voter that reported recently — the raft leader's host when it
//! qualifies (promotion is decided by the leader), never the host of a member being removed.
//! A failed promote changes nothing (DOMAIN §1), so a failed attempt is retried under a new id
//! (`ID/retry-N`, the agent executes each id at most once) after [`RETRY_DELAY`], at most
//! [`MAX_ATTEMPTS`] times. Learner adds and leader moves are not executed here yet.

use std::time::Duration;

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::{Action, ActionKind, OperationId};
use metalguard_api::protocol::Outcome;

use crate::backend::{OperationKind, State, StoredOperation, Write};

/// Wait between a failed attempt's creation and the next attempt.
pub const RETRY_DELAY: Duration = Duration::from_secs(2);
/// Attempts of one planned membership action before the executor gives up (and says so).
pub const MAX_ATTEMPTS: usize = 10;

/// The writes that start the next attempt of a membership action, if one is due.
pub fn writes_for(
    action: &Action,
    state: &State,
    now: Timestamp,
    heartbeat: Duration,
) -> Option<Vec<Write>> {
    let (kind, exclude) = match &action.kind {
        ActionKind::PromoteLearner { member_id, .. } => (
            OperationKind::EtcdPromote {
                member_id: *member_id,
            },
            None,
        ),
        ActionKind::RemoveMember { host, member_id } => (
            OperationKind::EtcdRemove {
                member_id: *member_id,
            },
            host.as_deref(),
        ),
        _ => return None,
    };
    let retry_prefix = format!("{}/retry-", action.id);
    let attempts: Vec<&StoredOperation> = state
        .operations
        .values()
        .filter(|op| op.id == action.id || op.id.0.starts_with(&retry_prefix))
        .collect();
    if attempts.iter().any(|op| op.in_flight()) {
        return None;
    }
    let latest = attempts.iter().max_by_key(|op| op.created_at);
    if let Some(latest) = latest {
        let outcome = latest.result.as_ref().map(|r| r.outcome);
        if outcome == Some(Outcome::Succeeded) || now < latest.created_at.after(RETRY_DELAY) {
            return None;
        }
        if attempts.len() >= MAX_ATTEMPTS {
            tracing::warn!(operation = %action.id, attempts = attempts.len(), "membership change gave up");
            return None;
        }
    }
    let Some(agent) = choose_agent(state, exclude, now, heartbeat) else {
        tracing::info!(operation = %action.id, "no healthy voter's agent can carry out the membership change");
        return None;
    };
    let id = if attempts.is_empty() {
        action.id.clone()
    } else {
        OperationId(format!("{retry_prefix}{}", attempts.len()))
    };
    Some(vec![Write::CreateOperation(StoredOperation {
        id,
        agent,
        kind,
        remediation_id: None,
        step: None,
        created_at: now,
        result: None,
    })])
}

/// A host whose agent reported within `heartbeat` and whose local member is a healthy voter;
/// the raft leader's host first, then by name.
fn choose_agent(
    state: &State,
    exclude: Option<&str>,
    now: Timestamp,
    heartbeat: Duration,
) -> Option<String> {
    let mut candidates: Vec<(bool, &str)> = state
        .reports
        .iter()
        .filter(|(host, _)| Some(host.as_str()) != exclude)
        .filter(|(_, stored)| stored.received_at.after(heartbeat) > now)
        .filter_map(|(host, stored)| {
            let view = stored.report.etcd.as_ref()?;
            let local = view.local_member_id?;
            let member = view.members.iter().find(|m| m.id == local)?;
            (member.healthy && !member.learner)
                .then_some((view.leader_id == Some(local), host.as_str()))
        })
        .collect();
    candidates.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(b.1)));
    candidates.first().map(|(_, host)| (*host).to_owned())
}

#[cfg(test)]
mod tests {
    use metalguard_api::protocol::{AgentReport, CommandResult, EtcdMemberView, EtcdView};

    use super::*;
    use crate::backend::StoredReport;

    const HB: Duration = Duration::from_secs(60);

    fn member(id: u64, learner: bool, healthy: bool) -> EtcdMemberView {
        EtcdMemberView {
            id,
            name: format!("cp-{id}"),
            peer_urls: vec![],
            client_urls: vec![],
            learner,
            healthy,
            alarms: vec![],
            raft_applied_index: None,
            error: None,
        }
    }

    fn reporting(state: &mut State, host: &str, local: u64, leader: u64, at: u64) {
        let members = vec![
            member(1, false, true),
            member(2, false, true),
            member(3, false, false),
            member(4, true, true),
        ];
        state.reports.insert(
            host.to_owned(),
            StoredReport {
                report: AgentReport {
                    host: host.to_owned(),
                    agent_version: "t".into(),
                    sequence: 1,
                    boot_id: String::new(),
                    sent_at: Timestamp(at),
                    conditions: vec![],
                    etcd: Some(EtcdView {
                        local_member_id: Some(local),
                        leader_id: Some(leader),
                        members,
                    }),
                    bmc_reachability: vec![],
                    unacknowledged_results: vec![],
                },
                received_at: Timestamp(at),
            },
        );
    }

    fn lab() -> State {
        let mut state = State::default();
        reporting(&mut state, "cp-1", 1, 2, 100_000);
        reporting(&mut state, "cp-2", 2, 2, 100_000);
        reporting(&mut state, "cp-3", 3, 2, 100_000); // its member is unhealthy
        reporting(&mut state, "cp-4", 4, 2, 100_000); // a learner
        state
    }

    fn promote() -> Action {
        Action {
            id: OperationId("promote/cp-4/4".into()),
            kind: ActionKind::PromoteLearner {
                host: "cp-4".into(),
                member_id: 4,
            },
            reason: "caught up".into(),
        }
    }

    fn created(writes: Option<Vec<Write>>) -> StoredOperation {
        match writes {
            Some(mut w) if w.len() == 1 && matches!(w[0], Write::CreateOperation(_)) => {
                let Some(Write::CreateOperation(op)) = w.pop() else {
                    unreachable!()
                };
                op
            }
            other => panic!("expected one created operation, got {other:?}"),
        }
    }

    #[test]
    fn a_promotion_goes_to_the_leaders_agent_and_a_removal_never_to_the_removed_host() {
        let state = lab();
        let op = created(writes_for(&promote(), &state, Timestamp(100_500), HB));
        assert_eq!((op.agent.as_str(), &op.id), ("cp-2", &promote().id));
        assert_eq!(op.kind, OperationKind::EtcdPromote { member_id: 4 });

        let remove = Action {
            id: OperationId("remove/2".into()),
            kind: ActionKind::RemoveMember {
                host: Some("cp-2".into()),
                member_id: 2,
            },
            reason: "replaced".into(),
        };
        let op = created(writes_for(&remove, &state, Timestamp(100_500), HB));
        assert_eq!(
            op.agent, "cp-1",
            "not the removed host, not an unhealthy or learner host"
        );
    }

    #[test]
    fn stale_reports_leave_no_agent_to_act() {
        let state = lab();
        let later = Timestamp(100_000).after(HB).after(Duration::from_millis(1));
        assert!(writes_for(&promote(), &state, later, HB).is_none());
    }

    #[test]
    fn a_failed_attempt_is_retried_under_a_new_id_after_the_delay_and_success_stops() {
        let mut state = lab();
        let first = created(writes_for(&promote(), &state, Timestamp(100_500), HB));
        state.operations.insert(first.id.clone(), first.clone());
        assert!(
            writes_for(&promote(), &state, Timestamp(100_600), HB).is_none(),
            "in flight"
        );
        let mut failed = first.clone();
        failed.result = Some(CommandResult {
            operation_id: first.id.clone(),
            outcome: Outcome::Failed,
            started_at: Timestamp(0),
            finished_at: Timestamp(0),
            timeline: vec![],
            error: Some("not in sync".into()),
        });
        state.operations.insert(failed.id.clone(), failed.clone());
        assert!(
            writes_for(&promote(), &state, Timestamp(101_000), HB).is_none(),
            "too soon"
        );
        let retry = created(writes_for(&promote(), &state, Timestamp(102_600), HB));
        assert_eq!(retry.id.0, "promote/cp-4/4/retry-1");
        let mut done = retry.clone();
        done.result = Some(CommandResult {
            operation_id: retry.id.clone(),
            outcome: Outcome::Succeeded,
            ..failed.result.clone().unwrap()
        });
        state.operations.insert(done.id.clone(), done);
        assert!(
            writes_for(&promote(), &state, Timestamp(110_000), HB).is_none(),
            "done"
        );
    }
}
