//! `FenceRequest`: an administrator's request to fence one host, created with kubectl or
//! `metalguard-controller fence`. The controller answers in its status: a phase and a
//! timeline of what happened, one entry per transition.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::k8s::host::RemediationPhaseName;

/// What the administrator asks for.
// Every `printcolumn(...)` repeats `type_ = ...`; clippy reads that as a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "metalguard.io",
    version = "v1alpha1",
    kind = "FenceRequest",
    namespaced,
    status = "FenceRequestStatus",
    shortname = "fence",
    category = "metalguard",
    derive = "PartialEq",
    crates(kube_core = "::kube_core"),
    doc = "A request to fence one GuardedHost through its BMC; the spec is immutable.",
    printcolumn(name = "Target", type_ = "string", json_path = ".spec.target"),
    printcolumn(name = "Action", type_ = "string", json_path = ".spec.action"),
    printcolumn(name = "Force", type_ = "boolean", json_path = ".spec.force"),
    printcolumn(name = "Phase", type_ = "string", json_path = ".status.phase"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self == oldSelf",
    "message": "a fence request cannot be changed; delete it and create another",
}]))]
pub struct FenceRequestSpec {
    /// Name of the `GuardedHost` (in this namespace) to fence.
    #[schemars(length(min = 1))]
    pub target: String,
    /// `Remediate` (default): the host's remediation flow, which powers it back on.
    /// `PowerOff`: power it off and leave it off for a person. `Drill`: a fence drill of a
    /// healthy host (a real power cycle, every gate kept).
    #[serde(default)]
    pub action: FenceAction,
    /// Why; recorded in the remediation, the timeline and the events.
    #[schemars(length(min = 1))]
    pub reason: String,
    /// Skip the policy gates (maxUnhealthy, retry limits, concurrency). The safety rules
    /// (etcd quorum, one remediation per host) are never skipped.
    #[serde(default)]
    pub force: bool,
}

/// The fence actions.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum FenceAction {
    /// Run the host's remediation (power off, Node handling, power on).
    #[default]
    Remediate,
    /// Power off and stay off.
    PowerOff,
    /// A fence drill: a real power cycle of a healthy host, to prove the fence path end to
    /// end. Skips no gate (`force` is ignored): only while no host is unhealthy or being
    /// remediated, and only when the quorum guard allows a fence of the host. Recorded as a
    /// drill in the remediation's cause.
    Drill,
}

/// The controller's answer.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FenceRequestStatus {
    /// Where the request stands.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<FencePhase>,
    /// The remediation it started (`remediation/<host>/<sequence>`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation_id: Option<String>,
    /// That remediation's current phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation_phase: Option<RemediationPhaseName>,
    /// Every transition, oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub timeline: Vec<TimelineEntry>,
    /// `Accepted` (False with the refusing rule when rejected), `Succeeded`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

/// Where a fence request stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum FencePhase {
    /// Not yet seen by the leader.
    Pending,
    /// A rule refused it (the `Accepted` condition names the rule); nothing was done.
    Rejected,
    /// A remediation is running for it.
    InProgress,
    /// The remediation finished.
    Succeeded,
    /// The remediation failed or needs a person.
    Failed,
    /// The request was withdrawn before anything destructive happened, or was undone.
    Cancelled,
}

/// One transition of a fence request.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TimelineEntry {
    /// When.
    pub time: Time,
    /// The request's phase from then on.
    pub phase: FencePhase,
    /// The remediation phase, once there is a remediation.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation_phase: Option<RemediationPhaseName>,
    /// What happened, for a person.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
}
