//! etcd membership actions carried out by agents: join a learner, promote it, move the
//! leadership, remove a member.
//!
//! Like fences, each attempt is an operation persisted before it is offered. A join goes to
//! the joining host's own agent (it adds its own learner from its configuration and succeeds
//! once the learner has caught up), and only while that agent reports. Every other change
//! goes to the agent of a healthy voter that reported recently — the raft leader's host when
//! it qualifies (promotion is decided by the leader), never the host of a member being
//! removed or losing the leadership. A failed attempt changes nothing (DOMAIN §1), so it is
//! retried under a new id (`ID/retry-N`, the agent executes each id at most once) after
//! [`RETRY_DELAY`], at most [`MAX_ATTEMPTS`] times.

use std::collections::BTreeMap;
use std::time::Duration;

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::{Action, ActionKind, OperationId};
use metalguard_api::protocol::Outcome;
use metalguard_api::snapshot::Snapshot;

use crate::backend::{OperationKind, State, StoredOperation, Write};

/// Wait between a failed attempt's creation and the next attempt.
pub const RETRY_DELAY: Duration = Duration::from_secs(2);
/// Attempts of one planned membership action before the executor gives up (and says so).
pub const MAX_ATTEMPTS: usize = 10;

/// What the executor does about one membership action now.
#[derive(Debug)]
pub enum Next {
    /// Not a membership action, already done, or an attempt is in flight or not due yet.
    Nothing,
    /// Start the next attempt with these writes.
    Start(Vec<Write>),
    /// It cannot start, for this reason (for logs and `status`).
    Waiting(String),
}

/// Who may carry out an action.
enum Executor<'a> {
    /// This host's own agent, if it reported recently.
    Own(&'a str),
    /// A healthy voter's agent, not on this host.
    Voter { exclude: Option<&'a str> },
}

/// The next step of a membership action.
pub fn next_for(action: &Action, state: &State, now: Timestamp, heartbeat: Duration) -> Next {
    let (kind, executor) = match &action.kind {
        ActionKind::AddLearner { host } => (OperationKind::EtcdJoin {}, Executor::Own(host)),
        ActionKind::PromoteLearner { member_id, .. } => (
            OperationKind::EtcdPromote {
                member_id: *member_id,
            },
            Executor::Voter { exclude: None },
        ),
        ActionKind::MoveLeader {
            from_member,
            to_member,
        } => (
            OperationKind::EtcdMoveLeader {
                to_member: *to_member,
            },
            Executor::Voter {
                exclude: host_of_member(state, *from_member),
            },
        ),
        ActionKind::RemoveMember { host, member_id } => (
            OperationKind::EtcdRemove {
                member_id: *member_id,
            },
            Executor::Voter {
                exclude: host.as_deref(),
            },
        ),
        _ => return Next::Nothing,
    };
    let retry_prefix = format!("{}/retry-", action.id);
    let attempts: Vec<&StoredOperation> = state
        .operations
        .values()
        .filter(|op| op.id == action.id || op.id.0.starts_with(&retry_prefix))
        .collect();
    if attempts.iter().any(|op| op.in_flight()) {
        return Next::Nothing;
    }
    let latest = attempts.iter().max_by_key(|op| op.created_at);
    if let Some(latest) = latest {
        let outcome = latest.result.as_ref().map(|r| r.outcome);
        if outcome == Some(Outcome::Succeeded) || now < latest.created_at.after(RETRY_DELAY) {
            return Next::Nothing;
        }
        if attempts.len() >= MAX_ATTEMPTS {
            let error = latest
                .result
                .as_ref()
                .and_then(|r| r.error.clone())
                .unwrap_or_default();
            return Next::Waiting(format!(
                "{} gave up after {} attempts (last: {error}); a person must look",
                action.id,
                attempts.len()
            ));
        }
    }
    let agent = match executor {
        Executor::Own(host) => match state.reports.get(host) {
            Some(stored) if stored.received_at.after(heartbeat) > now => host.to_owned(),
            Some(stored) => {
                return Next::Waiting(format!(
                    "{} waits for {host}'s agent, silent since {} (more than {})",
                    action.id,
                    stored.received_at,
                    metalguard_api::duration::format_duration(heartbeat)
                ));
            }
            None => {
                return Next::Waiting(format!(
                    "{} waits for {host}'s agent, which has never reported",
                    action.id
                ));
            }
        },
        Executor::Voter { exclude } => match choose_agent(state, exclude, now, heartbeat) {
            Some(agent) => agent,
            None => {
                return Next::Waiting(format!(
                    "{} waits: no healthy voter's agent{} reported within {}",
                    action.id,
                    exclude.map_or_else(String::new, |h| format!(" other than {h}'s")),
                    metalguard_api::duration::format_duration(heartbeat)
                ));
            }
        },
    };
    let id = if attempts.is_empty() {
        action.id.clone()
    } else {
        OperationId(format!("{retry_prefix}{}", attempts.len()))
    };
    Next::Start(vec![Write::CreateOperation(StoredOperation {
        id,
        agent,
        kind,
        remediation_id: None,
        step: None,
        created_at: now,
        requested_by: None,
        executed_by: None,
        result: None,
        term: 0,
    })])
}

/// The host whose agent reports `member` as its local member.
fn host_of_member(state: &State, member: u64) -> Option<&str> {
    state.reports.iter().find_map(|(host, stored)| {
        let view = stored.report.etcd.as_ref()?;
        (view.local_member_id == Some(member)).then_some(host.as_str())
    })
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

/// Every member of `snapshot` that a host claims, by member id: its host and whether it is a
/// learner.
pub fn members(snapshot: &Snapshot) -> BTreeMap<u64, (String, bool)> {
    snapshot
        .hosts
        .iter()
        .filter_map(|h| h.etcd.as_ref().map(|m| (m.id, (h.name.clone(), m.learner))))
        .collect()
}

/// What became of the learners seen at the previous round.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct LearnersSeen {
    /// Voters now, and no promotion operation of metalguard's promoted them nor found them
    /// promoted: someone outside metalguard did (`kubeadm join --control-plane` in its learner
    /// mode, a person with etcdctl), and nothing else records it. `(member id, host)`.
    pub promoted_outside: Vec<(u64, String)>,
    /// The learners to remember for the next round: today's, and yesterday's voters whose
    /// promotion operation has not reported yet (its result will say who promoted).
    pub still_watched: BTreeMap<u64, String>,
}

/// Compares the learners seen at the previous round (`before`) with the members now
/// (`now`, from [`members`]): a member that was a learner and now votes is recorded by a
/// finished promotion operation whose result says who promoted (`promoted_by`); without one
/// it was promoted outside metalguard. While a promotion operation for it is in flight it
/// stays watched (the result is on its way).
pub fn follow_learners(
    before: &BTreeMap<u64, String>,
    now: &BTreeMap<u64, (String, bool)>,
    state: &State,
) -> LearnersSeen {
    let mut seen = LearnersSeen {
        still_watched: now
            .iter()
            .filter(|(_, (_, learner))| *learner)
            .map(|(id, (host, _))| (*id, host.clone()))
            .collect(),
        ..LearnersSeen::default()
    };
    for (&id, host) in before {
        if now.get(&id).is_none_or(|(_, learner)| *learner) {
            continue;
        }
        let promotions: Vec<&StoredOperation> = state
            .operations
            .values()
            .filter(|op| op.kind == OperationKind::EtcdPromote { member_id: id })
            .collect();
        if promotions.iter().any(|op| op.in_flight()) {
            seen.still_watched.insert(id, host.clone());
        } else if !promotions
            .iter()
            .any(|op| op.result.as_ref().is_some_and(|r| r.promoted_by.is_some()))
        {
            seen.promoted_outside.push((id, host.clone()));
        }
    }
    seen
}

#[cfg(test)]
mod tests {
    use metalguard_api::protocol::{CommandResult, EtcdMemberView, EtcdView, PromotedBy};

    use super::*;

    const HB: Duration = Duration::from_secs(60);

    /// A promotion operation; `result` is `None` while in flight.
    fn promotion(member_id: u64, result: Option<(Outcome, Option<PromotedBy>)>) -> StoredOperation {
        let id = OperationId(format!("quorum/promote/{member_id:x}"));
        StoredOperation {
            id: id.clone(),
            agent: "cp-1".into(),
            kind: OperationKind::EtcdPromote { member_id },
            remediation_id: None,
            step: None,
            created_at: Timestamp(1),
            requested_by: None,
            executed_by: None,
            result: result.map(|(outcome, promoted_by)| CommandResult {
                operation_id: id,
                outcome,
                started_at: Timestamp(2),
                finished_at: Timestamp(3),
                timeline: vec![],
                error: None,
                promoted_by,
                term: 0,
            }),
            term: 0,
        }
    }

    #[test]
    fn a_learner_that_votes_without_a_promotion_that_says_who_was_promoted_outside() {
        let before: BTreeMap<u64, String> = [(4, "cp-4".to_owned()), (5, "cp-5".to_owned())].into();
        let now: BTreeMap<u64, (String, bool)> = [
            (1, ("cp-1".to_owned(), false)),
            (4, ("cp-4".to_owned(), false)),
            (5, ("cp-5".to_owned(), true)),
        ]
        .into();
        let mut state = State::default();
        // No promotion operation at all: kubeadm promoted it.
        let seen = follow_learners(&before, &now, &state);
        assert_eq!(seen.promoted_outside, [(4, "cp-4".to_owned())]);
        assert_eq!(seen.still_watched, [(5, "cp-5".to_owned())].into());
        // A failed attempt says nothing about who promoted: still outside.
        let failed = promotion(4, Some((Outcome::Failed, None)));
        state.operations.insert(failed.id.clone(), failed);
        assert_eq!(
            follow_learners(&before, &now, &state).promoted_outside,
            [(4, "cp-4".to_owned())]
        );
        // An attempt in flight: its result will say; keep watching.
        let mut state = State::default();
        let flying = promotion(4, None);
        state.operations.insert(flying.id.clone(), flying);
        let seen = follow_learners(&before, &now, &state);
        assert!(seen.promoted_outside.is_empty(), "{seen:?}");
        assert!(seen.still_watched.contains_key(&4), "{seen:?}");
        // A finished promotion that says who did it (either way) is the record.
        for by in [PromotedBy::Metalguard, PromotedBy::Outside] {
            let mut state = State::default();
            let done = promotion(4, Some((Outcome::Succeeded, Some(by))));
            state.operations.insert(done.id.clone(), done);
            let seen = follow_learners(&before, &now, &state);
            assert!(seen.promoted_outside.is_empty(), "{by:?}: {seen:?}");
            assert!(!seen.still_watched.contains_key(&4), "{seen:?}");
        }
        // A learner that went away (removed) is not a promotion.
        let gone: BTreeMap<u64, (String, bool)> = [(1, ("cp-1".to_owned(), false))].into();
        let seen = follow_learners(&before, &gone, &State::default());
        assert_eq!(seen, LearnersSeen::default());
    }

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
        let etcd = EtcdView {
            local_member_id: Some(local),
            leader_id: Some(leader),
            members,
        };
        state.reports.insert(
            host.to_owned(),
            crate::testkit::stored_report(host, at, Some(etcd)),
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

    fn created(next: Next) -> StoredOperation {
        match next {
            Next::Start(mut w) if w.len() == 1 && matches!(w[0], Write::CreateOperation(_)) => {
                let Some(Write::CreateOperation(op)) = w.pop() else {
                    unreachable!()
                };
                op
            }
            other => panic!("expected one created operation, got {other:?}"),
        }
    }

    fn nothing(next: &Next) -> bool {
        matches!(next, Next::Nothing)
    }

    #[test]
    fn a_promotion_goes_to_the_leaders_agent_and_a_removal_never_to_the_removed_host() {
        let state = lab();
        let op = created(next_for(&promote(), &state, Timestamp(100_500), HB));
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
        let op = created(next_for(&remove, &state, Timestamp(100_500), HB));
        assert_eq!(
            op.agent, "cp-1",
            "not the removed host, not an unhealthy or learner host"
        );
    }

    #[test]
    fn stale_reports_leave_no_agent_to_act() {
        let state = lab();
        let later = Timestamp(100_000).after(HB).after(Duration::from_millis(1));
        let next = next_for(&promote(), &state, later, HB);
        assert!(
            matches!(&next, Next::Waiting(why) if why.contains("no healthy voter's agent")),
            "{next:?}"
        );
    }

    #[test]
    fn a_failed_attempt_is_retried_under_a_new_id_after_the_delay_and_success_stops() {
        let mut state = lab();
        let first = created(next_for(&promote(), &state, Timestamp(100_500), HB));
        state.operations.insert(first.id.clone(), first.clone());
        assert!(
            nothing(&next_for(&promote(), &state, Timestamp(100_600), HB)),
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
            promoted_by: None,
            term: 0,
        });
        state.operations.insert(failed.id.clone(), failed.clone());
        assert!(
            nothing(&next_for(&promote(), &state, Timestamp(101_000), HB)),
            "too soon"
        );
        let retry = created(next_for(&promote(), &state, Timestamp(102_600), HB));
        assert_eq!(retry.id.0, "promote/cp-4/4/retry-1");
        let mut done = retry.clone();
        done.result = Some(CommandResult {
            operation_id: retry.id.clone(),
            outcome: Outcome::Succeeded,
            ..failed.result.clone().unwrap()
        });
        state.operations.insert(done.id.clone(), done);
        assert!(
            nothing(&next_for(&promote(), &state, Timestamp(110_000), HB)),
            "done"
        );
    }

    #[test]
    fn a_join_goes_to_the_joining_hosts_own_agent_only_while_it_reports() {
        let mut state = lab();
        let join = Action {
            id: OperationId("quorum/add-learner/cp-5".into()),
            kind: ActionKind::AddLearner {
                host: "cp-5".into(),
            },
            reason: "replacement".into(),
        };
        let next = next_for(&join, &state, Timestamp(100_500), HB);
        assert!(
            matches!(&next, Next::Waiting(why) if why.contains("cp-5's agent, which has never reported")),
            "{next:?}"
        );
        reporting(&mut state, "cp-5", 0, 2, 100_000);
        state.reports.get_mut("cp-5").unwrap().report.etcd = None;
        let op = created(next_for(&join, &state, Timestamp(100_500), HB));
        assert_eq!(
            (op.agent.as_str(), &op.id, &op.kind),
            ("cp-5", &join.id, &OperationKind::EtcdJoin {})
        );
        let later = Timestamp(100_000).after(HB).after(Duration::from_millis(1));
        let next = next_for(&join, &state, later, HB);
        assert!(
            matches!(&next, Next::Waiting(why) if why.contains("cp-5's agent, silent since")),
            "{next:?}"
        );
    }

    #[test]
    fn a_leadership_move_never_goes_to_the_leaders_own_agent() {
        let state = lab(); // cp-2 leads
        let mv = Action {
            id: OperationId("quorum/move-leader/2".into()),
            kind: ActionKind::MoveLeader {
                from_member: 2,
                to_member: 1,
            },
            reason: "cp-2 is retiring".into(),
        };
        let op = created(next_for(&mv, &state, Timestamp(100_500), HB));
        assert_eq!(op.agent, "cp-1", "the only other healthy voter");
        assert_eq!(op.kind, OperationKind::EtcdMoveLeader { to_member: 1 });
    }

    #[test]
    fn a_membership_change_that_keeps_failing_gives_up_and_says_so() {
        let mut state = lab();
        let mut at = 100_500;
        for _ in 0..MAX_ATTEMPTS {
            let mut op = created(next_for(&promote(), &state, Timestamp(at), HB));
            op.result = Some(CommandResult {
                operation_id: op.id.clone(),
                outcome: Outcome::Failed,
                started_at: Timestamp(0),
                finished_at: Timestamp(0),
                timeline: vec![],
                error: Some("not in sync".into()),
                promoted_by: None,
                term: 0,
            });
            state.operations.insert(op.id.clone(), op);
            at += 3_000;
            for r in state.reports.values_mut() {
                r.received_at = Timestamp(at);
            }
        }
        let next = next_for(&promote(), &state, Timestamp(at), HB);
        assert!(
            matches!(&next, Next::Waiting(why) if why.contains("gave up after 10 attempts (last: not in sync)")),
            "{next:?}"
        );
    }
}
