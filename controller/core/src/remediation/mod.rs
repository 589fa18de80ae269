//! The remediation planner: starts remediations through every gate and drives each running one
//! one step along the external-baremetal state machine (seed 003, DOMAIN.md §3, seed 004 KCP).

mod executors;
mod start;
mod steps;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::{Action, ActionKind, OperationId, ReasonKind, Refusal, RemediationStep};
use metalguard_api::policy::{DEFAULT_NODE_REREGISTER_DEADLINE, Policy};
use metalguard_api::remediation::{Remediation, RemediationPhase as P};
use metalguard_api::snapshot::{Host, Snapshot};

use crate::health::{CheckVerdict, judge_host, selects};
use crate::judge::record_guards_quorum;
use crate::quorum::{EtcdView, guards_quorum};

/// Prefix of the cause of an administrator-requested fence.
pub const ADMIN_CAUSE: &str = "fence requested by";

/// Prefix of the cause of a fence drill (`drill HOST`, `action: Drill`): how a remediation
/// is recorded as a drill.
pub const DRILL_CAUSE: &str = "fence drill requested by";

/// Whether a remediation with `cause` was a person's request (an administrator's fence or a
/// drill): not cancelled because its target looks healthy, and not second-guessed by a new
/// leadership.
pub fn requested_by_a_person(cause: &str) -> bool {
    cause.starts_with(ADMIN_CAUSE) || cause.starts_with(DRILL_CAUSE)
}

/// Everything the remediation planner reads.
#[derive(Debug, Clone, Copy)]
pub struct Inputs<'a> {
    /// The snapshot.
    pub snapshot: &'a Snapshot,
    /// The policy.
    pub policy: &'a Policy,
    /// Now.
    pub now: Timestamp,
    /// Health verdicts, one per check.
    pub verdicts: &'a [CheckVerdict<'a>],
    /// The etcd view.
    pub view: &'a EtcdView<'a>,
    /// The guard planned an etcd membership change in this plan.
    pub membership_change_planned: bool,
    /// The guard reported the control plane degraded.
    pub control_plane_degraded: bool,
}

/// What the remediation planner decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RemediationOutput {
    /// Actions, in order: steps of running remediations, then new ones.
    pub actions: Vec<Action>,
    /// Refusals with reasons.
    pub refusals: Vec<Refusal>,
    /// The earliest time a deadline or retry wait expires.
    pub next: Option<Timestamp>,
    /// For every host with a BMC, the agent that would execute its fence now.
    pub fence_executors: BTreeMap<String, String>,
}

impl RemediationOutput {
    /// Records that `subject` is not remediated (or a running remediation holds), and why.
    fn refuse(&mut self, subject: &str, kind: ReasonKind, reason: String) {
        self.refusals.push(Refusal {
            refused: "remediating".to_owned(),
            subject: subject.to_owned(),
            reason,
            kind,
        });
    }
    fn wake_at(&mut self, t: Timestamp) {
        self.next = Some(self.next.map_or(t, |n| n.min(t)));
    }
}

struct Candidate<'a> {
    host: &'a Host,
    cause: String,
    since: Timestamp,
    forced: Option<String>,
    blocked_by: Option<(ReasonKind, String)>,
    /// An administrator asked to power it off and leave it off.
    stay_off: bool,
    /// A fence drill of a healthy host.
    drill: bool,
}

struct Planner<'a> {
    inp: Inputs<'a>,
    hosts: HashMap<&'a str, &'a Host>,
    latest: BTreeMap<&'a str, &'a Remediation>,
    executors: executors::Executors<'a>,
    /// Guarded targets whose remediation is in progress past its gate (power touched), or
    /// failed and awaiting its retry (seed 004: the previous remediation MUST have completed).
    control_plane_in_progress: Vec<String>,
    /// A guarded power-off is already planned in this plan.
    guarded_power_off_planned: bool,
    out: RemediationOutput,
}

/// Plans remediation steps and starts.
pub fn plan_remediations(inp: Inputs<'_>) -> RemediationOutput {
    let snapshot = inp.snapshot;
    let hosts: HashMap<&str, &Host> = snapshot
        .hosts
        .iter()
        .map(|h| (h.name.as_str(), h))
        .collect();
    let mut latest: BTreeMap<&str, &Remediation> = BTreeMap::new();
    for r in &snapshot.remediations {
        let e = latest.entry(r.target.as_str()).or_insert(r);
        if r.seq > e.seq {
            *e = r;
        }
    }
    let busy: HashSet<&str> = snapshot
        .remediations
        .iter()
        .filter(|r| r.phase.is_active())
        .map(|r| r.target.as_str())
        .collect();
    let unhealthy: HashSet<&str> = inp
        .verdicts
        .iter()
        .flat_map(|v| v.unhealthy.iter().map(|u| u.host.name.as_str()))
        .collect();
    let hb = inp.policy.remediation.executor_heartbeat_timeout;
    let executors: Vec<&Host> = snapshot
        .hosts
        .iter()
        .filter(|h| {
            h.agent
                .as_ref()
                .is_some_and(|a| a.can_fence && a.last_heartbeat.after(hb) > inp.now)
                && h.node_ready()
                && h.hold.is_none()
                && !h.is_deleting()
                && !busy.contains(h.name.as_str())
                && !unhealthy.contains(h.name.as_str())
        })
        .collect();
    let executors = executors::Executors::new(executors);
    let mut control_plane_in_progress: Vec<String> = snapshot
        .remediations
        .iter()
        .filter(|r| r.phase.is_active() && !matches!(r.phase, P::Detected | P::Gated))
        .chain(
            latest
                .values()
                .copied()
                .filter(|r| matches!(r.phase, P::Failed { .. }))
                // Seed 004: "Previous remediation MUST have been completed. This rule
                // prevents KCP to remediate more machines while the replacement for the
                // previous machine is not yet created." Here the host itself is the
                // replacement: once it is back (healthy by every check, its node ready, its
                // member healthy) a failed attempt holds nothing back. Before, one whose host
                // recovered by itself was never retried (nothing to retry) and blocked every
                // other control-plane remediation until a person acted (the soak).
                .filter(|r| {
                    !hosts.get(r.target.as_str()).is_some_and(|h| {
                        !unhealthy.contains(h.name.as_str())
                            && h.node_ready()
                            && h.etcd.as_ref().is_none_or(|m| m.healthy)
                    })
                }),
        )
        .filter(|r| record_guards_quorum(r, hosts.get(r.target.as_str()).copied()))
        .map(|r| r.target.clone())
        .collect();
    control_plane_in_progress.sort();
    control_plane_in_progress.dedup();
    let mut p = Planner {
        inp,
        hosts,
        latest,
        executors,
        control_plane_in_progress,
        guarded_power_off_planned: false,
        out: RemediationOutput::default(),
    };
    let mut active: Vec<&Remediation> = snapshot
        .remediations
        .iter()
        .filter(|r| r.phase.is_active())
        .collect();
    active.sort_by(|a, b| a.id.cmp(&b.id));
    for r in &active {
        p.step(r);
    }
    p.start_new(&active);
    p.out.fence_executors = p.fence_executors();
    p.out
}

/// The candidates that may drive `target`'s BMC, in their order: those whose agent's latest
/// report says it cannot reach that BMC are left out (a candidate that has not said is
/// kept: older agents, nothing probed yet). When every candidate says it cannot, none is
/// left, and the caller says so instead of sending a fence that cannot work.
pub(crate) fn prefer_bmc_reachers<'a>(candidates: Vec<&'a Host>, target: &str) -> Vec<&'a Host> {
    candidates
        .into_iter()
        .filter(|h| {
            !h.agent
                .as_ref()
                .is_some_and(|a| a.cannot_reach_bmc_of(target))
        })
        .collect()
}

/// Why no executor was found.
pub(crate) fn no_executor_reason(candidates: usize, target: &str) -> String {
    if candidates == 0 {
        "no healthy agent other than the target can drive its BMC".to_owned()
    } else {
        format!(
            "every healthy agent ({candidates}) reports it cannot reach {target}'s BMC: check the BMC's network and address"
        )
    }
}

impl<'a> Planner<'a> {
    /// The executor of a remediation of `target`: the current one while it is eligible,
    /// else preferably one in another failure domain; never the target, and never an agent
    /// that reports it cannot reach the target's BMC. `Err` says why there is none.
    fn choose_executor(&self, target: &Host, current: Option<&str>) -> Result<&'a Host, String> {
        self.executors.choose(target, current)
    }

    /// For every host with a BMC, the agent [`Planner::choose_executor`] picks for its fence
    /// now: an active remediation's own executor while it is eligible.
    fn fence_executors(&self) -> BTreeMap<String, String> {
        let current: HashMap<&str, &str> = self
            .inp
            .snapshot
            .remediations
            .iter()
            .filter(|r| r.phase.is_active())
            .map(|r| (r.target.as_str(), r.executor.as_str()))
            .collect();
        self.inp
            .snapshot
            .hosts
            .iter()
            .filter(|h| h.bmc_configured)
            .filter_map(|h| {
                let executor = self
                    .choose_executor(h, current.get(h.name.as_str()).copied())
                    .ok()?;
                Some((h.name.clone(), executor.name.clone()))
            })
            .collect()
    }

    /// The short-circuit of a check covering `target`, if any.
    fn short_circuit_of(&self, target: &Host) -> Option<String> {
        self.inp.verdicts.iter().find_map(|v| {
            v.short_circuit
                .as_ref()
                .filter(|_| selects(&v.check.selector, target))
                .map(|sc| format!("check {} short-circuited: {sc}", v.check.name))
        })
    }

    /// True when `host` guards etcd quorum (by role or by membership).
    fn guarded(host: &Host) -> bool {
        guards_quorum(host)
    }

    /// The last verified power-on of `target` by a remediation.
    fn boot_of(&self, target: &str) -> Option<metalguard_api::duration::Timestamp> {
        self.inp
            .snapshot
            .remediations
            .iter()
            .filter(|r| r.target == target)
            .filter_map(|r| r.powered_on_at)
            .max()
    }

    fn node_deadline(&self, target: &Host) -> Duration {
        self.inp
            .policy
            .health_checks
            .iter()
            .filter(|c| selects(&c.selector, target))
            .find_map(|c| c.node_startup_timeout.filter(|t| !t.is_zero()))
            .unwrap_or(DEFAULT_NODE_REREGISTER_DEADLINE)
    }

    fn healthy_now(&self, target: &Host) -> bool {
        self.inp
            .policy
            .health_checks
            .iter()
            .filter(|c| selects(&c.selector, target))
            .all(|c| {
                judge_host(c, target, false, self.boot_of(&target.name), self.inp.now)
                    .0
                    .is_none()
            })
    }

    fn emit(&mut self, r: &Remediation, executor: &str, step: RemediationStep, reason: String) {
        self.out.actions.push(Action {
            id: OperationId(format!("{}/{}", r.id, step.name())),
            kind: ActionKind::Remediate {
                remediation_id: r.id.clone(),
                target: r.target.clone(),
                executor: executor.to_owned(),
                step,
            },
            reason,
        });
    }
}
