//! The top-level decision: `plan(snapshot, policy, now) -> Plan`.
//!
//! Order of the plan: quorum hooks, at most one etcd membership change, control-plane scaling,
//! the power-off of retired hosts with nothing of etcd left, then the next step of every
//! running remediation, then new remediations. Each part sees
//! what the earlier parts planned (a planned membership change holds control-plane fences).

use std::collections::BTreeSet;

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::{CheckSummary, Plan};
use metalguard_api::policy::Policy;
use metalguard_api::snapshot::{Role, Snapshot};

use crate::guard::{ControlPlaneActivity, plan_guard};
use crate::health::{CheckVerdict, evaluate_check};
use crate::quorum::EtcdView;
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

/// Plans what to do now. Pure: the same inputs always give the same plan.
pub fn plan(snapshot: &Snapshot, policy: &Policy, now: Timestamp) -> Plan {
    if let Err(e) = validate_snapshot(snapshot) {
        return Plan {
            now,
            degraded: Some(format!("snapshot is invalid: {e}; nothing is planned")),
            ..Plan::default()
        };
    }
    let remediating: BTreeSet<&str> = snapshot
        .remediations
        .iter()
        .filter(|r| r.phase.is_active())
        .map(|r| r.target.as_str())
        .collect();
    let verdicts: Vec<CheckVerdict<'_>> = policy
        .health_checks
        .iter()
        .map(|c| evaluate_check(c, &snapshot.hosts, &remediating, now))
        .collect();
    let view = EtcdView::from_snapshot(snapshot);
    let activity = ControlPlaneActivity {
        remediation_active: snapshot
            .remediations
            .iter()
            .any(|r| r.control_plane && r.phase.is_active()),
        unhealthy: verdicts
            .iter()
            .flat_map(|v| &v.unhealthy)
            .any(|u| u.host.role == Role::ControlPlane),
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
    let mut actions = guard.actions;
    actions.extend(retire.actions);
    actions.extend(rem.actions);
    let mut refusals = guard.refusals;
    refusals.extend(retire.refusals);
    refusals.extend(rem.refusals);
    Plan {
        now,
        actions,
        refusals,
        health: verdicts.iter().map(summarize).collect(),
        degraded: guard.degraded,
        min_available_members: guard.min_available,
        requeue_at,
    }
}
