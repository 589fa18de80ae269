//! The agent's side of the protocol: reports on an interval and on change, one long-poll for
//! commands, and delivery of results until the controller acknowledges them — over HTTPS with
//! this host's client certificate. While the controller is away every loop keeps trying with
//! capped exponential backoff; probes keep running regardless.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use metalguard_api::duration::Timestamp;
use metalguard_api::protocol::{
    self, AgentReport, Command, CommandBatch, CommandResult, Condition, ErrorBody, EtcdMemberView,
    EtcdView, HoldAck, ReportAck, ResultAck,
};
use metalguard_api::skew;
use metalguard_api::snapshot::ConditionStatus;
use metalguard_api::snapshot::Hold;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use super::bmc_reach::Reachability;
use super::execute::{Executor, error_chain};
use super::identity::Identity;
use super::notify::Heartbeats;
use super::probes::{Board, Polarity, now_ms};
use crate::config::ControllerConfig;

/// First retry delay after a failed call.
const BACKOFF_START: Duration = Duration::from_millis(250);
/// Largest retry delay: a controller that failed over must hear from every agent again well
/// within its heartbeat timeout, so this stays short (a report every 5 s is cheap).
const BACKOFF_MAX: Duration = Duration::from_secs(5);
/// A report the current controller has not answered within this long is sent to the others
/// too ([`Link::call_hedged`]): the controllers answer a report from memory in milliseconds.
const HEDGE_AFTER: Duration = Duration::from_secs(1);
/// How often pending results are re-sent.
const RESULT_RETRY: Duration = Duration::from_secs(2);
/// A pooled connection is dropped after this long unused: below the controller's idle and
/// header timeouts (10 s by default), so the agent never sends on a connection the controller
/// is closing.
pub(super) const POOL_IDLE: Duration = Duration::from_secs(5);
/// The longest `Retry-After` honoured: the loops' watchdog staleness bounds assume no longer
/// sleep, and a controller asking for more is only asked again then (and answers 429 cheaply).
const MAX_RETRY_AFTER: Duration = BACKOFF_MAX;
/// Wait before polling again when every listed command is already running here (the
/// controller lists a command until its result is acknowledged, so the poll answers at once).
const RUNNING_POLL: Duration = Duration::from_secs(1);

/// Why a call to the controller failed.
#[derive(Debug, thiserror::Error)]
pub enum LinkError {
    /// Transport failure (connect, TLS, timeout).
    #[error("request to the controller failed")]
    Transport(#[source] reqwest::Error),
    /// The controller refused the request for its rate (429) and said when to retry.
    #[error("controller asked this agent to slow down for {retry_after:?}: {message}")]
    Throttled {
        /// When to try again (the answer's `Retry-After`, at most [`MAX_RETRY_AFTER`]).
        retry_after: Duration,
        /// The controller's error message.
        message: String,
    },
    /// The controller answered with an error status.
    #[error("controller answered {status}: {message}")]
    Status {
        /// HTTP status.
        status: reqwest::StatusCode,
        /// The controller's error message.
        message: String,
    },
    /// No controller URL is configured.
    #[error("no controller URL is configured")]
    NoController,
    /// No controller gave an answer in time (each attempt still waiting).
    #[error("no controller answered within {0:?}")]
    NoAnswer(Duration),
    /// The controller's release is outside the skew policy (or its version header is not a
    /// version): nothing it answers is used, no command of it executed
    /// (`metalguard_api::skew`).
    #[error("controller not used: {0}")]
    Skew(#[source] metalguard_api::skew::SkewError),
    /// The answer is not the message it should be (a controller of the same or an older
    /// release sent a field this agent does not know, or a value of the wrong type).
    #[error("controller's answer could not be read: {0}")]
    Answer(String),
}

impl LinkError {
    /// Whether another controller may answer: this one is unreachable or not the leader.
    fn try_another(&self) -> bool {
        match self {
            // Another controller may run a release within the policy (a rolling update).
            LinkError::Transport(_)
            | LinkError::NoController
            | LinkError::NoAnswer(_)
            | LinkError::Skew(_) => true,
            LinkError::Status { status, .. } => *status == reqwest::StatusCode::SERVICE_UNAVAILABLE,
            // The leader answered (throttled, or with what this agent cannot read): another
            // controller would only answer 503.
            LinkError::Throttled { .. } | LinkError::Answer(_) => false,
        }
    }

    /// How long the controller asked to wait before the next request, if it did.
    fn retry_after(&self) -> Option<Duration> {
        match self {
            LinkError::Throttled { retry_after, .. } => Some(*retry_after),
            _ => None,
        }
    }

    /// The error for a non-2xx answer: its [`ErrorBody`] message, and for 429 the
    /// `Retry-After` to honour.
    async fn from_answer(response: reqwest::Response) -> Self {
        let status = response.status();
        let retry_after = response
            .headers()
            .get(reqwest::header::RETRY_AFTER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(Duration::from_secs);
        let text = response.text().await.unwrap_or_default();
        let message = serde_json::from_str::<ErrorBody>(&text).map_or(text, |e| e.error);
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS {
            return LinkError::Throttled {
                retry_after: retry_after
                    .unwrap_or(BACKOFF_START)
                    .clamp(BACKOFF_START, MAX_RETRY_AFTER),
                message,
            };
        }
        LinkError::Status { status, message }
    }
}

/// How long a loop waits after a failed call: its backoff, or longer when the controller
/// asked for longer (429 `Retry-After`).
fn wait_after(error: &LinkError, backoff: &mut Backoff) -> Duration {
    let next = backoff.next();
    error.retry_after().map_or(next, |asked| asked.max(next))
}

/// An mTLS client for this host's endpoints. Its certificate follows the files on disk
/// (renewal without a restart, [`Identity`]).
#[derive(Debug, Clone)]
pub struct Link {
    identity: Identity,
    /// Every configured controller, `url` first then `urls`.
    bases: Vec<String>,
    /// The one that answered last; shared by the clones the loops hold, so they move on
    /// together when the leader changes.
    current: Arc<AtomicUsize>,
    host: String,
    config: ControllerConfig,
    /// Where the host's boot ID is read (`[state] boot_id_file`).
    boot_id_file: std::path::PathBuf,
    /// Where the host's DMI identity is read (`[state] dmi_dir`).
    dmi_dir: std::path::PathBuf,
}

impl Link {
    /// Builds the client from the configured CA, certificate and key.
    pub fn new(config: &ControllerConfig, host: &str) -> Result<Self, String> {
        Ok(Self {
            identity: Identity::new(config)?,
            bases: config
                .all_urls()
                .map(|u| u.trim_end_matches('/').to_owned())
                .collect(),
            current: Arc::new(AtomicUsize::new(0)),
            host: host.to_owned(),
            config: config.clone(),
            boot_id_file: std::path::PathBuf::from(crate::config::DEFAULT_BOOT_ID_FILE),
            dmi_dir: std::path::PathBuf::from(crate::config::DEFAULT_DMI_DIR),
        })
    }

    /// Reads the host's boot ID from `path` instead of the kernel's (a simulated host).
    #[must_use]
    pub fn with_boot_id_file(mut self, path: &std::path::Path) -> Self {
        path.clone_into(&mut self.boot_id_file);
        self
    }

    /// Reads the host's DMI identity from `dir` instead of the kernel's (a simulated host, or
    /// copies the agent's user may read).
    #[must_use]
    pub fn with_dmi_dir(mut self, dir: &std::path::Path) -> Self {
        dir.clone_into(&mut self.dmi_dir);
        self
    }

    /// Calls the controller that answered last; when it cannot be reached or answers 503
    /// (a follower, or a leader without its store), tries the others in order and sticks to
    /// the first that answers.
    async fn call<B: Serialize, R: DeserializeOwned>(
        &self,
        path: &str,
        body: Option<&B>,
        timeout: Duration,
    ) -> Result<R, LinkError> {
        let first = self.current.load(Ordering::Relaxed);
        let mut last = None;
        for attempt in 0..self.bases.len() {
            let index = (first + attempt) % self.bases.len();
            match self.call_one(&self.bases[index], path, body, timeout).await {
                Err(error) if error.try_another() => last = Some(error),
                answer => {
                    if attempt > 0 {
                        self.current.store(index, Ordering::Relaxed);
                        tracing::info!(controller = %self.bases[index], "talking to another controller");
                    }
                    return answer;
                }
            }
        }
        Err(last.unwrap_or(LinkError::NoController))
    }

    async fn call_one<B: Serialize, R: DeserializeOwned>(
        &self,
        base: &str,
        path: &str,
        body: Option<&B>,
        timeout: Duration,
    ) -> Result<R, LinkError> {
        let url = format!("{base}{path}");
        let client = self.identity.client();
        let request = match body {
            Some(body) => client.post(url).json(body),
            None => client.get(url),
        };
        let (version_header, release) = skew::our_header();
        let response = request
            .header(version_header, release)
            .timeout(timeout)
            .send()
            .await
            .map_err(LinkError::Transport)?;
        read_answer(base, response).await
    }

    /// Sends a report, asking for the BMC targets in the answer (fitted to the protocol's
    /// limits by the caller, [`fit_report`]).
    ///
    /// The report is the agent's heartbeat, so it is hedged ([`Link::call_hedged`]): a
    /// controller that hangs (paused, or its host stalled) must not hold the heartbeat for a
    /// whole request timeout while another controller leads.
    pub async fn report(&self, report: &AgentReport) -> Result<ReportAck, LinkError> {
        self.call_hedged(
            &protocol::report_path_with_bmc_targets(&self.host),
            Some(report),
            self.config.request_timeout,
        )
        .await
    }

    /// As [`Link::call`], but no controller that hangs holds the call: when no final answer
    /// has come within [`HEDGE_AFTER`], the next controller in order is asked too (the current
    /// one first, then the others, then the current one again), each attempt with its own
    /// timeout, until one gives a final answer or `timeout` has passed since the call began.
    /// An attempt refused at once (503: not the leader) moves on to the next controller at
    /// once, once per controller; after that, one new attempt per [`HEDGE_AFTER`]. The first
    /// final answer wins, and the controller that gave it becomes the current one.
    ///
    /// Found by the nemesis soak, twice: the leader paused, another took over, and an agent
    /// kept sending its report to the paused one first, losing a request timeout (5 s) per
    /// try; and an agent whose current controller answered 503 a moment before it began to
    /// lead waited out the paused other one instead of asking the new leader again. Either
    /// way the leader heard nothing for longer than the lab's 5 s heartbeat timeout and fenced
    /// a healthy host.
    async fn call_hedged<B: Serialize + Sync, R: DeserializeOwned>(
        &self,
        path: &str,
        body: Option<&B>,
        timeout: Duration,
    ) -> Result<R, LinkError> {
        use futures::stream::{FuturesUnordered, StreamExt as _};
        let n = self.bases.len().max(1);
        let first = self.current.load(Ordering::Relaxed) % n;
        let deadline = tokio::time::Instant::now() + timeout;
        let attempt = |k: usize| {
            let index = (first + k) % n;
            async move {
                (
                    index,
                    self.call_one(&self.bases[index], path, body, timeout).await,
                )
            }
        };
        let mut pending = FuturesUnordered::new();
        pending.push(attempt(0));
        let mut launched = 1usize;
        let mut last_error = None;
        let hedge = tokio::time::sleep(HEDGE_AFTER.min(timeout));
        tokio::pin!(hedge);
        loop {
            tokio::select! {
                Some((index, answer)) = pending.next() => match answer {
                    Err(error) if error.try_another() => {
                        last_error = Some(error);
                        // Everyone refused once: the next hedge asks again.
                        if launched < n {
                            pending.push(attempt(launched));
                            launched += 1;
                        }
                    }
                    answer => {
                        self.switch_to(index);
                        return answer;
                    }
                },
                () = &mut hedge => {
                    if n > 1 || pending.is_empty() {
                        pending.push(attempt(launched));
                        launched += 1;
                    }
                    hedge.as_mut().reset(tokio::time::Instant::now() + HEDGE_AFTER);
                }
                () = tokio::time::sleep_until(deadline) => {
                    return Err(last_error.unwrap_or(LinkError::NoAnswer(timeout)));
                }
            }
        }
    }

    fn switch_to(&self, index: usize) {
        if self.current.swap(index, Ordering::Relaxed) != index {
            tracing::info!(controller = %self.bases[index], "talking to another controller");
        }
    }

    /// Waits up to the configured long-poll for commands.
    pub async fn poll(&self) -> Result<CommandBatch, LinkError> {
        let wait = self.config.command_wait;
        let path = protocol::commands_path(&self.host, wait);
        self.call::<(), _>(&path, None, wait + self.config.request_timeout)
            .await
    }

    /// Posts a break-glass hold recorded on this host (`fence --direct`), each request under
    /// `timeout`.
    pub async fn post_hold(&self, hold: &Hold, timeout: Duration) -> Result<HoldAck, LinkError> {
        self.call(&protocol::holds_path(&self.host), Some(hold), timeout)
            .await
    }

    /// Delivers one result, fitted to the protocol's limits (a long timeline loses entries
    /// from its middle, with a note saying how many).
    pub async fn deliver(&self, result: &CommandResult) -> Result<ResultAck, LinkError> {
        let mut fitted = result.clone();
        if metalguard_api::limits::fit_result(&mut fitted) {
            tracing::warn!(operation = %result.operation_id, "result cut to the protocol's limits");
        }
        self.call(
            &protocol::results_path(&self.host),
            Some(&fitted),
            self.config.request_timeout,
        )
        .await
    }
}

/// A controller's answer as this agent may use it: nothing from a controller whose release is
/// outside the skew policy ([`LinkError::Skew`], whatever it answered), an error answer as its
/// [`ErrorBody`], and a body read as the controller's release allows (a newer one's unknown
/// fields left out, anyone else's refused: [`LinkError::Answer`]).
async fn read_answer<R: DeserializeOwned>(
    base: &str,
    response: reqwest::Response,
) -> Result<R, LinkError> {
    let header = response
        .headers()
        .get(skew::VERSION_HEADER)
        .map(|value| value.to_str().unwrap_or("<not text>").to_owned());
    let (_, skew) = skew::judge(
        skew::Version::ours(),
        "agent",
        header.as_deref(),
        "controller",
    )
    .map_err(|error| {
        tracing::warn!(controller = %base, %error, "controller's release outside the skew policy: its answers are not used");
        LinkError::Skew(error)
    })?;
    if !response.status().is_success() {
        return Err(LinkError::from_answer(response).await);
    }
    let bytes = response.bytes().await.map_err(LinkError::Transport)?;
    let decoded = skew::decode::<R>(&bytes, skew.tolerance())
        .map_err(|error| LinkError::Answer(error.to_string()))?;
    if !decoded.ignored.is_empty() {
        tracing::debug!(controller = %base, ignored = ?decoded.ignored, "fields of a newer controller left out");
    }
    Ok(decoded.value)
}

/// Capped exponential backoff.
#[derive(Debug)]
struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    fn new() -> Self {
        Self::up_to(BACKOFF_MAX)
    }
    /// A backoff that never waits longer than `max` (nor [`BACKOFF_MAX`]).
    fn up_to(max: Duration) -> Self {
        let max = max.clamp(BACKOFF_START, BACKOFF_MAX);
        Self {
            next: BACKOFF_START,
            max,
        }
    }
    fn next(&mut self) -> Duration {
        let now = self.next;
        self.next = (self.next * 2).min(self.max);
        now
    }
    fn reset(&mut self) {
        self.next = BACKOFF_START;
    }
}

fn conditions(board: &Board) -> Vec<Condition> {
    board
        .snapshot()
        .into_iter()
        .map(|s| Condition {
            type_: s.condition,
            status: match (s.healthy, s.polarity) {
                (None, _) => ConditionStatus::Unknown,
                (Some(true), Polarity::Healthy) | (Some(false), Polarity::Pressure { .. }) => {
                    ConditionStatus::True
                }
                (Some(false), Polarity::Healthy) | (Some(true), Polarity::Pressure { .. }) => {
                    ConditionStatus::False
                }
            },
            reason: s.reason,
            message: s.message,
            last_transition: Timestamp(s.last_transition_ms),
        })
        .collect()
}

/// This host's view of etcd for the report: every member as our own probe saw it.
async fn etcd_view(settings: Option<&metalguard_etcd::ClientSettings>) -> Option<EtcdView> {
    let settings = settings?;
    let local = settings.endpoints.first()?.clone();
    let view = match Box::pin(metalguard_etcd::observe::observe(settings)).await {
        Ok(view) => view,
        Err(err) => {
            tracing::warn!(error = %error_chain(&err), "etcd not observable for the report");
            return Some(EtcdView::default());
        }
    };
    let local_member_id = view
        .members
        .iter()
        .find(|m| m.probe.as_ref().is_some_and(|p| p.endpoint == local))
        .map(|m| m.id);
    Some(EtcdView {
        local_member_id,
        leader_id: view.summary.leader,
        members: view
            .members
            .iter()
            .map(|m| EtcdMemberView {
                id: m.id,
                name: m.name.clone(),
                peer_urls: m.peer_urls.clone(),
                client_urls: m.client_urls.clone(),
                learner: m.is_learner,
                // A NOSPACE member still votes: the quorum guard must not count it as lost.
                healthy: m
                    .status()
                    .is_some_and(metalguard_etcd::view::MemberStatus::is_healthy_despite_nospace),
                alarms: m
                    .status()
                    .map(|s| s.alarms.iter().map(|a| a.name.clone()).collect())
                    .unwrap_or_default(),
                raft_applied_index: m.status().map(|s| s.raft_applied_index),
                error: m.probe.as_ref().and_then(|p| p.error.clone()),
            })
            .collect(),
    })
}

/// The host's boot ID, read from `path` (empty when unreadable: unknown).
fn boot_id(path: &std::path::Path) -> String {
    std::fs::read_to_string(path)
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// Whether the next report carries the host's identity: only once a controller said it takes
/// it ([`ReportAck::host_identity`]), and no longer after a report that carried it was
/// refused as unprocessable — an older controller, leading after a failover, refuses the
/// unknown field, and the heartbeat must get through.
#[derive(Debug, Default)]
struct IdentityOffer {
    accepted: bool,
}

impl IdentityOffer {
    /// The identity to put in the next report.
    fn attach(
        &self,
        identity: &metalguard_api::identity::SystemIdentity,
    ) -> Option<metalguard_api::identity::SystemIdentity> {
        self.accepted.then(|| identity.clone())
    }

    /// Takes the controller's word from an answer.
    fn answered(&mut self, ack: &ReportAck) {
        if ack.host_identity && !self.accepted {
            tracing::info!("the controller takes this host's identity; sending it from now on");
        }
        self.accepted = ack.host_identity;
    }

    /// After a failed report that carried the identity (`carried`): true when the report
    /// should go again at once without it.
    fn refused(&mut self, carried: bool, err: &LinkError) -> bool {
        if carried && unprocessable(err) {
            tracing::warn!(error = %error_chain(err), "a report with this host's identity was refused; sending reports without it until a controller says it takes it");
            self.accepted = false;
            return true;
        }
        false
    }
}

/// Whether the next report carries the credentialed BMC checks (`BmcReachability::check`):
/// not after a report that carried one was refused as unprocessable (an older controller,
/// leading after a failover, refuses the unknown field), until a controller hands out
/// credentials again (only one that takes checks does).
#[derive(Debug, Default)]
struct CheckOffer {
    refused: bool,
}

impl CheckOffer {
    /// `report` as it may go: without checks while they are refused.
    fn fit(&self, report: &mut AgentReport) {
        if self.refused {
            for probe in &mut report.bmc_reachability {
                probe.check = None;
            }
        }
    }

    /// Takes the controller's word from an answer.
    fn answered(&mut self, ack: &ReportAck) {
        if self.refused && ack.bmc_targets.iter().any(|t| t.credentials.is_some()) {
            tracing::info!("the controller hands out bmc credentials again: reporting checks");
            self.refused = false;
        }
    }

    /// After a failed report: true when it carried checks and was refused as unprocessable,
    /// so it should go again at once without them.
    fn refused(&mut self, report: &AgentReport, err: &LinkError) -> bool {
        let carried = report.bmc_reachability.iter().any(|p| p.check.is_some());
        if carried && unprocessable(err) {
            tracing::warn!(error = %error_chain(err), "a report with bmc checks was refused; sending reports without them until a controller hands out credentials again");
            self.refused = true;
            return true;
        }
        false
    }
}

fn unprocessable(err: &LinkError) -> bool {
    matches!(err, LinkError::Status { status, .. } if *status == reqwest::StatusCode::UNPROCESSABLE_ENTITY)
}

/// Reports every interval and whenever a probe verdict or a BMC's reachability changes;
/// hands the BMC targets of each answer to `reach`.
pub async fn report_loop(
    link: Link,
    board: Board,
    executor: Executor,
    reach: Reachability,
    beats: Heartbeats,
    cancel: CancellationToken,
) {
    let name = "report";
    let stale_after = BACKOFF_MAX + link.config.report_interval + link.config.request_timeout * 2;
    let mut changes = board.subscribe();
    let mut reach_changes = reach.subscribe();
    let mut sequence = 0u64;
    let boot = boot_id(&link.boot_id_file);
    // The report is the heartbeat: failures never make it rarer than the report interval
    // (unless the controller asks, 429). A controller that could not answer for a while (its
    // store or API server stalled, a takeover) must hear from every agent within one interval
    // of answering again (with a backoff doubling to 5 s, retries after a 5 s API server
    // freeze could come 4 s apart, close to the lab's 5 s heartbeat timeout).
    let identity = super::host_identity::read_and_log(&link.dmi_dir);
    let mut offer = IdentityOffer::default();
    let mut checks = CheckOffer::default();
    let mut backoff = Backoff::up_to(link.config.report_interval);
    let mut holds_problem = String::new();
    let mut reported_cut = false;
    loop {
        beats.beat(name, stale_after);
        sequence += 1;
        let holds = local_holds(executor.holds(), &mut holds_problem);
        let mut report = AgentReport {
            host: link.host.clone(),
            agent_version: env!("CARGO_PKG_VERSION").to_owned(),
            sequence,
            boot_id: boot.clone(),
            sent_at: Timestamp(now_ms()),
            conditions: conditions(&board),
            etcd: etcd_view(executor.etcd_settings()).await,
            bmc_reachability: reach.results(),
            unacknowledged_results: executor
                .journal()
                .pending()
                .unwrap_or_default()
                .into_iter()
                .map(|r| r.operation_id)
                .collect(),
            holds,
            seen_term: executor.terms().highest(),
            host_identity: offer.attach(&identity),
        };
        checks.fit(&mut report);
        let cut = metalguard_api::limits::fit_report(&mut report);
        if cut && !reported_cut {
            tracing::warn!(
                "report cut to the protocol's limits (messages, errors or reachability entries shortened)"
            );
        }
        reported_cut = cut;
        let wait = match link.report(&report).await {
            Ok(ack) => {
                backoff.reset();
                offer.answered(&ack);
                checks.answered(&ack);
                if let Err(err) = executor.terms().observe(ack.term) {
                    tracing::error!(term = ack.term, error = %err, "the controller's leadership term could not be recorded");
                }
                reach.set_targets(ack.bmc_targets);
                // The controller withholds fences of a released host from this agent until a
                // report no longer carries its hold: that report goes out at once.
                if forget_released(executor.holds(), &ack.released_holds) {
                    Duration::ZERO
                } else {
                    link.config.report_interval
                }
            }
            Err(err) if offer.refused(report.host_identity.is_some(), &err) => Duration::ZERO,
            Err(err) if checks.refused(&report, &err) => Duration::ZERO,
            Err(err) => {
                let delay = wait_after(&err, &mut backoff);
                tracing::warn!(error = %error_chain(&err), retry_in = ?delay, "report not delivered");
                delay
            }
        };
        beats.beat(name, stale_after);
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep(wait) => {}
            update = changes.changed() => if update.is_err() { break },
            update = reach_changes.changed() => if update.is_err() { break },
        }
    }
    beats.retire(name);
}

/// The holds recorded on this host, for the report. A problem reading them is logged when it
/// changes (`last` keeps the last one told), not on every report.
fn local_holds(store: &crate::holds::HoldStore, last: &mut String) -> Vec<Hold> {
    let (holds, problems) = match store.list() {
        Ok(found) => found,
        Err(err) => (Vec::new(), vec![err]),
    };
    let problem = problems
        .iter()
        .map(|e| error_chain(e))
        .collect::<Vec<_>>()
        .join("; ");
    if problem != *last {
        if problem.is_empty() {
            tracing::info!(dir = %store.dir().display(), "hold records readable again");
        } else {
            tracing::error!(dir = %store.dir().display(), problem = %problem, "break-glass hold records cannot be read; the controller does not learn of them from this agent");
        }
        last.clone_from(&problem);
    }
    holds
}

/// Deletes the local record of every hold the controller says a person released; true when
/// it deleted one.
fn forget_released(store: &crate::holds::HoldStore, released: &[String]) -> bool {
    let mut deleted = false;
    for id in released {
        match store.remove(id) {
            Ok(true) => {
                tracing::info!(hold = %id, "break-glass hold released by a person; local record deleted");
                deleted = true;
            }
            Ok(false) => {}
            Err(err) => {
                tracing::error!(hold = %id, error = %error_chain(&err), "released hold's local record cannot be deleted");
            }
        }
    }
    deleted
}

/// Long-polls for commands, executes each (at most once) and delivers its result.
pub async fn command_loop(
    link: Link,
    executor: Executor,
    beats: Heartbeats,
    cancel: CancellationToken,
) {
    let name = "commands";
    let stale_after = link.config.command_wait + link.config.request_timeout + BACKOFF_MAX * 2;
    let mut backoff = Backoff::new();
    loop {
        beats.beat(name, stale_after);
        let polled = tokio::select! {
            () = cancel.cancelled() => break,
            polled = link.poll() => polled,
        };
        match polled {
            Ok(batch) => {
                backoff.reset();
                let listed = batch.commands.len();
                let mut running = 0;
                for command in batch.commands {
                    beats.beat(name, stale_after);
                    if executor.is_running(&command.operation_id) {
                        running += 1;
                    } else if Executor::runs_in_background(&command.kind) {
                        running += 1;
                        start_in_background(&link, &executor, command);
                    } else {
                        match Box::pin(executor.handle(command)).await {
                            Ok(result) => deliver(&link, &executor, &result).await,
                            Err(err) => {
                                tracing::error!(error = %err, "cannot record a command in the journal; not executed");
                            }
                        }
                    }
                }
                if listed > 0 && running == listed {
                    tokio::select! {
                        () = cancel.cancelled() => break,
                        () = tokio::time::sleep(RUNNING_POLL) => {}
                    }
                }
            }
            Err(err) => {
                let delay = wait_after(&err, &mut backoff);
                tracing::warn!(error = %error_chain(&err), retry_in = ?delay, "polling for commands failed");
                tokio::select! {
                    () = cancel.cancelled() => break,
                    () = tokio::time::sleep(delay) => {}
                }
            }
        }
    }
    beats.retire(name);
}

/// Runs a long command in its own task and delivers its result when it finishes (the result
/// loop re-sends it if that delivery fails).
fn start_in_background(link: &Link, executor: &Executor, command: Command) {
    let op = command.operation_id.clone();
    let Some(task) = executor.start_background(command) else {
        return;
    };
    let link = link.clone();
    let executor = executor.clone();
    tokio::spawn(async move {
        match task.await {
            Ok(Ok(result)) => deliver(&link, &executor, &result).await,
            Ok(Err(err)) => {
                tracing::error!(operation = %op, error = %err, "cannot record a command in the journal; not executed");
            }
            Err(err) => {
                tracing::error!(operation = %op, error = %err, "background command task failed");
            }
        }
    });
}

/// Re-sends unacknowledged results (for example after the controller was away).
pub async fn result_loop(
    link: Link,
    executor: Executor,
    beats: Heartbeats,
    cancel: CancellationToken,
) {
    let name = "results";
    let stale_after = RESULT_RETRY + link.config.request_timeout * 4;
    loop {
        beats.beat(name, stale_after);
        for result in executor.journal().pending().unwrap_or_default() {
            deliver(&link, &executor, &result).await;
        }
        beats.beat(name, stale_after);
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep(RESULT_RETRY) => {}
        }
    }
    beats.retire(name);
}

async fn deliver(link: &Link, executor: &Executor, result: &CommandResult) {
    match link.deliver(result).await {
        Ok(ack) => {
            if let Err(err) = executor.journal().acknowledge(&ack.operation_id) {
                tracing::error!(operation = %ack.operation_id, error = %err, "cannot mark a result delivered");
            } else {
                tracing::info!(operation = %ack.operation_id, first = ack.first, "result delivered");
            }
        }
        Err(err) => {
            tracing::warn!(operation = %result.operation_id, error = %error_chain(&err), "result not delivered yet; will retry");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(status: u16, retry_after: Option<&str>, body: &str) -> reqwest::Response {
        let mut builder = http::Response::builder().status(status);
        if let Some(value) = retry_after {
            builder = builder.header("retry-after", value);
        }
        reqwest::Response::from(builder.body(body.to_owned()).unwrap())
    }

    #[tokio::test]
    async fn a_429_is_throttled_for_its_retry_after_and_the_loops_wait_that_long() {
        let error = LinkError::from_answer(answer(
            429,
            Some("3"),
            r#"{"error":"host w-1 sent more than 2 requests per second"}"#,
        ))
        .await;
        assert!(
            matches!(&error, LinkError::Throttled { retry_after, message }
                if *retry_after == Duration::from_secs(3) && message.contains("2 requests")),
            "{error:?}"
        );
        assert!(
            !error.try_another(),
            "the leader answered; a follower would answer 503"
        );
        let mut backoff = Backoff::new();
        assert_eq!(wait_after(&error, &mut backoff), Duration::from_secs(3));
        // Never longer than the loops' staleness bounds allow, never shorter than the backoff.
        let greedy = LinkError::from_answer(answer(429, Some("3600"), "")).await;
        assert_eq!(wait_after(&greedy, &mut Backoff::new()), MAX_RETRY_AFTER);
        let missing = LinkError::from_answer(answer(429, None, "")).await;
        assert_eq!(wait_after(&missing, &mut Backoff::new()), BACKOFF_START);
        // Other errors keep the backoff.
        let unavailable =
            LinkError::from_answer(answer(503, None, r#"{"error":"not the leader"}"#)).await;
        assert!(unavailable.try_another());
        let mut backoff = Backoff::new();
        assert_eq!(wait_after(&unavailable, &mut backoff), BACKOFF_START);
        assert_eq!(wait_after(&unavailable, &mut backoff), BACKOFF_START * 2);
    }

    /// A controller's 200 answer with `body`, saying `release` (none: the first release).
    fn from_release(release: Option<&str>, body: &str) -> reqwest::Response {
        let mut builder = http::Response::builder().status(200);
        if let Some(release) = release {
            builder = builder.header(skew::VERSION_HEADER, release);
        }
        reqwest::Response::from(builder.body(body.to_owned()).unwrap())
    }

    #[tokio::test]
    async fn commands_of_a_controller_outside_the_skew_policy_are_never_used() {
        let ours = skew::Version::ours();
        let release = |minors: u64| format!("{}.{}.0", ours.major, ours.minor + minors);
        let fence = r#"{"commands":[{"operation_id":"op-1","issued_at":5,"term":3,
            "kind":{"type":"fence","target":"cp-2","action":"off",
            "bmc_address":"ipmi://10.0.0.2","credentials":{"username":"u","password":"p"}%EXTRA%}}]}"#;
        let plain = fence.replace("%EXTRA%", "");
        let newer = fence.replace("%EXTRA%", r#","confirm_twice":true"#);
        // This release and the next minor one: the command is read; the next one's field
        // this agent does not know is left out.
        let batch: CommandBatch = read_answer("c", from_release(Some(&release(0)), &plain))
            .await
            .unwrap();
        assert_eq!(batch.commands.len(), 1);
        let batch: CommandBatch = read_answer("c", from_release(Some(&release(1)), &newer))
            .await
            .unwrap();
        assert_eq!(batch.commands[0].term, 3);
        // The same field from this release is refused (a bug or an attacker), and asking
        // another controller would not help.
        let error = read_answer::<CommandBatch>("c", from_release(Some(&release(0)), &newer))
            .await
            .unwrap_err();
        assert!(
            matches!(&error, LinkError::Answer(m) if m.contains("confirm_twice")),
            "{error:?}"
        );
        assert!(!error.try_another());
        // Two minor releases ahead, or a header that is not a version: nothing it says is
        // used, whatever it is; another controller (a rolling update) may be asked.
        for release in [release(2), "9.0.0".to_owned(), "latest".to_owned()] {
            let error = read_answer::<CommandBatch>("c", from_release(Some(&release), &plain))
                .await
                .unwrap_err();
            assert!(matches!(error, LinkError::Skew(_)), "{release}: {error:?}");
            assert!(error.try_another());
        }
        // No header: the first release, within the policy while this one is its next minor.
        let first = read_answer::<CommandBatch>("c", from_release(None, &plain)).await;
        assert_eq!(
            first.is_ok(),
            skew::judge(ours, "agent", None, "controller").is_ok(),
            "{first:?}"
        );
    }

    #[test]
    fn the_heartbeat_backoff_never_waits_longer_than_the_report_interval() {
        let mut heartbeat = Backoff::up_to(Duration::from_secs(1));
        let waits: Vec<Duration> = (0..6).map(|_| heartbeat.next()).collect();
        assert_eq!(
            waits,
            [250, 500, 1000, 1000, 1000, 1000].map(Duration::from_millis)
        );
        // Bounded both ways: a long interval keeps the usual cap, a tiny one the first step.
        let mut slow = Backoff::up_to(Duration::from_secs(60));
        assert_eq!((0..8).map(|_| slow.next()).max(), Some(BACKOFF_MAX));
        let mut fast = Backoff::up_to(Duration::from_millis(10));
        assert_eq!((fast.next(), fast.next()), (BACKOFF_START, BACKOFF_START));
    }

    fn ack(host_identity: bool) -> ReportAck {
        ReportAck {
            sequence: 1,
            received_at: Timestamp(1),
            bmc_targets: Vec::new(),
            released_holds: Vec::new(),
            term: 0,
            host_identity,
        }
    }

    #[tokio::test]
    async fn the_identity_goes_only_to_a_controller_that_takes_it_and_stops_when_refused() {
        let mut identity = metalguard_api::identity::SystemIdentity::default();
        identity.set_serial_number(Ok("SN-1"));
        let mut offer = IdentityOffer::default();
        assert_eq!(
            offer.attach(&identity),
            None,
            "not before a controller said so"
        );
        offer.answered(&ack(false));
        assert_eq!(offer.attach(&identity), None, "an older controller");
        offer.answered(&ack(true));
        assert_eq!(offer.attach(&identity), Some(identity.clone()));
        // An older controller leads now: it refuses the unknown field (axum: 422).
        let refused = LinkError::from_answer(answer(
            422,
            None,
            r#"{"error":"failed to deserialize the JSON body: host_identity: unknown field"}"#,
        ))
        .await;
        let unavailable = LinkError::from_answer(answer(503, None, "{}")).await;
        assert!(
            !offer.refused(true, &unavailable),
            "not a refusal of the field"
        );
        assert!(offer.attach(&identity).is_some());
        assert!(
            !offer.refused(false, &refused),
            "the report did not carry it"
        );
        assert!(offer.attach(&identity).is_some());
        assert!(offer.refused(true, &refused), "resent at once");
        assert_eq!(offer.attach(&identity), None);
        // Until a controller says again that it takes it.
        offer.answered(&ack(true));
        assert!(offer.attach(&identity).is_some());
    }

    #[tokio::test]
    async fn checks_go_until_refused_and_again_once_a_controller_hands_out_credentials() {
        let probe = metalguard_api::protocol::BmcReachability {
            host: "cp-2".into(),
            reachable: true,
            checked_at: Timestamp(1),
            error: None,
            check: Some(metalguard_api::protocol::BmcCheck {
                failure: None,
                power_state: Some("on".into()),
                identity: None,
                detail: "logged in".into(),
                credentials_id: None,
                request: None,
            }),
        };
        let report = || AgentReport {
            host: "cp-1".into(),
            agent_version: "t".into(),
            sequence: 1,
            boot_id: String::new(),
            sent_at: Timestamp(1),
            conditions: Vec::new(),
            etcd: None,
            bmc_reachability: vec![probe.clone()],
            unacknowledged_results: Vec::new(),
            holds: Vec::new(),
            seen_term: 0,
            host_identity: None,
        };
        let mut checks = CheckOffer::default();
        let mut sent = report();
        checks.fit(&mut sent);
        assert!(sent.bmc_reachability[0].check.is_some());
        let refused = LinkError::from_answer(answer(
            422,
            None,
            r#"{"error":"failed to deserialize the JSON body: check: unknown field"}"#,
        ))
        .await;
        let unavailable = LinkError::from_answer(answer(503, None, "{}")).await;
        assert!(
            !checks.refused(&sent, &unavailable),
            "not a refusal of the field"
        );
        assert!(checks.refused(&sent, &refused), "resent at once");
        let mut sent = report();
        checks.fit(&mut sent);
        assert_eq!(sent.bmc_reachability[0].check, None, "without checks");
        assert!(!checks.refused(&sent, &refused), "nothing left to drop");
        // An answer without credentials (the older controller) changes nothing.
        checks.answered(&ack(false));
        let mut sent = report();
        checks.fit(&mut sent);
        assert_eq!(sent.bmc_reachability[0].check, None);
        let mut handing = ack(false);
        handing.bmc_targets = vec![metalguard_api::protocol::BmcTarget {
            host: "cp-2".into(),
            bmc_address: "ipmi://cp-2-bmc".into(),
            tls: metalguard_api::protocol::BmcTrust::SystemRoots,
            credentials: Some(metalguard_api::protocol::BmcCredentials {
                username: "u".into(),
                password: metalguard_api::protocol::Secret::new("p"),
            }),
            expected_identity: None,
            credentials_id: None,
            credentials_new: false,
            check_request: None,
        }];
        checks.answered(&handing);
        let mut sent = report();
        checks.fit(&mut sent);
        assert!(sent.bmc_reachability[0].check.is_some(), "checks again");
    }
}
