//! Carries out one controller command, at most once per operation id, and turns what happened
//! into a [`CommandResult`] with its timeline.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use metalguard_api::duration::Timestamp;
use metalguard_api::protocol::{
    BmcTrust, Command, CommandKind, CommandResult, FenceCommand, Outcome, PowerAction,
    TimelineDirection, TimelineEntry,
};
use metalguard_bmc::{
    Bmc, CallTimeouts, Credentials, Direction, FenceAction, FenceOptions, PowerControl, TlsTrust,
};
use metalguard_etcd::ClientSettings;

use super::journal::{Claim, Journal, interrupted_result};
use super::probes::now_ms;

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
    ca_dir: PathBuf,
    fence: FenceOptions,
}

impl Executor {
    /// An executor recording into `journal`; etcd commands need `etcd` settings.
    pub fn new(
        journal: Journal,
        etcd: Option<ClientSettings>,
        state_dir: &std::path::Path,
    ) -> Self {
        Self {
            journal,
            etcd,
            ca_dir: state_dir.join("bmc-ca"),
            fence: FenceOptions::default(),
        }
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
    pub async fn handle(&self, command: Command) -> std::io::Result<CommandResult> {
        let op = command.operation_id.clone();
        match self.journal.claim(&op)? {
            Claim::Finished(result) => {
                tracing::info!(operation = %op, "command already executed; reporting its result again");
                Ok(*result)
            }
            Claim::Interrupted => {
                tracing::warn!(operation = %op, "command was interrupted by an agent restart; not running it again");
                let result = interrupted_result(&op, Timestamp(now_ms()));
                self.journal.finish(&result)?;
                Ok(result)
            }
            Claim::New => {
                tracing::info!(operation = %op, kind = command.kind.name(), "executing command");
                let started_at = Timestamp(now_ms());
                let (outcome, timeline, error) = Box::pin(self.run(&command.kind)).await;
                let result = CommandResult {
                    operation_id: op,
                    outcome,
                    started_at,
                    finished_at: Timestamp(now_ms()),
                    timeline,
                    error,
                };
                tracing::info!(operation = %result.operation_id, outcome = result.outcome.name(), error = ?result.error, "command finished");
                self.journal.finish(&result)?;
                Ok(result)
            }
        }
    }

    async fn run(&self, kind: &CommandKind) -> (Outcome, Vec<TimelineEntry>, Option<String>) {
        match kind {
            CommandKind::Fence(fence) => self.run_fence(fence).await,
            CommandKind::EtcdPromote { member_id } => {
                Box::pin(self.run_etcd(true, *member_id)).await
            }
            CommandKind::EtcdRemove { member_id } => {
                Box::pin(self.run_etcd(false, *member_id)).await
            }
            CommandKind::EtcdJoinGoAhead { .. } => rejected(
                "this agent runs the learner join with `metalguard-agent etcd join`, not from the daemon",
            ),
            CommandKind::EtcdMoveLeader { .. } => {
                rejected("this agent does not move etcd leadership yet")
            }
        }
    }

    async fn run_fence(
        &self,
        command: &FenceCommand,
    ) -> (Outcome, Vec<TimelineEntry>, Option<String>) {
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
        let outcome = metalguard_bmc::fence(&mut bmc, action, &self.fence).await;
        let _ = bmc.close().await;
        let timeline = outcome
            .timeline
            .entries()
            .iter()
            .map(|e| TimelineEntry {
                elapsed_ms: u64::try_from(e.elapsed.as_millis()).unwrap_or(u64::MAX),
                direction: match e.direction {
                    Direction::Sent => TimelineDirection::Sent,
                    Direction::Seen => TimelineDirection::Seen,
                    Direction::Note => TimelineDirection::Note,
                },
                what: e.what.clone(),
            })
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

    async fn run_etcd(
        &self,
        promote: bool,
        member_id: u64,
    ) -> (Outcome, Vec<TimelineEntry>, Option<String>) {
        let Some(settings) = &self.etcd else {
            return rejected("this agent has no [etcd] configuration");
        };
        let started = Instant::now();
        let (what, result) = if promote {
            let r = Box::pin(metalguard_etcd::ops::promote(
                settings,
                member_id,
                metalguard_etcd::ops::DEFAULT_PROMOTE_RETRY,
            ))
            .await;
            (
                format!("promote member {member_id:x}"),
                r.map(|p| format!("{p:?}")),
            )
        } else {
            let r = Box::pin(metalguard_etcd::ops::remove(settings, member_id)).await;
            (
                format!("remove member {member_id:x}"),
                r.map(|p| format!("{p:?}")),
            )
        };
        let elapsed_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let mut timeline = vec![TimelineEntry {
            elapsed_ms: 0,
            direction: TimelineDirection::Sent,
            what: what.clone(),
        }];
        match result {
            Ok(done) => {
                timeline.push(TimelineEntry {
                    elapsed_ms,
                    direction: TimelineDirection::Seen,
                    what: done,
                });
                (Outcome::Succeeded, timeline, None)
            }
            Err(err) => {
                let message = format!("{what}: {}", error_chain(&err));
                timeline.push(TimelineEntry {
                    elapsed_ms,
                    direction: TimelineDirection::Seen,
                    what: message.clone(),
                });
                (Outcome::Failed, timeline, Some(message))
            }
        }
    }

    fn trust(&self, trust: &BmcTrust) -> Result<TlsTrust, String> {
        Ok(match trust {
            BmcTrust::SystemRoots => TlsTrust::SystemRoots,
            BmcTrust::Insecure => TlsTrust::Insecure,
            BmcTrust::Fingerprint { sha256 } => TlsTrust::Fingerprint(
                metalguard_bmc::tls::parse_fingerprint(sha256).map_err(|e| e.to_string())?,
            ),
            BmcTrust::CaPem { pem } => {
                std::fs::create_dir_all(&self.ca_dir)
                    .map_err(|e| format!("{}: {e}", self.ca_dir.display()))?;
                let digest = metalguard_bmc::tls::hex(
                    &metalguard_bmc::tls::certificate_fingerprint(pem.as_bytes()),
                );
                let path = self.ca_dir.join(format!("{}.pem", &digest[..16]));
                std::fs::write(&path, pem).map_err(|e| format!("{}: {e}", path.display()))?;
                TlsTrust::CaBundle(path)
            }
        })
    }
}

fn rejected(why: &str) -> (Outcome, Vec<TimelineEntry>, Option<String>) {
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
