//! The next step of a running remediation, and the last gate before power-off.

use metalguard_api::duration::format_duration;
use metalguard_api::plan::{Action, ActionKind, OperationId, ReasonKind, RemediationStep};
use metalguard_api::remediation::{Remediation, RemediationPhase as P};
use metalguard_api::snapshot::Host;

use metalguard_api::policy::{NodeHandling, Strategy};

use super::Planner;

impl Planner<'_> {
    /// Plans the next step of one running remediation.
    pub(super) fn step(&mut self, r: &Remediation) {
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
        if let Some(hold) = &target.hold {
            // A person fenced the host by hand: nothing of this remediation touches it. One
            // that has not touched power yet is cancelled; one that has waits for the release.
            if matches!(r.phase, P::Detected | P::Gated) {
                let c = format!(
                    "{} is held after a break-glass fence by {} ({})",
                    r.target, hold.by, hold.reason
                );
                return self.emit(
                    r,
                    &r.executor,
                    RemediationStep::Cancel { reason: c.clone() },
                    format!("cancel {}: {c}", r.id),
                );
            }
            return self.out.refuse(
                &r.target,
                ReasonKind::Hold,
                format!(
                    "{} holds: {} is held since {} by {} after a break-glass fence ({}); `metalguard-controller release {}` hands it back",
                    r.id, r.target, hold.since, hold.by, hold.reason, r.target
                ),
            );
        }
        let executor = match self.choose_executor(target, Some(&r.executor)) {
            Ok(e) => e.name.clone(),
            Err(why) => {
                return self.out.refuse(
                    &r.target,
                    ReasonKind::Executor,
                    format!("{} holds: {why}", r.id),
                );
            }
        };
        let admin = super::requested_by_a_person(&r.cause);
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
            (P::VerifiedOff, None) if r.strategy == Strategy::Reboot && !r.stay_off => (
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
            (P::NodeRemoved, None) if r.stay_off => {
                let reason = format!(
                    "{name} was powered off on request ({}) and is left off: a person powers it on",
                    r.cause
                );
                (
                    RemediationStep::EscalateToPerson {
                        reason: reason.clone(),
                    },
                    reason,
                )
            }
            (P::NodeRemoved, _) => (RemediationStep::PowerOn, format!("power {name} on")),
            (P::PoweringOn, _) => (
                RemediationStep::VerifyPowerOn,
                format!("confirm {name} reports power On"),
            ),
            (P::WaitingForNode, _) => {
                let deadline = r.phase_since.after(self.node_deadline(target));
                let not_booted = not_booted_since(r, target);
                let heartbeat = crate::health::agent_heartbeat_timeout(self.inp.policy, target);
                if let Some(proof) = never_went_down(r, target, heartbeat) {
                    // No need to wait for the node deadline: the host ran its old boot long
                    // after both power changes were verified. Meanwhile no other control-plane
                    // host would be remediated (one at a time): a BMC that lied held every
                    // fence for the whole deadline (20 minutes by default; the soak).
                    (
                        RemediationStep::Fail {
                            reason: proof.clone(),
                        },
                        proof,
                    )
                } else if !target.node_ready() || not_booted.is_some() {
                    if now >= deadline {
                        let reason = match not_booted {
                            Some(why) if target.node_ready() => format!(
                                "{name} is ready but {why} within {}: the power-on did not boot it (a BMC that reports on and does nothing?)",
                                format_duration(self.node_deadline(target))
                            ),
                            _ => format!(
                                "node {name} did not become ready within {}",
                                format_duration(self.node_deadline(target))
                            ),
                        };
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
        if r.forced.is_none()
            && let Some(sc) = self.short_circuit_of(target)
        {
            self.out.refuse(
                name,
                ReasonKind::ShortCircuit,
                format!("{} holds before power-off: {sc}", r.id),
            );
            return None;
        }
        if Self::guarded(target) || r.control_plane {
            let held =
                |kind, why: String| (kind, format!("{} holds before power-off: {why}", r.id));
            let refusal = if self.inp.control_plane_degraded {
                Some(held(
                    ReasonKind::Degraded,
                    "the control plane is degraded".to_owned(),
                ))
            } else if self.inp.membership_change_planned {
                Some(held(
                    ReasonKind::ControlPlaneBusy,
                    "an etcd membership change goes first".to_owned(),
                ))
            } else if let Some(other) = self.control_plane_in_progress.iter().find(|o| *o != name) {
                Some(held(
                    ReasonKind::ControlPlaneBusy,
                    format!("the remediation of control-plane host {other} is still in progress"),
                ))
            } else if self.guarded_power_off_planned {
                Some(held(
                    ReasonKind::ControlPlaneBusy,
                    "another control-plane host is powered off in this plan".to_owned(),
                ))
            } else {
                self.inp.view.may_fence(target).err().map(|e| {
                    held(
                        ReasonKind::Quorum,
                        format!("{e} ({})", crate::seeds::REMEDIATION_PRESERVES_QUORUM),
                    )
                })
            };
            if let Some((kind, why)) = refusal {
                self.out.refuse(name, kind, why);
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
            self.guarded_power_off_planned = true;
            self.control_plane_in_progress.push(name.clone());
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
}

/// Why `target` has not shown that it booted since `r` started, if it has not: its agent
/// reported a boot ID before the fence (`boot_before`) and reports no other one since. A
/// remediation whose target's boot ID was never known is judged by readiness alone.
/// How long after the power-on was verified a report of the boot from before the fence must
/// have been received to prove the host never went down: at least this, and at least the
/// agent heartbeat timeout. Longer than any report in flight when the power went off (a
/// report sent before the cut could still arrive just after the verified power-off).
pub const NEVER_DOWN_AFTER: std::time::Duration = std::time::Duration::from_secs(30);

/// Why `target` certainly never went down during remediation `r`, if it did not: its agent
/// reported the boot ID from before the fence in a report the controller received
/// [`NEVER_DOWN_AFTER`] (or `heartbeat`, if longer) or more after the power-on was verified
/// (`r.phase_since`). A host that was power-cycled cannot do that: its agent died with it.
fn never_went_down(
    r: &Remediation,
    target: &Host,
    heartbeat: std::time::Duration,
) -> Option<String> {
    let before = r.boot_before.as_deref()?;
    let agent = target.agent.as_ref()?;
    let seen = agent.boot_reported_at?;
    let after = NEVER_DOWN_AFTER.max(heartbeat);
    (agent.boot_id.as_deref() == Some(before) && seen >= r.phase_since.after(after)).then(|| {
        format!(
            "{} still ran boot {before} {} after its power-on was verified (a report received then): the power-off and power-on did not take (a BMC that reports power changes and does nothing?)",
            r.target,
            format_duration(seen.since(r.phase_since))
        )
    })
}

fn not_booted_since(r: &Remediation, target: &Host) -> Option<String> {
    let before = r.boot_before.as_deref()?;
    match target.agent.as_ref().and_then(|a| a.boot_id.as_deref()) {
        Some(now) if now != before => None,
        Some(_) => Some(format!("its agent still reports boot {before}")),
        None => Some(format!("its agent reported no boot ID since boot {before}")),
    }
}
