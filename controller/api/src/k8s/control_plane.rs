//! `GuardedControlPlane`: the declared shape of the control plane (odd replicas, failure
//! domains, which hosts belong to it, how a replacement is rolled out) and the etcd cluster
//! metalguard guards.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector};
use kube_derive::CustomResource;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::k8s::host::LocalSecretReference;
use crate::snapshot::ControlPlaneSpec;

/// Default number of control-plane hosts.
pub const DEFAULT_REPLICAS: u32 = 3;

/// The desired control plane.
// Every `printcolumn(...)` repeats `type_ = ...`; clippy reads that as a duplicated attribute.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "metalguard.io",
    version = "v1alpha1",
    kind = "GuardedControlPlane",
    namespaced,
    status = "GuardedControlPlaneStatus",
    shortname = "gcp",
    category = "metalguard",
    derive = "PartialEq",
    crates(kube_core = "::kube_core"),
    doc = "The control plane metalguard keeps alive: odd replicas spread over failure domains, and the etcd cluster whose quorum it guards.",
    printcolumn(name = "Desired", type_ = "integer", json_path = ".spec.replicas"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyReplicas"),
    printcolumn(name = "Voters", type_ = "integer", json_path = ".status.etcdVoters"),
    printcolumn(name = "Leader", type_ = "string", json_path = ".status.etcdLeader"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[serde(rename_all = "camelCase")]
pub struct GuardedControlPlaneSpec {
    /// Desired control-plane hosts and etcd voters; odd, so that quorum tolerates
    /// `(replicas - 1) / 2` failures (seeds 001, 002).
    #[serde(default = "default_replicas")]
    #[schemars(range(min = 1, max = 9))]
    #[schemars(extend("x-kubernetes-validations" = [{
        "rule": "self % 2 == 1",
        "message": "replicas must be odd",
    }]))]
    pub replicas: u32,
    /// Failure domain names; hosts are spread over them (index i goes to the i-th domain in
    /// alphabetical order, modulo their count). Empty: one implicit domain.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    pub failure_domains: Vec<String>,
    /// Which `GuardedHost`s of this namespace belong to the control plane (their labels).
    pub host_selector: LabelSelector,
    /// How an outdated or removed control-plane host is replaced.
    #[serde(default)]
    pub rollout: Rollout,
    /// The guarded etcd cluster.
    pub etcd: EtcdConnection,
}

fn default_replicas() -> u32 {
    DEFAULT_REPLICAS
}

/// Rolling replacement of control-plane hosts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Rollout {
    /// 1: add the replacement (a learner, then a voter) before removing the old member
    /// (KCP's default). 0: remove first, for clusters without a spare host.
    #[serde(default = "default_max_surge")]
    #[schemars(range(min = 0, max = 1))]
    pub max_surge: u32,
}

impl Default for Rollout {
    fn default() -> Self {
        Rollout {
            max_surge: default_max_surge(),
        }
    }
}

fn default_max_surge() -> u32 {
    1
}

/// How metalguard reaches etcd.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct EtcdConnection {
    /// Client URLs of the etcd members.
    #[schemars(length(min = 1))]
    #[schemars(inner(pattern("^https?://")))]
    pub endpoints: Vec<String>,
    /// A Secret in this namespace with `ca.crt`, `tls.crt` and `tls.key` (the layout
    /// cert-manager writes) for etcd's client TLS; unset: plain HTTP endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls_secret: Option<LocalSecretReference>,
}

/// What metalguard observed about the control plane.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct GuardedControlPlaneStatus {
    /// The generation of the spec this status describes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    /// Selected hosts that are not being deleted.
    #[serde(default)]
    pub replicas: u32,
    /// Selected hosts whose Node is Ready and whose etcd member is a healthy voter.
    #[serde(default)]
    pub ready_replicas: u32,
    /// Selected hosts carrying the current specification.
    #[serde(default)]
    pub updated_replicas: u32,
    /// Voting etcd members.
    #[serde(default)]
    pub etcd_voters: u32,
    /// Learner etcd members (replacements catching up).
    #[serde(default)]
    pub etcd_learners: u32,
    /// Name of the member that leads raft.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_leader: Option<String>,
    /// Voter failures etcd survives at its current size: `(voters − 1) / 2` (unset while no
    /// voter is known).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quorum_tolerance: Option<u32>,
    /// The voluntary disruption budget: control-plane hosts that must stay available
    /// (hosts − 1, seed 001's quorum-guard PodDisruptionBudget).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_available: Option<u32>,
    /// `QuorumSafe` (healthy voters keep quorum after one more failure; `False` with
    /// `QuorumAtRisk` or `QuorumLost`), `Scaling` (a membership change is under way or the
    /// voters differ from `spec.replicas`), `FencingReady` (the read-only BMC check of every
    /// control-plane host passed; `False` `HostCannotBeFenced` naming each that failed or
    /// has no BMC, `Unknown` `NotChecked`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
}

impl GuardedControlPlaneSpec {
    /// The decision core's view of this spec.
    pub fn to_core(&self) -> ControlPlaneSpec {
        ControlPlaneSpec {
            desired_replicas: self.replicas,
            failure_domains: self.failure_domains.clone(),
        }
    }
}
