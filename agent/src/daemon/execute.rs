//! Carries out one controller command, at most once per operation id, and turns what happened
//! into a [`CommandResult`] with its timeline.
//!
//! Most commands finish within seconds and run in the command loop. A join go-ahead can take
//! minutes (catch-up of a large database), so it runs in the background
//! ([`Executor::start_background`]); while it runs, the controller keeps listing it and the
//! loop skips it ([`Executor::is_running`]), and reports and other commands go on.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::OperationId;
use metalguard_api::protocol::{
    BmcTrust, Command, CommandKind, CommandResult, FenceCommand, Outcome, PowerAction, PromotedBy,
    TimelineDirection, TimelineEntry,
};
use metalguard_api::text::escaped;
use metalguard_bmc::{
    Bmc, CallTimeouts, Credentials, Direction, FenceAction, FenceOptions, PowerControl, TlsTrust,
};
use metalguard_etcd::ClientSettings;
use metalguard_etcd::leader::LeaderMoved;
use metalguard_etcd::ops::Promoted;

use super::join::Joiner;
use super::journal::{Claim, Journal, interrupted_result};
use super::probes::now_ms;
use super::terms::{Admission, Terms};

/// What running a command produced: its outcome, timeline and error.
pub type Run = (Outcome, Vec<TimelineEntry>, Option<String>);

/// Per-call timeouts for fences the controller asks for.
const FENCE_CALL_TIMEOUTS: CallTimeouts = CallTimeouts {
    connect: Duration::from_secs(3),
    request: Duration::from_secs(10),
};

/// Executes commands for this agent.
#[derive(Debug, Clone)]
pub struct Executor {
    journal: Journal,
    etcd: Option<ClientSettings>,
    joiner: Option<Arc<Joiner>>,
    running: Arc<Mutex<HashSet<OperationId>>>,
    ca_dir: PathBuf,
    fence: FenceOptions,
    holds: crate::holds::HoldStore,
    terms: Terms,
}

impl Executor {
    /// An executor recording into `journal` (where the leadership term is kept too); etcd
    /// commands need `etcd` settings, the join go-ahead also a `joiner` (`[etcd.join]`).
    /// Fails when the kept term cannot be read.
    pub fn new(
        journal: Journal,
        etcd: Option<ClientSettings>,
        joiner: Option<Joiner>,
        state_dir: &std::path::Path,
    ) -> std::io::Result<Self> {
        let terms = Terms::load(journal.dir())?;
        Ok(Self {
            journal,
            etcd,
            joiner: joiner.map(Arc::new),
            running: Arc::default(),
            ca_dir: state_dir.join("bmc-ca"),
            fence: FenceOptions::default(),
            holds: crate::holds::HoldStore::new(state_dir),
            terms,
        })
    }

    /// The highest leadership term seen (kept across restarts).
    pub fn terms(&self) -> &Terms {
        &self.terms
    }

    /// The break-glass holds recorded on this host.
    pub fn holds(&self) -> &crate::holds::HoldStore {
        &self.holds
    }

    /// The join go-ahead's runner, if configured.
    #[cfg(test)]
    pub fn joiner(&self) -> Option<&Joiner> {
        self.joiner.as_deref()
    }

    /// Whether `kind` runs in the background (it may take minutes).
    pub fn runs_in_background(kind: &CommandKind) -> bool {
        matches!(kind, CommandKind::EtcdJoinGoAhead {})
    }

    /// Whether a command an earlier agent process started may run again after a restart.
    /// The join resumes from its own persisted state. A power-on changes nothing where it
    /// already took (a host that is on stays on) and is what the remediation waits for: left
    /// undone it kept a host off, its quorum seat empty, until a person acted (the Kubernetes
    /// soak: the executor's agent was killed during a power-on). Power-off and reboot cut a
    /// host's power: they run at most once.
    pub fn safe_to_run_again(kind: &CommandKind) -> bool {
        Self::runs_in_background(kind)
            || matches!(kind, CommandKind::Fence(f) if f.action == PowerAction::On)
    }

    /// Whether `op` is running in the background in this process.
    pub fn is_running(&self, op: &OperationId) -> bool {
        self.running_set().contains(op)
    }

    fn running_set(&self) -> std::sync::MutexGuard<'_, HashSet<OperationId>> {
        // A poisoned set only means a task panicked while holding it; the set is still valid.
        self.running
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Starts `command` in a task, unless the same operation id already runs here. The task
    /// executes it like [`Executor::handle`] (journal, at most once) and returns its result.
    pub fn start_background(
        &self,
        command: Command,
    ) -> Option<tokio::task::JoinHandle<std::io::Result<CommandResult>>> {
        let op = command.operation_id.clone();
        if !self.running_set().insert(op.clone()) {
            return None;
        }
        let executor = self.clone();
        Some(tokio::spawn(async move {
            let result = Box::pin(executor.handle(command)).await;
            executor.running_set().remove(&op);
            result
        }))
    }

    /// How this agent reaches etcd, if configured.
    pub fn etcd_settings(&self) -> Option<&ClientSettings> {
        self.etcd.as_ref()
    }

    /// The journal (for pending results).
    pub fn journal(&self) -> &Journal {
        &self.journal
    }

    /// Runs `command` unless this operation id was seen before; returns the result to report.
    ///
    /// A command of an older leadership term than this agent has seen is refused first: the
    /// refusal (outcome `rejected`, naming both terms) is returned to be reported and is not
    /// written to the journal, so the operation stays open for the current leadership's offer.
    pub async fn handle(&self, command: Command) -> std::io::Result<CommandResult> {
        let op = command.operation_id.clone();
        match self.terms.admit(command.term) {
            Ok(()) => {}
            Err(Admission::Older(_)) if super::mutation::skips("skip-term-check") => {}
            Err(Admission::Older(older)) => {
                tracing::warn!(operation = %op, kind = command.kind.name(), offered = older.offered, seen = older.seen, "command of an older leadership refused");
                let now = Timestamp(now_ms());
                let (outcome, timeline, error) = rejected(&older.to_string());
                return Ok(CommandResult {
                    operation_id: op,
                    outcome,
                    started_at: now,
                    finished_at: now,
                    timeline,
                    error,
                    promoted_by: None,
                    term: command.term,
                });
            }
            Err(Admission::Unrecorded(err)) => return Err(std::io::Error::other(err)),
        }
        match self.journal.claim(&op)? {
            Claim::Finished(result) => {
                tracing::info!(operation = %op, "command already executed; reporting its result again");
                Ok(*result)
            }
            // Safe to repeat ([`Executor::safe_to_run_again`]): finish what was started.
            Claim::Interrupted if Self::safe_to_run_again(&command.kind) => {
                tracing::info!(operation = %op, kind = command.kind.name(), "running again a command interrupted by an agent restart (safe to repeat)");
                Box::pin(self.execute(command)).await
            }
            Claim::Interrupted => {
                tracing::warn!(operation = %op, "command was interrupted by an agent restart; not running it again");
                let result = interrupted_result(&op, Timestamp(now_ms()));
                self.journal.finish(&result)?;
                Ok(result)
            }
            Claim::New => Box::pin(self.execute(command)).await,
        }
    }

    /// Runs a claimed command and records its result.
    async fn execute(&self, command: Command) -> std::io::Result<CommandResult> {
        let (target, action) = match &command.kind {
            CommandKind::Fence(f) => (f.target.as_str(), power_name(f.action)),
            _ => ("-", "-"),
        };
        tracing::info!(operation = %command.operation_id, kind = command.kind.name(), term = command.term, target, action, "executing command");
        let started_at = Timestamp(now_ms());
        let term = command.term;
        let ((outcome, timeline, error), promoted_by) = match command.kind {
            CommandKind::EtcdPromote { member_id } => Box::pin(self.run_promote(member_id)).await,
            ref kind => (Box::pin(self.run(kind)).await, None),
        };
        let result = CommandResult {
            operation_id: command.operation_id,
            outcome,
            started_at,
            finished_at: Timestamp(now_ms()),
            timeline,
            error,
            promoted_by,
            term,
        };
        tracing::info!(operation = %result.operation_id, outcome = result.outcome.name(), error = ?result.error, "command finished");
        self.journal.finish(&result)?;
        Ok(result)
    }

    async fn run(&self, kind: &CommandKind) -> Run {
        match kind {
            CommandKind::Fence(fence) => self.run_fence(fence).await,
            CommandKind::EtcdPromote { member_id } => {
                Box::pin(self.run_promote(*member_id)).await.0
            }
            CommandKind::EtcdRemove { member_id } => {
                Box::pin(self.run_etcd(EtcdChange::Remove(*member_id))).await
            }
            CommandKind::EtcdMoveLeader { to_member } => {
                Box::pin(self.run_etcd(EtcdChange::MoveLeader(*to_member))).await
            }
            CommandKind::EtcdJoinGoAhead {} => match (&self.joiner, &self.etcd) {
                (Some(joiner), Some(_)) => Box::pin(joiner.go_ahead()).await,
                _ => rejected(
                    "this agent has no [etcd.join] configuration: it cannot join its etcd member (add [etcd] and [etcd.join] to agent.toml)",
                ),
            },
        }
    }

    async fn run_fence(&self, command: &FenceCommand) -> Run {
        // Defence in depth: the controller does not send these, but a hold that reached it
        // late (or not at all) must still keep this host's hands off the held host's power.
        match self.holds.held(&command.target) {
            Ok(Some(hold)) => {
                return rejected(&format!(
                    "{} is held by break-glass hold {} (power {} by {} at {}: {}); this agent does not touch its power until a person runs `metalguard-controller release {}`",
                    command.target,
                    escaped(&hold.id),
                    escaped(&hold.action),
                    escaped(&hold.by),
                    hold.since,
                    escaped(&hold.reason),
                    command.target
                ));
            }
            Ok(None) => {}
            Err(err) => {
                return rejected(&format!(
                    "the break-glass holds of this host cannot be read, so a hold of {} cannot be ruled out: {}",
                    command.target,
                    error_chain(&err)
                ));
            }
        }
        // The last line of defence against any controller bug: this agent counts etcd's
        // healthy voters itself before it cuts a host's power.
        let checked = match command.action {
            PowerAction::Off | PowerAction::Reboot
                if super::mutation::skips("skip-quorum-check") =>
            {
                None
            }
            PowerAction::Off | PowerAction::Reboot => {
                match super::power_check::check_power_cut(command, self.etcd.as_ref()).await {
                    Ok(counted) => Some(counted),
                    Err(refusal) => return rejected(&refusal),
                }
            }
            PowerAction::On => None,
        };
        let address = match command.bmc_address.parse::<metalguard_bmc::BmcAddress>() {
            Ok(address) => address,
            Err(err) => return rejected(&format!("bmc address of {}: {err}", command.target)),
        };
        let trust = match self.trust(&command.tls) {
            Ok(trust) => trust,
            Err(err) => {
                return rejected(&format!("tls trust for bmc of {}: {err}", command.target));
            }
        };
        if trust == TlsTrust::Insecure {
            tracing::warn!(target_host = %command.target, "fencing over TLS without certificate verification (explicit opt-in)");
        }
        let credentials = Credentials::new(
            command.credentials.username.clone(),
            command.credentials.password.expose(),
        );
        let mut bmc = match Bmc::new(&address, credentials, &trust, FENCE_CALL_TIMEOUTS) {
            Ok(bmc) => bmc,
            Err(err) => return rejected(&format!("bmc client for {}: {err}", command.target)),
        };
        let action = match command.action {
            PowerAction::Off => FenceAction::Off,
            PowerAction::On => FenceAction::On,
            PowerAction::Reboot => FenceAction::Reboot,
        };
        let identity = match super::identity_gate::check(&mut bmc, command).await {
            Ok(note) => note,
            Err(refusal) => {
                let _ = bmc.close().await;
                return rejected(&refusal);
            }
        };
        let outcome = metalguard_bmc::fence(&mut bmc, action, &self.fence).await;
        let _ = bmc.close().await;
        let notes = checked
            .into_iter()
            .chain(identity)
            .map(|what| TimelineEntry {
                elapsed_ms: 0,
                direction: TimelineDirection::Note,
                what,
            });
        let timeline = notes
            .chain(outcome.timeline.entries().iter().map(|e| TimelineEntry {
                elapsed_ms: u64::try_from(e.elapsed.as_millis()).unwrap_or(u64::MAX),
                direction: match e.direction {
                    Direction::Sent => TimelineDirection::Sent,
                    Direction::Seen => TimelineDirection::Seen,
                    Direction::Note => TimelineDirection::Note,
                },
                what: e.what.clone(),
            }))
            .collect();
        let error = outcome
            .status
            .error()
            .map(|e| format!("{}: {}", outcome.status.summary(), error_chain(e)));
        let result = if outcome.status.is_success() {
            Outcome::Succeeded
        } else {
            Outcome::Failed
        };
        (result, timeline, error)
    }

    /// Promotes a learner and says who promoted it: this command, or someone before it (a
    /// voter already: kubeadm's learner mode promotes its own learner, or a person did).
    async fn run_promote(&self, member_id: u64) -> (Run, Option<PromotedBy>) {
        let Some(settings) = &self.etcd else {
            return (rejected("this agent has no [etcd] configuration"), None);
        };
        let mut timeline = Timeline::start();
        let what = format!("promote member {member_id:x}");
        timeline.push(TimelineDirection::Sent, what.clone());
        let promoted = Box::pin(metalguard_etcd::ops::promote(
            settings,
            member_id,
            metalguard_etcd::ops::DEFAULT_PROMOTE_RETRY,
        ))
        .await;
        match promoted {
            Ok(promoted) => {
                let (by, seen) = describe_promotion(member_id, promoted);
                tracing::info!(
                    member_id,
                    promoted_by = by.name(),
                    "etcd promotion finished"
                );
                timeline.push(TimelineDirection::Seen, seen);
                (timeline.succeeded(), Some(by))
            }
            Err(err) => {
                let message = format!("{what}: {}", error_chain(&err));
                timeline.push(TimelineDirection::Seen, message.clone());
                (timeline.failed(message), None)
            }
        }
    }

    async fn run_etcd(&self, change: EtcdChange) -> Run {
        let Some(settings) = &self.etcd else {
            return rejected("this agent has no [etcd] configuration");
        };
        let mut timeline = Timeline::start();
        let what = change.describe();
        timeline.push(TimelineDirection::Sent, what.clone());
        let result = match change {
            EtcdChange::Remove(id) => Box::pin(metalguard_etcd::ops::remove(settings, id))
                .await
                .map(|r| format!("{r:?}")),
            EtcdChange::MoveLeader(to) => Box::pin(metalguard_etcd::ops::move_leader(settings, to))
                .await
                .map(|moved| match moved {
                    LeaderMoved::Moved { from, took } => format!(
                        "leadership moved from member {from:x} to member {to:x} in {} ms",
                        took.as_millis()
                    ),
                    LeaderMoved::AlreadyLeader => format!("member {to:x} already leads"),
                }),
        };
        match result {
            Ok(done) => {
                timeline.push(TimelineDirection::Seen, done);
                timeline.succeeded()
            }
            Err(err) => {
                let message = format!("{what}: {}", error_chain(&err));
                timeline.push(TimelineDirection::Seen, message.clone());
                timeline.failed(message)
            }
        }
    }

    fn trust(&self, trust: &BmcTrust) -> Result<TlsTrust, String> {
        tls_trust(&self.ca_dir, trust)
    }

    /// Where CA bundles sent by the controller are written.
    pub fn ca_dir(&self) -> &std::path::Path {
        &self.ca_dir
    }
}

/// The BMC client's trust for the controller's `trust`; a CA bundle is written to `ca_dir`
/// (named by its digest) because the BMC client reads bundles from files.
pub fn tls_trust(ca_dir: &std::path::Path, trust: &BmcTrust) -> Result<TlsTrust, String> {
    Ok(match trust {
        BmcTrust::SystemRoots => TlsTrust::SystemRoots,
        BmcTrust::Insecure => TlsTrust::Insecure,
        BmcTrust::Fingerprint { sha256 } => TlsTrust::Fingerprint(
            metalguard_bmc::tls::parse_fingerprint(sha256).map_err(|e| e.to_string())?,
        ),
        BmcTrust::CaPem { pem } => {
            std::fs::create_dir_all(ca_dir).map_err(|e| format!("{}: {e}", ca_dir.display()))?;
            let digest = metalguard_bmc::tls::hex(&metalguard_bmc::tls::certificate_fingerprint(
                pem.as_bytes(),
            ));
            let path = ca_dir.join(format!("{}.pem", &digest[..16]));
            std::fs::write(&path, pem).map_err(|e| format!("{}: {e}", path.display()))?;
            TlsTrust::CaBundle(path)
        }
    })
}

/// Who promoted member `id`, and the timeline entry that says so.
fn describe_promotion(id: u64, promoted: Promoted) -> (PromotedBy, String) {
    match promoted {
        Promoted::Promoted { attempts } => (
            PromotedBy::Metalguard,
            format!("member {id:x} promoted by this command ({attempts} call(s))"),
        ),
        Promoted::AlreadyVoter => (
            PromotedBy::Outside,
            format!(
                "member {id:x} was a voter already: promoted outside metalguard (kubeadm's learner mode or a person), not by this command"
            ),
        ),
    }
}

/// An etcd change the controller asks for (a promotion runs on its own:
/// [`Executor::run_promote`]).
#[derive(Debug, Clone, Copy)]
enum EtcdChange {
    Remove(u64),
    MoveLeader(u64),
}

impl EtcdChange {
    fn describe(self) -> String {
        match self {
            Self::Remove(id) => format!("remove member {id:x}"),
            Self::MoveLeader(id) => format!("move etcd leadership to member {id:x}"),
        }
    }
}

/// A command's timeline, timed from its start.
#[derive(Debug)]
pub struct Timeline {
    started: Instant,
    entries: Vec<TimelineEntry>,
}

impl Timeline {
    /// A timeline starting now.
    pub fn start() -> Self {
        Self {
            started: Instant::now(),
            entries: Vec::new(),
        }
    }

    /// Records an entry at the time elapsed since the start.
    pub fn push(&mut self, direction: TimelineDirection, what: String) {
        self.entries.push(TimelineEntry {
            elapsed_ms: u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX),
            direction,
            what,
        });
    }

    /// The run succeeded.
    pub fn succeeded(self) -> Run {
        (Outcome::Succeeded, self.entries, None)
    }

    /// The run failed with `error` (also the last timeline entry, unless it is already).
    pub fn failed(mut self, error: String) -> Run {
        if self.entries.last().is_none_or(|e| e.what != error) {
            self.push(TimelineDirection::Seen, error.clone());
        }
        tracing::warn!(error = %error, "command failed");
        (Outcome::Failed, self.entries, Some(error))
    }
}

/// A power action's name in logs (`off`, `on`, `reboot`).
fn power_name(action: PowerAction) -> &'static str {
    match action {
        PowerAction::Off => "off",
        PowerAction::On => "on",
        PowerAction::Reboot => "reboot",
    }
}

fn rejected(why: &str) -> Run {
    tracing::warn!(reason = %why, "command rejected");
    (
        Outcome::Rejected,
        vec![TimelineEntry {
            elapsed_ms: 0,
            direction: TimelineDirection::Note,
            what: why.to_owned(),
        }],
        Some(why.to_owned()),
    )
}

/// An error and its causes, one after the other.
pub fn error_chain(err: &dyn std::error::Error) -> String {
    let mut parts = vec![err.to_string()];
    let mut source = err.source();
    while let Some(cause) = source {
        parts.push(cause.to_string());
        source = cause.source();
    }
    parts.join(": ")
}

#[cfg(test)]
mod tests {
    use metalguard_api::protocol::{BmcCredentials, Secret};
    use metalguard_api::snapshot::Hold;

    use super::*;

    fn fence_of(target: &str, id: &str) -> Command {
        Command {
            operation_id: OperationId(id.into()),
            issued_at: Timestamp(1),
            kind: CommandKind::Fence(FenceCommand {
                target: target.into(),
                action: PowerAction::Off,
                // Nothing listens here: a fence that got as far as the BMC fails, not rejects.
                bmc_address: "redfish+http://127.0.0.1:9/redfish/v1/Systems/1".into(),
                tls: BmcTrust::SystemRoots,
                credentials: BmcCredentials {
                    username: "admin".into(),
                    password: Secret::new("pw"),
                },
                etcd_member: None,
                forced: None,
                expected_identity: None,
            }),
            term: 0,
        }
    }

    fn executor_in(state: &std::path::Path) -> Executor {
        Executor::new(Journal::open(state).unwrap(), None, None, state).unwrap()
    }

    #[tokio::test]
    async fn a_command_of_an_older_term_is_refused_unjournaled_and_the_term_survives_a_restart() {
        let state = tempfile::tempdir().unwrap();
        let executor = executor_in(state.path());
        let mut newer = fence_of("cp-3", "op-9");
        newer.term = 12;
        // Term 12 is admitted (and the fence fails at the BMC: nobody listens).
        let ran = executor.handle(newer).await.unwrap();
        assert_eq!((ran.outcome, ran.term), (Outcome::Failed, 12), "{ran:?}");
        // A restarted agent still knows term 12 and refuses term 11 before any BMC traffic.
        let restarted = executor_in(state.path());
        assert_eq!(restarted.terms().highest(), 12);
        let mut older = fence_of("cp-1", "op-10");
        older.term = 11;
        let refused = restarted.handle(older.clone()).await.unwrap();
        assert_eq!(refused.outcome, Outcome::Rejected, "{refused:?}");
        assert_eq!(refused.term, 11);
        let error = refused.error.unwrap();
        assert!(
            error.contains("term 11 refused") && error.contains("seen term 12"),
            "{error}"
        );
        // Not journaled: the same operation offered by the current leadership runs.
        older.term = 12;
        let offered_again = restarted.handle(older).await.unwrap();
        assert_eq!(offered_again.outcome, Outcome::Failed, "{offered_again:?}");
        // A command without a term (a controller that predates terms) is refused too now.
        let mut untermed = fence_of("cp-1", "op-11");
        untermed.term = 0;
        assert_eq!(
            restarted.handle(untermed).await.unwrap().outcome,
            Outcome::Rejected
        );
    }

    #[tokio::test]
    async fn after_a_restart_an_interrupted_power_on_runs_again_and_a_power_off_does_not() {
        let state = tempfile::tempdir().unwrap();
        let mut on = fence_of("cp-3", "op-on");
        on.term = 5;
        if let CommandKind::Fence(fence) = &mut on.kind {
            fence.action = PowerAction::On;
        }
        let mut off = fence_of("cp-3", "op-off");
        off.term = 5;
        // An earlier process claimed both and died before any result.
        let journal = Journal::open(state.path()).unwrap();
        assert_eq!(journal.claim(&on.operation_id).unwrap(), Claim::New);
        assert_eq!(journal.claim(&off.operation_id).unwrap(), Claim::New);
        let restarted = executor_in(state.path());
        // The power-on goes to the BMC again (nobody listens here: it fails there).
        let ran = restarted.handle(on).await.unwrap();
        assert_eq!(ran.outcome, Outcome::Failed, "{ran:?}");
        assert!(
            !ran.error.as_deref().unwrap_or("").contains("restarted"),
            "{ran:?}"
        );
        // The power-off is not repeated: its effect is unknown.
        let not_run = restarted.handle(off).await.unwrap();
        assert!(
            not_run.error.as_deref().unwrap_or("").contains("restarted"),
            "{not_run:?}"
        );
    }

    #[tokio::test]
    async fn an_agent_without_etcd_access_refuses_to_cut_a_member_hosts_power() {
        let state = tempfile::tempdir().unwrap();
        let executor = executor_in(state.path());
        let mut command = fence_of("cp-1", "op-1");
        if let CommandKind::Fence(fence) = &mut command.kind {
            fence.etcd_member = Some(0xabc);
        }
        let refused = executor.handle(command).await.unwrap();
        assert_eq!(refused.outcome, Outcome::Rejected, "{refused:?}");
        assert!(
            refused
                .error
                .as_deref()
                .unwrap_or("")
                .contains("holds member abc"),
            "{refused:?}"
        );
        // Forced by a person: the check is skipped, said so, and the fence goes ahead.
        let mut forced = fence_of("cp-1", "op-2");
        if let CommandKind::Fence(fence) = &mut forced.kind {
            fence.etcd_member = Some(0xabc);
            fence.forced = Some(metalguard_api::protocol::ForcedBy {
                by: "alice".into(),
                reason: "disk controller wedged".into(),
            });
        }
        let ran = executor.handle(forced).await.unwrap();
        assert_eq!(ran.outcome, Outcome::Failed, "{ran:?}");
        assert!(
            ran.timeline[0]
                .what
                .contains("forced by alice (disk controller wedged)"),
            "{:?}",
            ran.timeline
        );
    }

    #[tokio::test]
    async fn a_power_command_for_a_host_held_here_is_refused_before_any_bmc_traffic() {
        let state = tempfile::tempdir().unwrap();
        let executor = executor_in(state.path());
        executor
            .holds()
            .record(&Hold {
                id: "cp-2/5".into(),
                target: "cp-1".into(),
                since: Timestamp(5),
                by: "alice on cp-2".into(),
                reason: "disk resets".into(),
                action: "off".into(),
            })
            .unwrap();
        let held = executor.handle(fence_of("cp-1", "op-1")).await.unwrap();
        assert_eq!(held.outcome, Outcome::Rejected, "{held:?}");
        let error = held.error.unwrap();
        assert!(
            error
                .starts_with("cp-1 is held by break-glass hold cp-2/5 (power off by alice on cp-2")
                && error.contains("metalguard-controller release cp-1"),
            "{error}"
        );
        assert_eq!(
            held.timeline.len(),
            1,
            "no request was sent: {:?}",
            held.timeline
        );
        // Another host is not held: its fence goes to the BMC (and fails: nobody listens).
        let other = executor.handle(fence_of("cp-3", "op-2")).await.unwrap();
        assert_eq!(other.outcome, Outcome::Failed, "{other:?}");
        // Released (the record deleted): the held host's power may be driven again.
        assert!(executor.holds().remove("cp-2/5").unwrap());
        let again = executor.handle(fence_of("cp-1", "op-3")).await.unwrap();
        assert_eq!(again.outcome, Outcome::Failed, "{again:?}");
    }
}
