//! The decision snapshot: everything `metalguard-core` knows about the cluster at one instant.
//!
//! Adapters (the Kubernetes backend, the standalone backend, the lab) build a [`Snapshot`] from
//! the world; the core plans from it alone, so a restarted controller re-plans from the
//! persisted snapshot and reaches the same decisions.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::duration::Timestamp;
use crate::remediation::Remediation;

/// The name of the preDrain lifecycle hook metalguard places on control-plane hosts that carry
/// an etcd member (seed 001: `EtcdQuorumOperator`).
pub const QUORUM_HOOK: &str = "metalguard.io/etcd-quorum";

/// Everything the decision core needs, observed at one instant.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Snapshot {
    /// When the adapter took this snapshot (informational; planning takes `now` separately).
    pub observed_at: Timestamp,
    /// The control-plane specification (desired replicas and failure domains).
    pub control_plane: ControlPlaneSpec,
    /// Every host, control-plane and worker.
    pub hosts: Vec<Host>,
    /// etcd members that no host claims (for example a member whose host was removed by hand).
    #[serde(default)]
    pub orphan_members: Vec<EtcdMember>,
    /// Remediations in flight and finished ones kept as history (retry accounting).
    #[serde(default)]
    pub remediations: Vec<Remediation>,
}

/// The declared shape of the control plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct ControlPlaneSpec {
    /// Desired number of control-plane hosts and etcd voters; must be odd (seeds 001, 002).
    pub desired_replicas: u32,
    /// Failure domain names; empty means everything lives in one implicit domain (seed 000).
    #[serde(default)]
    pub failure_domains: Vec<String>,
}

/// The role of a host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Role {
    /// Runs the Kubernetes control plane and an etcd member.
    ControlPlane,
    /// Runs workloads only.
    Worker,
}

/// One machine, as seen from the inventory, Kubernetes, its agent and etcd.
#[allow(clippy::struct_excessive_bools)] // independent facts observed from different sources
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Host {
    /// Unique host name (also its Node name).
    pub name: String,
    /// Control-plane or worker.
    pub role: Role,
    /// The failure domain the host lives in, if domains are used.
    #[serde(default)]
    pub failure_domain: Option<String>,
    /// When the host object was created (oldest-first ordering).
    pub created_at: Timestamp,
    /// Host object labels (health-check selectors match on these).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Host object annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// The host was provisioned outside metalguard's provisioner: never reprovisioned.
    #[serde(default)]
    pub externally_provisioned: bool,
    /// A BMC (power controller) is configured for this host.
    #[serde(default)]
    pub bmc_configured: bool,
    /// The host carries the current specification (false: outdated, replaced first).
    #[serde(default = "default_true")]
    pub up_to_date: bool,
    /// When deletion of the host was requested, if it was.
    #[serde(default)]
    pub deletion_requested_at: Option<Timestamp>,
    /// Names of the preDrain lifecycle hooks on the host.
    #[serde(default)]
    pub pre_drain_hooks: BTreeSet<String>,
    /// An administrator asked for this host to be fenced.
    #[serde(default)]
    pub fence_request: Option<FenceRequest>,
    /// An administrator retired this host (standalone backend: no Machine API removes it).
    /// A retiring host counts as being deleted; once its etcd member is gone and no preDrain
    /// hook is left, metalguard powers it off.
    #[serde(default)]
    pub retirement: Option<Retirement>,
    /// The host's machine phase is Failed (remediated at once, MHC semantics).
    #[serde(default)]
    pub phase_failed: bool,
    /// The Node object, if one exists.
    #[serde(default)]
    pub node: Option<NodeStatus>,
    /// A Node for this host has existed before: its absence now means the Node is missing
    /// (unhealthy at once), not that the host is still starting (MHC semantics).
    #[serde(default)]
    pub node_seen: bool,
    /// The latest report of the host's metalguard agent.
    #[serde(default)]
    pub agent: Option<AgentReport>,
    /// The etcd member running on the host, if any.
    #[serde(default)]
    pub etcd: Option<EtcdMember>,
    /// A break-glass fence left the host as a person wants it: metalguard does not touch its
    /// power, does not remediate it and does not use its agent, until a person releases it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold: Option<Hold>,
    /// Another actor holds the host's node lease (Kubernetes: `coordination.k8s.io/v1`
    /// Lease `medik8s-leases/node-<name>`, as Node Health Check and Node Maintenance take
    /// it): its holder. metalguard starts no remediation of the host while it is held.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lease_held_by: Option<String>,
}

fn default_true() -> bool {
    true
}

impl Host {
    /// True when deletion (or retirement) of the host has been requested.
    pub fn is_deleting(&self) -> bool {
        self.deletion_requested_at.is_some() || self.retirement.is_some()
    }

    /// True when an administrator retired the host.
    pub fn is_retiring(&self) -> bool {
        self.retirement.is_some()
    }

    /// True when the host carries metalguard's quorum hook.
    pub fn has_quorum_hook(&self) -> bool {
        self.pre_drain_hooks.contains(QUORUM_HOOK)
    }

    /// True when the Node exists and its `Ready` condition is `True`.
    pub fn node_ready(&self) -> bool {
        self.node.as_ref().is_some_and(|n| {
            n.conditions
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == ConditionStatus::True)
        })
    }
}

/// An administrator's request to fence a host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FenceRequest {
    /// When the request was made.
    pub requested_at: Timestamp,
    /// Who asked (recorded in the remediation).
    #[serde(default)]
    pub requested_by: Option<String>,
    /// When set, the fence skips policy gates (short-circuit, retry limits, concurrency) and
    /// this reason is recorded. Safety rules (quorum, one per target) are never skipped.
    #[serde(default)]
    pub force_reason: Option<String>,
    /// Power off and leave off (`fence --power-off`, a `FenceRequest` with `action:
    /// PowerOff`): the remediation ends needing a person instead of powering the host on.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub stay_off: bool,
    /// A fence drill (`drill HOST`, a `FenceRequest` with `action: Drill`): a real power cycle
    /// of a healthy host, to prove the fence path end to end. It skips no gate: only while no
    /// host is unhealthy or being remediated, and only when the quorum guard allows a fence
    /// of the host; recorded as a drill (the remediation's cause starts with `fence drill
    /// requested by`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub drill: bool,
    /// A random value the request is made with (standalone: sealed with it). The leader records
    /// it as consumed when the request becomes a remediation, apart from the remediation, so
    /// the same request put back from the store's history is refused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nonce: Option<String>,
}

/// A break-glass hold: a person fenced a host directly through its BMC
/// (`metalguard-agent fence --direct`), bypassing the controller. Until a person releases it,
/// the host is left alone: no remediation, no power step, no executor duty, and its etcd
/// member counts as down whatever it reports.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Hold {
    /// Unique id of the hold (`<executing host>/<milliseconds>`); a released id is never
    /// honoured again, however often an agent still reports it.
    pub id: String,
    /// The held host.
    pub target: String,
    /// When the break-glass fence ran.
    pub since: Timestamp,
    /// Who ran it: the user (and the host the command ran on).
    pub by: String,
    /// Why, as the person gave it.
    pub reason: String,
    /// What the fence did: `off`, `reboot` or `on`.
    pub action: String,
}

/// An administrator's request to retire a host: replace its etcd member, then power it off.
/// It stands in for deleting a Machine where no Machine API exists (the standalone backend).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retirement {
    /// When the request was made; it also identifies the request (operation ids use it).
    pub requested_at: Timestamp,
    /// Who asked.
    #[serde(default)]
    pub requested_by: Option<String>,
    /// Why (recorded and shown by `status`).
    #[serde(default)]
    pub reason: String,
}

/// The Node object of a host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct NodeStatus {
    /// When this Node object was created (a re-registered node is a new object).
    pub created_at: Timestamp,
    /// Node conditions with their last transition times.
    #[serde(default)]
    pub conditions: Vec<NodeCondition>,
    /// Node labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Node annotations.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
    /// The node carries the `node.kubernetes.io/out-of-service` taint.
    #[serde(default)]
    pub out_of_service: bool,
}

/// The status of a Kubernetes condition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum ConditionStatus {
    /// `True`.
    True,
    /// `False`.
    False,
    /// `Unknown`.
    Unknown,
}

/// One Node condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeCondition {
    /// Condition type, for example `Ready`.
    #[serde(rename = "type")]
    pub type_: String,
    /// Condition status.
    pub status: ConditionStatus,
    /// When the status last changed.
    pub last_transition: Timestamp,
}

/// The latest report of a host's agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentReport {
    /// When the agent last reported.
    pub last_heartbeat: Timestamp,
    /// The agent can reach the BMCs it may be asked to drive.
    #[serde(default = "default_true")]
    pub can_fence: bool,
    /// Per target host, whether this agent's latest probe of that host's BMC reached it
    /// (without credentials). A host missing here was not probed (an older agent, or not
    /// yet): nothing is known, which is not the same as unreachable.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub bmc_reachable: BTreeMap<String, bool>,
    /// The host's boot ID in its agent's latest report (changes only when the host boots).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_id: Option<String>,
    /// When the controller received the report that carried `boot_id` (its own clock, never
    /// stretched like `last_heartbeat`): proof that the host ran that boot then. `None`: not
    /// known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_reported_at: Option<Timestamp>,
}

impl AgentReport {
    /// True when this agent's latest probe says it cannot reach `target`'s BMC.
    pub fn cannot_reach_bmc_of(&self, target: &str) -> bool {
        self.bmc_reachable.get(target) == Some(&false)
    }
}

/// An etcd member as seen by probing every member (never trusting one member's view).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdMember {
    /// Member ID.
    pub id: u64,
    /// Member name (empty for an added-but-unstarted member).
    #[serde(default)]
    pub name: String,
    /// True for a learner (non-voting) member.
    pub learner: bool,
    /// The member answered a status probe within its timeout, sees a leader and reports no
    /// alarm other than NOSPACE (a member under NOSPACE still votes).
    pub healthy: bool,
    /// The member is the raft leader.
    #[serde(default)]
    pub leader: bool,
    /// For a learner: raft match index as a per-mille of the leader's (promotable at ≥ 900).
    #[serde(default)]
    pub progress_permille: u16,
}

impl EtcdMember {
    /// True for a voting member.
    pub fn is_voter(&self) -> bool {
        !self.learner
    }

    /// True when a learner has caught up enough to be promoted (≥ 90% of the leader, DOMAIN §1).
    pub fn caught_up(&self) -> bool {
        self.learner && self.healthy && self.progress_permille >= 900
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MINIMAL: &str = r#"{
        "observed_at": 1000,
        "control_plane": {"desired_replicas": 3, "failure_domains": ["a"]},
        "hosts": [{
            "name": "cp-0", "role": "control-plane", "created_at": 0,
            "node": {"created_at": 0, "conditions": [
                {"type": "Ready", "status": "True", "last_transition": 0}]},
            "etcd": {"id": 1, "learner": false, "healthy": true}
        }]
    }"#;

    #[test]
    fn minimal_snapshot_reads_with_defaults_and_round_trips() {
        let s: Snapshot = serde_json::from_str(MINIMAL).unwrap();
        let h = &s.hosts[0];
        assert!(h.up_to_date && !h.bmc_configured && !h.is_deleting() && h.node_ready());
        assert!(h.etcd.as_ref().unwrap().is_voter());
        let back: Snapshot = serde_json::from_str(&serde_json::to_string(&s).unwrap()).unwrap();
        assert_eq!(back, s);
    }

    #[test]
    fn unknown_fields_are_rejected() {
        let typo = MINIMAL.replace(
            "\"role\": \"control-plane\",",
            "\"role\": \"control-plane\", \"bmc_configred\": true,",
        );
        assert_ne!(typo, MINIMAL);
        let err = serde_json::from_str::<Snapshot>(&typo).unwrap_err();
        assert!(
            err.to_string().contains("unknown field `bmc_configred`"),
            "{err}"
        );
    }

    #[test]
    fn learner_promotable_at_90_percent() {
        let mut m: EtcdMember =
            serde_json::from_str(r#"{"id": 2, "learner": true, "healthy": true}"#).unwrap();
        assert!(!m.caught_up());
        m.progress_permille = 900;
        assert!(m.caught_up());
        m.healthy = false;
        assert!(!m.caught_up());
    }
}
