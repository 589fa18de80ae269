//! The safety judgement of a whole plan.
//!
//! The planner's gates look at one action at a time. This module looks at a plan as a whole:
//! it walks the actions in order over a *projection* of the cluster that starts from the
//! snapshot with everything already in flight counted against it (a member whose host a
//! remediation may have powered off, a host held after a break-glass fence, an unhealthy
//! member) and adds each admitted action's effect before judging the next one. An action is
//! admitted only if every rule below holds after it; otherwise it gets a [`Violation`] naming
//! the rule and its source. The planner drops what the judgement rejects and says why
//! ([`crate::plan`]); the controller's executor judges again before it persists anything.
//!
//! The rules (each with its source in [`Rule::source`], stated in `docs/design-core.md`):
//! - quorum holds after all of the plan's fences and removals together with those in flight;
//! - nothing that changes etcd, scales or fences a guarded host while the control plane is
//!   degraded;
//! - one control-plane remediation in progress, a failed one awaiting its retry included,
//!   and one guarded fence per plan;
//! - one remediation per target;
//! - no remediation started or powered off past a short-circuited health check (unless
//!   forced by a person);
//! - worker remediations within `maxConcurrent` (unless forced);
//! - the executor is another host whose agent is alive, not held, and has not said it
//!   cannot reach the target's BMC;
//! - no power step, start or power-off of a host held after a break-glass fence;
//! - one membership change per plan, at most one learner, a learner only with every voter
//!   up, promotion only of a caught-up, hooked, staying learner;
//! - a voter is removed only from a leaving host, a healthy one only once its replacement
//!   votes, and never while it leads;
//! - no scaling while machines and etcd members disagree;
//! - no quorum hook re-added to a host being deleted, none released while its member lives;
//! - a retired host is powered off only with no member and no hook left;
//! - a host that guards quorum is never reprovisioned automatically;
//! - every step is a legal transition of a known remediation.
//!
//! "Guarded" is decided by membership, not by label: a host with an etcd member guards
//! quorum whatever its role, and the host's role wins over a remediation record's flag.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::{Action, ActionKind, OperationId, ReasonKind, RemediationStep};
use metalguard_api::policy::Policy;
use metalguard_api::remediation::{Remediation, RemediationPhase as P};
use metalguard_api::snapshot::{Host, Role, Snapshot};

use crate::health::{HealthInputs, evaluate_check, selects};
use crate::quorum::{guards_quorum, quorum, validate_desired};

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
            | Rule::ScalingWhileDisagreeing => ReasonKind::ControlPlaneBusy,
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
                "seed 004 preflight: as many control-plane machines as etcd members"
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

/// An action the judgement rejects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// The rejected action.
    pub action: OperationId,
    /// What it was about (a host, "etcd" or "control-plane").
    pub subject: String,
    /// The rule it breaks.
    pub rule: Rule,
    /// Why, for people.
    pub reason: String,
}

impl fmt::Display for Violation {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} ({})",
            self.action,
            self.reason,
            self.rule.source()
        )
    }
}

/// One etcd member in the projection.
#[allow(clippy::struct_excessive_bools)] // independent facts about one member
#[derive(Debug, Clone)]
struct Member {
    host: Option<String>,
    learner: bool,
    leader: bool,
    caught_up: bool,
    /// Not counted as a healthy voter: unhealthy, held, or its host's power may be off (in
    /// flight or by an earlier action of the plan).
    down: bool,
    removed: bool,
}

/// The judgement's projection of the cluster, updated by every admitted action.
#[derive(Debug, Clone)]
pub struct Judge<'a> {
    snapshot: &'a Snapshot,
    policy: &'a Policy,
    now: Timestamp,
    hosts: BTreeMap<&'a str, &'a Host>,
    members: BTreeMap<u64, Member>,
    desired: Option<usize>,
    degraded: Option<String>,
    /// Hosts whose checks short-circuited, with the reason.
    short_circuited: BTreeMap<&'a str, String>,
    /// Targets with an active remediation (before the plan) or started by the plan.
    busy: BTreeSet<String>,
    /// Guarded targets whose remediation is in progress: active past `gated`, or failed and
    /// awaiting its retry. Plus those the plan starts or powers off.
    control_plane_in_progress: BTreeSet<String>,
    /// Guarded targets with an active remediation still in `detected`/`gated`.
    control_plane_gated: BTreeSet<String>,
    /// Guarded fences (starts or power-offs) admitted in this plan.
    guarded_fences: usize,
    workers_running: usize,
    membership_changes: usize,
    learner_added: bool,
    remediation_ids: BTreeSet<String>,
}

/// Judges `actions` in order; returns every violation (each judged after the admitted
/// actions before it, as if those had been carried out).
pub fn judge_plan(
    snapshot: &Snapshot,
    policy: &Policy,
    now: Timestamp,
    actions: &[Action],
) -> Vec<Violation> {
    let mut judge = Judge::new(snapshot, policy, now);
    actions
        .iter()
        .filter_map(|a| judge.admit(a).err())
        .collect()
}

fn latest_by_target(remediations: &[Remediation]) -> BTreeMap<&str, &Remediation> {
    let mut latest: BTreeMap<&str, &Remediation> = BTreeMap::new();
    for r in remediations {
        let e = latest.entry(r.target.as_str()).or_insert(r);
        if r.seq > e.seq {
            *e = r;
        }
    }
    latest
}

impl<'a> Judge<'a> {
    /// The projection of `snapshot` with everything in flight counted.
    pub fn new(snapshot: &'a Snapshot, policy: &'a Policy, now: Timestamp) -> Self {
        let hosts: BTreeMap<&str, &Host> = snapshot
            .hosts
            .iter()
            .map(|h| (h.name.as_str(), h))
            .collect();
        let power_may_be_off: BTreeSet<&str> = snapshot
            .remediations
            .iter()
            .filter(|r| r.phase.power_may_be_off())
            .map(|r| r.target.as_str())
            .collect();
        let mut members = BTreeMap::new();
        for h in &snapshot.hosts {
            if let Some(m) = &h.etcd {
                members.insert(
                    m.id,
                    Member {
                        host: Some(h.name.clone()),
                        learner: m.learner,
                        leader: m.leader,
                        caught_up: m.caught_up(),
                        down: !m.healthy
                            || h.hold.is_some()
                            || power_may_be_off.contains(h.name.as_str()),
                        removed: false,
                    },
                );
            }
        }
        for m in &snapshot.orphan_members {
            members.insert(
                m.id,
                Member {
                    host: None,
                    learner: m.learner,
                    leader: m.leader,
                    caught_up: m.caught_up(),
                    down: !m.healthy,
                    removed: false,
                },
            );
        }
        let mut short_circuited = BTreeMap::new();
        let view = crate::quorum::EtcdView::from_snapshot(snapshot);
        let inputs = HealthInputs::from_snapshot(snapshot, &view);
        for check in &policy.health_checks {
            let v = evaluate_check(check, &inputs, now);
            if let Some(sc) = &v.short_circuit {
                for h in snapshot
                    .hosts
                    .iter()
                    .filter(|h| selects(&check.selector, h))
                {
                    short_circuited
                        .entry(h.name.as_str())
                        .or_insert_with(|| format!("check {} short-circuited: {sc}", check.name));
                }
            }
        }
        let mut busy = BTreeSet::new();
        let mut control_plane_in_progress = BTreeSet::new();
        let mut control_plane_gated = BTreeSet::new();
        let mut workers_running = 0;
        for r in snapshot.remediations.iter().filter(|r| r.phase.is_active()) {
            busy.insert(r.target.clone());
            let guarded = record_guards_quorum(r, hosts.get(r.target.as_str()).copied());
            if !guarded {
                workers_running += 1;
            } else if matches!(r.phase, P::Detected | P::Gated) {
                control_plane_gated.insert(r.target.clone());
            } else {
                control_plane_in_progress.insert(r.target.clone());
            }
        }
        for (target, r) in latest_by_target(&snapshot.remediations) {
            if matches!(r.phase, P::Failed { .. })
                && record_guards_quorum(r, hosts.get(target).copied())
            {
                control_plane_in_progress.insert(target.to_owned());
            }
        }
        let mut judge = Judge {
            snapshot,
            policy,
            now,
            hosts,
            members,
            desired: validate_desired(snapshot.control_plane.desired_replicas).ok(),
            degraded: None,
            short_circuited,
            busy,
            control_plane_in_progress,
            control_plane_gated,
            guarded_fences: 0,
            workers_running,
            membership_changes: 0,
            learner_added: false,
            remediation_ids: snapshot.remediations.iter().map(|r| r.id.clone()).collect(),
        };
        judge.degraded = if judge.desired.is_none() {
            Some(format!(
                "desired control-plane replicas {} is not an odd number",
                snapshot.control_plane.desired_replicas
            ))
        } else {
            judge
                .quorum_shortfall()
                .map(|why| format!("{why} with what is already in flight or held"))
        };
        judge
    }

    fn voters(&self) -> impl Iterator<Item = (&u64, &Member)> {
        self.members
            .iter()
            .filter(|(_, m)| !m.learner && !m.removed)
    }

    /// Why healthy voters are below quorum now, if they are.
    fn quorum_shortfall(&self) -> Option<String> {
        let voters = self.voters().count();
        let up = self.voters().filter(|(_, m)| !m.down).count();
        if voters == 0 {
            return Some("no etcd voter is known".to_owned());
        }
        (up < quorum(voters)).then(|| {
            format!(
                "{up} of {voters} etcd voters would be up, quorum needs {}",
                quorum(voters)
            )
        })
    }

    fn member_of(&self, host: &str) -> Option<(u64, &Member)> {
        self.members
            .iter()
            .find(|(_, m)| !m.removed && m.host.as_deref() == Some(host))
            .map(|(id, m)| (*id, m))
    }

    /// Admits `action` (and projects its effect), or says which rule it breaks.
    pub fn admit(&mut self, action: &Action) -> Result<(), Violation> {
        let mut next = self.clone();
        match next.judge(action) {
            Ok(()) => {
                *self = next;
                Ok(())
            }
            Err((subject, rule, reason)) => Err(Violation {
                action: action.id.clone(),
                subject,
                rule,
                reason,
            }),
        }
    }

    fn judge(&mut self, action: &Action) -> Result<(), (String, Rule, String)> {
        match &action.kind {
            ActionKind::StartRemediation { remediation } => self.start(remediation),
            ActionKind::Remediate {
                remediation_id,
                target,
                executor,
                step,
            } => self.step(remediation_id, target, executor, step),
            ActionKind::DecommissionHost { host, executor } => self.decommission(host, executor),
            ActionKind::AddQuorumHook { host } => {
                let fail = |why: &str| Err((host.clone(), Rule::QuorumHook, why.to_owned()));
                match self.hosts.get(host.as_str()) {
                    None => fail("no such host"),
                    Some(h) if h.is_deleting() => {
                        fail("the host is being deleted: its hook stays off (the escape hatch)")
                    }
                    Some(_) => Ok(()),
                }
            }
            ActionKind::RemoveQuorumHook { host } => {
                if self.member_of(host).is_some() {
                    return Err((
                        host.clone(),
                        Rule::QuorumHook,
                        "its etcd member is still in the cluster".to_owned(),
                    ));
                }
                Ok(())
            }
            ActionKind::AddLearner { host } => self.add_learner(host),
            ActionKind::PromoteLearner { host, member_id } => self.promote(host, *member_id),
            ActionKind::RemoveMember { member_id, .. } => self.remove_member(*member_id),
            ActionKind::MoveLeader {
                from_member,
                to_member,
            } => {
                let ok_from = self
                    .members
                    .get(from_member)
                    .is_some_and(|m| !m.learner && !m.removed);
                let ok_to = self
                    .members
                    .get(to_member)
                    .is_some_and(|m| !m.learner && !m.removed && !m.down);
                if !ok_from || !ok_to || from_member == to_member {
                    return Err((
                        "etcd".to_owned(),
                        Rule::VoterRemoval,
                        format!(
                            "leadership can only move from a voter to another voter that is up ({from_member:x} → {to_member:x})"
                        ),
                    ));
                }
                for (id, m) in &mut self.members {
                    m.leader = id == to_member;
                }
                Ok(())
            }
            ActionKind::RequestHostDeletion { .. } => self.scaling(true),
            ActionKind::RequestHost { .. } | ActionKind::Rebalance { .. } => self.scaling(false),
        }
    }

    fn degraded(&self, subject: &str) -> Result<(), (String, Rule, String)> {
        match &self.degraded {
            Some(why) => Err((subject.to_owned(), Rule::Degraded, why.clone())),
            None => Ok(()),
        }
    }

    /// The executor of a power action on `target`: another host, alive, not held, and (for a
    /// destructive action) not saying it cannot reach the target's BMC.
    fn executor_ok(
        &self,
        target: &str,
        executor: &str,
        destructive: bool,
    ) -> Result<(), (String, Rule, String)> {
        let fail = |why: String| Err((target.to_owned(), Rule::Executor, why));
        if executor == target {
            return fail(format!("{target} cannot fence itself"));
        }
        let Some(e) = self.hosts.get(executor) else {
            return fail(format!("executor {executor} is not a known host"));
        };
        if e.hold.is_some() {
            return fail(format!(
                "executor {executor} is held after a break-glass fence"
            ));
        }
        let hb = self.policy.remediation.executor_heartbeat_timeout;
        let Some(agent) = e.agent.as_ref() else {
            return fail(format!("executor {executor} has no agent report"));
        };
        if !agent.can_fence || agent.last_heartbeat.after(hb) <= self.now {
            return fail(format!(
                "executor {executor}'s agent is silent or cannot fence"
            ));
        }
        if destructive && agent.cannot_reach_bmc_of(target) {
            return fail(format!(
                "executor {executor} reports it cannot reach {target}'s BMC"
            ));
        }
        Ok(())
    }

    fn not_held(&self, target: &str) -> Result<(), (String, Rule, String)> {
        match self.hosts.get(target).and_then(|h| h.hold.as_ref()) {
            Some(hold) => Err((
                target.to_owned(),
                Rule::Hold,
                format!(
                    "held since {} by {} after a break-glass fence ({}): release it first",
                    hold.since, hold.by, hold.reason
                ),
            )),
            None => Ok(()),
        }
    }

    /// The fence of guarded `target` as a whole: degraded, one at a time, quorum after it.
    fn guarded_fence(&mut self, target: &str) -> Result<(), (String, Rule, String)> {
        self.degraded(target)?;
        let busy = |name: &String| name != target;
        if let Some(other) = self.control_plane_in_progress.iter().find(|n| busy(n)) {
            return Err((
                target.to_owned(),
                Rule::OneControlPlaneRemediation,
                format!("the remediation of control-plane host {other} is still in progress"),
            ));
        }
        if self.guarded_fences > 0 {
            return Err((
                target.to_owned(),
                Rule::OneControlPlaneRemediation,
                "this plan already fences a control-plane host".to_owned(),
            ));
        }
        if let Some((id, _)) = self.member_of(target) {
            if let Some(m) = self.members.get_mut(&id) {
                m.down = true;
            }
            if let Some(why) = self.quorum_shortfall() {
                return Err((
                    target.to_owned(),
                    Rule::QuorumAfterPlan,
                    format!("fencing {target} together with what is in flight leaves {why}"),
                ));
            }
        }
        self.guarded_fences += 1;
        self.control_plane_in_progress.insert(target.to_owned());
        Ok(())
    }

    fn short_circuit(&self, target: &str, forced: bool) -> Result<(), (String, Rule, String)> {
        match self.short_circuited.get(target) {
            Some(sc) if !forced => Err((target.to_owned(), Rule::ShortCircuit, sc.clone())),
            _ => Ok(()),
        }
    }

    fn start(&mut self, r: &Remediation) -> Result<(), (String, Rule, String)> {
        let target = r.target.as_str();
        let Some(host) = self.hosts.get(target).copied() else {
            return Err((
                r.target.clone(),
                Rule::StateMachine,
                "no such host".to_owned(),
            ));
        };
        if r.phase != P::Gated || self.remediation_ids.contains(&r.id) {
            return Err((
                r.target.clone(),
                Rule::StateMachine,
                format!("{} must be new and start gated", r.id),
            ));
        }
        self.not_held(target)?;
        if self.busy.contains(target) {
            return Err((
                r.target.clone(),
                Rule::OneRemediationPerTarget,
                format!("{target} already has a remediation in progress"),
            ));
        }
        if !host.bmc_configured {
            return Err((
                r.target.clone(),
                Rule::Executor,
                "no BMC is configured for it".to_owned(),
            ));
        }
        self.executor_ok(target, &r.executor, true)?;
        let forced = r.forced.is_some();
        self.short_circuit(target, forced)?;
        if guards_quorum(host) {
            if let Some(other) = self.control_plane_gated.iter().find(|n| *n != target) {
                return Err((
                    r.target.clone(),
                    Rule::OneControlPlaneRemediation,
                    format!("the remediation of control-plane host {other} is still in progress"),
                ));
            }
            self.guarded_fence(target)?;
        } else {
            let max = self.policy.remediation.max_concurrent as usize;
            if !forced && self.workers_running >= max {
                return Err((
                    r.target.clone(),
                    Rule::WorkerConcurrency,
                    format!(
                        "{} worker remediations are running, maxConcurrent {max}",
                        self.workers_running
                    ),
                ));
            }
            self.workers_running += 1;
        }
        self.busy.insert(r.target.clone());
        self.remediation_ids.insert(r.id.clone());
        Ok(())
    }

    fn step(
        &mut self,
        remediation_id: &str,
        target: &str,
        executor: &str,
        step: &RemediationStep,
    ) -> Result<(), (String, Rule, String)> {
        let Some(r) = self
            .snapshot
            .remediations
            .iter()
            .find(|r| r.id == remediation_id && r.target == target)
        else {
            return Err((
                target.to_owned(),
                Rule::StateMachine,
                format!("{remediation_id} of {target} is not a known remediation"),
            ));
        };
        if !r.phase.can_transition_to(&step.resulting_phase()) {
            return Err((
                target.to_owned(),
                Rule::StateMachine,
                format!(
                    "{} cannot go from {} by {}",
                    r.id,
                    r.phase.name(),
                    step.name()
                ),
            ));
        }
        let host = self.hosts.get(target).copied();
        match step {
            RemediationStep::PowerOff => {
                let Some(host) = host else {
                    return Err((target.to_owned(), Rule::StateMachine, "no such host".into()));
                };
                self.not_held(target)?;
                self.executor_ok(target, executor, true)?;
                self.short_circuit(target, r.forced.is_some())?;
                if guards_quorum(host) || r.control_plane {
                    self.guarded_fence(target)?;
                }
                Ok(())
            }
            RemediationStep::PowerOn => {
                self.not_held(target)?;
                self.executor_ok(target, executor, false)
            }
            RemediationStep::Reprovision => match host {
                Some(h) if guards_quorum(h) || h.externally_provisioned || r.control_plane => Err((
                    target.to_owned(),
                    Rule::Reprovision,
                    format!("{target} guards etcd quorum or was provisioned outside metalguard"),
                )),
                _ => Ok(()),
            },
            _ => Ok(()),
        }
    }

    fn decommission(&mut self, host: &str, executor: &str) -> Result<(), (String, Rule, String)> {
        let fail = |why: String| Err((host.to_owned(), Rule::Retirement, why));
        let Some(h) = self.hosts.get(host).copied() else {
            return fail("no such host".to_owned());
        };
        if !h.is_retiring() {
            return fail(format!("{host} is not retiring"));
        }
        if self.member_of(host).is_some() {
            return fail(format!("{host} still has an etcd member"));
        }
        if !h.pre_drain_hooks.is_empty() {
            return fail(format!("{host} still has preDrain hooks"));
        }
        self.not_held(host)?;
        self.degraded(host)?;
        self.executor_ok(host, executor, true)
    }

    fn membership_change(&mut self) -> Result<(), (String, Rule, String)> {
        self.degraded("etcd")?;
        if self.membership_changes > 0 {
            return Err((
                "etcd".to_owned(),
                Rule::OneMembershipChange,
                "this plan already changes the etcd membership".to_owned(),
            ));
        }
        self.membership_changes += 1;
        Ok(())
    }

    fn add_learner(&mut self, host: &str) -> Result<(), (String, Rule, String)> {
        self.membership_change()?;
        let fail = |why: String| Err(("etcd".to_owned(), Rule::LearnerAdd, why));
        let Some(h) = self.hosts.get(host).copied() else {
            return fail(format!("{host} is not a known host"));
        };
        if h.is_deleting() || h.role != Role::ControlPlane || self.member_of(host).is_some() {
            return fail(format!(
                "{host} must be a staying control-plane host without a member"
            ));
        }
        if self.learner_added || self.members.values().any(|m| m.learner && !m.removed) {
            return fail("etcd allows one learner at a time".to_owned());
        }
        if let Some((id, _)) = self.voters().find(|(_, m)| m.down) {
            return fail(format!(
                "voter {id:x} is down: it is removed (or recovers) before a learner is added"
            ));
        }
        self.learner_added = true;
        Ok(())
    }

    fn promote(&mut self, host: &str, member_id: u64) -> Result<(), (String, Rule, String)> {
        self.membership_change()?;
        let fail = |why: String| Err(("etcd".to_owned(), Rule::Promotion, why));
        let Some(m) = self.members.get(&member_id).cloned() else {
            return fail(format!("member {member_id:x} is not known"));
        };
        if !m.learner || m.removed || !m.caught_up || m.down {
            return fail(format!("member {member_id:x} is not a caught-up learner"));
        }
        let staying_hooked = m
            .host
            .as_deref()
            .and_then(|n| self.hosts.get(n))
            .is_some_and(|h| {
                h.name == host && !h.is_deleting() && h.has_quorum_hook() && h.hold.is_none()
            });
        if !staying_hooked {
            return fail(format!(
                "the host of learner {member_id:x} must stay and carry the quorum hook"
            ));
        }
        let voters = self.voters().count();
        if let Some(desired) = self.desired
            && voters + 1 > desired + 1
        {
            return fail(format!(
                "{} voters would exceed desired {desired} + 1",
                voters + 1
            ));
        }
        if let Some(x) = self.members.get_mut(&member_id) {
            x.learner = false;
        }
        if let Some(why) = self.quorum_shortfall() {
            return Err((
                "etcd".to_owned(),
                Rule::QuorumAfterPlan,
                format!("promoting {member_id:x} leaves {why}"),
            ));
        }
        Ok(())
    }

    fn remove_member(&mut self, member_id: u64) -> Result<(), (String, Rule, String)> {
        self.membership_change()?;
        let fail = |why: String| Err(("etcd".to_owned(), Rule::VoterRemoval, why));
        let Some(m) = self.members.get(&member_id).cloned() else {
            return fail(format!("member {member_id:x} is not known"));
        };
        if m.removed {
            return fail(format!("member {member_id:x} is already removed"));
        }
        if !m.learner {
            let leaving = m
                .host
                .as_deref()
                .and_then(|n| self.hosts.get(n))
                .is_none_or(|h| h.is_deleting());
            if !leaving {
                return fail(format!(
                    "voter {member_id:x} is on a host that stays: only a leaving host's voter is removed"
                ));
            }
            if !m.down && m.leader {
                return fail(format!(
                    "voter {member_id:x} leads: leadership moves off it first"
                ));
            }
            let voters = self.voters().count();
            if !m.down && self.desired.is_some_and(|d| voters <= d) {
                return fail(format!(
                    "healthy voter {member_id:x} goes only once its replacement votes ({voters} voters)"
                ));
            }
        }
        if let Some(x) = self.members.get_mut(&member_id) {
            x.removed = true;
        }
        if !m.learner
            && let Some(why) = self.quorum_shortfall()
        {
            return Err((
                "etcd".to_owned(),
                Rule::QuorumAfterPlan,
                format!("removing {member_id:x} leaves {why}"),
            ));
        }
        Ok(())
    }

    /// Scaling waits for machines and members to agree (seed 004); a scale-down may go while
    /// a staying host still waits for its member (see `guard::machines_and_members_disagree`).
    fn scaling(&mut self, scale_down: bool) -> Result<(), (String, Rule, String)> {
        self.degraded("control-plane")?;
        let fail = |why: String| {
            Err((
                "control-plane".to_owned(),
                Rule::ScalingWhileDisagreeing,
                why,
            ))
        };
        if let Some((id, _)) = self
            .members
            .iter()
            .find(|(_, m)| m.host.is_none() && !m.removed)
        {
            return fail(format!("etcd member {id:x} belongs to no host"));
        }
        for h in &self.snapshot.hosts {
            let member = self.member_of(&h.name).is_some();
            if h.role == Role::ControlPlane && !h.is_deleting() && !member && !scale_down {
                return fail(format!(
                    "control-plane host {} has no etcd member yet",
                    h.name
                ));
            }
            if h.role != Role::ControlPlane && member {
                return fail(format!(
                    "{} runs an etcd member but is not a control-plane host",
                    h.name
                ));
            }
        }
        Ok(())
    }
}

/// True when a remediation's target guards quorum: the host decides (by role or member);
/// the record's flag only counts when the host is unknown.
pub fn record_guards_quorum(r: &Remediation, host: Option<&Host>) -> bool {
    host.map_or(r.control_plane, guards_quorum)
}
