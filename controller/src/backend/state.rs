//! The persisted records: reports, operations (intent + result), remediations, fence requests,
//! retirement requests, hooks and the leader's notes for people. Credentials are never part of a record; they are read from the inventory's
//! files when a command is handed to an agent.

use std::collections::{BTreeMap, BTreeSet};

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::OperationId;
use metalguard_api::protocol::{AgentReport, CommandResult, PowerAction};
use metalguard_api::remediation::Remediation;
use metalguard_api::snapshot::{FenceRequest, Retirement};
use serde::{Deserialize, Serialize};

/// An agent's latest report and when the controller received it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredReport {
    /// The report.
    pub report: AgentReport,
    /// The controller's receive time (heartbeats use this, not the agent's clock).
    pub received_at: Timestamp,
}

/// What an operation does (the command minus credentials).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "type")]
pub enum OperationKind {
    /// Drive `target`'s BMC.
    Fence {
        /// The host fenced.
        target: String,
        /// The power action.
        action: PowerAction,
    },
    /// Promote a learner.
    EtcdPromote {
        /// Member id.
        member_id: u64,
    },
    /// Remove a member.
    EtcdRemove {
        /// Member id.
        member_id: u64,
    },
    /// Join the agent's own host as a learner and wait until it has caught up.
    EtcdJoin {},
    /// Move raft leadership to `to_member`.
    EtcdMoveLeader {
        /// The voter that should lead.
        to_member: u64,
    },
}

/// A destructive operation: written before its command is sent, completed by its result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredOperation {
    /// The plan's stable operation id.
    pub id: OperationId,
    /// The agent host that executes it.
    pub agent: String,
    /// What it does.
    pub kind: OperationKind,
    /// The remediation it belongs to, if any.
    #[serde(default)]
    pub remediation_id: Option<String>,
    /// The remediation step name (`power-off`, `power-on`), if any.
    #[serde(default)]
    pub step: Option<String>,
    /// When the intent was persisted.
    pub created_at: Timestamp,
    /// Who asked for it: the remediation's cause (an administrator's identity for a fence
    /// request, the failing health check otherwise) or the retirement's requester; `None`
    /// for the controller's own membership steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// Who posted the result: the host and serial of the executing agent's client
    /// certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executed_by: Option<String>,
    /// The agent's result, once received.
    #[serde(default)]
    pub result: Option<CommandResult>,
}

impl StoredOperation {
    /// True while the result is outstanding (the command is offered to the agent).
    pub fn in_flight(&self) -> bool {
        self.result.is_none()
    }
}

/// Everything a backend persists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Latest report per host.
    pub reports: BTreeMap<String, StoredReport>,
    /// Every operation, by id.
    pub operations: BTreeMap<OperationId, StoredOperation>,
    /// Remediations by id.
    pub remediations: BTreeMap<String, Remediation>,
    /// Pending administrator fence requests by host.
    pub fence_requests: BTreeMap<String, FenceRequest>,
    /// Pending administrator retirement requests by host.
    pub retirements: BTreeMap<String, Retirement>,
    /// preDrain hooks per host.
    pub hooks: BTreeMap<String, BTreeSet<String>>,
    /// Break-glass holds by held host: a person fenced it directly, and metalguard leaves it
    /// alone until a person releases it.
    pub holds: BTreeMap<String, metalguard_api::snapshot::Hold>,
    /// What the leader last told people (inventory generation, what it needs, what waits).
    pub notes: Option<ControllerNotes>,
    /// The current leader's identity, if any.
    pub leader: Option<String>,
    /// The Kubernetes backend's Node of each host (by host name); `None` for the standalone
    /// backend, which has no Node objects (an agent's report stands in for its Node).
    pub nodes: Option<BTreeMap<String, metalguard_api::snapshot::NodeStatus>>,
    /// Stored records that were not believed (their seal does not hold): left out of
    /// everything above, so never acted on; shown by `status` and counted in metrics.
    pub rejected: Vec<RejectedRecord>,
    /// Records whose seal holds but was made with a key that no longer signs (a rotation is
    /// under way): the leader seals them again with the signing key.
    pub stale_seals: Vec<StaleSeal>,
}

/// A stored record that is not believed, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RejectedRecord {
    /// Its key under the prefix, e.g. `operations/remediation/cp-1/1/power-off`.
    pub key: String,
    /// `operation`, `remediation`, `report`, `fence-request`, `retirement`, `hooks`, `notes`.
    pub kind: String,
    /// Why its seal does not hold (never the record or a key).
    pub reason: String,
}

/// A record sealed with a key that verifies but no longer signs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleSeal {
    /// Its key under the prefix.
    pub key: String,
    /// The record as stored.
    pub record: serde_json::Value,
    /// The revision it was read at (it is sealed again only if still unchanged).
    pub revision: i64,
}

/// What the leading controller wants people to know, written when it changes and shown by
/// `status`: things it cannot do itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerNotes {
    /// The identity of the controller that wrote these notes.
    pub identity: String,
    /// Increases with every inventory (re)load that was accepted.
    pub inventory_generation: u64,
    /// Why the latest change of the inventory file was not accepted (the previous one is
    /// still in use), if it was not.
    #[serde(default)]
    pub inventory_error: Option<String>,
    /// Work for a person, e.g. `add a control-plane host to the inventory (failure domain a)`.
    #[serde(default)]
    pub needs: Vec<String>,
    /// Planned actions that wait, with the reason (e.g. an agent that has not reported).
    #[serde(default)]
    pub waiting: Vec<String>,
}

impl State {
    /// The operation of `remediation_id` for `step`, if one was created.
    pub fn operation_of(&self, remediation_id: &str, step: &str) -> Option<&StoredOperation> {
        self.operations.values().find(|op| {
            op.remediation_id.as_deref() == Some(remediation_id) && op.step.as_deref() == Some(step)
        })
    }
}
