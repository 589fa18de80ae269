//! `metalguard-controller run`: the API server plus the controller loop.
//!
//! The loop campaigns for leadership every tick; while it leads it re-plans on every report,
//! every result and every `plan_interval`: load state → build snapshot → `metalguard_core::plan`
//! → apply each action's writes (intent first, guarded by leadership) → publish the
//! in-flight operations as commands. When the store is unreachable it stops acting at once
//! and says so.
//!
//! Every tick it also re-reads the inventory file when it changed ([`crate::control::reload`]) and the
//! deny list of certificates ([`crate::pki::revocation`]), and tells the hub who may speak (the
//! inventory's hosts, less the retired ones verified off). Whenever what it needs from people
//! changes (a host to add to the inventory, a join that waits for its agent) it logs it and
//! persists it as notes that `status` prints. Stored records whose seal does not hold are
//! never planned from: each is logged once when first seen and counted while it stays.
//!
//! Break-glass holds reach it posted by the agent CLI (`Inbound::Hold`) or carried in reports;
//! every round records the reported ones it has no record of, and tells the hub which ids a
//! person released (the report's answer names them, so the agent drops its local record).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use metalguard_api::protocol::{Outcome, PromotedBy};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use crate::api::hub::{Hub, Inbound, ResultError};
use crate::backend::{Backend, BackendError, Leadership, StoredReport};
use crate::clock::now;
use crate::control::executor;
use crate::control::metrics::{Metrics, label};
use crate::control::reload::InventoryFile;
use crate::inventory::Inventory;
use crate::pki::revocation::{CertIdentity, DenyListFile};

pub(crate) mod gauges;
mod holds;
mod report_store;
mod reserved;
mod round;
#[cfg(all(test, feature = "kubernetes"))]
pub use round::RoundWork;
mod terms;
mod upkeep;

use report_store::ReportStore;
use reserved::ReservedSeen;

/// How often the leader gauge is checked against the hub's lease deadline.
const LAPSE_CHECK: std::time::Duration = std::time::Duration::from_millis(100);
/// How long a leader may spend handling what queued up before a round ([`Controller::drain`]).
const DRAIN_BUDGET: std::time::Duration = std::time::Duration::from_millis(250);

/// Sets the leader gauge to 0 as soon as the hub's leadership lapses by itself: the loop
/// notices only when its current store call returns (up to three etcd timeouts later), and an
/// operator's dashboard must not show a leader that answers 503.
/// Notes every span in which this process did not run (a look every
/// [`hearing::STALL_TICK`] that comes [`hearing::STALL_AFTER`] late or later) as deaf: agents'
/// reports could not be accepted meanwhile, so that time is not their silence
/// ([`crate::api::hearing`]).
async fn watch_stalls(hub: Arc<Hub>, metrics: Arc<Metrics>) {
    use crate::api::hearing;
    let mut looked = (tokio::time::Instant::now(), now());
    loop {
        tokio::time::sleep(hearing::STALL_TICK).await;
        let late = looked.0.elapsed().saturating_sub(hearing::STALL_TICK);
        let at = now();
        if late >= hearing::STALL_AFTER {
            hub.deaf(looked.1, at);
            metrics.stalls.inc();
            tracing::warn!(
                stalled_ms = u64::try_from(late.as_millis()).unwrap_or(u64::MAX),
                "this process did not run for a while: agents' silence is not counted over it"
            );
        }
        looked = (tokio::time::Instant::now(), at);
    }
}

async fn gauge_lapses(hub: Arc<Hub>, metrics: Arc<Metrics>) {
    let mut tick = tokio::time::interval(LAPSE_CHECK);
    loop {
        tick.tick().await;
        if !hub.is_leader() {
            metrics.leader.set(0);
        }
    }
}

/// The controller loop's context.
pub struct Controller<B> {
    backend: B,
    inventory: Inventory,
    hub: Arc<Hub>,
    metrics: Arc<Metrics>,
    /// When this controller last became leader (hosts are "known" from then on).
    leader_since: Option<metalguard_api::duration::Timestamp>,
    /// When the last successful leadership round started (the lease runs from then at least).
    renewed_at: Option<tokio::time::Instant>,
    /// The inventory file, re-read when it changes.
    file: Option<InventoryFile>,
    /// This controller's identity (in its notes).
    identity: String,
    /// The latest report of each host, as received (planned from; the store gets it when it
    /// changed or once per heartbeat interval, and not at all under etcd's NOSPACE alarm).
    latest: BTreeMap<String, StoredReport>,
    /// What of each host's report was written to the store, and when.
    stored_reports: ReportStore,
    /// Per host, the reserved condition types its agent reported last (logged on change).
    reserved_seen: ReservedSeen,
    /// Hold ids already logged as not recordable (logged once each).
    holds_warned: BTreeSet<String>,
    /// The deny list file of agent certificates, if the inventory names one.
    deny_list: Option<DenyListFile>,
    /// Rejected records already logged (each is logged once while it stays).
    rejected_seen: BTreeSet<String>,
    /// The etcd learners seen at the last round, by member id, with their host (to notice one
    /// promoted outside metalguard).
    learners_seen: BTreeMap<u64, String>,
    /// Inherited power cuts not offered: this leadership has not judged their targets
    /// unhealthy itself (`control::revalidate`), as of the last round.
    held_back: std::collections::BTreeSet<metalguard_api::plan::OperationId>,
    /// What the BMC check grants were last built from, and when (`upkeep::grant_checks`).
    granted: upkeep::Granted,
    grants_read_at: Option<tokio::time::Instant>,
    /// Per BMC, the credentials fences use and any rotation under way (`control::credentials`).
    credentials: crate::control::credentials::CredentialBook,
    /// When an agent's newer term last made this controller ask the store (`terms.rs`).
    term_rechecked: Option<tokio::time::Instant>,
    /// The snapshot of the last round, updated in place (`control::snapshot_cache`).
    snapshots: crate::control::snapshot_cache::SnapshotCache,
    /// What the last round read or built again.
    work: round::RoundWork,
    /// The per-host gauges as last set.
    series: gauges::HostSeries,
}

impl<B: Backend> Controller<B> {
    /// A controller that does not lead yet.
    pub fn new(backend: B, inventory: Inventory, hub: Arc<Hub>, metrics: Arc<Metrics>) -> Self {
        Self {
            backend,
            inventory,
            hub,
            metrics,
            leader_since: None,
            renewed_at: None,
            file: None,
            identity: String::new(),
            latest: BTreeMap::new(),
            stored_reports: ReportStore::default(),
            reserved_seen: ReservedSeen::default(),
            holds_warned: BTreeSet::new(),
            deny_list: None,
            rejected_seen: BTreeSet::new(),
            learners_seen: BTreeMap::new(),
            held_back: std::collections::BTreeSet::new(),
            granted: upkeep::Granted::new(),
            grants_read_at: None,
            credentials: crate::control::credentials::CredentialBook::default(),
            term_rechecked: None,
            snapshots: crate::control::snapshot_cache::SnapshotCache::default(),
            work: round::RoundWork::default(),
            series: gauges::HostSeries::default(),
        }
    }

    /// The backend (tests).
    #[cfg(all(test, feature = "kubernetes"))]
    pub fn backend_mut(&mut self) -> &mut B {
        &mut self.backend
    }

    /// What the last plan round read, built and observed again.
    #[cfg(all(test, feature = "kubernetes"))]
    pub fn last_round_work(&self) -> round::RoundWork {
        self.work
    }

    /// Re-reads `file` into the hub's deny list on every tick when it changed.
    pub fn revoking(mut self, file: DenyListFile) -> Self {
        self.deny_list = Some(file);
        let count = self.hub.revoked().read().map_or(0, |list| list.len());
        self.metrics
            .revoked_certificates
            .set(i64::try_from(count).unwrap_or(i64::MAX));
        self
    }

    /// What a load found that the loop must act on besides the plan: records not believed
    /// (logged once each, counted), operations never offered (counted), and the retired
    /// hosts whose certificates may no longer speak.
    fn note_state(&mut self, state: &crate::backend::State) {
        let mut kinds: BTreeMap<&str, i64> = BTreeMap::new();
        for r in &state.rejected {
            *kinds.entry(r.kind.as_str()).or_default() += 1;
            if self.rejected_seen.insert(r.key.clone()) {
                tracing::error!(key = %r.key, kind = %r.kind, reason = %r.reason, "record rejected: its seal does not hold, so it is never acted on (written by someone without the controllers' hmac key?)");
            }
        }
        self.rejected_seen
            .retain(|key| state.rejected.iter().any(|r| &r.key == key));
        self.metrics.rejected_records.clear();
        for (kind, count) in kinds {
            self.metrics
                .rejected_records
                .get_or_create(&label("kind", kind))
                .set(count);
        }
        let withheld = state
            .operations
            .values()
            .filter(|op| op.in_flight() && executor::withheld(&self.inventory, state, op).is_some())
            .count();
        self.metrics
            .operations_withheld
            .set(i64::try_from(withheld).unwrap_or(i64::MAX));
        // Only a host with a retirement can be retired: those, not every host, each round.
        let retired = state
            .retirements
            .keys()
            .filter(|h| self.inventory.host(h).is_some())
            .filter(|h| crate::control::snapshot::powered_off_for_retirement(state, h))
            .cloned()
            .collect();
        self.hub.set_retired(retired);
    }

    /// Names this controller in its notes (the backend supplies the inventory).
    pub fn identified(mut self, identity: String) -> Self {
        self.identity = identity;
        self
    }

    /// Re-reads `path` on every tick when it changed; `identity` signs the notes.
    pub fn reloading(mut self, path: &std::path::Path, identity: String) -> Self {
        self.file = Some(InventoryFile::new(path));
        self.identity = identity;
        self.metrics.inventory_generation.set(1);
        self
    }

    /// Runs until `cancel`, then resigns leadership.
    pub async fn run(mut self, mut inbox: mpsc::Receiver<Inbound>, cancel: CancellationToken) {
        let mut tick = tokio::time::interval(self.inventory.controller.plan_interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        self.count_insecure_bmcs();
        self.publish_bmc_targets();
        self.admit_inventory();
        self.reload_deny_list();
        let (wake_tx, mut wake) = mpsc::channel(16);
        let watch = tokio::spawn(self.backend.watch_inputs(wake_tx));
        let lapse = tokio::spawn(gauge_lapses(self.hub.clone(), self.metrics.clone()));
        let stalls = tokio::spawn(watch_stalls(self.hub.clone(), self.metrics.clone()));
        loop {
            let mut ticked = false;
            tokio::select! {
                // Leadership rounds first: a busy inbox must not starve lease renewal.
                biased;
                () = cancel.cancelled() => break,
                _ = tick.tick() => {
                    let started = tokio::time::Instant::now();
                    self.reload_inventory();
                    self.reload_deny_list();
                    let reloaded = started.elapsed();
                    self.campaign().await;
                    tracing::debug!(
                        target: round::ROUNDS_TARGET,
                        inventory_us = u64::try_from(reloaded.as_micros()).unwrap_or(u64::MAX),
                        campaign_us = u64::try_from(started.elapsed().saturating_sub(reloaded).as_micros()).unwrap_or(u64::MAX),
                        "tick"
                    );
                    ticked = true;
                }
                Some(()) = wake.recv() => {}
                message = inbox.recv() => match message {
                    Some(message) => self.handle(message).await,
                    None => break,
                },
            }
            if self.leader_since.is_some() && !self.hub.is_leader() {
                tracing::error!(
                    "cannot act: leadership expired without a renewal (backend store unreachable?)"
                );
                self.set_leader(false);
            }
            self.metrics
                .agents_connected
                .set(i64::try_from(self.hub.agents_polling()).unwrap_or(i64::MAX));
            self.metrics.count_api_refusals(&self.hub.refusals());
            self.metrics.set_agent_releases(&self.hub.agent_releases());
            self.metrics.agent_certificate_expiry.clear();
            for (host, end) in self.hub.agent_certificates() {
                self.metrics
                    .agent_certificate_expiry
                    .get_or_create(&label("host", &host))
                    .set(end);
            }
            if self.hub.is_leader() {
                if ticked {
                    // Changes that waited for their host's next write slot.
                    self.store_due_reports().await;
                }
                self.drain(&mut inbox).await;
                self.plan_and_execute().await;
            }
        }
        watch.abort();
        lapse.abort();
        stalls.abort();
        self.set_leader(false);
        self.backend.resign().await;
    }

    pub(crate) async fn campaign(&mut self) {
        // Every backend call has its own timeout; this is the overall deadline of a round.
        let deadline = self.inventory.etcd.timeout * 3;
        let round_started = tokio::time::Instant::now();
        let outcome = tokio::time::timeout(deadline, self.backend.campaign())
            .await
            .unwrap_or_else(|_| {
                Err(BackendError::Unavailable {
                    what: "leadership round".to_owned(),
                    source: format!("no answer within {deadline:?}").into(),
                })
            });
        match outcome {
            Ok(Leadership::Leader { term }) => {
                self.metrics.store_unavailable.set(0);
                let since = leading_since(self.leader_since, self.hub.is_leader(), now());
                if self.leader_since.is_some_and(|before| before != since) {
                    tracing::warn!(
                        "leadership had lapsed while a round or a request was blocked (agents were answered 503 meanwhile); leading again from now, so each agent gets a heartbeat timeout as after any takeover"
                    );
                }
                self.leader_since = Some(since);
                self.renewed_at = Some(round_started);
                self.set_leader(true);
                self.note_term(term);
            }
            Ok(Leadership::Follower { holder }) => {
                self.metrics.store_unavailable.set(0);
                self.renewed_at = None;
                if self.hub.is_leader() {
                    tracing::warn!(
                        holder = holder.as_deref().unwrap_or("unknown"),
                        "leadership lost"
                    );
                }
                self.set_leader(false);
            }
            Err(error) => {
                if self.metrics.store_unavailable.get() == 0 {
                    tracing::error!(error = %crate::error::chain(&error), "cannot act: the backend store is unavailable");
                }
                self.metrics.store_unavailable.set(1);
                // Keep leading only while the lease certainly still holds: the hub's deadline
                // (set at the last good round) expires by itself, and a hiccup shorter than it
                // (an etcd leader election, ~1 s) must not depose us. Nothing is persisted
                // meanwhile (writes need quorum and carry the fencing token) and only commands
                // already persisted stay offered. Here only the bookkeeping follows.
                if !self.hub.is_leader() {
                    self.set_leader(false);
                }
            }
        }
    }

    /// Records leadership. While leading, the hub's deadline is the last good round's start
    /// plus the lease time to live less one request timeout of margin.
    fn set_leader(&mut self, leader: bool) {
        match (leader, self.leader_since) {
            (true, None) => self.leader_since = Some(now()),
            (false, Some(_)) => self.leader_since = None,
            _ => {}
        }
        if !leader {
            self.renewed_at = None;
        }
        let etcd = &self.inventory.etcd;
        let grace = etcd.lease_ttl.saturating_sub(etcd.timeout);
        self.hub
            .set_leader_until(self.renewed_at.filter(|_| leader).map(|t| t + grace));
        self.metrics.leader.set(i64::from(leader));
    }

    /// Handles the messages already queued (for at most [`DRAIN_BUDGET`]), so that a round
    /// plans on every report the agent API accepted before it. One message per round let a
    /// backlog build under load: a new leader judged a host on a report its agent had
    /// superseded 3 s before, the newer one still queued, and fenced it (the 2-hour
    /// standalone soak, 118:35; docs/design-soak.md).
    pub(crate) async fn drain(&mut self, inbox: &mut mpsc::Receiver<Inbound>) {
        self.drain_within(inbox, DRAIN_BUDGET).await;
    }

    /// [`Controller::drain`] with `budget` (the tests give one a loaded machine cannot
    /// exceed: the 250 ms of a round ran out under a 2-core machine's load before the third
    /// report was handled).
    pub(crate) async fn drain_within(
        &mut self,
        inbox: &mut mpsc::Receiver<Inbound>,
        budget: std::time::Duration,
    ) {
        let started = tokio::time::Instant::now();
        while started.elapsed() < budget {
            match inbox.try_recv() {
                Ok(message) => self.handle(message).await,
                Err(_) => break,
            }
        }
    }

    pub(crate) async fn handle(&mut self, message: Inbound) {
        match message {
            Inbound::Report {
                report,
                received_at,
            } => {
                Box::pin(self.recheck_term(report.seen_term, &report.host)).await;
                self.note_reserved_conditions(&report);
                self.note_foreign_holds(&report);
                self.take_report(StoredReport {
                    report,
                    received_at,
                })
                .await;
            }
            Inbound::Result {
                host,
                certificate,
                result,
                reply,
            } => {
                Box::pin(self.recheck_term(result.term, &host)).await;
                let answer = if result.term > self.hub.term() {
                    Err(ResultError::Unavailable(format!(
                        "the result comes from a command of term {}, newer than this controller's: it does not lead",
                        result.term
                    )))
                } else {
                    self.persist_result(&host, &certificate, result).await
                };
                let _ = reply.send(answer);
            }
            Inbound::Hold { host, hold, reply } => {
                let answer = self.persist_posted_hold(&host, hold).await;
                let _ = reply.send(answer);
            }
        }
    }

    async fn persist_result(
        &mut self,
        host: &str,
        certificate: &CertIdentity,
        result: metalguard_api::protocol::CommandResult,
    ) -> Result<metalguard_api::protocol::ResultAck, ResultError> {
        let state = self
            .backend
            .load()
            .await
            .map_err(|e| ResultError::Unavailable(crate::error::chain(&e)))?;
        let protocol = state
            .operations
            .get(&result.operation_id)
            .and_then(|op| match &op.kind {
                crate::backend::OperationKind::Fence { target, .. } => self.inventory.host(target),
                _ => None,
            })
            .and_then(|h| h.bmc.as_ref())
            .map_or("none", |b| {
                if b.address.starts_with("ipmi") {
                    "ipmi"
                } else {
                    "redfish"
                }
            });
        let outcome = result.outcome;
        let promoted_by = result.promoted_by.map(PromotedBy::name);
        let seconds = result.finished_at.since(result.started_at).as_secs_f64();
        let promotion_started = state
            .operations
            .get(&result.operation_id)
            .filter(|op| matches!(op.kind, crate::backend::OperationKind::EtcdPromote { .. }))
            .map(|op| op.created_at);
        let (write, ack) = executor::record_result(
            &state,
            host,
            &certificate.describe(),
            result,
            self.hub.term(),
        )
        .map_err(ResultError::Rejected)?;
        if let Some(write) = write {
            self.backend
                .apply(vec![write])
                .await
                .map_err(|e| ResultError::Unavailable(crate::error::chain(&e)))?;
            if protocol != "none" {
                let labels = vec![
                    ("protocol".to_owned(), protocol.to_owned()),
                    ("outcome".to_owned(), outcome.name().to_owned()),
                ];
                self.metrics.fences.get_or_create(&labels).inc();
                if outcome == Outcome::Succeeded {
                    self.metrics
                        .fence_seconds
                        .get_or_create(&label("protocol", protocol))
                        .observe(seconds);
                }
            }
            if let Some(started) = promotion_started {
                self.metrics
                    .promotions
                    .get_or_create(&label("outcome", outcome.name()))
                    .inc();
                if outcome == Outcome::Succeeded {
                    // From persisted intent to persisted result, on the controller's clock.
                    self.metrics
                        .promotion_seconds
                        .observe(now().since(started).as_secs_f64());
                }
            }
            tracing::info!(operation = %ack.operation_id, %host, outcome = outcome.name(), promoted_by, "command result persisted");
        }
        Ok(ack)
    }
}

/// When the current leadership began, once a campaign found this controller leading:
/// `previous` while it has led without a gap (the hub's deadline has not passed), `now` after
/// any lapse. A lapse can go unobserved: while a round or a request to a stalled store blocks
/// the loop, the hub's deadline passes and agents are answered 503, and the next campaign may
/// find the Lease still held. The silence of agents is counted from this moment, so a lapse
/// that kept them from reporting must restart it, exactly as a takeover does.
fn leading_since(
    previous: Option<metalguard_api::duration::Timestamp>,
    hub_still_leading: bool,
    now: metalguard_api::duration::Timestamp,
) -> metalguard_api::duration::Timestamp {
    match previous {
        Some(since) if hub_still_leading => since,
        _ => now,
    }
}

#[cfg(test)]
mod leadership_tests {
    use metalguard_api::duration::Timestamp;

    use super::leading_since;

    #[test]
    fn a_lapse_even_an_unobserved_one_starts_a_new_leadership() {
        let (before, now) = (Timestamp(1_000), Timestamp(50_000));
        assert_eq!(leading_since(None, false, now), now);
        assert_eq!(leading_since(Some(before), true, now), before);
        // The hub's deadline passed while the loop was blocked: agents got 503 meanwhile.
        assert_eq!(leading_since(Some(before), false, now), now);
    }
}
