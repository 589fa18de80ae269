//! The agent ↔ controller protocol: HTTP/JSON over HTTPS with mutual TLS.
//!
//! Four versioned endpoints, all scoped to the host named by the agent's client certificate
//! (the controller answers 403 when the `{host}` in the path is not that host):
//!
//! | method | path | body | answer |
//! |---|---|---|---|
//! | POST | [`REPORT_PATH`] | [`AgentReport`] | [`ReportAck`] |
//! | GET  | [`COMMANDS_PATH`]`?wait=SECONDS` | — | [`CommandBatch`] (long-poll) |
//! | POST | [`RESULTS_PATH`] | [`CommandResult`] | [`ResultAck`] |
//! | POST | [`HOLDS_PATH`] | [`Hold`] | [`HoldAck`] |
//!
//! Data flow: the agent reports on an interval and on change; it keeps one long-poll open and
//! receives commands within ~100 ms of the controller planning them; it executes each command
//! at most once per [`OperationId`] and posts a [`CommandResult`] until the controller
//! acknowledges it (also after a controller restart). Errors are answered as [`ErrorBody`].
//!
//! Break-glass holds: `metalguard-agent fence --direct` records a [`Hold`] on its host and
//! posts it to [`HOLDS_PATH`]; the daemon then carries every local hold in
//! [`AgentReport::holds`] until the controller names it in [`ReportAck::released_holds`]
//! (a person released it). Both fields are left out of the JSON while empty, so an agent
//! and a controller that predate them keep talking until a hold exists.
//!
//! Host identity: an agent asks with [`HOST_IDENTITY_PARAM`] whether the controller takes
//! [`AgentReport::host_identity`]; it sends the field only after an answer said so
//! ([`ReportAck::host_identity`]), and stops (resending at once without it) when a report that
//! carried it is refused as unprocessable (422): an older controller may lead after a
//! failover, and it refuses unknown fields.
//!
//! Pure serde types: no I/O, no clock. Secrets ([`Secret`]) serialize as plain strings on the
//! wire (inside TLS) but never print through `Debug`.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::duration::Timestamp;
use crate::identity::SystemIdentity;
use crate::plan::OperationId;
use crate::snapshot::{ConditionStatus, Hold};

/// The protocol version, the first segment of every path.
pub const API_VERSION: &str = "v1";
/// POST: an agent's report. `{host}` is the host named by the client certificate.
pub const REPORT_PATH: &str = "/v1/hosts/{host}/report";
/// GET: the agent's pending commands; long-polls up to `?wait=SECONDS` ([`WAIT_PARAM`]).
pub const COMMANDS_PATH: &str = "/v1/hosts/{host}/commands";
/// POST: the result of one command.
pub const RESULTS_PATH: &str = "/v1/hosts/{host}/results";
/// POST: a break-glass hold recorded on this host (`metalguard-agent fence --direct`). The
/// hold's id must start with `{host}/`; its target may be any inventory host.
pub const HOLDS_PATH: &str = "/v1/hosts/{host}/holds";
/// The query parameter of [`COMMANDS_PATH`] that holds the long-poll wait in whole seconds.
pub const WAIT_PARAM: &str = "wait";
/// The longest long-poll the controller honours; larger waits are clamped to this.
pub const MAX_WAIT: Duration = Duration::from_secs(60);
/// The placeholder in the path templates.
pub const HOST_PLACEHOLDER: &str = "{host}";
/// The query parameter of [`REPORT_PATH`] by which an agent asks for
/// [`ReportAck::bmc_targets`] (`=true`). Agents that predate the field refuse an answer that
/// carries it (`deny_unknown_fields`), so the controller sends it only to agents that ask;
/// a controller that predates it ignores the parameter.
pub const BMC_TARGETS_PARAM: &str = "bmc_targets";

/// The query parameter of [`REPORT_PATH`] and [`COMMANDS_PATH`] by which an agent says it
/// knows leadership terms (`=true`): the controller then puts its term in
/// [`ReportAck::term`] and [`Command::term`]. Agents that predate terms refuse those fields
/// (`deny_unknown_fields`), so only agents that ask get them; a controller that predates
/// them ignores the parameter and its commands read as term 0.
pub const TERMS_PARAM: &str = "terms";

/// The query parameter of [`REPORT_PATH`] by which an agent says it can send
/// [`AgentReport::host_identity`] (`=true`): a controller that takes the field answers with
/// [`ReportAck::host_identity`] set, and the agent sends its identity from then on. A
/// controller that predates it ignores the parameter (and would refuse the field).
pub const HOST_IDENTITY_PARAM: &str = "host_identity";

/// The query parameter of [`REPORT_PATH`] by which an agent says it runs credentialed
/// read-only BMC checks (`=true`): the controller then puts the credentials of the BMCs whose
/// fence this agent would execute in [`BmcTarget::credentials`], and the agent reports
/// [`BmcReachability::check`] for them. A controller that predates it ignores the parameter,
/// sends no credentials, and so never gets a `check`; an agent whose report with a `check`
/// is refused as unprocessable (an older replica leading after a failover) sends reports
/// without it until a controller hands credentials out again.
pub const BMC_CHECKS_PARAM: &str = "bmc_checks";

/// Whether `term` is zero: "no term", left out of the JSON.
#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
pub fn no_term(term: &u64) -> bool {
    *term == 0
}

/// [`REPORT_PATH`] for `host`.
pub fn report_path(host: &str) -> String {
    REPORT_PATH.replace(HOST_PLACEHOLDER, host)
}

/// [`REPORT_PATH`] for `host`, asking for the BMC targets ([`BMC_TARGETS_PARAM`]) with the
/// credentials for checks ([`BMC_CHECKS_PARAM`]), the leadership term ([`TERMS_PARAM`]) and
/// whether the controller takes the host's identity ([`HOST_IDENTITY_PARAM`]) in the answer.
pub fn report_path_with_bmc_targets(host: &str) -> String {
    format!(
        "{}?{BMC_TARGETS_PARAM}=true&{BMC_CHECKS_PARAM}=true&{TERMS_PARAM}=true&{HOST_IDENTITY_PARAM}=true",
        report_path(host)
    )
}

/// [`COMMANDS_PATH`] for `host` with a long-poll of `wait` (whole seconds, rounded down),
/// asking for each command's leadership term ([`TERMS_PARAM`]) and a fence's expected target
/// identity ([`HOST_IDENTITY_PARAM`], [`FenceCommand::expected_identity`]).
pub fn commands_path(host: &str, wait: Duration) -> String {
    format!(
        "{}?{WAIT_PARAM}={}&{TERMS_PARAM}=true&{HOST_IDENTITY_PARAM}=true",
        COMMANDS_PATH.replace(HOST_PLACEHOLDER, host),
        wait.as_secs()
    )
}

/// [`RESULTS_PATH`] for `host`.
pub fn results_path(host: &str) -> String {
    RESULTS_PATH.replace(HOST_PLACEHOLDER, host)
}

/// [`HOLDS_PATH`] for `host`.
pub fn holds_path(host: &str) -> String {
    HOLDS_PATH.replace(HOST_PLACEHOLDER, host)
}

/// A secret string (a BMC password). Serialized as a plain string; `Debug` prints
/// `<redacted>` and there is deliberately no `Display`, so it cannot reach a log by accident.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    /// Wraps a secret value.
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }

    /// The secret value, for the one place that must send it (the BMC client).
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

/// An agent's report about its own host, sent on an interval and whenever a condition changes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentReport {
    /// The reporting host; must equal the host named by the client certificate.
    pub host: String,
    /// The agent's version (`CARGO_PKG_VERSION`).
    pub agent_version: String,
    /// Increases by one with every report of one agent process; the controller ignores a
    /// report whose sequence is not above the last one it kept from the same `boot_id`.
    pub sequence: u64,
    /// The host's boot ID (Linux: `/proc/sys/kernel/random/boot_id`, or the agent's
    /// `[state] boot_id_file`), which changes only when the host boots: with `sequence` it
    /// identifies a report, and it is the controller's evidence that a power cycle really
    /// booted the host. Empty when unknown.
    #[serde(default)]
    pub boot_id: String,
    /// When the agent sent this report (the agent's clock; the controller also records its own).
    pub sent_at: Timestamp,
    /// Probe verdicts, one per condition type.
    #[serde(default)]
    pub conditions: Vec<Condition>,
    /// What the agent sees of etcd, if the host runs or may run an etcd member.
    #[serde(default)]
    pub etcd: Option<EtcdView>,
    /// Whether the agent can reach the BMCs of the hosts it may be asked to fence.
    #[serde(default)]
    pub bmc_reachability: Vec<BmcReachability>,
    /// Operation ids the agent has executed and whose results are not acknowledged yet
    /// (so a restarted controller knows a result is on its way).
    #[serde(default)]
    pub unacknowledged_results: Vec<OperationId>,
    /// Break-glass holds recorded on this host and not yet released (the agent deletes its
    /// local record when the controller lists the id in [`ReportAck::released_holds`]). Left
    /// out while empty: a controller that predates the field refuses unknown fields
    /// (`deny_unknown_fields`), so it keeps accepting reports until a hold exists.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub holds: Vec<Hold>,
    /// The highest leadership term this agent has seen (in a command or an answer), kept
    /// across its restarts. A controller whose own term is lower has been superseded and
    /// stops acting at once. Left out while zero (a controller that predates terms refuses
    /// unknown fields; an agent sees a term only from a controller that knows them).
    #[serde(default, skip_serializing_if = "no_term")]
    pub seen_term: u64,
    /// This host's identity from its firmware tables (Linux: `/sys/class/dmi/id/product_uuid`
    /// and `product_serial`, or the agent's `[state] dmi_dir`), each field present or absent
    /// with the reason, for the controller to compare with what the host's BMC says. Sent only
    /// to a controller that said it takes it ([`ReportAck::host_identity`]; one that predates
    /// the field refuses unknown fields).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub host_identity: Option<SystemIdentity>,
}

/// Condition types an agent may not report: Kubernetes' own Node conditions. `Ready` is the
/// controller's judgement over the other conditions (an agent reporting `Ready=True` would
/// hide every failing one), and the kubelet's pressure and network conditions belong to the
/// kubelet. The agent's `check-config` refuses them as probe names; the controller ignores
/// them in reports.
pub const RESERVED_CONDITION_TYPES: &[&str] = &[
    "Ready",
    "MemoryPressure",
    "DiskPressure",
    "PIDPressure",
    "NetworkUnavailable",
];

/// Whether `type_` is one of the [`RESERVED_CONDITION_TYPES`] (exact, case-sensitive, as
/// Kubernetes compares condition types).
pub fn is_reserved_condition(type_: &str) -> bool {
    RESERVED_CONDITION_TYPES.contains(&type_)
}

/// The condition an agent reports while etcd's NOSPACE alarm is active (a pressure condition).
pub const ETCD_NO_SPACE: &str = "EtcdNoSpace";

/// Condition types whose `True` means trouble, like Kubernetes' `MemoryPressure`: they are
/// reported, and they do not make a host unready (a health check may still name them).
pub const PRESSURE_CONDITIONS: &[&str] = &[ETCD_NO_SPACE];

/// Whether conditions of this type are pressure conditions ([`PRESSURE_CONDITIONS`]).
pub fn is_pressure(type_: &str) -> bool {
    PRESSURE_CONDITIONS.contains(&type_)
}

/// Whether a condition of this type and status says something is wrong: `False` for most
/// conditions, `True` for the [`PRESSURE_CONDITIONS`]. `Unknown` never does.
pub fn is_adverse(type_: &str, status: ConditionStatus) -> bool {
    let trouble = if is_pressure(type_) {
        ConditionStatus::True
    } else {
        ConditionStatus::False
    };
    status == trouble
}

/// One probe verdict, shaped like a Kubernetes condition.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Condition {
    /// Condition type, e.g. `EtcdMemberHealthy`, `APIServerReady`, `KubeletHealthy`,
    /// `DiskSpaceSufficient`, `ClockSynchronized`, a custom probe's name, or the pressure
    /// condition `EtcdNoSpace`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `True` when the probed thing is healthy; for a pressure condition (`EtcdNoSpace`,
    /// see [`PRESSURE_CONDITIONS`]) `True` when the pressure is on.
    pub status: ConditionStatus,
    /// A CamelCase machine-readable reason, e.g. `Timeout`, `NoLeader`, `AlarmNoSpace`.
    pub reason: String,
    /// A human-readable message (never contains secrets).
    #[serde(default)]
    pub message: String,
    /// When `status` last changed (after hysteresis).
    pub last_transition: Timestamp,
}

/// What the agent sees of etcd: its local member and the members it probed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct EtcdView {
    /// The id of the member running on this host, if one runs.
    #[serde(default)]
    pub local_member_id: Option<u64>,
    /// The raft leader as the local member sees it.
    #[serde(default)]
    pub leader_id: Option<u64>,
    /// Every member of the member list, with what probing it showed.
    #[serde(default)]
    pub members: Vec<EtcdMemberView>,
}

/// One etcd member as the agent observed it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdMemberView {
    /// Member id.
    pub id: u64,
    /// Member name (empty for an added-but-unstarted member).
    #[serde(default)]
    pub name: String,
    /// Peer URLs.
    #[serde(default)]
    pub peer_urls: Vec<String>,
    /// Client URLs.
    #[serde(default)]
    pub client_urls: Vec<String>,
    /// True for a learner.
    #[serde(default)]
    pub learner: bool,
    /// The member answered a status probe within its timeout, sees a leader and has no alarm
    /// other than NOSPACE (a member under NOSPACE refuses writes but still serves reads and
    /// votes, so it is not lost for quorum; `alarms` still lists it).
    pub healthy: bool,
    /// Active alarms (`NOSPACE`, `CORRUPT`).
    #[serde(default)]
    pub alarms: Vec<String>,
    /// The member's raft applied index, if its status was read.
    #[serde(default)]
    pub raft_applied_index: Option<u64>,
    /// Why the probe failed, if it did.
    #[serde(default)]
    pub error: Option<String>,
}

/// Whether this agent can reach one host's BMC.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BmcReachability {
    /// The host whose BMC was probed.
    pub host: String,
    /// True when the BMC answered a request that needs no credentials (Redfish: the service
    /// root over TLS verified with the target's trust, any HTTP status; IPMI: Get Channel
    /// Authentication Capabilities). It says nothing about the credentials.
    pub reachable: bool,
    /// When the probe ran.
    pub checked_at: Timestamp,
    /// Why it failed, if it did (never contains credentials).
    #[serde(default)]
    pub error: Option<String>,
    /// The credentialed check, when the controller handed out the credentials for one
    /// ([`BmcTarget::credentials`]); absent otherwise, so a controller that predates it
    /// never sees the field unless it sent credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check: Option<BmcCheck>,
}

/// A read-only check of a BMC with the credentials a fence would use (issue 25): log in,
/// read the power state and the system's identity, compare it with the identity the host's
/// own agent reported. Never changes power.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BmcCheck {
    /// Why the check failed; `None`: it passed (a fence through this BMC would log in, and
    /// the BMC is not proven to answer for another machine).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub failure: Option<crate::bmc::CheckFailure>,
    /// The power state read (`on`, `off`, ...), when it was.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub power_state: Option<String>,
    /// The system's identity as the BMC gave it, when it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub identity: Option<SystemIdentity>,
    /// What the check found, in one line: the error, or how the identity compared (never
    /// contains credentials).
    pub detail: String,
    /// The [`BmcTarget::credentials_id`] of the credentials the check used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_id: Option<String>,
    /// The [`BmcTarget::check_request`] this check answered, when a person asked for it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub request: Option<String>,
}

/// The controller's answer to a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReportAck {
    /// The sequence number the controller recorded.
    pub sequence: u64,
    /// When the controller received the report (its clock).
    pub received_at: Timestamp,
    /// The BMCs this agent may be asked to drive (every other inventory host with a BMC), for
    /// it to probe and report in [`AgentReport::bmc_reachability`]. Never credentials. Sent
    /// only when the report asked for it ([`BMC_TARGETS_PARAM`]); empty from a controller
    /// that predates the field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub bmc_targets: Vec<BmcTarget>,
    /// Ids among the report's [`AgentReport::holds`] that a person has released: the agent
    /// deletes its local record of each. Only ever non-empty for a report that carried holds,
    /// so agents that predate the field (and carry none) never see it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub released_holds: Vec<String>,
    /// The answering leader's term, for agents that asked ([`TERMS_PARAM`]): the agent keeps
    /// the highest it has seen and refuses commands from older terms.
    #[serde(default, skip_serializing_if = "no_term")]
    pub term: u64,
    /// This controller takes [`AgentReport::host_identity`]: the agent sends it from the next
    /// report on. Only for agents that asked ([`HOST_IDENTITY_PARAM`]): older ones refuse
    /// unknown fields.
    #[serde(default, skip_serializing_if = "is_false")]
    pub host_identity: bool,
}

/// Whether `value` is false: a flag left out of the JSON.
#[allow(clippy::trivially_copy_pass_by_ref)] // serde's skip_serializing_if passes a reference
pub fn is_false(value: &bool) -> bool {
    !*value
}

/// The controller's answer to a posted [`Hold`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoldAck {
    /// The hold's id.
    pub id: String,
    /// False when the controller already had this hold (the post was a retry, or a report
    /// carried it first).
    pub first: bool,
}

/// A BMC an agent may be asked to fence, without credentials: enough to check reachability.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BmcTarget {
    /// The host the BMC belongs to.
    pub host: String,
    /// The BMC's address, as in [`FenceCommand::bmc_address`].
    pub bmc_address: String,
    /// How the BMC's TLS certificate is trusted, as in [`FenceCommand::tls`].
    #[serde(default)]
    pub tls: BmcTrust,
    /// The credentials for a read-only check ([`BmcCheck`]), as in
    /// [`FenceCommand::credentials`]: only for an agent that asked for them and may execute a
    /// fence of `host`; absent, the agent checks reachability without credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials: Option<BmcCredentials>,
    /// The identity `host`'s own agent reported, to compare with what the BMC says, as in
    /// [`FenceCommand::expected_identity`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_identity: Option<Box<SystemIdentity>>,
    /// Which credentials these are: an opaque id the controller chose, echoed in
    /// [`BmcCheck::credentials_id`] so a result is never taken for credentials it was not made
    /// with (a check still running when the credentials changed). Sent with the credentials;
    /// they shipped together, so an agent that asks for checks knows the field.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credentials_id: Option<String>,
    /// True while these credentials are a rotation's new ones: checked here before any fence
    /// uses them (fences keep the previous ones until a check with these passes).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub credentials_new: bool,
    /// A person's on-demand check (`metalguard-controller check-bmc`): an opaque id, new per
    /// request. The agent checks at once when it sees a new one (once per id, even while its
    /// logins back off) and echoes it in [`BmcCheck::request`]. Sent with the credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub check_request: Option<String>,
}

/// The answer to a long-poll: zero or more commands (empty when the wait ran out).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct CommandBatch {
    /// Commands to execute, in order. A command stays in every batch until its result is
    /// acknowledged; the agent deduplicates by operation id.
    pub commands: Vec<Command>,
}

/// One command for an agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Command {
    /// The operation id; the agent executes each id at most once.
    pub operation_id: OperationId,
    /// When the controller persisted the intent behind this command.
    pub issued_at: Timestamp,
    /// What to do.
    pub kind: CommandKind,
    /// The term of the leadership offering this command (a fencing token: it only grows from
    /// one leadership to the next). The agent refuses a command whose term is below the
    /// highest it has seen. Sent only to agents that ask ([`TERMS_PARAM`]); 0 from a
    /// controller that predates terms.
    #[serde(default, skip_serializing_if = "no_term")]
    pub term: u64,
}

impl Command {
    /// Leaves out the term and the fields that came with terms (the fence's etcd member and
    /// forced marker), for an agent that predates them.
    pub fn strip_terms(&mut self) {
        self.term = 0;
        if let CommandKind::Fence(fence) = &mut self.kind {
            fence.etcd_member = None;
            fence.forced = None;
        }
    }

    /// Leaves out a fence's expected target identity, for an agent that did not ask for it
    /// ([`HOST_IDENTITY_PARAM`]; one that predates it refuses the field).
    pub fn strip_identity(&mut self) {
        if let CommandKind::Fence(fence) = &mut self.kind {
            fence.expected_identity = None;
        }
    }
}

/// What a command asks for.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "type")]
pub enum CommandKind {
    /// Drive another host's BMC.
    Fence(FenceCommand),
    /// Join the local etcd member to the cluster as a learner, with the agent's own join
    /// configuration (`[etcd.join]`): add the learner unless it is already there, start the
    /// local etcd, and wait until the learner has caught up. Succeeds once it is promotable
    /// (the controller promotes it); the result's timeline names the member id.
    EtcdJoinGoAhead {},
    /// Promote a caught-up learner (bounded retries; a failed promote changes nothing).
    EtcdPromote {
        /// The learner's member id.
        member_id: u64,
    },
    /// Remove a member from the cluster.
    EtcdRemove {
        /// The member id.
        member_id: u64,
    },
    /// Move raft leadership to another voter (before the current leader is removed).
    EtcdMoveLeader {
        /// The voter that should lead.
        to_member: u64,
    },
}

impl CommandKind {
    /// A short, stable name for logs and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            CommandKind::Fence(_) => "fence",
            CommandKind::EtcdJoinGoAhead { .. } => "etcd-join-go-ahead",
            CommandKind::EtcdPromote { .. } => "etcd-promote",
            CommandKind::EtcdRemove { .. } => "etcd-remove",
            CommandKind::EtcdMoveLeader { .. } => "etcd-move-leader",
        }
    }
}

/// Drive the BMC of `target`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FenceCommand {
    /// The host being fenced.
    pub target: String,
    /// The power action.
    pub action: PowerAction,
    /// The target's BMC address, e.g. `redfish+https://10.0.0.5/redfish/v1/Systems/1` or
    /// `ipmi://10.0.0.5:623` (parsed by `metalguard-bmc`).
    pub bmc_address: String,
    /// How the BMC's TLS certificate is trusted.
    #[serde(default)]
    pub tls: BmcTrust,
    /// Credentials for the BMC.
    pub credentials: BmcCredentials,
    /// The target's etcd member as the controller knows it (from the target's own agent), so
    /// the executing agent can check quorum itself before a power-off or reboot; the agent
    /// also finds the target's member by name. Sent with terms ([`TERMS_PARAM`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd_member: Option<u64>,
    /// Set when a person forced this fence past every gate (`fence --force` with a reason):
    /// the only thing that overrides the executing agent's own quorum check, and recorded
    /// in its result as such.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forced: Option<ForcedBy>,
    /// The target's identity as its own agent last reported it
    /// ([`AgentReport::host_identity`]). Before a power-off or reboot the executing agent reads
    /// the identity of the system behind the BMC and refuses, changing nothing, when it is
    /// another machine (a swapped cable, a copied address): both identities in the refusal.
    /// Sent only to agents that ask ([`HOST_IDENTITY_PARAM`] on the long-poll).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expected_identity: Option<Box<SystemIdentity>>,
}

/// Who forced a fence, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ForcedBy {
    /// Who asked (the identity recorded with the request).
    pub by: String,
    /// The reason they gave.
    pub reason: String,
}

/// A power action.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PowerAction {
    /// Hard power off, verified by reading the state back.
    Off,
    /// Power on, verified by reading the state back.
    On,
    /// Off, verified, then on.
    Reboot,
}

/// How an agent trusts a BMC's TLS certificate.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "kebab-case", tag = "mode")]
pub enum BmcTrust {
    /// The system CA bundle.
    #[default]
    SystemRoots,
    /// These CA certificates (PEM) only.
    CaPem {
        /// The PEM text.
        pem: String,
    },
    /// Exactly the certificate with this SHA-256 fingerprint (hex, colons allowed).
    Fingerprint {
        /// The fingerprint.
        sha256: String,
    },
    /// Any certificate (explicit opt-in; counted as an insecure BMC connection).
    Insecure,
}

/// BMC credentials. The password is a [`Secret`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BmcCredentials {
    /// User name.
    pub username: String,
    /// Password (redacted in `Debug`).
    pub password: Secret,
}

/// The result of one command, posted until acknowledged.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommandResult {
    /// The command's operation id.
    pub operation_id: OperationId,
    /// How it ended.
    pub outcome: Outcome,
    /// When the agent started executing it.
    pub started_at: Timestamp,
    /// When it finished.
    pub finished_at: Timestamp,
    /// What was sent and seen, in order.
    #[serde(default)]
    pub timeline: Vec<TimelineEntry>,
    /// Why it failed, for `failed` and `rejected` outcomes.
    #[serde(default)]
    pub error: Option<String>,
    /// For a succeeded promotion: whether this command promoted the learner, or found it a
    /// voter already (someone else promoted it: `kubeadm join --control-plane` in its learner
    /// mode, or a person with etcdctl). `None` for every other command.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub promoted_by: Option<PromotedBy>,
    /// The term of the command that was executed (0: none), so a leader knows which
    /// leadership's command produced this result.
    #[serde(default, skip_serializing_if = "no_term")]
    pub term: u64,
}

/// Who promoted a learner, as the promotion command found out.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum PromotedBy {
    /// This command's MemberPromote call did (metalguard, after its promotion gates).
    Metalguard,
    /// It was a voter already when the command ran (or became one between its retries):
    /// promoted outside metalguard, whose gates did not decide it.
    Outside,
}

impl PromotedBy {
    /// A short, stable name for logs, metrics and the Kubernetes record.
    pub fn name(self) -> &'static str {
        match self {
            PromotedBy::Metalguard => "metalguard",
            PromotedBy::Outside => "outside",
        }
    }
}

/// How a command ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Done and verified (for a fence: the power state was read back).
    Succeeded,
    /// Attempted and failed; the target's state is unknown or unchanged.
    Failed,
    /// Not attempted (bad address, missing trust, unknown member).
    Rejected,
}

impl Outcome {
    /// A short, stable name for logs and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Succeeded => "succeeded",
            Outcome::Failed => "failed",
            Outcome::Rejected => "rejected",
        }
    }
}

/// One step of a command's execution.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TimelineEntry {
    /// Milliseconds since the command started.
    pub elapsed_ms: u64,
    /// Which way the entry went.
    pub direction: TimelineDirection,
    /// What was sent or seen (never contains credentials).
    pub what: String,
}

/// Which way a timeline entry went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum TimelineDirection {
    /// A request the agent sent.
    Sent,
    /// An answer (or its absence) the agent saw.
    Seen,
    /// A decision the agent took.
    Note,
}

/// The controller's answer to a posted result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResultAck {
    /// The operation id whose result was recorded.
    pub operation_id: OperationId,
    /// False when the controller already had a result for this id (the post was a retry).
    pub first: bool,
}

/// The body of every non-2xx answer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ErrorBody {
    /// A lowercase message naming the subject.
    pub error: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pressure_conditions_are_adverse_when_true() {
        use ConditionStatus::{False, True, Unknown};
        assert!(is_adverse("EtcdMemberHealthy", False) && !is_adverse("EtcdMemberHealthy", True));
        assert!(is_adverse(ETCD_NO_SPACE, True) && !is_adverse(ETCD_NO_SPACE, False));
        assert!(!is_adverse(ETCD_NO_SPACE, Unknown) && !is_adverse("Ready", Unknown));
        assert!(is_pressure(ETCD_NO_SPACE) && !is_pressure("EtcdMemberHealthy"));
    }

    fn fence() -> Command {
        Command {
            operation_id: OperationId("rem-1/power-off".into()),
            issued_at: Timestamp(1_000),
            kind: CommandKind::Fence(FenceCommand {
                target: "cp-2".into(),
                action: PowerAction::Off,
                bmc_address: "redfish+https://10.0.0.5/redfish/v1/Systems/1".into(),
                tls: BmcTrust::Fingerprint {
                    sha256: "ab:cd".into(),
                },
                credentials: BmcCredentials {
                    username: "admin".into(),
                    password: Secret::new("hunter2"),
                },
                etcd_member: None,
                forced: None,
                expected_identity: None,
            }),
            term: 0,
        }
    }

    #[test]
    fn debug_never_prints_the_password() {
        let text = format!("{:?}", fence());
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.contains("<redacted>"), "{text}");
    }

    #[test]
    fn commands_round_trip_through_json_with_the_password() {
        let json = serde_json::to_string(&fence()).unwrap();
        assert!(json.contains("\"password\":\"hunter2\""), "{json}");
        assert!(json.contains("\"type\":\"fence\""), "{json}");
        let back: Command = serde_json::from_str(&json).unwrap();
        assert_eq!(back, fence());
    }

    #[test]
    fn paths_fill_in_the_host_and_wait() {
        assert_eq!(report_path("cp-1"), "/v1/hosts/cp-1/report");
        assert_eq!(
            commands_path("cp-1", Duration::from_millis(30_900)),
            "/v1/hosts/cp-1/commands?wait=30&terms=true&host_identity=true"
        );
        assert_eq!(results_path("cp-1"), "/v1/hosts/cp-1/results");
        assert_eq!(holds_path("cp-1"), "/v1/hosts/cp-1/holds");
        assert_eq!(
            report_path_with_bmc_targets("cp-1"),
            "/v1/hosts/cp-1/report?bmc_targets=true&bmc_checks=true&terms=true&host_identity=true"
        );
        assert!(REPORT_PATH.starts_with(&format!("/{API_VERSION}/")));
    }

    #[test]
    fn reports_reject_unknown_fields() {
        let json = r#"{"host":"a","agent_version":"0.1.0","sequence":1,"sent_at":5,"bogus":1}"#;
        let err = serde_json::from_str::<AgentReport>(json).unwrap_err();
        assert!(err.to_string().contains("bogus"), "{err}");
        let ok = r#"{"host":"a","agent_version":"0.1.0","sequence":1,"sent_at":5}"#;
        let report: AgentReport = serde_json::from_str(ok).unwrap();
        assert!(report.conditions.is_empty());
    }

    #[test]
    fn an_ack_from_an_older_controller_has_no_bmc_targets() {
        let ack: ReportAck = serde_json::from_str(r#"{"sequence":1,"received_at":2}"#).unwrap();
        assert!(ack.bmc_targets.is_empty());
        let target: BmcTarget =
            serde_json::from_str(r#"{"host":"cp-2","bmc_address":"ipmi://10.0.0.5"}"#).unwrap();
        assert_eq!(target.tls, BmcTrust::SystemRoots);
    }

    fn hold() -> Hold {
        Hold {
            id: "cp-2/1700000000000".into(),
            target: "cp-1".into(),
            since: Timestamp(1_700_000_000_000),
            by: "alice on cp-2".into(),
            reason: "disk controller resets".into(),
            action: "off".into(),
        }
    }

    #[test]
    fn holds_are_left_out_of_reports_and_acks_until_there_is_one() {
        let mut report: AgentReport = serde_json::from_str(
            r#"{"host":"cp-2","agent_version":"0.1.0","sequence":1,"sent_at":5}"#,
        )
        .unwrap();
        assert!(report.holds.is_empty(), "a report from an older agent");
        // Without a hold the JSON is what a controller that predates the field accepts.
        let json = serde_json::to_value(&report).unwrap();
        assert!(json.get("holds").is_none(), "{json}");
        report.holds.push(hold());
        let json = serde_json::to_string(&report).unwrap();
        assert!(
            json.contains(r#""holds":[{"id":"cp-2/1700000000000""#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<AgentReport>(&json).unwrap(), report);

        let ack = ReportAck {
            sequence: 1,
            received_at: Timestamp(2),
            bmc_targets: Vec::new(),
            released_holds: Vec::new(),
            term: 0,
            host_identity: false,
        };
        assert_eq!(
            serde_json::to_string(&ack).unwrap(),
            r#"{"sequence":1,"received_at":2}"#,
            "what an agent that predates the field accepts"
        );
        let released = ReportAck {
            released_holds: vec!["cp-2/1700000000000".into()],
            ..ack
        };
        let json = serde_json::to_string(&released).unwrap();
        assert_eq!(serde_json::from_str::<ReportAck>(&json).unwrap(), released);
        let ack: HoldAck = serde_json::from_str(r#"{"id":"cp-2/1","first":true}"#).unwrap();
        assert!(ack.first);
    }

    #[test]
    fn host_identity_is_left_out_until_a_controller_takes_it() {
        let mut report: AgentReport = serde_json::from_str(
            r#"{"host":"cp-2","agent_version":"0.1.0","sequence":1,"sent_at":5}"#,
        )
        .unwrap();
        assert_eq!(report.host_identity, None, "a report from an older agent");
        assert!(
            serde_json::to_value(&report)
                .unwrap()
                .get("host_identity")
                .is_none()
        );
        let mut identity = SystemIdentity::default();
        identity.set_uuid(Ok(crate::identity::SystemUuid::from_bytes([7; 16])));
        identity.set_serial_number(Err("permission denied".into()));
        report.host_identity = Some(identity);
        let json = serde_json::to_string(&report).unwrap();
        assert!(
            json.contains(r#""host_identity":{"uuid":"07070707-0707-0707-0707-070707070707","serial_number_absent":"permission denied"}"#),
            "{json}"
        );
        assert_eq!(serde_json::from_str::<AgentReport>(&json).unwrap(), report);

        let ack: ReportAck = serde_json::from_str(r#"{"sequence":1,"received_at":2}"#).unwrap();
        assert!(!ack.host_identity, "an ack from an older controller");
        let takes = ReportAck {
            host_identity: true,
            ..ack
        };
        let json = serde_json::to_string(&takes).unwrap();
        assert_eq!(
            json,
            r#"{"sequence":1,"received_at":2,"host_identity":true}"#
        );
        assert_eq!(serde_json::from_str::<ReportAck>(&json).unwrap(), takes);
    }

    #[test]
    fn kubernetes_node_conditions_are_reserved() {
        for reserved in [
            "Ready",
            "MemoryPressure",
            "DiskPressure",
            "PIDPressure",
            "NetworkUnavailable",
        ] {
            assert!(is_reserved_condition(reserved), "{reserved}");
        }
        for allowed in ["EtcdMemberHealthy", ETCD_NO_SPACE, "ready", "NodeReady", ""] {
            assert!(!is_reserved_condition(allowed), "{allowed}");
        }
    }

    #[test]
    fn etcd_commands_are_tagged_by_type() {
        let json = serde_json::to_string(&CommandKind::EtcdPromote { member_id: 7 }).unwrap();
        assert_eq!(json, r#"{"type":"etcd-promote","member_id":7}"#);
    }
}
