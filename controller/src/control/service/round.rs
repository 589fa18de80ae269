//! One round of the leader: load the state, build the snapshot, plan, and carry the plan out
//! through the executor (intent first), following learners and telling people what the
//! backend cannot do (the leader's notes).

use metalguard_api::protocol::PromotedBy;
use metalguard_api::remediation::RemediationPhase;

use super::Controller;
use super::gauges;
use super::report_store::overlay_latest;
use crate::backend::{Backend, ControllerNotes, Write};
use crate::clock::now;
use crate::control::executor;
use crate::control::membership::Next;
use crate::control::metrics::label;

/// How many hosts a round read or built again (issue 27: work proportional to what changed).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct RoundWork {
    /// Hosts the backend read again from its sources (`None`: it reads all every round).
    pub loaded: Option<usize>,
    /// Hosts whose snapshot entry was built again.
    pub built: usize,
    /// Hosts whose observed status was derived again (`None`: the backend observes none).
    pub observed: Option<usize>,
}

/// Most plan rounds run back to back after one trigger (each round that persisted something
/// is followed by another).
const MAX_ROUNDS: usize = 8;
/// The tracing target of the per-round timing line (`RUST_LOG=info,metalguard_rounds=debug`
/// turns it on; off, it costs one disabled-callsite check per round). The histogram
/// `round_duration_seconds` has buckets only; this line gives every round's own figures, so a
/// benchmark can take a real median (`benches/kube_scale.rs`).
pub(crate) const ROUNDS_TARGET: &str = "metalguard_rounds";

impl<B: Backend> Controller<B> {
    /// Plans and executes until a round changes nothing (bounded by [`MAX_ROUNDS`]), so chained
    /// steps — start a remediation, then power off — do not wait for the timer; then offers
    /// every in-flight operation to its agent.
    pub(crate) async fn plan_and_execute(&mut self) {
        for round in 0..MAX_ROUNDS {
            // A round blocked on a stalled store can outlast the leadership: no further round
            // then, until a campaign leads again (and restarts the agents' grace).
            if !self.hub.is_leader() {
                return;
            }
            // A chain yields to a campaign that is due: the leadership is read again on the
            // plan interval, and what the last read proved can end sooner than the hub's
            // grace (a Lease read in its last seconds). At 20,005 hosts a chain of rounds ran
            // 3.7 s without a campaign and its next guarded write was refused. The loop
            // campaigns and the chain goes on.
            if round > 0 && self.campaign_due() {
                return;
            }
            let load_started = tokio::time::Instant::now();
            let mut state = match self.backend.load().await {
                Ok(state) => state,
                Err(error) => {
                    tracing::warn!(error = %crate::error::chain(&error), "state could not be loaded");
                    return;
                }
            };
            overlay_latest(&mut state, &self.latest);
            self.note_state(&state);
            state.refresh_holds();
            self.hub.set_released_holds(state.released_hold_ids());
            self.metrics
                .held_hosts
                .set(i64::try_from(state.holds.len()).unwrap_or(i64::MAX));
            if self.record_reported_holds(&state).await {
                continue;
            }
            let round_started = tokio::time::Instant::now();
            let changed = self.execute_round(&state).await;
            let executed = round_started.elapsed();
            self.metrics.round_seconds.observe(executed.as_secs_f64());
            tracing::debug!(
                target: ROUNDS_TARGET,
                load_us = u64::try_from((round_started - load_started).as_micros()).unwrap_or(u64::MAX),
                execute_us = u64::try_from(executed.as_micros()).unwrap_or(u64::MAX),
                changed,
                "plan round"
            );
            if !changed {
                if self.hub.is_leader() {
                    let mut pending = executor::pending_commands(
                        &self.inventory,
                        &state,
                        self.hub.term(),
                        &self.credentials,
                    );
                    crate::control::revalidate::hold_back(&mut pending, &self.held_back);
                    self.hub.publish(&pending);
                    self.reseal(&state).await;
                }
                return;
            }
        }
    }

    /// Whether the plan interval has passed since the last campaign that led.
    fn campaign_due(&self) -> bool {
        self.renewed_at
            .is_some_and(|at| at.elapsed() >= self.inventory.controller.plan_interval)
    }

    /// Logs (and counts) every learner seen at the last round that votes now without a
    /// promotion operation that says who promoted it: kubeadm's learner mode or a person did,
    /// and metalguard's promotion gates did not decide it.
    pub(super) fn follow_learners(
        &mut self,
        snapshot: &metalguard_api::snapshot::Snapshot,
        state: &crate::backend::State,
    ) {
        let now = crate::control::membership::members(snapshot);
        let seen = crate::control::membership::follow_learners(&self.learners_seen, &now, state);
        for (member_id, host) in &seen.promoted_outside {
            tracing::warn!(
                member_id = %format!("{member_id:x}"),
                %host,
                promoted_by = PromotedBy::Outside.name(),
                "etcd learner promoted outside metalguard: its promotion gates did not decide it"
            );
            self.metrics.promotions_outside.inc();
        }
        self.learners_seen = seen.still_watched;
    }

    /// One plan over `state`; true when it persisted anything.
    pub(super) async fn execute_round(&mut self, state: &crate::backend::State) -> bool {
        let at = now();
        let withdrawn = crate::control::mutation::withdrawals(
            state,
            self.hub.term(),
            at,
            metalguard_api::mutation::switched(crate::control::mutation::WITHDRAW_INHERITED),
        );
        if !withdrawn.is_empty() {
            // Test builds only: nothing is offered before the withdrawal is persisted (a
            // failed write is tried again by the next round; none offers meanwhile).
            if let Err(error) = self.backend.apply(withdrawn).await {
                tracing::warn!(error = %crate::error::chain(&error), "withdrawal not persisted");
            }
            return true;
        }
        let started = tokio::time::Instant::now();
        let known_since = self.leader_since.unwrap_or(at);
        let hearing = self.hub.heard();
        let snapshot = self
            .snapshots
            .build(&self.inventory, state, (known_since, &hearing), at);
        let built = started.elapsed();
        let revalidation = crate::control::revalidate::revalidate(
            state,
            (&snapshot, &self.inventory.policy),
            (self.hub.term(), known_since),
            at,
        );
        if !revalidation.writes.is_empty() {
            // Nothing is offered before the withdrawal is persisted (a failed write is tried
            // again by the next round, which holds the power cut back meanwhile).
            if let Err(error) = self.backend.apply(revalidation.writes).await {
                tracing::warn!(error = %crate::error::chain(&error), "withdrawal not persisted");
            }
            self.snapshots.keep(snapshot);
            return true;
        }
        self.held_back = revalidation.held_back.keys().cloned().collect();
        let plan = metalguard_core::plan(&snapshot, &self.inventory.policy, at);
        let planned = started.elapsed();
        gauges::record(
            &self.metrics,
            &mut self.series,
            &self.inventory,
            (state, &snapshot, &plan),
            known_since,
            at,
        );
        self.follow_learners(&snapshot, state);
        self.grant_checks(&plan, state);
        let recorded = started.elapsed();
        self.backend
            .publish(crate::backend::Judged {
                state,
                snapshot: &snapshot,
                plan: &plan,
                policy: &self.inventory.policy,
            })
            .await;
        let published = started.elapsed();
        let micros = |d: std::time::Duration| u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        let visited = self.backend.hosts_visited();
        self.work = RoundWork {
            loaded: visited.loaded,
            built: self.snapshots.visited,
            observed: visited.observed,
        };
        tracing::debug!(
            target: ROUNDS_TARGET,
            snapshot_us = micros(built),
            plan_us = micros(planned.saturating_sub(built)),
            gauges_us = micros(recorded.saturating_sub(planned)),
            publish_us = micros(published.saturating_sub(recorded)),
            hosts = snapshot.hosts.len(),
            hosts_loaded = ?self.work.loaded,
            hosts_built = self.work.built,
            hosts_observed = ?self.work.observed,
            "round parts"
        );
        tracing::debug!(plan = %plan, "planned");
        let mut changed = false;
        let mut waiting: Vec<String> = revalidation.held_back.into_values().collect();
        // The executor judges again before it persists anything: the plan must still be
        // safe as a whole over the state it is carried out on.
        let mut judge = metalguard_core::judge::Judge::new(&snapshot, &self.inventory.policy, at);
        for action in executor::actions(&plan) {
            if let Some(why) = superseded(action, state, &self.hub) {
                tracing::info!(operation = %action.id, reason = %why, "action left to the next round");
                waiting.push(why);
                continue;
            }
            if let Err(violation) = judge.admit(action) {
                tracing::error!(operation = %action.id, rule = %violation.rule, reason = %violation.reason, "action rejected by the safety judgement at execution");
                continue;
            }
            let heartbeat = self.inventory.policy.remediation.executor_heartbeat_timeout;
            let writes = match executor::writes_for(action, state, at) {
                Some(writes) => Some(writes),
                None => match crate::control::membership::next_for(action, state, at, heartbeat) {
                    Next::Start(writes) => Some(writes),
                    Next::Nothing => None,
                    Next::Waiting(why) => {
                        waiting.push(why);
                        None
                    }
                },
            };
            let Some(mut writes) = writes else {
                continue;
            };
            // Every intent carries the term of the leadership that persisted it.
            let term = self.hub.term();
            for write in &mut writes {
                if let Write::CreateOperation(op) = write {
                    op.term = term;
                }
            }
            let creates = writes
                .iter()
                .any(|w| matches!(w, Write::CreateOperation(_)));
            let finished: Vec<&'static str> = writes
                .iter()
                .filter_map(|w| match w {
                    Write::PutRemediation(r)
                        if r.phase.is_terminal()
                            || matches!(r.phase, RemediationPhase::Failed { .. }) =>
                    {
                        Some(r.phase.name())
                    }
                    _ => None,
                })
                .collect();
            match self.backend.apply(writes).await {
                Ok(()) => {
                    changed = true;
                    for outcome in &finished {
                        self.metrics
                            .remediations_finished
                            .get_or_create(&label("outcome", outcome))
                            .inc();
                    }
                    if creates {
                        tracing::info!(operation = %action.id, reason = %action.reason, "intent persisted");
                    }
                }
                Err(error) => {
                    tracing::warn!(operation = %action.id, error = %crate::error::chain(&error), "action not persisted");
                    drop(judge);
                    self.snapshots.keep(snapshot);
                    return changed;
                }
            }
        }
        // Notes do not change the plan: no extra round for them.
        self.publish_notes(&plan, waiting, state).await;
        self.snapshots.keep(snapshot);
        changed
    }

    /// Persists (and logs) what people must know when it changed; true when it wrote.
    pub(super) async fn publish_notes(
        &mut self,
        plan: &metalguard_api::plan::Plan,
        waiting: Vec<String>,
        state: &crate::backend::State,
    ) -> bool {
        let notes = ControllerNotes {
            identity: self.identity.clone(),
            inventory_generation: self.file.as_ref().map_or(1, |f| f.generation),
            inventory_error: self.file.as_ref().and_then(|f| f.error.clone()),
            needs: crate::control::notes::needs(plan)
                .into_iter()
                .chain(crate::control::notes::control_plane_blocked(state, plan))
                .collect(),
            waiting,
        };
        let before = state.notes.clone().unwrap_or_default();
        if before == notes {
            return false;
        }
        for need in notes.needs.iter().filter(|n| !before.needs.contains(n)) {
            tracing::warn!(need = %need, "the controller needs a person");
        }
        for wait in notes.waiting.iter().filter(|w| !before.waiting.contains(w)) {
            tracing::info!(reason = %wait, "an action waits");
        }
        match self.backend.apply(vec![Write::PutNotes(notes)]).await {
            Ok(()) => true,
            Err(error) => {
                tracing::warn!(error = %crate::error::chain(&error), "notes not persisted");
                false
            }
        }
    }
}

/// Why `action`, a remediation's start or power-off, waits for the next round, if it does: its
/// target's agent has a report accepted by the agent API that this round's state does not
/// have yet (queued behind the round, or arrived while it ran). The decision may rest on what
/// that report supersedes: the 2-hour standalone soak fenced a healthy host on a report its
/// agent had replaced 3 s before the round. A hung host sends nothing, so nothing waits for it.
fn superseded(
    action: &metalguard_api::plan::Action,
    state: &crate::backend::State,
    hub: &crate::api::hub::Hub,
) -> Option<String> {
    use metalguard_api::plan::{ActionKind, RemediationStep};
    let target = match &action.kind {
        ActionKind::StartRemediation { remediation } => &remediation.target,
        ActionKind::Remediate {
            target,
            step: RemediationStep::PowerOff,
            ..
        } => target,
        _ => return None,
    };
    let handled = state.reports.get(target)?.received_at;
    hub.report_newer_than(target, handled).then(|| {
        format!("{target}: a newer report of its agent was accepted after this round's state was read; judged again next round")
    })
}

#[cfg(test)]
mod tests {
    use metalguard_api::duration::Timestamp;
    use metalguard_api::plan::{Action, ActionKind, OperationId, RemediationStep};

    use super::superseded;

    fn step(step: RemediationStep) -> Action {
        Action {
            id: OperationId("remediation/cp-2/1/x".into()),
            kind: ActionKind::Remediate {
                remediation_id: "remediation/cp-2/1".into(),
                target: "cp-2".into(),
                executor: "cp-1".into(),
                step,
            },
            reason: String::new(),
        }
    }

    #[test]
    fn a_power_off_waits_while_a_newer_report_of_its_target_is_on_its_way() {
        let (hub, _inbox) = crate::api::hub::Hub::new();
        let mut state = crate::backend::State::default();
        state.reports.insert(
            "cp-2".into(),
            crate::testkit::stored_report("cp-2", 10, None),
        );
        let off = step(RemediationStep::PowerOff);
        assert_eq!(superseded(&off, &state, &hub), None, "nothing newer");
        hub.report_accepted("cp-2", Timestamp(10));
        assert_eq!(
            superseded(&off, &state, &hub),
            None,
            "the one the round has"
        );
        hub.report_accepted("cp-2", Timestamp(11));
        assert!(
            superseded(&off, &state, &hub)
                .is_some_and(|why| why.starts_with("cp-2: a newer report")),
        );
        // Later steps go on: the power is already being cut or restored.
        assert_eq!(
            superseded(&step(RemediationStep::PowerOn), &state, &hub),
            None
        );
        // A host with no report (never heard, or silent) never waits.
        state.reports.clear();
        assert_eq!(superseded(&off, &state, &hub), None);
    }
}
