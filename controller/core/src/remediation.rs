//! The remediation planner: starts remediations through every gate and drives each running one
//! one step along the external-baremetal state machine (seed 003, DOMAIN.md §3, seed 004 KCP).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use metalguard_api::duration::{Timestamp, format_duration};
use metalguard_api::plan::{Action, ActionKind, OperationId, Refusal, RemediationStep};
use metalguard_api::policy::{DEFAULT_NODE_REREGISTER_DEADLINE, NodeHandling, Policy, Strategy};
use metalguard_api::remediation::{Remediation, RemediationPhase as P, remediation_id};
use metalguard_api::snapshot::{Host, Role, Snapshot};

use crate::health::{CheckVerdict, UnhealthyReason, judge_host, selects};
use crate::quorum::EtcdView;

/// Prefix of the cause of an administrator-requested fence.
pub const ADMIN_CAUSE: &str = "fence requested by";

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
}

impl RemediationOutput {
    fn refuse(&mut self, subject: &str, reason: String) {
        self.refusals.push(Refusal {
            subject: subject.to_owned(),
            reason,
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
    blocked_by: Option<String>,
}

struct Planner<'a> {
    inp: Inputs<'a>,
    hosts: HashMap<&'a str, &'a Host>,
    latest: BTreeMap<&'a str, &'a Remediation>,
    executors: Vec<&'a Host>,
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
    let mut executors: Vec<&Host> = snapshot
        .hosts
        .iter()
        .filter(|h| {
            h.agent
                .as_ref()
                .is_some_and(|a| a.can_fence && a.last_heartbeat.after(hb) > inp.now)
                && h.node_ready()
                && !h.is_deleting()
                && !busy.contains(h.name.as_str())
                && !unhealthy.contains(h.name.as_str())
        })
        .collect();
    executors.sort_by(|a, b| a.name.cmp(&b.name));
    let mut p = Planner {
        inp,
        hosts,
        latest,
        executors,
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
    p.out
}

impl<'a> Planner<'a> {
    fn choose_executor(&self, target: &Host, current: Option<&str>) -> Option<&'a Host> {
        if let Some(c) = current
            && c != target.name
            && let Ok(i) = self.executors.binary_search_by(|h| h.name.as_str().cmp(c))
        {
            return Some(self.executors[i]);
        }
        let others = || {
            self.executors
                .iter()
                .copied()
                .filter(|h| h.name != target.name)
        };
        others()
            .find(|h| target.failure_domain.is_some() && h.failure_domain != target.failure_domain)
            .or_else(|| others().next())
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
            .all(|c| judge_host(c, target, false, self.inp.now).0.is_none())
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

    /// Plans the next step of one running remediation.
    fn step(&mut self, r: &Remediation) {
        let now = self.inp.now;
        let Some(target) = self.hosts.get(r.target.as_str()).copied() else {
            let reason = format!("target {} disappeared from the inventory", r.target);
            return self.emit(
                r,
                &r.executor,
                RemediationStep::Fail {
                    reason: reason.clone(),
                },
                reason,
            );
        };
        let executor = match self.choose_executor(target, Some(&r.executor)) {
            Some(e) => e.name.clone(),
            None => {
                return self.out.refuse(
                    &r.target,
                    format!(
                        "{} holds: no healthy agent other than the target can drive its BMC",
                        r.id
                    ),
                );
            }
        };
        let admin = r.cause.starts_with(ADMIN_CAUSE);
        let mut cancel = r.cancel_requested.clone();
        if cancel.is_none() && target.is_deleting() && !r.phase.power_may_be_off() {
            cancel = Some("target is being deleted".to_owned());
        }
        if cancel.is_none()
            && r.phase == P::Gated
            && r.forced.is_none()
            && !admin
            && self.healthy_now(target)
        {
            cancel = Some("target recovered before power-off".to_owned());
        }
        let name = &r.target;
        let (step, reason) = match (&r.phase, &cancel) {
            (P::Detected | P::Gated, Some(c)) => (
                RemediationStep::Cancel { reason: c.clone() },
                format!("cancel {} of {name}: {c}", r.id),
            ),
            (P::Detected, None) => {
                let c =
                    "detected but never gated; gates are re-evaluated on the next plan".to_owned();
                (
                    RemediationStep::Cancel { reason: c.clone() },
                    format!("cancel {}: {c}", r.id),
                )
            }
            (P::Gated, None) => match self.gate_power_off(r, target) {
                Some(x) => x,
                None => return,
            },
            (P::PoweringOff | P::VerifiedOff | P::BackedUp, Some(c)) => (
                RemediationStep::PowerOn,
                format!("cancelling {} ({c}): power {name} back on", r.id),
            ),
            (P::PoweringOff, None) => (
                RemediationStep::VerifyPowerOff,
                format!("confirm {name} reports power Off (PoweringOff is not off)"),
            ),
            (P::VerifiedOff, None) if r.strategy == Strategy::Reboot => (
                RemediationStep::PowerOn,
                format!("reboot strategy: {name} is off, power it on"),
            ),
            (P::VerifiedOff, None) => (
                RemediationStep::BackupNodeMetadata,
                format!("{name} is off: save its node labels and annotations"),
            ),
            (P::BackedUp, None) if r.node_handling == NodeHandling::OutOfServiceTaint => (
                RemediationStep::TaintOutOfService,
                format!("taint {name} out-of-service so its workloads move"),
            ),
            (P::BackedUp, None) => (
                RemediationStep::DeleteNode,
                format!("delete node {name} so its workloads are rescheduled"),
            ),
            (P::NodeRemoved, _) => (RemediationStep::PowerOn, format!("power {name} on")),
            (P::PoweringOn, _) => (
                RemediationStep::VerifyPowerOn,
                format!("confirm {name} reports power On"),
            ),
            (P::WaitingForNode, _) => {
                let deadline = r.phase_since.after(self.node_deadline(target));
                if !target.node_ready() {
                    if now >= deadline {
                        let reason = format!(
                            "node {name} did not become ready within {}",
                            format_duration(self.node_deadline(target))
                        );
                        (
                            RemediationStep::Fail {
                                reason: reason.clone(),
                            },
                            reason,
                        )
                    } else {
                        self.out.wake_at(deadline);
                        return;
                    }
                } else if r.backup.is_some() && (r.strategy == Strategy::ExternalBaremetal) {
                    (
                        RemediationStep::RestoreNodeMetadata,
                        format!(
                            "node {name} is back: restore saved labels and annotations (keys on the new node win)"
                        ),
                    )
                } else if let Some(c) = &cancel {
                    (
                        RemediationStep::Cancel { reason: c.clone() },
                        format!("{name} is back on: finish cancelling {} ({c})", r.id),
                    )
                } else {
                    (
                        RemediationStep::Complete,
                        format!("node {name} is back and ready: remediation done"),
                    )
                }
            }
            (P::Restored, Some(c)) => (
                RemediationStep::Cancel { reason: c.clone() },
                format!("{name} restored: finish cancelling {} ({c})", r.id),
            ),
            (P::Restored, None) => (
                RemediationStep::Complete,
                format!("node {name} restored: remediation done"),
            ),
            _ => return,
        };
        self.emit(r, &executor, step, reason);
    }

    /// The last gate before anything destructive: re-checked on every plan.
    fn gate_power_off(
        &mut self,
        r: &Remediation,
        target: &Host,
    ) -> Option<(RemediationStep, String)> {
        let name = &r.target;
        if target.role == Role::ControlPlane {
            if self.inp.control_plane_degraded {
                self.out.refuse(
                    name,
                    format!(
                        "{} holds before power-off: the control plane is degraded",
                        r.id
                    ),
                );
                return None;
            }
            if self.inp.membership_change_planned {
                self.out.refuse(
                    name,
                    format!(
                        "{} holds before power-off: an etcd membership change goes first",
                        r.id
                    ),
                );
                return None;
            }
            if let Err(e) = self.inp.view.may_fence(target) {
                self.out
                    .refuse(name, format!("{} holds before power-off: {e}", r.id));
                return None;
            }
            if let Some(m) = self.inp.view.member_of(name)
                && m.member.leader
                && m.member.healthy
            {
                let to = self
                    .inp
                    .view
                    .voters()
                    .find(|o| o.member.id != m.member.id && o.member.healthy);
                if let Some(to) = to {
                    self.out.actions.push(Action {
                        id: OperationId(format!("{}/move-leader", r.id)),
                        kind: ActionKind::MoveLeader {
                            from_member: m.member.id,
                            to_member: to.member.id,
                        },
                        reason: format!(
                            "{name} leads etcd: move leadership to {} before fencing it",
                            to.label()
                        ),
                    });
                }
                return None;
            }
        }
        let how = r
            .forced
            .as_ref()
            .map_or_else(String::new, |f| format!(" (forced: {f})"));
        Some((
            RemediationStep::PowerOff,
            format!("{name} is unhealthy ({}){how}: power it off", r.cause),
        ))
    }

    fn candidates(&self) -> Vec<Candidate<'a>> {
        let mut by_host: BTreeMap<&str, Candidate<'a>> = BTreeMap::new();
        for v in self.inp.verdicts {
            for u in &v.unhealthy {
                if u.reason == UnhealthyReason::UnderRemediation {
                    continue;
                }
                let c = by_host
                    .entry(u.host.name.as_str())
                    .or_insert_with(|| Candidate {
                        host: u.host,
                        cause: format!("{} (check {})", u.reason, v.check.name),
                        since: u.since,
                        forced: None,
                        blocked_by: None,
                    });
                if let (None, Some(sc)) = (&c.blocked_by, &v.short_circuit) {
                    c.blocked_by = Some(format!("check {} short-circuited: {sc}", v.check.name));
                }
            }
        }
        for h in &self.inp.snapshot.hosts {
            let Some(req) = &h.fence_request else {
                continue;
            };
            let served = self
                .inp
                .snapshot
                .remediations
                .iter()
                .any(|r| r.target == h.name && r.started_at >= req.requested_at);
            if served || by_host.contains_key(h.name.as_str()) && req.force_reason.is_none() {
                continue;
            }
            let blocked_by = self.inp.verdicts.iter().find_map(|v| {
                let covers = selects(&v.check.selector, h);
                v.short_circuit
                    .as_ref()
                    .filter(|_| covers)
                    .map(|sc| format!("check {} short-circuited: {sc}", v.check.name))
            });
            let who = req.requested_by.as_deref().unwrap_or("an administrator");
            by_host.insert(
                h.name.as_str(),
                Candidate {
                    host: h,
                    cause: format!("{ADMIN_CAUSE} {who}"),
                    since: req.requested_at,
                    forced: req.force_reason.clone(),
                    blocked_by,
                },
            );
        }
        let mut list: Vec<Candidate<'a>> = by_host.into_values().collect();
        list.sort_by(|a, b| {
            a.since
                .cmp(&b.since)
                .then_with(|| a.host.name.cmp(&b.host.name))
        });
        list
    }

    fn start_new(&mut self, active: &[&Remediation]) {
        let settings = &self.inp.policy.remediation;
        let now = self.inp.now;
        let busy: HashSet<&str> = active.iter().map(|r| r.target.as_str()).collect();
        let mut cp_running: Vec<String> = active
            .iter()
            .filter(|r| r.control_plane)
            .map(|r| r.target.clone())
            .collect();
        let mut workers_running = active.iter().filter(|r| !r.control_plane).count();
        for c in self.candidates() {
            let host = c.host;
            let name = host.name.as_str();
            if busy.contains(name) {
                continue;
            }
            let refuse = |out: &mut RemediationOutput, why: String| {
                out.refuse(name, format!("not remediating: {why}"));
            };
            if host.is_deleting() {
                refuse(&mut self.out, "the host is being deleted".into());
                continue;
            }
            let latest = self.latest.get(name).copied();
            let (seq, attempt, wait_until) = match latest {
                None => (1, 1, None),
                Some(l) => match &l.phase {
                    P::NeedsPerson { reason } => {
                        refuse(&mut self.out, format!("{} needs a person: {reason}", l.id));
                        continue;
                    }
                    P::Reprovisioning => {
                        refuse(
                            &mut self.out,
                            format!("{} handed the host to the provisioner", l.id),
                        );
                        continue;
                    }
                    P::Failed { .. } => (
                        l.seq + 1,
                        l.attempt + 1,
                        Some(l.phase_since.after(settings.retry_period)),
                    ),
                    P::Cancelled { .. } => (l.seq + 1, l.attempt, None),
                    _ if now < l.phase_since.after(settings.min_healthy_period) => (
                        l.seq + 1,
                        l.attempt + 1,
                        Some(l.phase_since.after(settings.retry_period)),
                    ),
                    _ => (l.seq + 1, 1, None),
                },
            };
            let forced = c.forced.is_some();
            if attempt > settings.max_retry + 1 && !forced {
                let l_failed = latest.filter(|l| matches!(l.phase, P::Failed { .. }));
                let why = format!(
                    "{} attempts failed or did not last {} (maxRetry {})",
                    attempt - 1,
                    format_duration(settings.min_healthy_period),
                    settings.max_retry
                );
                let may_reprovision = settings.allow_reprovision
                    && host.role == Role::Worker
                    && !host.externally_provisioned;
                if let Some(l) = l_failed {
                    let executor = l.executor.clone();
                    if may_reprovision {
                        self.emit(
                            l,
                            &executor,
                            RemediationStep::Reprovision,
                            format!("{name}: {why}: reprovision it"),
                        );
                    } else {
                        let who = if host.role == Role::ControlPlane {
                            "a control-plane host"
                        } else if host.externally_provisioned {
                            "an externally provisioned host"
                        } else {
                            "reprovisioning is not allowed"
                        };
                        let reason = format!("{why}; {who} is never reprovisioned automatically");
                        self.emit(
                            l,
                            &executor,
                            RemediationStep::EscalateToPerson {
                                reason: reason.clone(),
                            },
                            format!("{name}: {reason}"),
                        );
                    }
                } else {
                    refuse(&mut self.out, format!("{why}; a person must look at it"));
                }
                continue;
            }
            if let Some(w) = wait_until
                && now < w
                && !forced
            {
                refuse(
                    &mut self.out,
                    format!("attempt {attempt} waits for retryPeriod until {w}"),
                );
                self.out.wake_at(w);
                continue;
            }
            if !forced {
                if let Some(b) = &c.blocked_by {
                    refuse(&mut self.out, b.clone());
                    continue;
                }
                if host.role == Role::Worker && workers_running >= settings.max_concurrent as usize
                {
                    refuse(
                        &mut self.out,
                        format!(
                            "{workers_running} worker remediations running, maxConcurrent {}",
                            settings.max_concurrent
                        ),
                    );
                    continue;
                }
            }
            if !host.bmc_configured {
                refuse(&mut self.out, "no BMC is configured for it".into());
                continue;
            }
            if host.role == Role::ControlPlane {
                if let Some(other) = cp_running.first() {
                    refuse(
                        &mut self.out,
                        format!("one control-plane remediation at a time ({other} is running)"),
                    );
                    continue;
                }
                if let Err(e) = self.control_plane_gate(host) {
                    refuse(&mut self.out, e);
                    continue;
                }
            }
            let Some(executor) = self.choose_executor(host, None) else {
                refuse(
                    &mut self.out,
                    "no healthy agent other than the target can drive its BMC".into(),
                );
                continue;
            };
            let r = Remediation {
                id: remediation_id(name, seq),
                target: name.to_owned(),
                seq,
                attempt,
                executor: executor.name.clone(),
                strategy: settings.strategy,
                node_handling: settings.node_handling,
                phase: P::Gated,
                started_at: now,
                phase_since: now,
                control_plane: host.role == Role::ControlPlane,
                cause: c.cause.clone(),
                forced: c.forced.clone(),
                cancel_requested: None,
                backup: None,
            };
            let mut reason = format!(
                "{name}: {}; attempt {attempt}; executor {}",
                c.cause, executor.name
            );
            if let Some(f) = &c.forced {
                reason = format!("{reason}; FORCED past policy gates: {f}");
            }
            if host.role == Role::ControlPlane {
                cp_running.push(name.to_owned());
            } else {
                workers_running += 1;
            }
            self.out.actions.push(Action {
                id: OperationId(format!("{}/start", r.id)),
                kind: ActionKind::StartRemediation { remediation: r },
                reason,
            });
        }
    }

    /// KCP and quorum rules for starting a control-plane remediation.
    fn control_plane_gate(&self, host: &Host) -> Result<(), String> {
        let view = self.inp.view;
        if self.inp.control_plane_degraded {
            return Err("the control plane is degraded".into());
        }
        if view.control_plane.len() < 2 {
            return Err("a control plane needs at least two hosts to be remediated".into());
        }
        if self.inp.membership_change_planned || view.membership_in_flux() {
            return Err(
                "an etcd membership change or control-plane deletion is in progress".into(),
            );
        }
        if let Some(h) = view
            .control_plane
            .iter()
            .find(|h| h.name != host.name && h.etcd.is_none())
        {
            return Err(format!(
                "control-plane host {} is still provisioning",
                h.name
            ));
        }
        view.may_fence(host)
    }
}
