//! The meeting point of the API server and the controller loop.
//!
//! The loop publishes, per host, the commands whose intent is persisted and whose result is
//! not in yet ([`Hub::publish`]); long-polls wait on a per-host [`Notify`] and return within
//! milliseconds of a publish. Reports and results go the other way through an mpsc inbox;
//! a result is acknowledged only after the loop has persisted it.
//!
//! The hub also holds who may speak at all ([`Hub::admits`]): the hosts of the inventory in
//! force, less those retired and verified off, and no certificate on the deny list.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use metalguard_api::duration::Timestamp;
use metalguard_api::protocol::{
    AgentReport, BmcTarget, Command, CommandResult, HoldAck, ResultAck,
};
use metalguard_api::snapshot::Hold;
use tokio::sync::{Notify, mpsc, oneshot};
use tokio::time::Instant;

use crate::pki::revocation::{CertIdentity, Revoked};

/// Something an agent sent, for the controller loop.
#[derive(Debug)]
pub enum Inbound {
    /// A report, already checked against the client certificate, with the time the agent API
    /// took it. The loop may handle it much later (a round blocked on a stalled store): a
    /// report stamped when handled would look fresh after the stall and speak for a cluster
    /// it no longer describes.
    Report {
        /// The report.
        report: AgentReport,
        /// When the agent API received it (the time its answer carries too).
        received_at: Timestamp,
    },
    /// A command result from `host`; `reply` receives the ack once it is persisted.
    Result {
        /// The reporting agent.
        host: String,
        /// Its client certificate (recorded as who executed the operation).
        certificate: CertIdentity,
        /// The result.
        result: CommandResult,
        /// Where the acknowledgement goes.
        reply: oneshot::Sender<Result<ResultAck, ResultError>>,
    },
    /// A break-glass hold posted by `host`'s agent certificate (its id already checked to
    /// start with `host/`); `reply` receives the ack once it is persisted.
    Hold {
        /// The posting agent's host.
        host: String,
        /// The hold.
        hold: Hold,
        /// Where the acknowledgement goes.
        reply: oneshot::Sender<Result<HoldAck, HoldError>>,
    },
}

/// Why a posted hold was not recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HoldError {
    /// The hold can never be recorded (its target is not an inventory host): 422.
    Invalid(String),
    /// The hold's id was released by a person: it is not honoured again: 409.
    Released(String),
    /// The store is unavailable; retry: 503.
    Unavailable(String),
}

/// Why a result was not recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ResultError {
    /// The result can never be recorded (unknown operation, another host's operation): 409.
    Rejected(String),
    /// The store is unavailable; the agent should retry: 503.
    Unavailable(String),
}

#[derive(Debug, Default)]
struct Queue {
    commands: Vec<Command>,
    notify: Arc<Notify>,
    polling: usize,
}

/// Shared state between the server and the loop.
#[derive(Debug)]
pub struct Hub {
    /// Leadership is valid until this instant (the lease certainly holds until then).
    leader_until: Mutex<Option<Instant>>,
    /// The term of the leadership under way (0 while not leading).
    term: std::sync::atomic::AtomicU64,
    queues: Mutex<HashMap<String, Queue>>,
    inbox: mpsc::Sender<Inbound>,
    /// Every inventory BMC without credentials, answered to each report (less the reporter's).
    bmc_targets: Mutex<Vec<BmcTarget>>,
    /// Per fence target, what its would-be executor gets for its read-only checks
    /// ([`Hub::set_check_grants`]).
    check_grants: Mutex<BTreeMap<String, CheckGrant>>,
    /// Ids of released break-glass holds, answered to a report that still carries one.
    released_holds: Mutex<BTreeSet<String>>,
    /// Who may speak: the inventory's hosts and the retired ones among them.
    admission: Mutex<Admission>,
    /// The deny list in force (shared with the handshake verifier).
    revoked: Revoked,
    /// Per host, the end of validity (Unix seconds) of the certificate it was last admitted with.
    certificates: Mutex<BTreeMap<String, i64>>,
    /// Error answers of the agent API so far, by HTTP status.
    refusals: Mutex<BTreeMap<u16, u64>>,
    /// Per host, the release its agent last sent and whether the skew policy supports it.
    releases: Mutex<BTreeMap<String, (String, bool)>>,
    /// Reports accepted before the loop handled them, and spans this process was deaf.
    hearing: Mutex<crate::api::hearing::Hearing>,
}

/// What the agent that would execute a host's fence gets for its read-only checks of that
/// host's BMC (issue 25).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckGrant {
    /// The agent that would execute the fence.
    pub executor: String,
    /// The BMC's credentials, as a fence command would carry them.
    pub credentials: metalguard_api::protocol::BmcCredentials,
    /// The identity the host's own agent reported.
    pub expected_identity: Option<Box<metalguard_api::identity::SystemIdentity>>,
    /// Which credentials these are ([`BmcTarget::credentials_id`]).
    pub credentials_id: String,
    /// True for a rotation's new credentials ([`BmcTarget::credentials_new`]).
    pub credentials_new: bool,
    /// A person's on-demand check ([`BmcTarget::check_request`]).
    pub check_request: Option<String>,
}

/// The hosts whose certificates may use the agent API.
#[derive(Debug, Default)]
struct Admission {
    /// Every host of the inventory in force.
    hosts: BTreeSet<String>,
    /// Retired hosts whose power-off for the retirement is verified.
    retired: BTreeSet<String>,
}

impl Hub {
    /// A hub and the receiving end of its inbox.
    pub fn new() -> (Arc<Self>, mpsc::Receiver<Inbound>) {
        let (tx, rx) = mpsc::channel(1024);
        let hub = Self {
            leader_until: Mutex::new(None),
            term: std::sync::atomic::AtomicU64::new(0),
            queues: Mutex::new(HashMap::new()),
            inbox: tx,
            bmc_targets: Mutex::new(Vec::new()),
            check_grants: Mutex::new(BTreeMap::new()),
            released_holds: Mutex::new(BTreeSet::new()),
            admission: Mutex::new(Admission::default()),
            revoked: Revoked::default(),
            certificates: Mutex::new(BTreeMap::new()),
            releases: Mutex::new(BTreeMap::new()),
            refusals: Mutex::new(BTreeMap::new()),
            hearing: Mutex::new(crate::api::hearing::Hearing::default()),
        };
        (Arc::new(hub), rx)
    }

    fn queues(&self) -> MutexGuard<'_, HashMap<String, Queue>> {
        // A poisoned lock only means another thread panicked mid-update of plain data.
        self.queues
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn leader_until(&self) -> MutexGuard<'_, Option<Instant>> {
        self.leader_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// True while this controller holds leadership and its lease certainly holds: it expires
    /// by itself even while the controller loop is blocked on the store.
    pub fn is_leader(&self) -> bool {
        self.leader_until()
            .is_some_and(|until| Instant::now() < until)
    }

    /// Records leadership valid until `until` (`None`: not leading); losing it withdraws
    /// every published command.
    pub fn set_leader_until(&self, until: Option<Instant>) {
        let was = std::mem::replace(&mut *self.leader_until(), until).is_some();
        if was && until.is_none() {
            self.term.store(0, std::sync::atomic::Ordering::SeqCst);
            self.publish(&BTreeMap::new());
        }
    }

    /// The term of the leadership under way (0 while not leading): answered to agents that
    /// know terms with every report.
    pub fn term(&self) -> u64 {
        self.term.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Records the term of the leadership under way. A new term withdraws every command
    /// published before it: the new leadership offers its own after its first round.
    pub fn set_term(&self, term: u64) {
        let before = self.term.swap(term, std::sync::atomic::Ordering::SeqCst);
        if before != term {
            self.publish(&BTreeMap::new());
        }
    }

    /// Replaces the pending commands of every host; wakes the long-polls of hosts whose set
    /// changed.
    pub fn publish(&self, pending: &BTreeMap<String, Vec<Command>>) {
        let mut queues = self.queues();
        for (host, queue) in queues.iter_mut() {
            let next = pending.get(host).cloned().unwrap_or_default();
            if queue.commands != next {
                queue.commands = next;
                queue.notify.notify_waiters();
            }
        }
        for (host, commands) in pending {
            if !queues.contains_key(host) {
                queues.insert(
                    host.clone(),
                    Queue {
                        commands: commands.clone(),
                        ..Queue::default()
                    },
                );
            }
        }
    }

    /// Waits up to `wait` for `host` to have pending commands and returns them (empty when the
    /// wait ran out).
    pub async fn poll(&self, host: &str, wait: Duration) -> Vec<Command> {
        let notify = {
            let mut queues = self.queues();
            let queue = queues.entry(host.to_owned()).or_default();
            if !queue.commands.is_empty() {
                return queue.commands.clone();
            }
            queue.polling += 1;
            queue.notify.clone()
        };
        let deadline = tokio::time::Instant::now() + wait;
        let commands = loop {
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            let current = self.commands_of(host);
            if !current.is_empty() {
                break current;
            }
            if tokio::time::timeout_at(deadline, notified).await.is_err() {
                break Vec::new();
            }
        };
        if let Some(queue) = self.queues().get_mut(host) {
            queue.polling = queue.polling.saturating_sub(1);
        }
        commands
    }

    fn commands_of(&self, host: &str) -> Vec<Command> {
        self.queues()
            .get(host)
            .map(|q| q.commands.clone())
            .unwrap_or_default()
    }

    /// Number of hosts with a long-poll open right now.
    pub fn agents_polling(&self) -> usize {
        self.queues().values().filter(|q| q.polling > 0).count()
    }

    /// Replaces the BMC targets (at start and whenever the inventory is reloaded).
    pub fn set_bmc_targets(&self, targets: Vec<BmcTarget>) {
        *self
            .bmc_targets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = targets;
    }

    /// Replaces the check grants (each round, from the plan's would-be executors).
    pub fn set_check_grants(&self, grants: BTreeMap<String, CheckGrant>) {
        *self
            .check_grants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = grants;
    }

    /// The BMCs `host`'s agent may be asked to drive: every target but its own. With
    /// `checks` (the agent asked, `BMC_CHECKS_PARAM`), a target whose fence `host` would
    /// execute now carries the credentials and the expected identity for a read-only check;
    /// no other agent gets them, so one agent's certificate yields only the passwords of the
    /// BMCs it would drive anyway.
    pub fn bmc_targets_for(&self, host: &str, checks: bool) -> Vec<BmcTarget> {
        let grants = self
            .check_grants
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        self.bmc_targets
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|t| t.host != host)
            .map(|t| {
                let mut target = t.clone();
                if let Some(grant) = grants.get(&t.host).filter(|g| checks && g.executor == host) {
                    target.credentials = Some(grant.credentials.clone());
                    target
                        .expected_identity
                        .clone_from(&grant.expected_identity);
                    target.credentials_id = Some(grant.credentials_id.clone());
                    target.credentials_new = grant.credentials_new;
                    target.check_request.clone_from(&grant.check_request);
                }
                target
            })
            .collect()
    }

    /// Replaces the ids of released holds (every plan round, from the store).
    pub fn set_released_holds(&self, ids: BTreeSet<String>) {
        *self
            .released_holds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = ids;
    }

    /// The holds of `report` that a person has released (the agent deletes their records).
    pub fn released_among(&self, report: &AgentReport) -> Vec<String> {
        let released = self
            .released_holds
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        report
            .holds
            .iter()
            .filter(|h| released.contains(&h.id))
            .map(|h| h.id.clone())
            .collect()
    }

    fn admission(&self) -> MutexGuard<'_, Admission> {
        self.admission
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The hosts of the inventory in force (at start and on every accepted reload).
    pub fn set_hosts(&self, hosts: impl IntoIterator<Item = String>) {
        self.admission().hosts = hosts.into_iter().collect();
    }

    /// The retired hosts whose power-off is verified (after every load of the state).
    pub fn set_retired(&self, retired: BTreeSet<String>) {
        self.admission().retired = retired;
    }

    /// The deny list in force, for the handshake verifier and the reloads.
    pub fn revoked(&self) -> Revoked {
        self.revoked.clone()
    }

    /// Whether the holder of `certificate` may use the agent API: its host is in the
    /// inventory in force, not retired and verified off, and the certificate is not revoked.
    /// The error says why not (answered with 403).
    pub fn admits(&self, certificate: &CertIdentity) -> Result<(), String> {
        if let Some(why) = crate::pki::revocation::refused(&self.revoked, certificate) {
            return Err(format!(
                "client certificate for {}: {why}",
                certificate.host
            ));
        }
        let admission = self.admission();
        if !admission.hosts.contains(&certificate.host) {
            return Err(format!(
                "host {} is not in the inventory: its certificate may not use the agent api",
                certificate.host
            ));
        }
        if admission.retired.contains(&certificate.host) {
            return Err(format!(
                "host {} is retired and was powered off: its certificate may not use the agent api",
                certificate.host
            ));
        }
        drop(admission);
        self.certificates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(certificate.host.clone(), certificate.not_after);
        Ok(())
    }

    /// Counts one error answer of the agent API with `status`.
    pub fn count_refusal(&self, status: u16) {
        *self
            .refusals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .entry(status)
            .or_default() += 1;
    }

    /// Error answers of the agent API so far, by HTTP status.
    pub fn refusals(&self) -> BTreeMap<u16, u64> {
        self.refusals
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Records the release `host`'s agent sent, and whether the skew policy supports it;
    /// true when that differs from what it sent before (worth a log line).
    pub fn note_release(&self, host: &str, release: String, supported: bool) -> bool {
        let entry = (release, supported);
        self.releases
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(host.to_owned(), entry.clone())
            .is_none_or(|before| before != entry)
    }

    /// Per inventory host, the release its agent last sent and whether it is supported.
    pub fn agent_releases(&self) -> BTreeMap<String, (String, bool)> {
        let hosts = self.admission().hosts.clone();
        self.releases
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|(host, _)| hosts.contains(*host))
            .map(|(host, release)| (host.clone(), release.clone()))
            .collect()
    }

    /// Per inventory host, the end of validity (Unix seconds) of the certificate it was last
    /// admitted with.
    pub fn agent_certificates(&self) -> BTreeMap<String, i64> {
        let hosts = self.admission().hosts.clone();
        self.certificates
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .iter()
            .filter(|(host, _)| hosts.contains(*host))
            .map(|(host, end)| (host.clone(), *end))
            .collect()
    }

    fn hearing(&self) -> MutexGuard<'_, crate::api::hearing::Hearing> {
        self.hearing
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Records that the agent API accepted `host`'s report at `at` (before the loop gets it).
    pub fn report_accepted(&self, host: &str, at: Timestamp) {
        self.hearing().accepted(host, at);
    }

    /// Records that this process could not hear from `from` to `to` (its runtime stalled).
    pub fn deaf(&self, from: Timestamp, to: Timestamp) {
        self.hearing().deaf(from, to);
    }

    /// Whether a report of `host` later than `handled` was accepted (see
    /// [`Hearing::newer_than`](crate::api::hearing::Hearing::newer_than)), as of now.
    pub fn report_newer_than(&self, host: &str, handled: Timestamp) -> bool {
        self.hearing().newer_than(host, handled)
    }

    /// A copy of what was heard, for a plan round.
    pub fn heard(&self) -> crate::api::hearing::Hearing {
        self.hearing().clone()
    }

    /// Hands an inbound message to the loop; false when the loop has stopped.
    pub async fn send(&self, message: Inbound) -> bool {
        self.inbox.send(message).await.is_ok()
    }
}

#[cfg(test)]
#[path = "hub_tests.rs"]
mod tests;
