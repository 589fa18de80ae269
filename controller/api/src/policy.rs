//! Policy: health checks (`MachineHealthCheck` semantics) and remediation settings.
//!
//! Config types: unknown fields are rejected, durations are Go-style strings, defaults are
//! named constants.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::duration::{go_duration, go_duration_opt};
use crate::snapshot::{ConditionStatus, Role};

/// Default `nodeStartupTimeout` (MAO): 10 minutes.
pub const DEFAULT_NODE_STARTUP_TIMEOUT: Duration = Duration::from_secs(600);
/// Deadline for a node to re-register after power-on when no startup timeout applies (CAPBM).
pub const DEFAULT_NODE_REREGISTER_DEADLINE: Duration = Duration::from_secs(1200);
/// Default `minHealthyPeriod` (KCP): 1 hour.
pub const DEFAULT_MIN_HEALTHY_PERIOD: Duration = Duration::from_secs(3600);
/// Default `retryPeriod`: 5 minutes.
pub const DEFAULT_RETRY_PERIOD: Duration = Duration::from_secs(300);
/// Default `maxRetry`: 3 retries after the first attempt.
pub const DEFAULT_MAX_RETRY: u32 = 3;
/// The most retries a policy may allow (`max_retry`, Kubernetes `maxRetries`): far more than
/// any host deserves, and far from the integer's end (4294967295 overflowed the planner).
pub const MAX_MAX_RETRY: u32 = 100;
/// Default number of worker remediations running at once ("one node at a time", seed 003).
pub const DEFAULT_MAX_CONCURRENT: u32 = 1;
/// An agent that has not reported for this long may not execute remediations.
pub const DEFAULT_EXECUTOR_HEARTBEAT_TIMEOUT: Duration = Duration::from_secs(60);
/// Default maxUnhealthy of a health check that targets control-plane hosts (seed 000).
pub const DEFAULT_CONTROL_PLANE_MAX_UNHEALTHY: u32 = 1;

/// The whole decision policy.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Policy {
    /// Health checks; a host may be covered by several.
    #[serde(default)]
    pub health_checks: Vec<HealthCheck>,
    /// How unhealthy hosts are remediated.
    #[serde(default)]
    pub remediation: RemediationSettings,
}

/// One health check (a `MachineHealthCheck`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HealthCheck {
    /// Name, used in reasons and operation ids.
    pub name: String,
    /// Which hosts this check covers.
    #[serde(default)]
    pub selector: Selector,
    /// Conditions that make a target unhealthy once held for their timeout (OR-ed).
    #[serde(default)]
    pub unhealthy_conditions: Vec<UnhealthyCondition>,
    /// Short-circuit threshold: int, bare numeric string or percentage (rounded down).
    /// Default 100%, or 1 when the selector targets control-plane hosts only.
    #[serde(default)]
    pub max_unhealthy: Option<MaxUnhealthy>,
    /// How long a host may be without a Node before it is unhealthy; `0` disables.
    /// Default [`DEFAULT_NODE_STARTUP_TIMEOUT`].
    #[serde(default, with = "go_duration_opt")]
    pub node_startup_timeout: Option<Duration>,
    /// A target whose agent has not reported for this long is unhealthy; unset disables.
    #[serde(default, with = "go_duration_opt")]
    pub agent_heartbeat_timeout: Option<Duration>,
}

/// Label and role selector.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Selector {
    /// Every label here must be present with this value.
    #[serde(default)]
    pub match_labels: BTreeMap<String, String>,
    /// If set, only hosts with this role.
    #[serde(default)]
    pub role: Option<Role>,
}

/// A condition that makes a target unhealthy when held for `timeout`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct UnhealthyCondition {
    /// Node condition type, for example `Ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The status that counts as unhealthy.
    pub status: ConditionStatus,
    /// How long the status must have held.
    #[serde(with = "go_duration")]
    pub timeout: Duration,
}

/// `maxUnhealthy` as written: an integer or a string (`"2"`, `"40%"`); parsed at decision time
/// so that a parse error blocks remediation instead of failing the whole policy (MAO).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MaxUnhealthy {
    /// An absolute number.
    Count(u32),
    /// A bare number or a percentage.
    Text(String),
}

/// What remediation does to an unhealthy host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum Strategy {
    /// CAPBM external-baremetal: power off, remove the Node, power on, restore metadata.
    #[default]
    ExternalBaremetal,
    /// A plain power cycle.
    Reboot,
}

/// How the Node of a powered-off host is taken out of service.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case")]
pub enum NodeHandling {
    /// Delete the Node object (CAPBM; unsafe on k3s/RKE2 control planes, DOMAIN §3).
    #[default]
    Delete,
    /// Taint it `node.kubernetes.io/out-of-service`.
    OutOfServiceTaint,
}

/// Remediation settings.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RemediationSettings {
    /// Power-cycle strategy.
    #[serde(default)]
    pub strategy: Strategy,
    /// Delete the Node or taint it.
    #[serde(default)]
    pub node_handling: NodeHandling,
    /// Retries after the first attempt before giving up on a host.
    #[serde(default = "default_max_retry")]
    pub max_retry: u32,
    /// Minimum wait between attempts on one host.
    #[serde(default = "default_retry_period", with = "go_duration")]
    pub retry_period: Duration,
    /// A host unhealthy again within this period after a remediation counts as a retry.
    #[serde(default = "default_min_healthy_period", with = "go_duration")]
    pub min_healthy_period: Duration,
    /// Reprovision workers whose remediation failed for good (never control-plane or
    /// externally provisioned hosts).
    #[serde(default)]
    pub allow_reprovision: bool,
    /// Worker remediations running at once.
    #[serde(default = "default_max_concurrent")]
    pub max_concurrent: u32,
    /// An agent silent for longer than this is not chosen to execute a remediation.
    #[serde(default = "default_executor_heartbeat_timeout", with = "go_duration")]
    pub executor_heartbeat_timeout: Duration,
}

impl Default for RemediationSettings {
    fn default() -> Self {
        RemediationSettings {
            strategy: Strategy::default(),
            node_handling: NodeHandling::default(),
            max_retry: DEFAULT_MAX_RETRY,
            retry_period: DEFAULT_RETRY_PERIOD,
            min_healthy_period: DEFAULT_MIN_HEALTHY_PERIOD,
            allow_reprovision: false,
            max_concurrent: DEFAULT_MAX_CONCURRENT,
            executor_heartbeat_timeout: DEFAULT_EXECUTOR_HEARTBEAT_TIMEOUT,
        }
    }
}

fn default_max_retry() -> u32 {
    DEFAULT_MAX_RETRY
}
fn default_retry_period() -> Duration {
    DEFAULT_RETRY_PERIOD
}
fn default_min_healthy_period() -> Duration {
    DEFAULT_MIN_HEALTHY_PERIOD
}
fn default_max_concurrent() -> u32 {
    DEFAULT_MAX_CONCURRENT
}
fn default_executor_heartbeat_timeout() -> Duration {
    DEFAULT_EXECUTOR_HEARTBEAT_TIMEOUT
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_check_reads_mhc_style_json() {
        let json = r#"{
            "name": "workers",
            "selector": {"match_labels": {"pool": "a"}},
            "unhealthy_conditions": [
                {"type": "Ready", "status": "False", "timeout": "300s"},
                {"type": "Ready", "status": "Unknown", "timeout": "300s"}
            ],
            "max_unhealthy": "40%",
            "node_startup_timeout": "10m"
        }"#;
        let hc: HealthCheck = serde_json::from_str(json).unwrap();
        assert_eq!(hc.max_unhealthy, Some(MaxUnhealthy::Text("40%".into())));
        assert_eq!(hc.node_startup_timeout, Some(Duration::from_secs(600)));
        assert_eq!(hc.unhealthy_conditions[0].timeout, Duration::from_secs(300));
        let hc2: HealthCheck = serde_json::from_str(r#"{"name":"x","max_unhealthy":2}"#).unwrap();
        assert_eq!(hc2.max_unhealthy, Some(MaxUnhealthy::Count(2)));
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let err = serde_json::from_str::<RemediationSettings>(r#"{"max_retries": 3}"#);
        assert!(err.is_err());
        let ok: RemediationSettings = serde_json::from_str("{}").unwrap();
        assert_eq!(ok, RemediationSettings::default());
    }
}
