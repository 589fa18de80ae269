//! The plan: what the decision core wants done, in order, and why; plus what it refused to do.
//!
//! Every action has an [`OperationId`] derived only from its target, its kind and the
//! remediation or member it belongs to — never from `now` — so re-planning an unchanged
//! snapshot yields the same ids and executors can deduplicate.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::duration::Timestamp;
use crate::remediation::{Remediation, RemediationPhase};

/// A stable operation id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct OperationId(pub String);

impl fmt::Display for OperationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One step of a running remediation, carried out by its executor.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "step")]
pub enum RemediationStep {
    /// Ask the BMC to power the target off (→ powering-off).
    PowerOff,
    /// Read the power state until it is `Off` (→ verified-off, or failed on timeout).
    VerifyPowerOff,
    /// Save the Node's labels and annotations into the remediation (→ backed-up).
    BackupNodeMetadata,
    /// Delete the Node object (→ node-removed).
    DeleteNode,
    /// Taint the Node `node.kubernetes.io/out-of-service` (→ node-removed).
    TaintOutOfService,
    /// Ask the BMC to power the target on (→ powering-on).
    PowerOn,
    /// Read the power state until it is `On` (→ waiting-for-node).
    VerifyPowerOn,
    /// Merge the backup into the new Node, keys already present win; remove the taint
    /// (→ restored).
    RestoreNodeMetadata,
    /// Mark the remediation done (→ done).
    Complete,
    /// Cancel cleanly (→ cancelled).
    Cancel {
        /// Why.
        reason: String,
    },
    /// Record the failure of this attempt (→ failed).
    Fail {
        /// Why.
        reason: String,
    },
    /// Hand the host to the provisioner (→ reprovisioning).
    Reprovision,
    /// Stop and ask for a person, with a condition and an event (→ needs-a-person).
    EscalateToPerson {
        /// Why.
        reason: String,
    },
}

impl RemediationStep {
    /// The phase the remediation is in once this step succeeded.
    pub fn resulting_phase(&self) -> RemediationPhase {
        match self {
            RemediationStep::PowerOff => RemediationPhase::PoweringOff,
            RemediationStep::VerifyPowerOff => RemediationPhase::VerifiedOff,
            RemediationStep::BackupNodeMetadata => RemediationPhase::BackedUp,
            RemediationStep::DeleteNode | RemediationStep::TaintOutOfService => {
                RemediationPhase::NodeRemoved
            }
            RemediationStep::PowerOn => RemediationPhase::PoweringOn,
            RemediationStep::VerifyPowerOn => RemediationPhase::WaitingForNode,
            RemediationStep::RestoreNodeMetadata => RemediationPhase::Restored,
            RemediationStep::Complete => RemediationPhase::Done,
            RemediationStep::Cancel { reason } => RemediationPhase::Cancelled {
                reason: reason.clone(),
            },
            RemediationStep::Fail { reason } => RemediationPhase::Failed {
                reason: reason.clone(),
            },
            RemediationStep::Reprovision => RemediationPhase::Reprovisioning,
            RemediationStep::EscalateToPerson { reason } => RemediationPhase::NeedsPerson {
                reason: reason.clone(),
            },
        }
    }

    /// A short, stable name (used in operation ids).
    pub fn name(&self) -> &'static str {
        match self {
            RemediationStep::PowerOff => "power-off",
            RemediationStep::VerifyPowerOff => "verify-power-off",
            RemediationStep::BackupNodeMetadata => "backup-node-metadata",
            RemediationStep::DeleteNode => "delete-node",
            RemediationStep::TaintOutOfService => "taint-out-of-service",
            RemediationStep::PowerOn => "power-on",
            RemediationStep::VerifyPowerOn => "verify-power-on",
            RemediationStep::RestoreNodeMetadata => "restore-node-metadata",
            RemediationStep::Complete => "complete",
            RemediationStep::Cancel { .. } => "cancel",
            RemediationStep::Fail { .. } => "fail",
            RemediationStep::Reprovision => "reprovision",
            RemediationStep::EscalateToPerson { .. } => "escalate",
        }
    }
}

/// What an action does.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum ActionKind {
    /// Put metalguard's preDrain quorum hook on a host.
    AddQuorumHook {
        /// The host.
        host: String,
    },
    /// Remove metalguard's preDrain quorum hook from a host (its member is gone).
    RemoveQuorumHook {
        /// The host.
        host: String,
    },
    /// Add an etcd learner for a host and start its etcd.
    AddLearner {
        /// The host.
        host: String,
    },
    /// Promote a caught-up learner to a voter.
    PromoteLearner {
        /// The host.
        host: String,
        /// The learner's member id.
        member_id: u64,
    },
    /// Move raft leadership from one voter to another.
    MoveLeader {
        /// Current leader.
        from_member: u64,
        /// New leader.
        to_member: u64,
    },
    /// Remove an etcd member.
    RemoveMember {
        /// The host it runs on, if any host claims it.
        host: Option<String>,
        /// The member id.
        member_id: u64,
    },
    /// Ask the inventory for a new control-plane host in a failure domain.
    RequestHost {
        /// The chosen failure domain (`None`: the single implicit domain).
        failure_domain: Option<String>,
    },
    /// Power off a retired control-plane host whose etcd member is gone and whose preDrain
    /// hooks are released, through another host's agent (the standalone stand-in for the
    /// Machine API deprovisioning a deleted Machine).
    DecommissionHost {
        /// The retired host.
        host: String,
        /// The agent host that drives its BMC (never the host itself).
        executor: String,
    },
    /// Request deletion of a control-plane host (scale-down).
    RequestHostDeletion {
        /// The host.
        host: String,
    },
    /// Proposal: replace a host to rebalance failure domains.
    Rebalance {
        /// The host to replace.
        host: String,
        /// Its current domain.
        from: Option<String>,
        /// The domain its replacement should go to.
        to: String,
    },
    /// Persist a new remediation (in phase `gated`) before anything destructive.
    StartRemediation {
        /// The record to persist.
        remediation: Remediation,
    },
    /// Carry out one step of a persisted remediation.
    Remediate {
        /// The remediation's id.
        remediation_id: String,
        /// The target host.
        target: String,
        /// The executing agent's host.
        executor: String,
        /// The step.
        step: RemediationStep,
    },
}

impl ActionKind {
    /// True for etcd membership changes (at most one per plan).
    pub fn is_membership_change(&self) -> bool {
        matches!(
            self,
            ActionKind::AddLearner { .. }
                | ActionKind::PromoteLearner { .. }
                | ActionKind::RemoveMember { .. }
        )
    }
}

/// One planned action.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Action {
    /// Stable id for deduplication.
    pub id: OperationId,
    /// What to do.
    pub kind: ActionKind,
    /// Why, for people.
    pub reason: String,
}

/// The kind of reason behind a refusal, for scripts and metrics (the text says the rest).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[serde(rename_all = "kebab-case")]
pub enum ReasonKind {
    /// It would cost etcd quorum, or quorum is lost and the etcd view cannot be trusted.
    Quorum,
    /// The control plane is degraded (quorum lost, invalid desired replicas): nothing is done.
    Degraded,
    /// A health check short-circuited (more unhealthy than `maxUnhealthy`, or it is invalid).
    ShortCircuit,
    /// The control plane is busy: another control-plane remediation, a membership change, a
    /// host provisioning or being deleted, machines and members that disagree.
    ControlPlaneBusy,
    /// Retry accounting: `retryPeriod` not over, `maxRetry` spent, a person must look.
    Retry,
    /// Worker `maxConcurrent` reached.
    Concurrency,
    /// No agent can carry it out (none healthy, or none reaches the BMC).
    Executor,
    /// A person holds the host after a break-glass fence, or another actor holds its node
    /// lease.
    Hold,
    /// Waiting for something under way (a learner catching up, a hook, a result).
    Waiting,
    /// A policy rule or a missing prerequisite (healthy host without `--force`, no BMC,
    /// being deleted).
    Policy,
    /// The snapshot is invalid.
    Invalid,
    /// Anything else (and refusals recorded before kinds existed).
    #[default]
    Other,
}

impl ReasonKind {
    /// The kebab-case name (as in JSON).
    pub fn name(self) -> &'static str {
        match self {
            ReasonKind::Quorum => "quorum",
            ReasonKind::Degraded => "degraded",
            ReasonKind::ShortCircuit => "short-circuit",
            ReasonKind::ControlPlaneBusy => "control-plane-busy",
            ReasonKind::Retry => "retry",
            ReasonKind::Concurrency => "concurrency",
            ReasonKind::Executor => "executor",
            ReasonKind::Hold => "hold",
            ReasonKind::Waiting => "waiting",
            ReasonKind::Policy => "policy",
            ReasonKind::Invalid => "invalid",
            ReasonKind::Other => "other",
        }
    }
}

impl fmt::Display for ReasonKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Something the planner decided not to do, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Refusal {
    /// What was not done, as a verb phrase: "remediating", "changing the membership of".
    #[serde(default = "default_refused")]
    pub refused: String,
    /// What it was not done to (usually a host name, "etcd" or "control-plane").
    pub subject: String,
    /// Why.
    pub reason: String,
    /// The kind of reason.
    #[serde(default)]
    pub kind: ReasonKind,
}

fn default_refused() -> String {
    "acting on".to_owned()
}

/// The health verdict of one health check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckSummary {
    /// Check name.
    pub name: String,
    /// Number of targets the check covers.
    pub targets: usize,
    /// Unhealthy targets (including those under remediation), sorted.
    pub unhealthy: Vec<String>,
    /// The effective maxUnhealthy, if it parsed.
    pub max_unhealthy: Option<usize>,
    /// Set when remediation is short-circuited, with the reason.
    pub short_circuit: Option<String>,
}

/// The output of planning.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// The time the plan was made for.
    pub now: Timestamp,
    /// Actions, in the order they must be carried out.
    pub actions: Vec<Action>,
    /// Refusals, with reasons.
    pub refusals: Vec<Refusal>,
    /// Per-check health verdicts.
    pub health: Vec<CheckSummary>,
    /// Set when the cluster is degraded beyond what the guard repairs; it then does nothing.
    pub degraded: Option<String>,
    /// Voluntary disruption budget (seed 001's quorum-guard PDB): control-plane machines that
    /// must stay available, machines − 1.
    pub min_available_members: Option<usize>,
    /// The earliest time a verdict can change by time alone (requeue no later than this).
    pub requeue_at: Option<Timestamp>,
    /// For every host with a BMC, the agent that would execute its fence now (a running
    /// remediation's executor while it is eligible): the one agent the controller hands
    /// that BMC's credentials for its read-only checks (issue 25).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub fence_executors: BTreeMap<String, String>,
}

impl fmt::Display for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "plan at {}", self.now)?;
        if let Some(d) = &self.degraded {
            writeln!(f, "DEGRADED: {d}")?;
        }
        for c in &self.health {
            let max = c
                .max_unhealthy
                .map_or_else(|| "invalid".to_owned(), |m| m.to_string());
            write!(
                f,
                "check {}: {} of {} unhealthy (maxUnhealthy {max})",
                c.name,
                c.unhealthy.len(),
                c.targets
            )?;
            if !c.unhealthy.is_empty() {
                write!(f, " [{}]", c.unhealthy.join(", "))?;
            }
            if let Some(s) = &c.short_circuit {
                write!(f, " SHORT-CIRCUITED: {s}")?;
            }
            writeln!(f)?;
        }
        if let Some(m) = self.min_available_members {
            writeln!(
                f,
                "disruption budget: {m} control-plane machines must stay available"
            )?;
        }
        if self.actions.is_empty() {
            writeln!(f, "no actions")?;
        }
        for (i, a) in self.actions.iter().enumerate() {
            writeln!(f, "{}. [{}] {}", i + 1, a.id, a.reason)?;
        }
        for r in &self.refusals {
            writeln!(f, "not {} {}: {}", r.refused, r.subject, r.reason)?;
        }
        if let Some(t) = self.requeue_at {
            writeln!(f, "re-plan no later than {t}")?;
        }
        Ok(())
    }
}
