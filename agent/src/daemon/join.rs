//! The join go-ahead: runs this host's [`JoinFlow`] (from `[etcd.join]`) until the learner
//! has caught up (promotable) or is already a voter, and records every step in the timeline.
//!
//! The flow is kept for the life of the daemon, because the exec launcher's supervisor lives
//! in it, and runs one go-ahead at a time. Its persisted state makes a go-ahead resumable: one
//! after a failed go-ahead, or after an agent restart, continues from the recorded step; one
//! whose member is already promotable or a voter (and answers) succeeds at once. Promotion is
//! the controller's: the daemon never promotes by itself.

use std::time::{Duration, Instant};

use metalguard_api::protocol::TimelineDirection;
use metalguard_etcd::join::state::JoinState;
use metalguard_etcd::join::{self, JoinFlow, StepOutcome};
use metalguard_etcd::observe::observe;
use metalguard_etcd::view::MemberView;

use super::execute::{Run, Timeline, error_chain};
use crate::etcd_join::JoinSetup;

/// Wait before retrying a step that failed transiently (etcd busy, an election, a member
/// that just (re)connected).
const JOIN_RETRY: Duration = Duration::from_secs(1);

/// Runs go-aheads for this host's join, one at a time.
#[derive(Debug)]
pub struct Joiner {
    setup: JoinSetup,
    timeout: Duration,
    flow: tokio::sync::Mutex<Option<JoinFlow>>,
}

impl Joiner {
    /// A joiner for `setup`; one go-ahead fails after `timeout`.
    pub fn new(setup: JoinSetup, timeout: Duration) -> Self {
        Self {
            setup,
            timeout,
            flow: tokio::sync::Mutex::new(None),
        }
    }

    /// Stops the local etcd if this joiner's launcher runs it (tests: the exec child outlives
    /// the flow on purpose).
    #[cfg(test)]
    pub async fn stop_etcd(&self) {
        if let Some(flow) = self.flow.lock().await.as_mut() {
            let _ = flow.launcher_mut().stop().await;
        }
    }

    /// Carries out one go-ahead.
    pub async fn go_ahead(&self) -> Run {
        let mut timeline = Timeline::start();
        let mut slot = self.flow.lock().await;
        let mut flow = match slot.take() {
            Some(flow) => flow,
            None => match JoinFlow::load(self.setup.config.clone(), self.setup.launcher()) {
                Ok(flow) => flow,
                Err(err) => {
                    return timeline.failed(format!(
                        "etcd join of {} could not load its state: {}",
                        self.setup.config.name,
                        error_chain(&err)
                    ));
                }
            },
        };
        let result = self.drive(&mut flow, &mut timeline).await;
        *slot = Some(flow);
        match result {
            Ok(()) => timeline.succeeded(),
            Err(error) => timeline.failed(error),
        }
    }

    async fn drive(&self, flow: &mut JoinFlow, timeline: &mut Timeline) -> Result<(), String> {
        let name = &self.setup.config.name;
        timeline.push(
            TimelineDirection::Note,
            format!(
                "join of {name} (peer url {}) with the {} launcher, from step {}",
                self.setup.config.peer_url,
                self.setup.launcher.kind().name(),
                flow.state().name()
            ),
        );
        if let Some(done) = self.already_done(flow.state()).await {
            timeline.push(TimelineDirection::Seen, done);
            return Ok(());
        }
        let began = Instant::now();
        let mut etcd_started: Option<Instant> = None;
        let mut last_retry: Option<String> = None;
        loop {
            if began.elapsed() >= self.timeout {
                return Err(format!(
                    "etcd join of {name} did not reach promotable within {:?}; it stopped in step {} (a new go-ahead resumes from there)",
                    self.timeout,
                    flow.state().name()
                ));
            }
            match Box::pin(flow.step()).await {
                Ok(StepOutcome::Advanced(state)) => {
                    if matches!(state, JoinState::Started { .. }) {
                        etcd_started = Some(Instant::now());
                    }
                    let caught_up_after = etcd_started.unwrap_or(began).elapsed();
                    let found = flow.found_learner();
                    timeline.push(
                        TimelineDirection::Seen,
                        self.describe(&state, caught_up_after, etcd_started.is_some(), found),
                    );
                    if matches!(
                        state,
                        JoinState::Promotable { .. } | JoinState::Member { .. }
                    ) {
                        return Ok(());
                    }
                }
                Ok(StepOutcome::Done) => return Ok(()),
                Ok(StepOutcome::Waiting(_))
                    if matches!(
                        flow.state(),
                        JoinState::Promotable { .. } | JoinState::Member { .. }
                    ) =>
                {
                    timeline.push(
                        TimelineDirection::Seen,
                        format!(
                            "member {:x} is {} and its etcd was started again",
                            flow.state().member_id().unwrap_or(0),
                            flow.state().name()
                        ),
                    );
                    return Ok(());
                }
                Ok(StepOutcome::Waiting(verdict)) => {
                    if let Some(v) = verdict.filter(|v| v.stalled) {
                        return Err(format!(
                            "learner {:x} of {name} made no catch-up progress for {:?} ({} entries behind the leader); it stays added and its etcd keeps running: a new go-ahead resumes, or remove the learner",
                            flow.state().member_id().unwrap_or(0),
                            v.since_progress,
                            v.lag
                                .map_or_else(|| "unknown".to_owned(), |l| l.to_string())
                        ));
                    }
                    tokio::time::sleep(self.setup.config.poll_interval).await;
                }
                Err(err) if join::is_retryable(&err) => {
                    let message = error_chain(&err);
                    if last_retry.as_ref() != Some(&message) {
                        timeline.push(
                            TimelineDirection::Seen,
                            format!("step {} failed, retrying: {message}", flow.state().name()),
                        );
                        last_retry = Some(message);
                    }
                    tokio::time::sleep(JOIN_RETRY).await;
                }
                Err(err) => {
                    return Err(format!(
                        "etcd join of {name} failed in step {}: {}",
                        flow.state().name(),
                        error_chain(&err)
                    ));
                }
            }
        }
    }

    /// A recorded promotable or voting member that the cluster still lists and that answers
    /// our probe: nothing to do.
    async fn already_done(&self, state: &JoinState) -> Option<String> {
        if !matches!(
            state,
            JoinState::Promotable { .. } | JoinState::Member { .. }
        ) {
            return None;
        }
        let id = state.member_id()?;
        let view = observe(&self.setup.config.client).await.ok()?;
        let member = view.member(id).filter(|m| MemberView::reachable(m))?;
        Some(if member.is_learner {
            format!("learner {id:x} already caught up (promotable); waiting for promotion")
        } else {
            format!("member {id:x} is already a voter")
        })
    }

    fn describe(
        &self,
        state: &JoinState,
        caught_up_after: Duration,
        since_start: bool,
        found: Option<u64>,
    ) -> String {
        let id = state.member_id().unwrap_or(0);
        match state {
            JoinState::Discover => "the member of this host was removed from the cluster: etcd stopped and its data dir wiped; joining again".to_owned(),
            JoinState::Added { .. } if found == Some(id) => format!(
                "learner {id:x} for peer url {} was already a member, not added by this agent (kubeadm's learner mode, a person, or an agent that died before recording its add): joining it, no second add",
                self.setup.config.peer_url
            ),
            JoinState::Added { .. } => format!(
                "learner {id:x} added for peer url {}",
                self.setup.config.peer_url
            ),
            JoinState::Started { .. } => format!(
                "local etcd started ({} launcher)",
                self.setup.launcher.kind().name()
            ),
            JoinState::Promotable { .. } => format!(
                "learner {id:x} caught up (promotable) {} ms after {}",
                caught_up_after.as_millis(),
                if since_start {
                    "its etcd started"
                } else {
                    "this go-ahead began"
                }
            ),
            JoinState::Member { .. } => format!("member {id:x} is a voter"),
        }
    }
}
