//! The rules of the safety judgement, their reason kinds and their sources.

use std::fmt;

use metalguard_api::plan::ReasonKind;

/// A rule of the safety judgement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Rule {
    /// Healthy voters stay at or above quorum after the plan and what is in flight.
    QuorumAfterPlan,
    /// Nothing quorum-affecting while the control plane is degraded.
    Degraded,
    /// One control-plane remediation in progress (a failed one awaiting retry counts).
    OneControlPlaneRemediation,
    /// One remediation per target.
    OneRemediationPerTarget,
    /// A short-circuited health check stops remediation.
    ShortCircuit,
    /// Worker remediations within `maxConcurrent`.
    WorkerConcurrency,
    /// The executor can carry the action out.
    Executor,
    /// A held host is left alone.
    Hold,
    /// One etcd membership change per plan.
    OneMembershipChange,
    /// At most one learner, added only with every voter up.
    LearnerAdd,
    /// A learner is promoted only when caught up, hooked and staying.
    Promotion,
    /// A voter is removed only from a leaving host, a healthy one only after its
    /// replacement votes, never while it leads.
    VoterRemoval,
    /// No scaling while machines and members disagree.
    ScalingWhileDisagreeing,
    /// No scaling while an etcd member is down (in flight and holds counted).
    ScalingWithMemberDown,
    /// The quorum hook is never re-added to a deleting host, nor released while its member
    /// lives.
    QuorumHook,
    /// A retired host is powered off only once nothing of etcd is left on it.
    Retirement,
    /// A host that guards quorum, or an externally provisioned one, is never reprovisioned.
    Reprovision,
    /// A step of an unknown remediation, or an illegal transition.
    StateMachine,
}

impl Rule {
    /// The kind of reason a violation of this rule is reported as.
    pub fn kind(self) -> ReasonKind {
        match self {
            Rule::QuorumAfterPlan | Rule::VoterRemoval | Rule::LearnerAdd | Rule::Promotion => {
                ReasonKind::Quorum
            }
            Rule::Degraded => ReasonKind::Degraded,
            Rule::OneControlPlaneRemediation
            | Rule::OneMembershipChange
            | Rule::ScalingWhileDisagreeing
            | Rule::ScalingWithMemberDown => ReasonKind::ControlPlaneBusy,
            Rule::ShortCircuit => ReasonKind::ShortCircuit,
            Rule::WorkerConcurrency => ReasonKind::Concurrency,
            Rule::Executor => ReasonKind::Executor,
            Rule::Hold => ReasonKind::Hold,
            Rule::OneRemediationPerTarget | Rule::Retirement | Rule::StateMachine => {
                ReasonKind::Waiting
            }
            Rule::QuorumHook | Rule::Reprovision => ReasonKind::Policy,
        }
    }

    /// Where the rule comes from.
    pub fn source(self) -> &'static str {
        match self {
            Rule::QuorumAfterPlan => "seed 004: remediation MUST preserve etcd quorum",
            Rule::Degraded => "seed 001: a degraded cluster is reported, not repaired",
            Rule::OneControlPlaneRemediation => {
                "seed 004: the previous remediation MUST have completed"
            }
            Rule::OneRemediationPerTarget => "seed 003: one remediation per machine",
            Rule::ShortCircuit => {
                "seed 003: no remediation when unhealthy machines exceed maxUnhealthy"
            }
            Rule::WorkerConcurrency => "seed 003: one node at a time (maxConcurrent)",
            Rule::Executor => "a fence no agent can carry out spends a retry and hides the cause",
            Rule::Hold => "a person's break-glass fence is not undone by the controller",
            Rule::OneMembershipChange => "seed 001: membership changes one at a time",
            Rule::LearnerAdd => {
                "DOMAIN §1: one learner; seed 004: remove a dead member before adding"
            }
            Rule::Promotion => "seed 001: promote a caught-up learner of a protected machine",
            Rule::VoterRemoval => {
                "seed 001: no voter removed before its replacement is promoted; DOMAIN §1: move the leader first"
            }
            Rule::ScalingWhileDisagreeing => {
                "seed 004 preflight: \"an equal number of control plane Machines and members in the etcd cluster\", for scale-up and scale-down"
            }
            Rule::ScalingWithMemberDown => {
                "seed 004: scaling is \"blocked based on Etcd and control plane preflight checks\"; seed 002 step 6: short-circuit unless \"all etcd members are healthy\""
            }
            Rule::QuorumHook => "seed 001: the hook is not re-added once deletion started",
            Rule::Retirement => "seed 001: the machine goes once its member and hook are gone",
            Rule::Reprovision => {
                "seed 003: control-plane and externally provisioned hosts are not reprovisioned"
            }
            Rule::StateMachine => "the remediation state machine",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(self, f)
    }
}
