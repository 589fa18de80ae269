//! Prometheus metrics of the agent, with an explicit registry.

use std::sync::Arc;
use std::time::Duration;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

/// Labels of per-probe series.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeLabels {
    condition: String,
}

/// Labels of per-probe run outcomes.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ProbeRunLabels {
    condition: String,
    result: String,
}

/// Labels of per-BMC series.
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct BmcLabels {
    host: String,
}

/// The agent's metrics; cheap to clone.
#[derive(Debug, Clone)]
pub struct AgentMetrics {
    registry: Arc<Registry>,
    probe_healthy: Family<ProbeLabels, Gauge>,
    probe_runs: Family<ProbeRunLabels, Counter>,
    probe_seconds: Family<ProbeLabels, Histogram>,
    insecure_tls: Counter,
    bmc_reachable: Family<BmcLabels, Gauge>,
    journal_files_ignored: Gauge,
}

impl AgentMetrics {
    /// Creates the registry and every series.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("metalguard_agent");
        let probe_healthy = Family::<ProbeLabels, Gauge>::default();
        registry.register(
            "probe_healthy",
            "Verdict of each local probe after hysteresis: 1 healthy, 0 unhealthy, -1 not run yet",
            probe_healthy.clone(),
        );
        let probe_runs = Family::<ProbeRunLabels, Counter>::default();
        registry.register("probe_runs", "Probe runs by raw result", probe_runs.clone());
        let probe_seconds = Family::<ProbeLabels, Histogram>::new_with_constructor(|| {
            Histogram::new([0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0])
        });
        registry.register(
            "probe_duration_seconds",
            "Duration of probe runs",
            probe_seconds.clone(),
        );
        let insecure_tls = Counter::default();
        registry.register(
            "bmc_insecure_tls_handshakes",
            "TLS handshakes with BMCs accepted without certificate verification (explicit opt-in)",
            insecure_tls.clone(),
        );
        let bmc_reachable = Family::<BmcLabels, Gauge>::default();
        registry.register(
            "bmc_reachable",
            "Whether the latest credential-free check reached the BMC of each host this agent may be asked to fence: 1 reached, 0 not",
            bmc_reachable.clone(),
        );
        let journal_files_ignored = Gauge::default();
        registry.register(
            "journal_files_ignored",
            "Files in the operation journal this agent did not write (another owner, a symlink): ignored, each logged once",
            journal_files_ignored.clone(),
        );
        Self {
            registry: Arc::new(registry),
            probe_healthy,
            probe_runs,
            probe_seconds,
            insecure_tls,
            bmc_reachable,
            journal_files_ignored,
        }
    }

    /// The gauge the operation journal counts its ignored files in.
    pub fn journal_files_ignored(&self) -> Gauge {
        self.journal_files_ignored.clone()
    }

    /// Records a round of BMC reachability checks, one series per target checked (hosts no
    /// longer listed by the controller lose theirs).
    pub fn set_bmc_reachability(&self, results: &[metalguard_api::protocol::BmcReachability]) {
        self.bmc_reachable.clear();
        for r in results {
            self.bmc_reachable
                .get_or_create(&BmcLabels {
                    host: r.host.clone(),
                })
                .set(i64::from(r.reachable));
        }
    }

    /// Records one probe run.
    pub fn observe_probe(&self, condition: &str, ok: bool, verdict: Option<bool>, took: Duration) {
        let labels = ProbeLabels {
            condition: condition.to_owned(),
        };
        self.probe_healthy
            .get_or_create(&labels)
            .set(match verdict {
                Some(true) => 1,
                Some(false) => 0,
                None => -1,
            });
        self.probe_seconds
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
        let result = if ok { "ok" } else { "fail" };
        self.probe_runs
            .get_or_create(&ProbeRunLabels {
                condition: condition.to_owned(),
                result: result.to_owned(),
            })
            .inc();
    }

    /// The OpenMetrics text exposition.
    pub fn encode(&self) -> String {
        let seen = metalguard_bmc::tls::insecure_handshakes();
        self.insecure_tls
            .inc_by(seen.saturating_sub(self.insecure_tls.get()));
        let mut out = String::new();
        if prometheus_client::encoding::text::encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn probe_series_are_exposed() {
        let metrics = AgentMetrics::new();
        metrics.observe_probe(
            "EtcdMemberHealthy",
            false,
            Some(false),
            Duration::from_millis(3),
        );
        let text = metrics.encode();
        assert!(
            text.contains("metalguard_agent_probe_healthy{condition=\"EtcdMemberHealthy\"} 0"),
            "{text}"
        );
        assert!(text.contains("metalguard_agent_probe_runs_total{condition=\"EtcdMemberHealthy\",result=\"fail\"} 1"), "{text}");
        assert!(
            text.contains("metalguard_agent_bmc_insecure_tls_handshakes_total 0"),
            "{text}"
        );
    }

    #[test]
    fn bmc_reachability_has_one_series_per_checked_host() {
        use metalguard_api::duration::Timestamp;
        use metalguard_api::protocol::BmcReachability;
        let metrics = AgentMetrics::new();
        let result = |host: &str, reachable| BmcReachability {
            host: host.into(),
            reachable,
            checked_at: Timestamp(1),
            error: None,
            check: None,
        };
        metrics.set_bmc_reachability(&[result("cp-2", true), result("cp-3", false)]);
        let text = metrics.encode();
        assert!(
            text.contains("metalguard_agent_bmc_reachable{host=\"cp-2\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("metalguard_agent_bmc_reachable{host=\"cp-3\"} 0"),
            "{text}"
        );
        metrics.set_bmc_reachability(&[result("cp-3", true)]);
        let text = metrics.encode();
        assert!(!text.contains("host=\"cp-2\""), "{text}");
        assert!(
            text.contains("metalguard_agent_bmc_reachable{host=\"cp-3\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn every_agent_metric_the_alert_rules_and_the_dashboard_read_is_exported() {
        use metalguard_api::duration::Timestamp;
        use metalguard_api::protocol::BmcReachability;
        let metrics = AgentMetrics::new();
        metrics.observe_probe("P", true, Some(true), Duration::from_millis(1));
        metrics.set_bmc_reachability(&[BmcReachability {
            host: "cp-2".into(),
            reachable: true,
            checked_at: Timestamp(1),
            error: None,
            check: None,
        }]);
        let text = metrics.encode();
        let exported: std::collections::BTreeSet<&str> = text
            .lines()
            .filter(|l| !l.starts_with('#'))
            .filter_map(|l| l.split(['{', ' ']).next())
            .collect();
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        let mut read = 0;
        for file in [
            "packaging/prometheus/metalguard-rules.yaml",
            "packaging/grafana/metalguard-dashboard.json",
        ] {
            let body = std::fs::read_to_string(root.join(file)).unwrap();
            for (at, _) in body.match_indices("metalguard_agent_") {
                let name: String = body[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '_')
                    .collect();
                read += 1;
                assert!(
                    exported.contains(name.as_str()),
                    "{file} reads {name}, which the agent does not export:\n{text}"
                );
            }
        }
        assert!(read >= 2, "{read} agent metric references");
    }
}
