//! Rules about fences: starts, power steps, retirement power-offs, executors and holds.

use metalguard_api::plan::RemediationStep;
use metalguard_api::remediation::{Remediation, RemediationPhase as P};

use super::{Judge, Rule, Verdict};
use crate::quorum::guards_quorum;

impl Judge<'_> {
    /// The executor of a power action on `target`: another host, alive, not held, and (for a
    /// destructive action) not saying it cannot reach the target's BMC.
    pub(super) fn executor_ok(&self, target: &str, executor: &str, destructive: bool) -> Verdict {
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

    pub(super) fn not_held(&self, target: &str) -> Verdict {
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
    pub(super) fn guarded_fence(&mut self, target: &str) -> Verdict {
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
        if self.membership_changes > 0 {
            return Err((
                target.to_owned(),
                Rule::OneControlPlaneRemediation,
                "this plan changes the etcd membership: the fence goes after it".to_owned(),
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

    pub(super) fn short_circuit(&self, target: &str, forced: bool) -> Verdict {
        if forced {
            return Ok(());
        }
        let Some(host) = self.hosts.get(target) else {
            return Ok(());
        };
        match self
            .short_circuits
            .iter()
            .find(|(check, _)| crate::health::selects(&check.selector, host))
        {
            Some((_, sc)) => Err((target.to_owned(), Rule::ShortCircuit, sc.clone())),
            None => Ok(()),
        }
    }

    pub(super) fn start(&mut self, r: &Remediation) -> Verdict {
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

    pub(super) fn step(
        &mut self,
        remediation_id: &str,
        target: &str,
        executor: &str,
        step: &RemediationStep,
    ) -> Verdict {
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
        if !r.may_step_to(&step.resulting_phase()) {
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
                None if r.control_plane => Err((
                    target.to_owned(),
                    Rule::Reprovision,
                    format!("{target} is unknown and its record says control-plane"),
                )),
                Some(h) if guards_quorum(h) || h.externally_provisioned => Err((
                    target.to_owned(),
                    Rule::Reprovision,
                    format!("{target} guards etcd quorum or was provisioned outside metalguard"),
                )),
                _ => Ok(()),
            },
            _ => Ok(()),
        }
    }

    pub(super) fn decommission(&mut self, host: &str, executor: &str) -> Verdict {
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
}
