//! Which reports reach the store. Every report refreshes the controller's in-memory latest
//! report of its host at once (heartbeats, conditions and views are planned from it, so a
//! silent agent is still noticed to the millisecond and a healthy one never looks silent); the
//! store — etcd in standalone mode, where every write is a revision — gets a host's report only
//! when what it says changed (conditions, etcd view, BMC reachability, holds, unacknowledged
//! results), at most once a second per host, and otherwise once per heartbeat interval. One
//! agent certificate posting changing reports as fast as it can costs etcd one write a second;
//! an agent reporting every second, unchanged, one write per heartbeat interval.
//!
//! The stored copy serves `status` and a controller that takes over; a new leader gives every
//! host one heartbeat timeout from the moment it leads anyway (`crate::control::snapshot`).

use std::collections::BTreeMap;
use std::hash::{Hash as _, Hasher as _};
use std::time::Duration;

use metalguard_api::policy::Policy;
use metalguard_api::protocol::AgentReport;
use tokio::time::Instant;

use super::Controller;
use crate::backend::{Backend, StoredReport};

/// The shortest time between two stored reports of one host, however much they change.
pub const MIN_CHANGE_INTERVAL: Duration = Duration::from_secs(1);
/// The shortest and the longest heartbeat interval (see [`heartbeat_interval`]).
const HEARTBEAT_BOUNDS: (Duration, Duration) = (Duration::from_secs(1), Duration::from_secs(15));

/// How often an unchanged report is stored: a quarter of the shortest heartbeat timeout of the
/// policy (the executor's, and every health check's agent heartbeat), between 1 s and 15 s,
/// so that the stored receive times `status` reads stay well within every timeout.
pub fn heartbeat_interval(policy: &Policy) -> Duration {
    let shortest = policy
        .health_checks
        .iter()
        .filter_map(|c| c.agent_heartbeat_timeout)
        .fold(policy.remediation.executor_heartbeat_timeout, Duration::min);
    (shortest / 4).clamp(HEARTBEAT_BOUNDS.0, HEARTBEAT_BOUNDS.1)
}

/// Puts into `state` every report this controller received after the stored one: the store
/// gets a host's report only when it changed or once per heartbeat interval
/// (this module), and while etcd refuses writes (NOSPACE) not at all — planning from the
/// stored, older reports would take healthy agents for silent ones and fence hosts (seen in
/// `tests/tests/lab_nospace.rs` before reports were kept in memory).
pub(super) fn overlay_latest(
    state: &mut crate::backend::State,
    latest: &BTreeMap<String, StoredReport>,
) {
    for (host, report) in latest {
        let newer = state
            .reports
            .get(host)
            .is_none_or(|stored| stored.received_at < report.received_at);
        if newer {
            state.reports.insert(host.clone(), report.clone());
        }
    }
}

/// What of a report counts as a change: everything but the sequence, the send time, message
/// texts, raft indexes and check times, which move on every report.
fn change_key(report: &AgentReport) -> u64 {
    let mut hasher = std::hash::DefaultHasher::new();
    report.agent_version.hash(&mut hasher);
    report.boot_id.hash(&mut hasher);
    for c in &report.conditions {
        (&c.type_, c.status as u8, &c.reason, c.last_transition.0).hash(&mut hasher);
    }
    if let Some(etcd) = &report.etcd {
        (etcd.local_member_id, etcd.leader_id).hash(&mut hasher);
        for m in &etcd.members {
            (
                m.id,
                &m.name,
                &m.peer_urls,
                &m.client_urls,
                m.learner,
                m.healthy,
            )
                .hash(&mut hasher);
            (&m.alarms, m.error.is_some()).hash(&mut hasher);
        }
    }
    for r in &report.bmc_reachability {
        (&r.host, r.reachable, r.error.is_some()).hash(&mut hasher);
    }
    for id in &report.unacknowledged_results {
        id.0.hash(&mut hasher);
    }
    for hold in &report.holds {
        hold.id.hash(&mut hasher);
    }
    hasher.finish()
}

/// Per host, what was last written and when.
#[derive(Debug, Default)]
pub(super) struct ReportStore {
    written: BTreeMap<String, Written>,
}

#[derive(Debug, Clone, Copy)]
struct Written {
    /// The change key of what was written; `None` after a failed write.
    key: Option<u64>,
    /// When it was written (or attempted).
    at: Instant,
}

impl ReportStore {
    /// Whether `report` is to be written now, `heartbeat` being the interval for unchanged
    /// reports.
    pub(super) fn due(&self, report: &AgentReport, heartbeat: Duration, now: Instant) -> bool {
        let Some(last) = self.written.get(&report.host) else {
            return true;
        };
        let since = now.saturating_duration_since(last.at);
        if last.key == Some(change_key(report)) {
            since >= heartbeat
        } else {
            since >= MIN_CHANGE_INTERVAL
        }
    }

    /// Records a write (`ok`) or a failed attempt of `report`.
    pub(super) fn wrote(&mut self, report: &AgentReport, ok: bool, now: Instant) {
        let key = ok.then(|| change_key(report));
        self.written
            .insert(report.host.clone(), Written { key, at: now });
    }
}

impl<B: Backend> Controller<B> {
    /// Takes a report: the latest in memory at once, the store when it is due.
    pub(super) async fn take_report(&mut self, stored: StoredReport) {
        let host = stored.report.host.clone();
        self.metrics.reports_received.inc();
        self.latest.insert(host.clone(), stored);
        self.store_report_if_due(&host).await;
    }

    /// Writes every host's latest report whose write is due (a change that waited for
    /// [`MIN_CHANGE_INTERVAL`]); called on every tick.
    pub(super) async fn store_due_reports(&mut self) {
        let hosts: Vec<String> = self.latest.keys().cloned().collect();
        for host in hosts {
            self.store_report_if_due(&host).await;
        }
    }

    async fn store_report_if_due(&mut self, host: &str) {
        let heartbeat = heartbeat_interval(&self.inventory.policy);
        let now = Instant::now();
        let Some(stored) = self.latest.get(host) else {
            return;
        };
        if !self.stored_reports.due(&stored.report, heartbeat, now) {
            return;
        }
        let stored = stored.clone();
        let result = self.backend.record_report(&stored).await;
        if let Err(error) = &result {
            tracing::warn!(host = %host, error = %crate::error::chain(error), "report could not be stored");
        }
        self.metrics.report_writes.inc();
        self.stored_reports
            .wrote(&stored.report, result.is_ok(), Instant::now());
    }
}

#[cfg(test)]
mod tests {
    use metalguard_api::duration::Timestamp;
    use metalguard_api::protocol::Condition;
    use metalguard_api::snapshot::ConditionStatus;

    use super::*;

    fn report(sequence: u64, status: ConditionStatus) -> AgentReport {
        let mut report: AgentReport = serde_json::from_value(serde_json::json!({
            "host": "w-1", "agent_version": "t", "sequence": sequence, "sent_at": sequence,
        }))
        .unwrap();
        report.conditions = vec![Condition {
            type_: "KubeletHealthy".into(),
            status,
            reason: "Probe".into(),
            message: format!("answered in {sequence} ms"),
            last_transition: Timestamp(1),
        }];
        report
    }

    #[test]
    fn unchanged_reports_are_due_once_per_heartbeat_and_changes_at_most_once_a_second() {
        let heartbeat = Duration::from_secs(10);
        let mut store = ReportStore::default();
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let healthy = report(1, ConditionStatus::True);
        assert!(store.due(&healthy, heartbeat, t0), "the first report");
        store.wrote(&healthy, true, t0);
        // The sequence, the send time and the message move on every report: not a change.
        assert!(!store.due(&report(2, ConditionStatus::True), heartbeat, at(5_000)));
        assert!(store.due(&report(3, ConditionStatus::True), heartbeat, at(10_000)));
        let sick = report(4, ConditionStatus::False);
        assert!(
            !store.due(&sick, heartbeat, at(500)),
            "a change waits a second"
        );
        assert!(store.due(&sick, heartbeat, at(1_000)));
        store.wrote(&sick, false, at(1_000));
        assert!(
            !store.due(&sick, heartbeat, at(1_500)),
            "a failed write is retried after a second"
        );
        assert!(store.due(&sick, heartbeat, at(2_000)));
    }

    #[test]
    fn the_heartbeat_interval_is_a_quarter_of_the_shortest_heartbeat_timeout() {
        let mut policy = Policy::default();
        assert_eq!(
            heartbeat_interval(&policy),
            Duration::from_secs(15),
            "60 s / 4"
        );
        policy.remediation.executor_heartbeat_timeout = Duration::from_secs(20);
        assert_eq!(heartbeat_interval(&policy), Duration::from_secs(5));
        let check: metalguard_api::policy::HealthCheck = serde_json::from_value(
            serde_json::json!({"name": "w", "agent_heartbeat_timeout": "2s"}),
        )
        .unwrap();
        policy.health_checks.push(check);
        assert_eq!(
            heartbeat_interval(&policy),
            Duration::from_secs(1),
            "at least a second"
        );
    }

    fn stored(host: &str, received_at: u64) -> StoredReport {
        StoredReport {
            report: serde_json::from_value(serde_json::json!({
                "host": host, "agent_version": "t", "sequence": received_at,
                "boot_id": "", "sent_at": received_at,
            }))
            .unwrap(),
            received_at: Timestamp(received_at),
        }
    }

    #[test]
    fn reports_kept_in_memory_count_only_when_newer() {
        let mut state = crate::backend::State::default();
        state.reports.insert("cp-1".into(), stored("cp-1", 10));
        state.reports.insert("cp-2".into(), stored("cp-2", 30));
        let latest: BTreeMap<String, StoredReport> = [
            ("cp-1".to_owned(), stored("cp-1", 20)),
            ("cp-2".to_owned(), stored("cp-2", 25)),
            ("cp-3".to_owned(), stored("cp-3", 5)),
        ]
        .into();
        overlay_latest(&mut state, &latest);
        let at = |h: &str| state.reports[h].received_at;
        assert_eq!(
            (at("cp-1"), at("cp-2"), at("cp-3")),
            (Timestamp(20), Timestamp(30), Timestamp(5))
        );
    }
}
