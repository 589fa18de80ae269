//! The host's learner join as an explicit state machine with persisted state.
//!
//! ```text
//! Discover ──gate, add learner──▶ Added ──start etcd (existing)──▶ Started
//!     ▲                                                              │ caught up
//!     │ member removed: stop etcd, wipe data dir                     ▼
//!     └──────────────── (from any state) ◀──────────────────── Promotable
//!                                                                    │ promoted (controller,
//!                                                                    ▼  or self in bootstrap)
//!                                                                  Member
//! ```
//!
//! Every transition is persisted (atomically) before the next begins, so an agent restarted
//! at any step resumes: the peer URL finds an earlier, unpersisted add; the pid file finds an
//! etcd left running. The data dir is wiped only when the recorded member ID is no longer in
//! the cluster.

pub mod launcher;
pub mod state;

use crate::catchup::{CatchUp, Sample, Verdict};
use crate::client::ClientSettings;
use crate::error::{EtcdError, EtcdErrorKind};
use crate::observe::observe;
use crate::ops::{self, PromoteRetry};
use crate::view::MemberView;
use launcher::{EtcdLaunch, LaunchError, Launcher};
use state::{Discovery, InitialClusterError, JoinState, Reconcile, StateFileError};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// Default interval between observations while waiting (catch-up, promotion).
pub const DEFAULT_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// This host's join configuration.
#[derive(Debug, Clone)]
pub struct JoinConfig {
    /// How to reach the cluster.
    pub client: ClientSettings,
    /// Member name.
    pub name: String,
    /// Advertised peer URL: the identity of this host's member.
    pub peer_url: String,
    /// Advertised client URL.
    pub client_url: String,
    /// Peer listen URL, when it differs from the peer URL.
    pub listen_peer_url: Option<String>,
    /// Client listen URL, when it differs from the client URL.
    pub listen_client_url: Option<String>,
    /// etcd's data directory.
    pub data_dir: PathBuf,
    /// Where the join's state is kept; `None` for `<data dir>.metalguard-join.json`
    /// ([`state::state_path`]). An agent that may not write next to the data directory (the
    /// packaged agent runs unprivileged, with only its state directory writable) keeps it in
    /// its own state directory.
    pub state_file: Option<PathBuf>,
    /// Further `ETCD_*` variables for the local etcd.
    pub extra_env: Vec<(String, String)>,
    /// Promote ourselves once promotable while voters < `desired_voters` (bootstrap only);
    /// otherwise the controller promotes.
    pub bootstrap_desired_voters: Option<usize>,
    /// Interval between observations while waiting.
    pub poll_interval: Duration,
    /// Time without catch-up progress after which the learner is reported stalled.
    pub stall_after: Duration,
    /// Promotion retry in bootstrap mode.
    pub promote_retry: PromoteRetry,
}

impl JoinConfig {
    /// The state file: [`JoinConfig::state_file`] or `<data dir>.metalguard-join.json`.
    pub fn state_path(&self) -> PathBuf {
        self.state_file
            .clone()
            .unwrap_or_else(|| state::state_path(&self.data_dir))
    }

    fn launch(&self, initial_cluster: &str) -> EtcdLaunch {
        EtcdLaunch {
            name: self.name.clone(),
            data_dir: self.data_dir.clone(),
            peer_url: self.peer_url.clone(),
            client_url: self.client_url.clone(),
            listen_peer_url: self.listen_peer_url.clone(),
            listen_client_url: self.listen_client_url.clone(),
            initial_cluster: initial_cluster.to_owned(),
            extra_env: self.extra_env.clone(),
        }
    }
}

/// Errors of the join flow.
#[derive(Debug, thiserror::Error)]
pub enum JoinError {
    /// An etcd call or the gate failed.
    #[error("etcd join of {name} failed in step {step}")]
    Etcd {
        /// This host's member name.
        name: String,
        /// The step.
        step: &'static str,
        /// The cause.
        #[source]
        source: EtcdError,
    },
    /// The state file failed.
    #[error("etcd join state could not be kept")]
    State(#[from] StateFileError),
    /// The launcher failed.
    #[error("local etcd could not be started or stopped")]
    Launch(#[from] LaunchError),
    /// `--initial-cluster` could not be built.
    #[error("etcd initial cluster could not be built")]
    InitialCluster(#[from] InitialClusterError),
    /// The data dir holds data, but no member of this cluster was recorded for it.
    #[error(
        "etcd data dir {path} is not empty but this host has no recorded member: refusing to wipe it; move it away to join"
    )]
    ForeignDataDir {
        /// The data dir.
        path: PathBuf,
    },
    /// This host's peer URL is a voter but its data dir is empty.
    #[error(
        "this host is voter {member_id:x} but etcd data dir {path} is empty: remove the member first, then join again"
    )]
    VoterWithoutData {
        /// The voter.
        member_id: u64,
        /// The empty data dir.
        path: PathBuf,
    },
    /// The data dir could not be read, so whether it holds data is unknown.
    #[error(
        "cannot tell whether etcd data dir {path} holds data: the agent's user must be able to list it"
    )]
    DataDir {
        /// The data dir.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// Wiping the data dir of a removed member failed.
    #[error("wiping etcd data dir {path} of the removed member failed")]
    Wipe {
        /// The data dir.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// What one [`JoinFlow::step`] did.
#[derive(Debug, Clone, PartialEq)]
pub enum StepOutcome {
    /// Moved to a new state (already persisted).
    Advanced(JoinState),
    /// Still waiting in the same state (catch-up or promotion); the verdict is the learner's.
    Waiting(Option<Verdict>),
    /// The flow was already in [`JoinState::Member`].
    Done,
}

/// The join flow of this host: configuration, persisted state, launcher, catch-up tracker.
#[derive(Debug)]
pub struct JoinFlow {
    config: JoinConfig,
    launcher: Launcher,
    state: JoinState,
    catch_up: CatchUp,
    resumed: bool,
    found_learner: Option<u64>,
}

impl JoinFlow {
    /// Loads the persisted state (a missing file is [`JoinState::Discover`]).
    pub fn load(config: JoinConfig, launcher: Launcher) -> Result<Self, JoinError> {
        let mut launcher = launcher;
        launcher.set_data_dir(&config.data_dir);
        launcher.set_local_member(&config.client_url, &config.peer_url, &config.client);
        let state = state::load(&config.state_path())?;
        tracing::info!(
            step = state.name(),
            member_id = state.member_id(),
            "etcd join state loaded"
        );
        let catch_up = CatchUp::new(config.stall_after);
        Ok(Self {
            config,
            launcher,
            state,
            catch_up,
            resumed: false,
            found_learner: None,
        })
    }

    /// The current state.
    pub fn state(&self) -> &JoinState {
        &self.state
    }

    /// The learner this flow found already added for its peer URL instead of adding one
    /// (someone else added it: `kubeadm join --control-plane` with its learner mode, a person
    /// with etcdctl, or an earlier agent that died before recording its add), if it did.
    pub fn found_learner(&self) -> Option<u64> {
        self.found_learner
    }

    /// The launcher (to stop etcd, or to read the exec child's PID).
    pub fn launcher_mut(&mut self) -> &mut Launcher {
        &mut self.launcher
    }

    fn etcd_err(&self, step: &'static str) -> impl FnOnce(EtcdError) -> JoinError + '_ {
        move |source| JoinError::Etcd {
            name: self.config.name.clone(),
            step,
            source,
        }
    }

    fn persist(&mut self, next: JoinState) -> Result<StepOutcome, JoinError> {
        state::save(&self.config.state_path(), &next)?;
        tracing::info!(
            from = self.state.name(),
            to = next.name(),
            member_id = next.member_id(),
            "etcd join advanced"
        );
        self.state = next.clone();
        Ok(StepOutcome::Advanced(next))
    }

    /// Runs the flow until this host is a voter, waiting `poll_interval` between
    /// observations. Gate refusals and transient etcd errors are returned, not retried: the
    /// caller decides whether to try again.
    pub async fn run(&mut self) -> Result<JoinState, JoinError> {
        loop {
            match Box::pin(self.step()).await? {
                StepOutcome::Done => return Ok(self.state.clone()),
                StepOutcome::Advanced(_) => {}
                StepOutcome::Waiting(_) => tokio::time::sleep(self.config.poll_interval).await,
            }
        }
    }

    /// Performs one transition (or one wait observation) and persists the result.
    pub async fn step(&mut self) -> Result<StepOutcome, JoinError> {
        if !self.resumed {
            self.resumed = true;
            if let Some(outcome) = self.resume().await? {
                return Ok(outcome);
            }
        }
        match self.state.clone() {
            JoinState::Discover => Box::pin(self.discover_and_add()).await,
            JoinState::Added {
                member_id,
                initial_cluster,
            } => {
                self.launcher
                    .start(&self.config.launch(&initial_cluster))
                    .await?;
                self.persist(JoinState::Started {
                    member_id,
                    initial_cluster,
                })
            }
            JoinState::Started {
                member_id,
                initial_cluster,
            } => {
                let view = observe(&self.config.client)
                    .await
                    .map_err(self.etcd_err("started"))?;
                if view.member(member_id).is_some_and(|m| !m.is_learner) {
                    return self.persist(JoinState::Member {
                        member_id,
                        initial_cluster,
                    });
                }
                let verdict = self
                    .catch_up
                    .observe(Instant::now(), Sample::from_view(&view, member_id));
                if verdict.stalled {
                    tracing::warn!(
                        member_id,
                        since_progress_ms =
                            u64::try_from(verdict.since_progress.as_millis()).unwrap_or(u64::MAX),
                        "etcd learner catch-up stalled"
                    );
                }
                if verdict.promotable {
                    tracing::info!(member_id, lag = verdict.lag, "etcd learner promotable");
                    return self.persist(JoinState::Promotable {
                        member_id,
                        initial_cluster,
                    });
                }
                Ok(StepOutcome::Waiting(Some(verdict)))
            }
            JoinState::Promotable {
                member_id,
                initial_cluster,
            } => {
                let view = observe(&self.config.client)
                    .await
                    .map_err(self.etcd_err("promotable"))?;
                if view.member(member_id).is_some_and(|m| !m.is_learner) {
                    return self.persist(JoinState::Member {
                        member_id,
                        initial_cluster,
                    });
                }
                // A restarted etcd may not serve yet: wait for it to answer before promoting.
                let reachable = view.member(member_id).is_some_and(MemberView::reachable);
                if reachable
                    && self
                        .config
                        .bootstrap_desired_voters
                        .is_some_and(|want| view.summary.voters < want)
                {
                    Box::pin(ops::promote(
                        &self.config.client,
                        member_id,
                        self.config.promote_retry,
                    ))
                    .await
                    .map_err(self.etcd_err("promote"))?;
                    return self.persist(JoinState::Member {
                        member_id,
                        initial_cluster,
                    });
                }
                let verdict = self
                    .catch_up
                    .observe(Instant::now(), Sample::from_view(&view, member_id));
                Ok(StepOutcome::Waiting(Some(verdict)))
            }
            JoinState::Member { .. } => Ok(StepOutcome::Done),
        }
    }

    /// On the first step after loading: checks the recorded member against the cluster,
    /// wipes a removed member's data dir, and restarts etcd where it should be running.
    async fn resume(&mut self) -> Result<Option<StepOutcome>, JoinError> {
        if self.state == JoinState::Discover {
            return Ok(None);
        }
        let view = observe(&self.config.client)
            .await
            .map_err(self.etcd_err("resume"))?;
        if state::reconcile(&self.state, &view) == Reconcile::RemovedWipe {
            tracing::warn!(
                member_id = self.state.member_id(),
                "etcd member of this host was removed, wiping data dir"
            );
            self.launcher.stop().await?;
            wipe_dir(&self.config.data_dir)?;
            return self.persist(JoinState::Discover).map(Some);
        }
        if self.state.etcd_should_run()
            && let Some(initial_cluster) = self.state.initial_cluster()
        {
            let launch = self.config.launch(initial_cluster);
            self.launcher.start(&launch).await?;
        }
        Ok(None)
    }

    async fn discover_and_add(&mut self) -> Result<StepOutcome, JoinError> {
        let view = observe(&self.config.client)
            .await
            .map_err(self.etcd_err("discover"))?;
        let discovery = state::discover(&view, &self.config.peer_url);
        if discovery == Discovery::Add {
            if dir_has_data(&self.config.data_dir)? {
                return Err(JoinError::ForeignDataDir {
                    path: self.config.data_dir.clone(),
                });
            }
            // Never add a learner this host cannot start: it would block every other learner.
            self.launcher.preflight()?;
        }
        // A voter that lost its data dir lost its raft term and vote too: starting it empty
        // could let it vote twice in one term. It must be removed and join again as a learner.
        if let Discovery::AlreadyVoter { member_id } = discovery
            && !dir_has_data(&self.config.data_dir)?
        {
            return Err(JoinError::VoterWithoutData {
                member_id,
                path: self.config.data_dir.clone(),
            });
        }
        let added = Box::pin(ops::add_learner(&self.config.client, &self.config.peer_url))
            .await
            .map_err(self.etcd_err("add learner"))?;
        if added.reused && !added.already_voter {
            tracing::info!(
                member_id = added.member_id,
                peer_url = self.config.peer_url,
                "etcd learner for this peer url exists already (added by kubeadm, a person, or an agent that died before recording its add): joining it, not adding another"
            );
            self.found_learner = Some(added.member_id);
        }
        let initial_cluster =
            state::build_initial_cluster(&added.members, added.member_id, &self.config.name)?;
        if added.already_voter {
            // A voter already: etcd must run from its data dir (or it was restored elsewhere).
            self.launcher
                .start(&self.config.launch(&initial_cluster))
                .await?;
            return self.persist(JoinState::Member {
                member_id: added.member_id,
                initial_cluster,
            });
        }
        self.persist(JoinState::Added {
            member_id: added.member_id,
            initial_cluster,
        })
    }
}

/// Whether an etcd error is worth retrying the step for (used by the CLI loop).
pub fn is_retryable(err: &JoinError) -> bool {
    match err {
        JoinError::Etcd { source, .. } => {
            source
                .kind()
                .is_some_and(|k| k.is_transient() || k == EtcdErrorKind::UnhealthyCluster)
                || matches!(source, EtcdError::NoEndpointAnswered { .. })
        }
        _ => false,
    }
}

/// Whether `dir` holds anything; a missing dir is empty, one that cannot be listed is an
/// error (the answer decides between refusing a foreign data dir and starting a voter).
fn dir_has_data(dir: &std::path::Path) -> Result<bool, JoinError> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => Ok(entries.next().is_some()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(JoinError::DataDir {
            path: dir.to_owned(),
            source,
        }),
    }
}

fn wipe_dir(dir: &std::path::Path) -> Result<(), JoinError> {
    match std::fs::remove_dir_all(dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(source) => Err(JoinError::Wipe {
            path: dir.to_owned(),
            source,
        }),
    }
}
