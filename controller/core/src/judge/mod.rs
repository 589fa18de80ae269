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
//! - no scaling (a scale-down included) while machines and etcd members disagree, nor while
//!   an etcd member is down;
//! - no quorum hook re-added to a host being deleted, none released while its member lives;
//! - a retired host is powered off only with no member and no hook left;
//! - a host that guards quorum is never reprovisioned automatically;
//! - every step is a legal transition of a known remediation.
//!
//! "Guarded" is decided by membership, not by label: a host with an etcd member guards
//! quorum whatever its role, and the host's role wins over a remediation record's flag.

mod etcd;
mod fence;
mod rules;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::fmt;

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::{Action, ActionKind, OperationId};
use metalguard_api::policy::{HealthCheck, Policy};
use metalguard_api::remediation::{Remediation, RemediationPhase as P};
use metalguard_api::snapshot::{Host, Snapshot};

use crate::health::{CheckVerdict, HealthInputs, evaluate_check};
use crate::quorum::{guards_quorum, quorum, validate_desired};

pub use rules::Rule;

/// What judging one action gives: admitted, or (subject, rule broken, why).
type Verdict = Result<(), (String, Rule, String)>;

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
    hosts: HashMap<&'a str, &'a Host>,
    members: BTreeMap<u64, Member>,
    desired: Option<usize>,
    degraded: Option<String>,
    /// The checks that short-circuited, in the policy's order, with the reason: a host
    /// selected by one is not fenced unless a person forces it (the first one speaks). Kept
    /// per check, not per host: a short-circuit at 5,000 hosts formatted 5,000 reasons.
    short_circuits: Vec<(&'a HealthCheck, String)>,
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
        let view = crate::quorum::EtcdView::from_snapshot(snapshot);
        let inputs = HealthInputs::from_snapshot(snapshot, &view);
        let verdicts: Vec<CheckVerdict<'a>> = policy
            .health_checks
            .iter()
            .map(|check| evaluate_check(check, &inputs, now))
            .collect();
        Self::with_verdicts(snapshot, policy, now, &verdicts)
    }

    /// As [`Judge::new`], with `verdicts` the health checks of `policy` evaluated over
    /// `snapshot` at `now` (the planner has them already).
    pub(crate) fn with_verdicts(
        snapshot: &'a Snapshot,
        policy: &'a Policy,
        now: Timestamp,
        verdicts: &[CheckVerdict<'a>],
    ) -> Self {
        let hosts: HashMap<&str, &Host> = snapshot
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
        let mut short_circuits = Vec::new();
        let mut unhealthy: BTreeSet<&str> = BTreeSet::new();
        for v in verdicts {
            unhealthy.extend(v.unhealthy.iter().map(|u| u.host.name.as_str()));
            if let Some(sc) = &v.short_circuit {
                short_circuits.push((
                    v.check,
                    format!("check {} short-circuited: {sc}", v.check.name),
                ));
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
        // Seed 004: a failed attempt is not completed, unless its host came back (healthy by
        // every check, its node ready, its member healthy): the host is its own replacement.
        for (target, r) in latest_by_target(&snapshot.remediations) {
            let back = hosts.get(target).is_some_and(|h| {
                !unhealthy.contains(target)
                    && h.node_ready()
                    && h.etcd.as_ref().is_none_or(|m| m.healthy)
            });
            if matches!(r.phase, P::Failed { .. })
                && record_guards_quorum(r, hosts.get(target).copied())
                && !back
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
            short_circuits,
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

    fn judge(&mut self, action: &Action) -> Verdict {
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
            ActionKind::RequestHostDeletion { .. }
            | ActionKind::RequestHost { .. }
            | ActionKind::Rebalance { .. } => self.scaling(),
        }
    }

    fn degraded(&self, subject: &str) -> Verdict {
        match &self.degraded {
            Some(why) => Err((subject.to_owned(), Rule::Degraded, why.clone())),
            None => Ok(()),
        }
    }
}

/// True when a remediation's target guards quorum: the host decides (by role or member);
/// the record's flag only counts when the host is unknown.
pub fn record_guards_quorum(r: &Remediation, host: Option<&Host>) -> bool {
    host.map_or(r.control_plane, guards_quorum)
}
