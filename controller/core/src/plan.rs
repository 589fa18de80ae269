//! The top-level decision: `plan(snapshot, policy, now) -> Plan`.
//!
//! Order of the plan: quorum hooks, at most one etcd membership change, control-plane scaling,
//! the power-off of retired hosts with nothing of etcd left, then the next step of every
//! running remediation, then new remediations. Each part sees
//! what the earlier parts planned (a planned membership change holds control-plane fences).
//! Last, the whole plan goes through the safety judgement ([`crate::judge`]): every action
//! it rejects is dropped and becomes a refusal that names the rule.

use std::borrow::Cow;

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::{Action, CheckSummary, Plan, ReasonKind, Refusal};
use metalguard_api::policy::Policy;
use metalguard_api::snapshot::Snapshot;

use crate::guard::{ControlPlaneActivity, plan_guard};
use crate::health::{CheckVerdict, HealthInputs, evaluate_check};
use crate::judge::{Judge, record_guards_quorum};
use crate::quorum::{EtcdView, guards_quorum};
use crate::remediation::{Inputs, plan_remediations};
use crate::retire::{RetireInputs, plan_decommissions};
use crate::validate::validate_snapshot;

fn summarize(v: &CheckVerdict<'_>) -> CheckSummary {
    CheckSummary {
        name: v.check.name.clone(),
        targets: v.targets,
        unhealthy: v.unhealthy.iter().map(|u| u.host.name.clone()).collect(),
        max_unhealthy: v.max_unhealthy.as_ref().ok().copied(),
        short_circuit: v.short_circuit.clone(),
    }
}

/// The snapshot as the planner sees it: the etcd member of a host held after a break-glass
/// fence counts as down (the host is off, or a person is working on it), whatever the last
/// report said.
fn with_holds_applied(snapshot: &Snapshot) -> Cow<'_, Snapshot> {
    if snapshot.hosts.iter().all(|h| h.hold.is_none()) {
        return Cow::Borrowed(snapshot);
    }
    let mut s = snapshot.clone();
    for h in s.hosts.iter_mut().filter(|h| h.hold.is_some()) {
        if let Some(m) = h.etcd.as_mut() {
            m.healthy = false;
            m.leader = false;
        }
    }
    Cow::Owned(s)
}

/// Plans what to do now. Pure: the same inputs always give the same plan.
pub fn plan(snapshot: &Snapshot, policy: &Policy, now: Timestamp) -> Plan {
    if let Err(e) = validate_snapshot(snapshot) {
        return Plan {
            now,
            degraded: Some(format!("snapshot is invalid: {e}; nothing is planned")),
            refusals: vec![Refusal {
                refused: "planning for".to_owned(),
                subject: "the cluster".to_owned(),
                reason: e.to_string(),
                kind: ReasonKind::Invalid,
            }],
            ..Plan::default()
        };
    }
    let seen = with_holds_applied(snapshot);
    let snapshot: &Snapshot = &seen;
    let view = EtcdView::from_snapshot(snapshot);
    let inputs = HealthInputs::from_snapshot(snapshot, &view);
    let verdicts: Vec<CheckVerdict<'_>> = policy
        .health_checks
        .iter()
        .map(|c| evaluate_check(c, &inputs, now))
        .collect();
    let host_of = |name: &str| snapshot.hosts.iter().find(|h| h.name == name);
    let activity = ControlPlaneActivity {
        remediation_active: snapshot
            .remediations
            .iter()
            .any(|r| r.phase.is_active() && record_guards_quorum(r, host_of(&r.target))),
        // A host being deleted is on its way out: its health does not hold up its replacement.
        unhealthy: verdicts
            .iter()
            .flat_map(|v| &v.unhealthy)
            .any(|u| guards_quorum(u.host) && !u.host.is_deleting()),
    };
    let guard = plan_guard(snapshot, &view, activity);
    let retire = plan_decommissions(RetireInputs {
        snapshot,
        view: &view,
        verdicts: &verdicts,
        executor_heartbeat: policy.remediation.executor_heartbeat_timeout,
        now,
    });
    let rem = plan_remediations(Inputs {
        snapshot,
        policy,
        now,
        verdicts: &verdicts,
        view: &view,
        membership_change_planned: guard.has_membership_change(),
        control_plane_degraded: guard.degraded.is_some(),
    });
    let requeue_at = verdicts
        .iter()
        .filter_map(|v| v.next_change)
        .chain(rem.next)
        .min();
    let mut candidates = guard.actions;
    candidates.extend(retire.actions);
    candidates.extend(rem.actions);
    let mut refusals = guard.refusals;
    refusals.extend(retire.refusals);
    refusals.extend(rem.refusals);
    let actions = admit_safe(
        Judge::with_verdicts(snapshot, policy, now, &verdicts),
        candidates,
        &mut refusals,
    );
    Plan {
        now,
        actions,
        refusals,
        health: verdicts.iter().map(summarize).collect(),
        degraded: guard.degraded,
        min_available_members: guard.min_available,
        requeue_at,
        fence_executors: rem.fence_executors,
    }
}

/// The planner's last step: the actions the safety judgement admits, in order; each rejected
/// one becomes a refusal naming the rule and its source.
fn admit_safe(
    mut judge: Judge<'_>,
    candidates: Vec<Action>,
    refusals: &mut Vec<Refusal>,
) -> Vec<Action> {
    let mut admitted = Vec::with_capacity(candidates.len());
    for action in candidates {
        match judge.admit(&action) {
            Ok(()) => admitted.push(action),
            Err(v) => refusals.push(Refusal {
                refused: "carrying out".to_owned(),
                subject: v.subject.clone(),
                reason: format!(
                    "{} was planned and is rejected by the safety judgement: {} ({})",
                    v.action,
                    v.reason,
                    v.rule.source()
                ),
                kind: v.rule.kind(),
            }),
        }
    }
    admitted
}
