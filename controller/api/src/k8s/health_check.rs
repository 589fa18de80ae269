//! `HostHealthCheck`: `MachineHealthCheck`'s fields (selector, unhealthyConditions,
//! maxUnhealthy, nodeStartupTimeout) over `GuardedHost`s, plus how an unhealthy host is
//! remediated. The `machine.openshift.io/remediation-strategy: external-baremetal` annotation
//! of an MHC copied over is honoured.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::k8s::schema;
use crate::policy::{NodeHandling, Strategy};

/// The annotation machine-api-operator reads to power-cycle instead of reprovisioning.
pub const REMEDIATION_STRATEGY_ANNOTATION: &str = "machine.openshift.io/remediation-strategy";
/// Its one value.
pub const EXTERNAL_BAREMETAL: &str = "external-baremetal";

/// Which hosts to watch, when they count as unhealthy and what to do about it.
// Every `printcolumn(...)` repeats `type_ = ...`; clippy reads that as a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "metalguard.io",
    version = "v1alpha1",
    kind = "HostHealthCheck",
    namespaced,
    status = "HostHealthCheckStatus",
    shortname = "hhc",
    category = "metalguard",
    derive = "PartialEq",
    crates(kube_core = "::kube_core"),
    doc = "A MachineHealthCheck over GuardedHosts, with power-based (external-baremetal) remediation.",
    printcolumn(
        name = "MaxUnhealthy",
        type_ = "string",
        json_path = ".spec.maxUnhealthy"
    ),
    printcolumn(
        name = "Expected",
        type_ = "integer",
        json_path = ".status.expectedHosts"
    ),
    printcolumn(
        name = "Healthy",
        type_ = "integer",
        json_path = ".status.currentHealthy"
    ),
    printcolumn(
        name = "Allowed",
        type_ = "integer",
        json_path = ".status.remediationsAllowed"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct HostHealthCheckSpec {
    /// Labels of the `GuardedHost`s (in this namespace) this check covers.
    pub selector: LabelSelector,
    /// A host is unhealthy when its Node has held any of these conditions for its timeout.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub unhealthy_conditions: Vec<UnhealthyCondition>,
    /// Remediate only while at most this many selected hosts are unhealthy (hosts under
    /// remediation count). Percentages round down, like machine-api-operator (medik8s NHC
    /// rounds up). A value that does not parse blocks remediation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::max_unhealthy")]
    pub max_unhealthy: Option<IntOrString>,
    /// A host whose Node has not appeared this long after the host did is unhealthy;
    /// `0` disables. Default 10m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    pub node_startup_timeout: Option<String>,
    /// A host whose agent has not reported this long is unhealthy; unset disables.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    pub agent_heartbeat_timeout: Option<String>,
    /// How unhealthy hosts are remediated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation: Option<RemediationSpec>,
}

/// One unhealthy condition (OR-ed with the others).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct UnhealthyCondition {
    /// Node condition type, for example `Ready`.
    #[serde(rename = "type")]
    #[schemars(length(min = 1))]
    pub type_: String,
    /// The status that counts as unhealthy.
    pub status: ConditionStatus,
    /// How long the status must have held.
    #[schemars(schema_with = "schema::duration")]
    pub timeout: String,
}

/// A condition status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    /// `True`.
    True,
    /// `False`.
    False,
    /// `Unknown`.
    Unknown,
}

/// Remediation settings of one health check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemediationSpec {
    /// `external-baremetal`: power off, take the Node out, power on, restore the Node's labels
    /// and annotations. `reboot`: a plain power cycle. Unset: the annotation
    /// `machine.openshift.io/remediation-strategy`, else `external-baremetal`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub strategy: Option<StrategyName>,
    /// `Delete` the Node, or taint it `node.kubernetes.io/out-of-service` (`OutOfServiceTaint`:
    /// required where deleting a Node removes its etcd member, as on k3s and RKE2).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_action: Option<NodeAction>,
    /// Attempts after the first before the host is left for a person. Default 3.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(max = 10))]
    pub max_retries: Option<u32>,
    /// Minimum wait between attempts on one host. Default 5m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    pub retry_period: Option<String>,
    /// A host unhealthy again this soon after a remediation counts as a retry. Default 1h.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    pub min_healthy_period: Option<String>,
    /// An agent silent this long is not chosen to execute a remediation, and its view of etcd
    /// no longer counts for the quorum guard (nor does it once the agent is silent past the
    /// `agentHeartbeatTimeout` of a check selecting its host). Default 1m.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "schema::duration")]
    pub executor_heartbeat_timeout: Option<String>,
}

/// A remediation strategy, spelled as the MHC annotation spells it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "kebab-case")]
pub enum StrategyName {
    /// Power off, remove the Node, power on, restore metadata.
    #[default]
    ExternalBaremetal,
    /// A plain power cycle.
    Reboot,
}

impl From<StrategyName> for Strategy {
    fn from(name: StrategyName) -> Strategy {
        match name {
            StrategyName::ExternalBaremetal => Strategy::ExternalBaremetal,
            StrategyName::Reboot => Strategy::Reboot,
        }
    }
}

/// How the Node of a powered-off host is taken out of service.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum NodeAction {
    /// Delete the Node object.
    #[default]
    Delete,
    /// Taint it `node.kubernetes.io/out-of-service`.
    OutOfServiceTaint,
}

impl From<Strategy> for StrategyName {
    fn from(strategy: Strategy) -> StrategyName {
        match strategy {
            Strategy::ExternalBaremetal => StrategyName::ExternalBaremetal,
            Strategy::Reboot => StrategyName::Reboot,
        }
    }
}

impl From<NodeHandling> for NodeAction {
    fn from(handling: NodeHandling) -> NodeAction {
        match handling {
            NodeHandling::Delete => NodeAction::Delete,
            NodeHandling::OutOfServiceTaint => NodeAction::OutOfServiceTaint,
        }
    }
}

impl From<NodeAction> for NodeHandling {
    fn from(action: NodeAction) -> NodeHandling {
        match action {
            NodeAction::Delete => NodeHandling::Delete,
            NodeAction::OutOfServiceTaint => NodeHandling::OutOfServiceTaint,
        }
    }
}

/// What the last evaluation of the check found.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HostHealthCheckStatus {
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Hosts the selector matches.
    #[serde(default)]
    pub expected_hosts: u32,
    /// Of those, hosts that are healthy.
    #[serde(default)]
    pub current_healthy: u32,
    /// How many more remediations `maxUnhealthy` allows now.
    #[serde(default)]
    pub remediations_allowed: u32,
    /// `RemediationAllowed` (False with the reason when short-circuited or `maxUnhealthy`
    /// does not parse).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// The strategy annotation names a strategy metalguard does not know.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "health check {check} has annotation {REMEDIATION_STRATEGY_ANNOTATION}={value}; the only value understood is {EXTERNAL_BAREMETAL}"
)]
pub struct UnknownStrategyAnnotation {
    /// The health check.
    pub check: String,
    /// The annotation's value.
    pub value: String,
}

impl HostHealthCheck {
    /// The strategy this check asks for: `spec.remediation.strategy` if set, else the MHC
    /// annotation, else external-baremetal. An annotation with another value is refused
    /// (remediation is blocked with a condition) rather than guessed at.
    pub fn effective_strategy(&self) -> Result<Strategy, UnknownStrategyAnnotation> {
        if let Some(name) = self.spec.remediation.as_ref().and_then(|r| r.strategy) {
            return Ok(name.into());
        }
        let annotation = self
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(REMEDIATION_STRATEGY_ANNOTATION));
        match annotation.map(String::as_str) {
            None | Some(EXTERNAL_BAREMETAL) => Ok(Strategy::ExternalBaremetal),
            Some(other) => Err(UnknownStrategyAnnotation {
                check: self.metadata.name.clone().unwrap_or_default(),
                value: other.to_owned(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;

    fn check(strategy: Option<StrategyName>, annotation: Option<&str>) -> HostHealthCheck {
        let mut hc = HostHealthCheck::new(
            "workers",
            HostHealthCheckSpec {
                selector: LabelSelector::default(),
                unhealthy_conditions: Vec::new(),
                max_unhealthy: None,
                node_startup_timeout: None,
                agent_heartbeat_timeout: None,
                remediation: strategy.map(|s| RemediationSpec {
                    strategy: Some(s),
                    node_action: None,
                    max_retries: None,
                    retry_period: None,
                    min_healthy_period: None,
                    executor_heartbeat_timeout: None,
                }),
            },
        );
        hc.metadata.annotations = annotation
            .map(|v| BTreeMap::from([(REMEDIATION_STRATEGY_ANNOTATION.to_owned(), v.to_owned())]));
        hc
    }

    #[test]
    fn the_spec_wins_over_the_annotation_which_wins_over_the_default() {
        assert_eq!(
            check(None, None).effective_strategy(),
            Ok(Strategy::ExternalBaremetal)
        );
        assert_eq!(
            check(None, Some("external-baremetal")).effective_strategy(),
            Ok(Strategy::ExternalBaremetal)
        );
        assert_eq!(
            check(Some(StrategyName::Reboot), Some("external-baremetal")).effective_strategy(),
            Ok(Strategy::Reboot)
        );
    }

    #[test]
    fn an_unknown_annotation_value_is_refused_naming_the_check() {
        let err = check(None, Some("reprovision"))
            .effective_strategy()
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "health check workers has annotation machine.openshift.io/remediation-strategy=reprovision; the only value understood is external-baremetal"
        );
    }
}
