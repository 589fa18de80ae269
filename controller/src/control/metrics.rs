//! Prometheus metrics, on an explicit registry, for what an operator alerts on.

use std::sync::Arc;

use axum::routing::get;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use tokio_util::sync::CancellationToken;

pub(crate) type Labels = Vec<(String, String)>;

/// The controller's metrics.
pub struct Metrics {
    registry: Registry,
    /// 1 while this controller leads.
    pub leader: Gauge,
    /// The term of the leadership under way (kept after it ends: the last term led).
    pub leader_term: Gauge,
    /// 1 while the store is unreachable (the controller cannot act).
    pub store_unavailable: Gauge,
    /// Unhealthy targets per health check.
    pub unhealthy_targets: Family<Labels, Gauge>,
    /// 1 per health check whose remediation is short-circuited.
    pub short_circuited: Family<Labels, Gauge>,
    /// Control-plane hosts waiting behind a failed control-plane remediation.
    pub control_plane_blocked_by_failed: Gauge,
    /// Remediations per phase.
    pub remediations: Family<Labels, Gauge>,
    /// Fence results by protocol and outcome.
    pub fences: Family<Labels, Counter>,
    /// Fence durations (agent-measured) by protocol.
    pub fence_seconds: Family<Labels, Histogram>,
    /// Remediations that reached an end (done, failed, cancelled, …) by outcome.
    pub remediations_finished: Family<Labels, Counter>,
    /// Learner promotions by outcome.
    pub promotions: Family<Labels, Counter>,
    /// Time from a promotion's persisted intent to its persisted success.
    pub promotion_seconds: Histogram,
    /// Learners seen voting that no promotion operation of metalguard's promoted (kubeadm's
    /// learner mode or a person did).
    pub promotions_outside: Counter,
    /// Times this process did not run for [`crate::api::hearing::STALL_AFTER`] or more
    /// (agents' silence is not counted over them).
    pub stalls: Counter,
    /// Agents with a long-poll open.
    pub agents_connected: Gauge,
    /// BMCs configured to accept any certificate.
    pub insecure_bmcs: Gauge,
    /// Increases with every accepted inventory (re)load.
    pub inventory_generation: Gauge,
    /// 1 while the latest change of the inventory file is rejected (the previous one is used).
    pub inventory_rejected: Gauge,
    /// Hosts held after a break-glass fence (left alone until a person releases them).
    pub held_hosts: Gauge,
    /// Times an agent started reporting a reserved condition type (`Ready`, the kubelet's),
    /// which the controller ignores, by condition type.
    pub reserved_conditions_ignored: Family<Labels, Counter>,
    /// Stored records whose seal does not hold at the last load, by kind (never acted on).
    pub rejected_records: Family<Labels, Gauge>,
    /// In-flight operations never offered because their agent or fence target is not an
    /// inventory host.
    pub operations_withheld: Gauge,
    /// Records sealed again with the signing key after a key rotation.
    pub records_resealed: Counter,
    /// Certificates on the deny list in force.
    pub revoked_certificates: Gauge,
    /// Reports accepted from agents (each refreshes its host's heartbeat).
    pub reports_received: Counter,
    /// Reports written to the store (a change, or once per heartbeat interval).
    pub report_writes: Counter,
    /// etcd voting members, as the latest plan saw them.
    pub etcd_voters: Gauge,
    /// etcd voting members that are healthy.
    pub etcd_healthy_voters: Gauge,
    /// etcd learners (non-voting members).
    pub etcd_learners: Gauge,
    /// Healthy voters beyond quorum: how many more voter failures etcd survives (negative
    /// when quorum is lost or no voter is known).
    pub etcd_failure_tolerance: Gauge,
    /// Per inventory host, 1 while its agent is silent (no report within the executor
    /// heartbeat timeout).
    pub agent_silent: Family<Labels, Gauge>,
    /// Per host, when its latest report was received (Unix seconds).
    pub agent_last_report: Family<Labels, Gauge>,
    /// Per inventory host with a BMC, the agents whose fresh report reached that BMC.
    pub bmc_reachable_agents: Family<Labels, Gauge>,
    /// Per inventory host with a BMC, its latest credentialed check: 1 passed, 0 failed
    /// (the `failure` label says how), -1 never checked (`control::fencing`).
    pub fencing_ready: Family<Labels, Gauge>,
    /// End of validity (Unix seconds) of the certificates the controller uses, by role.
    pub certificate_expiry: Family<Labels, Gauge>,
    /// End of validity (Unix seconds) of each agent's client certificate, as last presented.
    pub agent_certificate_expiry: Family<Labels, Gauge>,
    /// Refusals in the latest plan, by kind of reason.
    pub refusals: Family<Labels, Gauge>,
    /// Time of one plan round: plan over the loaded state, then persist its writes.
    pub round_seconds: Histogram,
    /// Error answers of the agent API, by HTTP status (`code`).
    pub api_refusals: Family<Labels, Counter>,
    /// Per host, 1 for the release its agent last sent (`version`), with `supported` false
    /// when the skew policy does not cover it (its commands and results are refused).
    pub agent_release: Family<Labels, Gauge>,
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Arc<Self> {
        let mut registry = Registry::with_prefix("metalguard_controller");
        let metrics = Self {
            leader: Gauge::default(),
            leader_term: Gauge::default(),
            store_unavailable: Gauge::default(),
            unhealthy_targets: Family::default(),
            short_circuited: Family::default(),
            control_plane_blocked_by_failed: Gauge::default(),
            remediations: Family::default(),
            fences: Family::default(),
            fence_seconds: Family::new_with_constructor(|| {
                Histogram::new(exponential_buckets(0.05, 2.0, 10))
            }),
            remediations_finished: Family::default(),
            promotions: Family::default(),
            promotions_outside: Counter::default(),
            stalls: Counter::default(),
            promotion_seconds: Histogram::new(exponential_buckets(0.1, 2.0, 12)),
            agents_connected: Gauge::default(),
            insecure_bmcs: Gauge::default(),
            inventory_generation: Gauge::default(),
            inventory_rejected: Gauge::default(),
            held_hosts: Gauge::default(),
            reserved_conditions_ignored: Family::default(),
            rejected_records: Family::default(),
            operations_withheld: Gauge::default(),
            records_resealed: Counter::default(),
            revoked_certificates: Gauge::default(),
            reports_received: Counter::default(),
            report_writes: Counter::default(),
            etcd_voters: Gauge::default(),
            etcd_healthy_voters: Gauge::default(),
            etcd_learners: Gauge::default(),
            etcd_failure_tolerance: Gauge::default(),
            agent_silent: Family::default(),
            agent_last_report: Family::default(),
            bmc_reachable_agents: Family::default(),
            fencing_ready: Family::default(),
            certificate_expiry: Family::default(),
            agent_certificate_expiry: Family::default(),
            refusals: Family::default(),
            round_seconds: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            api_refusals: Family::default(),
            agent_release: Family::default(),
            registry: Registry::default(),
        };
        registry.register(
            "leader",
            "1 while this controller leads",
            metrics.leader.clone(),
        );
        registry.register(
            "leader_term",
            "The term of the leadership this controller leads or last led",
            metrics.leader_term.clone(),
        );
        registry.register(
            "store_unavailable",
            "1 while the backend store is unreachable and the controller cannot act",
            metrics.store_unavailable.clone(),
        );
        registry.register(
            "unhealthy_targets",
            "Unhealthy targets per health check",
            metrics.unhealthy_targets.clone(),
        );
        registry.register(
            "short_circuited",
            "1 per health check whose remediation is short-circuited",
            metrics.short_circuited.clone(),
        );
        registry.register(
            "control_plane_blocked_by_failed",
            "Control-plane hosts the plan does not remediate because a failed control-plane remediation holds the one-at-a-time slot until it is retried or a person acts",
            metrics.control_plane_blocked_by_failed.clone(),
        );
        registry.register(
            "remediations",
            "Remediations per phase",
            metrics.remediations.clone(),
        );
        registry.register(
            "fences",
            "Fence results by protocol and outcome",
            metrics.fences.clone(),
        );
        registry.register(
            "fence_duration_seconds",
            "Fence durations by protocol",
            metrics.fence_seconds.clone(),
        );
        registry.register(
            "remediations_finished",
            "Remediations that reached an end, by outcome",
            metrics.remediations_finished.clone(),
        );
        registry.register(
            "promotions",
            "Learner promotions by outcome",
            metrics.promotions.clone(),
        );
        registry.register(
            "promotions_outside",
            "Learners seen voting that no metalguard promotion promoted",
            metrics.promotions_outside.clone(),
        );
        registry.register(
            "stalls",
            "Times the controller process did not run for a second or more (agents' silence is not counted over them)",
            metrics.stalls.clone(),
        );
        registry.register(
            "promotion_duration_seconds",
            "Time from a promotion's persisted intent to its persisted success",
            metrics.promotion_seconds.clone(),
        );
        registry.register(
            "agents_connected",
            "Agents with a long-poll open",
            metrics.agents_connected.clone(),
        );
        registry.register(
            "insecure_bmc_connections",
            "BMCs configured to accept any certificate",
            metrics.insecure_bmcs.clone(),
        );
        registry.register(
            "inventory_generation",
            "Increases with every accepted inventory (re)load",
            metrics.inventory_generation.clone(),
        );
        registry.register(
            "held_hosts",
            "Hosts held after a break-glass fence, left alone until a person releases them",
            metrics.held_hosts.clone(),
        );
        registry.register(
            "reserved_conditions_ignored",
            "Times an agent started reporting a reserved condition type, which is ignored",
            metrics.reserved_conditions_ignored.clone(),
        );
        registry.register(
            "reports_received",
            "Reports accepted from agents",
            metrics.reports_received.clone(),
        );
        registry.register(
            "report_writes",
            "Reports written to the store: a change, or once per heartbeat interval",
            metrics.report_writes.clone(),
        );
        registry.register(
            "inventory_rejected",
            "1 while the latest change of the inventory file is rejected and the previous one is in use",
            metrics.inventory_rejected.clone(),
        );
        registry.register(
            "rejected_records",
            "Stored records whose seal does not hold (not written by a controller holding the hmac key), by kind; never acted on",
            metrics.rejected_records.clone(),
        );
        registry.register(
            "operations_withheld",
            "In-flight operations never offered: their agent or fence target is not an inventory host",
            metrics.operations_withheld.clone(),
        );
        registry.register(
            "records_resealed",
            "Records sealed again with the signing key after an hmac key rotation",
            metrics.records_resealed.clone(),
        );
        registry.register(
            "revoked_certificates",
            "Certificates on the deny list in force",
            metrics.revoked_certificates.clone(),
        );
        metrics.register_health(&mut registry);
        Arc::new(Self {
            registry,
            ..metrics
        })
    }

    /// Registers what the alert rules and the dashboard read about quorum, agents, BMCs,
    /// certificates and plan rounds (`packaging/prometheus/`).
    fn register_health(&self, registry: &mut Registry) {
        registry.register(
            "etcd_voters",
            "etcd voting members, as the latest plan saw them",
            self.etcd_voters.clone(),
        );
        registry.register(
            "etcd_healthy_voters",
            "etcd voting members that are healthy",
            self.etcd_healthy_voters.clone(),
        );
        registry.register(
            "etcd_learners",
            "etcd learners (non-voting members)",
            self.etcd_learners.clone(),
        );
        registry.register(
            "etcd_failure_tolerance",
            "Healthy etcd voters beyond quorum: further voter failures survived (negative when quorum is lost or no voter is known)",
            self.etcd_failure_tolerance.clone(),
        );
        registry.register(
            "agent_silent",
            "1 per inventory host whose agent sent no report within the executor heartbeat timeout",
            self.agent_silent.clone(),
        );
        registry.register(
            "agent_last_report_timestamp_seconds",
            "When each host's latest agent report was received (Unix seconds)",
            self.agent_last_report.clone(),
        );
        registry.register(
            "bmc_reachable_agents",
            "Per inventory host with a BMC, the agents whose fresh report reached that BMC",
            self.bmc_reachable_agents.clone(),
        );
        registry.register(
            "fencing_ready",
            "Per inventory host with a BMC, its latest credentialed read-only check: 1 passed, 0 failed (label failure), -1 never checked",
            self.fencing_ready.clone(),
        );
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "End of validity (Unix seconds) of the certificates the controller uses, by role",
            self.certificate_expiry.clone(),
        );
        registry.register(
            "agent_certificate_expiry_timestamp_seconds",
            "End of validity (Unix seconds) of each agent's client certificate, as last presented",
            self.agent_certificate_expiry.clone(),
        );
        registry.register(
            "refusals",
            "Refusals in the latest plan, by kind of reason",
            self.refusals.clone(),
        );
        registry.register(
            "round_duration_seconds",
            "Time of one plan round: plan over the loaded state, then persist its writes",
            self.round_seconds.clone(),
        );
        registry.register(
            "api_refusals",
            "Error answers of the agent API, by HTTP status",
            self.api_refusals.clone(),
        );
        registry.register(
            "agent_release",
            "1 per host for the release its agent last sent; supported=false outside the skew policy",
            self.agent_release.clone(),
        );
    }

    /// Brings the API refusal counters up to the hub's totals (`refusals`, by status).
    pub fn count_api_refusals(&self, refusals: &std::collections::BTreeMap<u16, u64>) {
        for (status, total) in refusals {
            let counter = self
                .api_refusals
                .get_or_create(&label("code", &status.to_string()));
            counter.inc_by(total.saturating_sub(counter.get()));
        }
    }

    /// Sets the per-host release gauges to `releases` (host → release, supported).
    pub fn set_agent_releases(
        &self,
        releases: &std::collections::BTreeMap<String, (String, bool)>,
    ) {
        self.agent_release.clear();
        for (host, (release, supported)) in releases {
            let labels = vec![
                ("host".to_owned(), host.clone()),
                ("version".to_owned(), release.clone()),
                ("supported".to_owned(), supported.to_string()),
            ];
            self.agent_release.get_or_create(&labels).set(1);
        }
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

/// One label pair.
pub fn label(key: &str, value: &str) -> Labels {
    vec![(key.to_owned(), value.to_owned())]
}

/// Connections the metrics endpoint serves at once (a scraper or two need a handful); part of
/// the descriptors kept out of the agent API's budget (`api::rlimit::RESERVED_FILES`).
pub const METRICS_MAX_CONNECTIONS: usize = 32;

/// Serves `/metrics` on `listener` (plain HTTP, bind it to a local address) until `cancel`,
/// with the agent API's header-read and idle timeouts and at most
/// [`METRICS_MAX_CONNECTIONS`] connections: a flood of idle connections to it cannot take the
/// descriptors the agent API needs.
pub async fn serve(
    listener: tokio::net::TcpListener,
    metrics: Arc<Metrics>,
    limits: crate::inventory::ApiLimits,
    cancel: CancellationToken,
) {
    let app = axum::Router::new().route("/metrics", get(move || async move { metrics.render() }));
    crate::api::server::http::serve_plain(
        listener,
        app,
        limits,
        METRICS_MAX_CONNECTIONS,
        "metrics",
        cancel,
    )
    .await;
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    /// The exposition with one series in every family (a family without one exports nothing).
    fn every_series() -> String {
        let m = Metrics::new();
        let one = label("x", "y");
        for family in [
            &m.unhealthy_targets,
            &m.short_circuited,
            &m.remediations,
            &m.rejected_records,
            &m.agent_silent,
            &m.agent_last_report,
            &m.bmc_reachable_agents,
            &m.fencing_ready,
            &m.certificate_expiry,
            &m.agent_certificate_expiry,
            &m.refusals,
        ] {
            family.get_or_create(&one).set(1);
        }
        for family in [
            &m.fences,
            &m.api_refusals,
            &m.remediations_finished,
            &m.promotions,
            &m.reserved_conditions_ignored,
        ] {
            family.get_or_create(&one).inc();
        }
        m.fence_seconds.get_or_create(&one).observe(1.0);
        m.render()
    }

    #[test]
    fn every_controller_metric_the_alert_rules_and_the_dashboard_read_is_exported() {
        let exported: BTreeSet<String> = every_series()
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next())
            .map(str::to_owned)
            .collect();
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let name = regex::Regex::new(r"\bmetalguard_controller_[a-z0-9_]+").unwrap();
        let mut read = 0;
        for file in [
            "packaging/prometheus/metalguard-rules.yaml",
            "packaging/grafana/metalguard-dashboard.json",
        ] {
            let text = std::fs::read_to_string(root.join(file)).unwrap();
            for found in name.find_iter(&text) {
                read += 1;
                assert!(
                    exported.contains(found.as_str()),
                    "{file} reads {}, which the controller does not export:\n{exported:?}",
                    found.as_str()
                );
            }
        }
        assert!(read > 30, "{read} metric references");
    }

    #[test]
    fn api_refusal_counters_follow_the_hub_totals() {
        let m = Metrics::new();
        m.count_api_refusals(&[(403, 2), (503, 1)].into());
        m.count_api_refusals(&[(403, 5), (503, 1)].into());
        let text = m.render();
        assert!(
            text.contains("metalguard_controller_api_refusals_total{code=\"403\"} 5"),
            "{text}"
        );
        assert!(
            text.contains("metalguard_controller_api_refusals_total{code=\"503\"} 1"),
            "{text}"
        );
    }
}
