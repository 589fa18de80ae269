//! `GuardedHost`: one physical host — its Node, BMC, failure domain, role and lifecycle hooks;
//! its status carries what metalguard observed (power, agent, etcd member), the remediation in
//! flight and, during one, the backup of the Node's labels and annotations.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::k8s::health_check::{NodeAction, StrategyName};
use crate::k8s::schema;
use crate::snapshot::Role;

/// The desired state of a host (written by an administrator or a provisioner).
// Every `printcolumn(...)` repeats `type_ = ...`; clippy reads that as a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "metalguard.io",
    version = "v1alpha1",
    kind = "GuardedHost",
    namespaced,
    status = "GuardedHostStatus",
    shortname = "gh",
    category = "metalguard",
    derive = "PartialEq",
    crates(kube_core = "::kube_core"),
    doc = "A physical host guarded by metalguard: its Node, BMC, failure domain, role and lifecycle hooks.",
    printcolumn(name = "Node", type_ = "string", json_path = ".spec.nodeName"),
    printcolumn(name = "Role", type_ = "string", json_path = ".spec.role"),
    printcolumn(name = "Domain", type_ = "string", json_path = ".spec.failureDomain"),
    printcolumn(name = "Power", type_ = "string", json_path = ".status.power"),
    printcolumn(
        name = "Member",
        type_ = "string",
        json_path = ".status.etcdMember.name"
    ),
    printcolumn(
        name = "Remediation",
        type_ = "string",
        json_path = ".status.remediation.phase"
    ),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct GuardedHostSpec {
    /// Name of the host's Node object (a Node that re-registers after remediation has the
    /// same name).
    #[schemars(length(min = 1))]
    pub node_name: String,
    /// ControlPlane (runs the API server and an etcd member) or Worker.
    pub role: HostRole,
    /// The failure domain the host lives in; one of its control plane's `failureDomains`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure_domain: Option<String>,
    /// The host was provisioned outside metalguard: it is never handed over for
    /// reprovisioning, even when power operations fail.
    #[serde(default)]
    pub externally_provisioned: bool,
    /// The host's BMC; without one the host can be watched but not power-fenced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc: Option<Bmc>,
    /// Hooks that hold a deletion of this host before drain and before power-off.
    #[serde(default)]
    pub lifecycle_hooks: LifecycleHooks,
    /// A control-plane host declared retired (`metalguard-controller retire`): the quorum
    /// guard replaces its etcd member (a new `GuardedHost` joins as learner, is promoted,
    /// the old member removed), its preDrain hooks are released, and then it is powered off
    /// and left off. The controller decides each step with the same checks as in standalone
    /// mode; this field only declares.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retirement: Option<HostRetirement>,
    /// A person hands the host back after a break-glass fence (`metalguard-controller release
    /// HOST --kubeconfig`): the leader marks each named hold of this host released in
    /// `status.holds`, and a released id is never honoured again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_release: Option<HoldReleaseRequest>,
    /// A person's on-demand check of the host's BMC (`metalguard-controller check-bmc`): the
    /// agent that would execute the host's fence checks it at once, and `status.bmcCheckAnswered`
    /// names `id` once the `FencingReady` condition holds that check's verdict.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc_check_request: Option<BmcCheckRequestSpec>,
}

/// A person's on-demand BMC check: an id new per request, who and when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct BmcCheckRequestSpec {
    /// New per request (random).
    #[schemars(length(min = 1, max = 128))]
    pub id: String,
    /// When it was requested.
    pub requested_at: Time,
    /// Who asked (the user the API server authenticated, as the command line recorded it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
}

/// A person's release of break-glass holds: which, when, who, why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HoldReleaseRequest {
    /// The ids of the holds released (as `status.holds` lists them).
    #[schemars(length(min = 1, max = 64))]
    pub holds: Vec<String>,
    /// When it was requested.
    pub requested_at: Time,
    /// Who asked (the user the API server authenticated, as the command line recorded it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// Why.
    #[serde(default)]
    pub reason: String,
}

/// A retirement request: when, who, why. It cannot be changed once made.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "self == oldSelf",
    "message": "a retirement cannot be changed once requested",
}]))]
pub struct HostRetirement {
    /// When it was requested; it also names the power-off that ends it.
    pub requested_at: Time,
    /// Who asked (the user the API server authenticated, as the command line recorded it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// Why.
    #[serde(default)]
    pub reason: String,
}

/// The role of a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum HostRole {
    /// Runs the Kubernetes control plane and an etcd member.
    ControlPlane,
    /// Runs workloads only.
    Worker,
}

impl From<HostRole> for Role {
    fn from(role: HostRole) -> Role {
        match role {
            HostRole::ControlPlane => Role::ControlPlane,
            HostRole::Worker => Role::Worker,
        }
    }
}

/// A host's BMC and how to trust it. At most one of `caBundle`, `fingerprintSha256` and
/// `insecure` may be set; with none, the system CA bundle is used.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(extend("x-kubernetes-validations" = [{
    "rule": "(has(self.caBundle) ? 1 : 0) + (has(self.fingerprintSha256) ? 1 : 0) + (has(self.insecure) && self.insecure ? 1 : 0) <= 1",
    "message": "set at most one of caBundle, fingerprintSha256 and insecure",
}]))]
pub struct Bmc {
    /// Address as metalguard-bmc parses it: `redfish+https://10.0.0.5/redfish/v1/Systems/1`,
    /// `ipmi://10.0.0.5:623` (the metal3 spellings are accepted). No credentials in the URL.
    #[schemars(pattern(schema::BMC_ADDRESS_PATTERN))]
    pub address: String,
    /// A Secret in the BMC credentials namespace (`metalguard-bmc` unless the controller's
    /// `--credentials-namespace` says otherwise) with keys `username` and `password`.
    pub credentials_secret: LocalSecretReference,
    /// PEM CA certificates that signed the BMC's certificate (Redfish over HTTPS).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_bundle: Option<String>,
    /// Trust exactly the certificate with this SHA-256 fingerprint (hex, colons allowed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(pattern(schema::FINGERPRINT_PATTERN))]
    pub fingerprint_sha256: Option<String>,
    /// Accept any certificate. An explicit opt-in, counted as an insecure BMC connection.
    #[serde(default)]
    pub insecure: bool,
}

/// A Secret in the namespace of the object that names it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LocalSecretReference {
    /// The Secret's name.
    #[schemars(length(min = 1))]
    pub name: String,
}

/// Lifecycle hooks (seed 001): while any hook is present, deletion of the host stops before
/// the named step; the hook's owner removes it when it is safe to go on.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleHooks {
    /// Hooks that hold the drain (metalguard places `metalguard.io/etcd-quorum` on hosts with
    /// a voting etcd member).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub pre_drain: Vec<LifecycleHook>,
    /// Hooks that hold the power-off after the drain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub pre_terminate: Vec<LifecycleHook>,
}

/// One lifecycle hook.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LifecycleHook {
    /// Unique name of the hook.
    #[schemars(length(min = 3, max = 256))]
    pub name: String,
    /// Who placed it and will remove it (for example `clusteroperator/etcd`).
    #[schemars(length(min = 3, max = 512))]
    pub owner: String,
}

/// What metalguard observed about a host (written by the controller only).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GuardedHostStatus {
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Power as the BMC last reported it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<PowerState>,
    /// When the BMC last reported the power state.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_observed_time: Option<Time>,
    /// The host's metalguard agent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub agent: Option<AgentStatus>,
    /// The etcd member running on the host.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_member: Option<EtcdMemberStatus>,
    /// The remediation in flight, or the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation: Option<RemediationStatus>,
    /// The operations of that remediation and the host's etcd membership operations: the
    /// intent is written before the command is offered, the agent's result after.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["id"]))]
    pub operations: Vec<OperationStatus>,
    /// `Healthy`, `Fenceable` (BMC reachable by another agent), `Remediating`, `NeedsPerson`,
    /// `FencingReady` (the agent that would fence it logged in to its BMC read-only: `True`
    /// `CheckPassed`, `False` with the failure class, e.g. `CredentialsRefused`, `Unknown`
    /// `NotChecked`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// Break-glass holds of this host (a person fenced it with `metalguard-agent fence
    /// --direct`): while one is not released, metalguard leaves the host alone. Released
    /// holds stay listed so that their ids are never honoured again (the oldest released go
    /// first once the list is full).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64))]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["id"]))]
    pub holds: Vec<HoldStatus>,
    /// The id of the latest `spec.bmcCheckRequest` the executor's check answered (its verdict
    /// is the `FencingReady` condition).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bmc_check_answered: Option<String>,
}

/// A break-glass hold as the leader recorded it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HoldStatus {
    /// `<host the fence ran on>/<milliseconds>`.
    pub id: String,
    /// When the break-glass fence ran.
    pub since: Time,
    /// Who ran it (the user and the host the command ran on).
    pub by: String,
    /// Why, as the person gave it.
    #[serde(default)]
    pub reason: String,
    /// What the fence did: `off`, `reboot` or `on`.
    pub action: String,
    /// The agent whose report or post brought it.
    pub reported_by: String,
    /// When the leader recorded it.
    pub record_time: Time,
    /// The release, once a person gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<HoldReleased>,
}

/// Who released a hold, when and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct HoldReleased {
    /// When the release was requested.
    pub time: Time,
    /// Who.
    pub by: String,
    /// Why.
    #[serde(default)]
    pub reason: String,
}

/// Power state reported by a BMC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum PowerState {
    /// Powered on.
    On,
    /// Powered off.
    Off,
    /// The BMC did not answer or answered something else.
    Unknown,
}

/// The host's agent, from its latest report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AgentStatus {
    /// When the agent last reported.
    pub last_heartbeat_time: Time,
    /// The agent's version.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub version: String,
    /// The agent can reach the BMCs it may be asked to drive.
    pub can_fence: bool,
}

/// The etcd member on the host, as seen by probing every member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdMemberStatus {
    /// Member ID in hex (etcd IDs are unsigned 64-bit, beyond JSON's safe integers).
    #[schemars(pattern("^[0-9a-f]{1,16}$"))]
    pub id: String,
    /// Member name (empty for an added-but-unstarted member).
    #[serde(default)]
    pub name: String,
    /// A learner (non-voting) member.
    pub learner: bool,
    /// The member answered its probe, sees a leader and reports no alarm but NOSPACE.
    pub healthy: bool,
    /// The member is the raft leader.
    #[serde(default)]
    pub leader: bool,
}

/// One remediation of the host, mirrored from the executor's persisted record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RemediationStatus {
    /// Stable id: `remediation/<host>/<sequence>`.
    pub id: String,
    /// Current phase.
    pub phase: RemediationPhaseName,
    /// Attempt within the current retry window (1 = first).
    #[schemars(range(min = 1))]
    pub attempt: u32,
    /// The agent host that drives this host's BMC (never the host itself).
    pub executor: String,
    /// Why the remediation started.
    pub cause: String,
    /// When it started.
    pub start_time: Time,
    /// When the current phase was entered.
    pub phase_transition_time: Time,
    /// Why it failed, needs a person or was cancelled.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// The Node's labels and annotations, saved before the Node is removed and merged back
    /// (keys already on the re-registered Node win) once it returns; cleared afterwards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub node_backup: Option<NodeBackup>,
    /// The host's remediation number (the last part of `id`).
    #[serde(default)]
    pub seq: u32,
    /// The strategy it follows.
    #[serde(default)]
    pub strategy: StrategyName,
    /// What happens to the Node once the host is off.
    #[serde(default)]
    pub node_action: NodeAction,
    /// True for a control-plane host (its etcd member is guarded).
    #[serde(default)]
    pub control_plane: bool,
    /// Why an administrator forced it past the policy gates, if they did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forced: Option<String>,
    /// Why a cancellation was requested, if it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cancel_requested: Option<String>,
    /// When the host was verified powered on again (its boot): health evidence from before
    /// it is not held against the host during its startup grace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_on_time: Option<Time>,
    /// Power off and leave off (a `PowerOff` fence request): after the Node is handled the
    /// remediation ends `NeedsPerson`, the host off, instead of powering it on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stay_off: bool,
    /// The host's boot ID when the remediation started: it is done only once the host reports
    /// another one after its power-on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_before: Option<String>,
}

/// One destructive operation (a BMC power action or an etcd membership change): its intent is
/// written here before the command is offered to the executing agent, and its result after.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationStatus {
    /// The plan's stable operation id (an agent executes an id at most once).
    pub id: String,
    /// The host whose agent executes it.
    pub agent: String,
    /// `fence`, `etcd-promote`, `etcd-remove`, `etcd-join` or `etcd-move-leader`.
    #[serde(rename = "type")]
    pub type_: String,
    /// The host whose BMC is driven (fence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target: Option<String>,
    /// `off`, `on` or `reboot` (fence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power: Option<String>,
    /// The etcd member id, in hex (membership operations).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub member_id: Option<String>,
    /// The remediation it belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remediation_id: Option<String>,
    /// The remediation step (`power-off`, `power-on`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub step: Option<String>,
    /// When the intent was written.
    pub create_time: Time,
    /// The agent's verified result, once received.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<OperationResult>,
    /// The term of the leadership that wrote this intent (its Lease's
    /// `metalguard.io/leader-term` then).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub term: Option<u64>,
}

/// The result an agent posted for an operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct OperationResult {
    /// `succeeded` (done and verified), `failed` or `rejected` (not attempted).
    pub outcome: String,
    /// When the agent started.
    pub start_time: Time,
    /// When it finished.
    pub finish_time: Time,
    /// Why it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// For a succeeded promotion, who promoted the learner: `metalguard` (this operation)
    /// or `outside` (a voter already: kubeadm's learner mode or a person).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted_by: Option<String>,
}

/// The Node metadata saved during a remediation.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct NodeBackup {
    /// Saved labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Saved annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

impl From<&crate::remediation::NodeBackup> for NodeBackup {
    fn from(backup: &crate::remediation::NodeBackup) -> NodeBackup {
        NodeBackup {
            labels: backup.labels.clone(),
            annotations: backup.annotations.clone(),
        }
    }
}

/// The phases of [`crate::remediation::RemediationPhase`], spelled the Kubernetes way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum RemediationPhaseName {
    /// The host was found unhealthy (or a fence was requested).
    Detected,
    /// Every gate passed; intent persisted, nothing destructive done yet.
    Gated,
    /// Power-off requested from the BMC.
    PoweringOff,
    /// The BMC reported the host off.
    VerifiedOff,
    /// The Node's labels and annotations are saved.
    BackedUp,
    /// The Node was deleted or tainted out-of-service.
    NodeRemoved,
    /// Power-on requested.
    PoweringOn,
    /// Waiting for the Node to re-register and become Ready.
    WaitingForNode,
    /// Saved labels and annotations merged back.
    Restored,
    /// Finished successfully.
    Done,
    /// This attempt failed.
    Failed,
    /// metalguard will not act further; a person must.
    NeedsPerson,
    /// Handed over to be reprovisioned.
    Reprovisioning,
    /// Cancelled; the host was left or put back powered on.
    Cancelled,
}

impl From<&crate::remediation::RemediationPhase> for RemediationPhaseName {
    fn from(phase: &crate::remediation::RemediationPhase) -> RemediationPhaseName {
        use crate::remediation::RemediationPhase as P;
        match phase {
            P::Detected => Self::Detected,
            P::Gated => Self::Gated,
            P::PoweringOff => Self::PoweringOff,
            P::VerifiedOff => Self::VerifiedOff,
            P::BackedUp => Self::BackedUp,
            P::NodeRemoved => Self::NodeRemoved,
            P::PoweringOn => Self::PoweringOn,
            P::WaitingForNode => Self::WaitingForNode,
            P::Restored => Self::Restored,
            P::Done => Self::Done,
            P::Failed { .. } => Self::Failed,
            P::NeedsPerson { .. } => Self::NeedsPerson,
            P::Reprovisioning => Self::Reprovisioning,
            P::Cancelled { .. } => Self::Cancelled,
        }
    }
}
