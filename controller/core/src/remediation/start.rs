//! Starting new remediations: candidates, retry accounting, policy and safety gates.

use std::collections::{BTreeMap, HashSet};

use metalguard_api::duration::format_duration;
use metalguard_api::plan::{Action, ActionKind, OperationId, ReasonKind, RemediationStep};
use metalguard_api::remediation::{Remediation, RemediationPhase as P, remediation_id};
use metalguard_api::snapshot::{Host, Role};

use super::{ADMIN_CAUSE, Candidate, DRILL_CAUSE, Planner, RemediationOutput};
use crate::health::UnhealthyReason;
use crate::judge::record_guards_quorum;
use crate::quorum::quorum;
use crate::seeds;

impl<'a> Planner<'a> {
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
                        stay_off: false,
                        drill: false,
                    });
                if let (None, Some(sc)) = (&c.blocked_by, &v.short_circuit) {
                    c.blocked_by = Some((
                        ReasonKind::ShortCircuit,
                        format!("check {} short-circuited: {sc}", v.check.name),
                    ));
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
            if served {
                continue;
            }
            // Unhealthy already: the request adds only what it asks beyond the check's
            // remediation (leaving the host off); forced, it becomes the candidate below. A
            // drill of an unhealthy host is that host's remediation, not a drill.
            if let Some(c) = by_host.get_mut(h.name.as_str())
                && (req.force_reason.is_none() || req.drill)
            {
                c.stay_off |= req.stay_off && !req.drill;
                continue;
            }
            let who = req.requested_by.as_deref().unwrap_or("an administrator");
            if req.drill {
                // Healthy, which is the point: a drill proves the fence path of a host that
                // does not need it. Every other gate holds (`start_new`).
                by_host.insert(
                    h.name.as_str(),
                    Candidate {
                        host: h,
                        cause: format!("{DRILL_CAUSE} {who}"),
                        since: req.requested_at,
                        forced: None,
                        blocked_by: self
                            .short_circuit_of(h)
                            .map(|sc| (ReasonKind::ShortCircuit, sc)),
                        stay_off: false,
                        drill: true,
                    },
                );
                continue;
            }
            let blocked_by = self
                .short_circuit_of(h)
                .map(|sc| (ReasonKind::ShortCircuit, sc));
            // Not unhealthy by any check (unhealthy hosts are candidates already): fencing a
            // healthy host is a person's call, made explicit with --force and a reason.
            let unhealthy = by_host.contains_key(h.name.as_str());
            let blocked_by = blocked_by.or_else(|| {
                (!unhealthy).then(|| (ReasonKind::Policy, format!(
                    "{} is healthy by every health check: fencing a healthy host needs --force with a reason",
                    h.name
                )))
            });
            by_host.insert(
                h.name.as_str(),
                Candidate {
                    host: h,
                    cause: format!("{ADMIN_CAUSE} {who}"),
                    since: req.requested_at,
                    forced: req.force_reason.clone(),
                    blocked_by,
                    stay_off: req.stay_off,
                    drill: false,
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

    pub(super) fn start_new(&mut self, active: &[&Remediation]) {
        let settings = &self.inp.policy.remediation;
        let now = self.inp.now;
        let busy: HashSet<&str> = active.iter().map(|r| r.target.as_str()).collect();
        let guarded_record =
            |r: &Remediation| record_guards_quorum(r, self.hosts.get(r.target.as_str()).copied());
        // Seed 004: the previous remediation MUST have completed; one that failed and waits
        // for its retry has not (its host may still be off).
        let mut cp_running: Vec<String> = active
            .iter()
            .copied()
            .filter(|r| guarded_record(r))
            .map(|r| r.target.clone())
            .chain(self.control_plane_in_progress.iter().cloned())
            .collect();
        cp_running.sort();
        cp_running.dedup();
        let mut workers_running = active.iter().filter(|r| !guarded_record(r)).count();
        let candidates = self.candidates();
        // What a drill waits for: any host unhealthy, any remediation under way.
        let troubled: Vec<String> = candidates
            .iter()
            .filter(|c| !c.drill)
            .map(|c| c.host.name.clone())
            .chain(active.iter().map(|r| r.target.clone()))
            .chain(cp_running.iter().cloned())
            .collect();
        for c in candidates {
            let host = c.host;
            let name = host.name.as_str();
            if busy.contains(name) {
                continue;
            }
            let refuse = |out: &mut RemediationOutput, kind: ReasonKind, why: String| {
                out.refuse(name, kind, why);
            };
            if c.drill
                && let Some(other) = troubled.iter().find(|o| *o != name)
            {
                refuse(
                    &mut self.out,
                    ReasonKind::Policy,
                    format!(
                        "a fence drill runs only while no host is unhealthy or being remediated ({other} is); ask again later"
                    ),
                );
                continue;
            }
            if let Some(hold) = &host.hold {
                refuse(
                    &mut self.out,
                    ReasonKind::Hold,
                    format!(
                        "held since {} by {} after a break-glass fence ({}); `metalguard-controller release {name}` hands it back",
                        hold.since,
                        metalguard_api::text::escaped(&hold.by),
                        metalguard_api::text::escaped(&hold.reason)
                    ),
                );
                continue;
            }
            if let Some(holder) = &host.lease_held_by {
                // Another actor (Node Maintenance draining it, Node Health Check remediating
                // it) is disrupting the host: a second power actor would be a double fence.
                // Never skipped, forced or not: the person ends the other actor's claim.
                refuse(
                    &mut self.out,
                    ReasonKind::Hold,
                    format!(
                        "its node lease medik8s-leases/node-{name} is held by {}: another actor is disrupting it; nothing starts until the lease is free",
                        metalguard_api::text::escaped(holder)
                    ),
                );
                continue;
            }
            if host.is_deleting() {
                refuse(
                    &mut self.out,
                    ReasonKind::Policy,
                    "the host is being deleted".into(),
                );
                continue;
            }
            let latest = self.latest.get(name).copied();
            let (seq, attempt, wait_until) = match latest {
                None => (1, 1, None),
                Some(l) => match &l.phase {
                    P::NeedsPerson { reason } => {
                        refuse(
                            &mut self.out,
                            ReasonKind::Retry,
                            format!("{} needs a person: {reason}", l.id),
                        );
                        continue;
                    }
                    P::Reprovisioning => {
                        refuse(
                            &mut self.out,
                            ReasonKind::Policy,
                            format!("{} handed the host to the provisioner", l.id),
                        );
                        continue;
                    }
                    P::Failed { .. } => (
                        l.seq.saturating_add(1),
                        l.attempt.saturating_add(1),
                        Some(l.phase_since.after(settings.retry_period)),
                    ),
                    // Cancelled before power was touched: the same attempt, again.
                    P::Cancelled { .. } if l.powered_on_at.is_none() => {
                        (l.seq.saturating_add(1), l.attempt, None)
                    }
                    // Within minHealthyPeriod or retryPeriod of the last one: its retry, never
                    // a fresh start.
                    _ if now
                        < l.phase_since
                            .after(settings.min_healthy_period.max(settings.retry_period)) =>
                    {
                        (
                            l.seq.saturating_add(1),
                            l.attempt.saturating_add(1),
                            Some(l.phase_since.after(settings.retry_period)),
                        )
                    }
                    _ => (l.seq.saturating_add(1), 1, None),
                },
            };
            let forced = c.forced.is_some();
            if attempt > settings.max_retry.saturating_add(1) && !forced {
                let l_failed = latest.filter(|l| matches!(l.phase, P::Failed { .. }));
                let why = format!(
                    "{} attempts failed or did not last {} (maxRetry {})",
                    attempt.saturating_sub(1),
                    format_duration(settings.min_healthy_period),
                    settings.max_retry
                );
                let guarded = Self::guarded(host);
                let may_reprovision =
                    settings.allow_reprovision && !guarded && !host.externally_provisioned;
                if let Some(l) = l_failed {
                    let Ok(executor) = self.choose_executor(host, Some(&l.executor)) else {
                        refuse(
                            &mut self.out,
                            ReasonKind::Retry,
                            format!("{why}; no healthy agent other than the target can record it"),
                        );
                        continue;
                    };
                    let executor = executor.name.clone();
                    if may_reprovision {
                        self.emit(
                            l,
                            &executor,
                            RemediationStep::Reprovision,
                            format!("{name}: {why}: reprovision it"),
                        );
                    } else {
                        let rule = if host.role == Role::ControlPlane {
                            "a control-plane host is never reprovisioned automatically"
                        } else if guarded {
                            "a host with an etcd member is never reprovisioned automatically"
                        } else if host.externally_provisioned {
                            "an externally provisioned host is never reprovisioned automatically"
                        } else {
                            "reprovisioning is not allowed by policy"
                        };
                        // The last failure is what the person has to fix (a rejected
                        // password, an unreachable BMC): say it first.
                        let reason = match &l.phase {
                            P::Failed { reason: last } => {
                                format!("last attempt: {last}; {why}; {rule}")
                            }
                            _ => format!("{why}; {rule}"),
                        };
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
                    refuse(
                        &mut self.out,
                        ReasonKind::Retry,
                        format!("{why}; a person must look at it"),
                    );
                }
                continue;
            }
            if let Some(w) = wait_until
                && now < w
                && !forced
            {
                refuse(
                    &mut self.out,
                    ReasonKind::Retry,
                    format!("attempt {attempt} waits for retryPeriod until {w}"),
                );
                self.out.wake_at(w);
                continue;
            }
            if !forced {
                if let Some((kind, b)) = &c.blocked_by {
                    refuse(&mut self.out, *kind, b.clone());
                    continue;
                }
                if !Self::guarded(host) && workers_running >= settings.max_concurrent as usize {
                    refuse(
                        &mut self.out,
                        ReasonKind::Concurrency,
                        format!(
                            "{workers_running} worker remediations running, maxConcurrent {}",
                            settings.max_concurrent
                        ),
                    );
                    continue;
                }
            }
            if !host.bmc_configured {
                refuse(
                    &mut self.out,
                    ReasonKind::Policy,
                    "no BMC is configured for it".into(),
                );
                continue;
            }
            let guarded = Self::guarded(host);
            let mut quorum_note: Option<String> = None;
            if guarded {
                if let Some(other) = cp_running.iter().find(|o| *o != name) {
                    refuse(
                        &mut self.out,
                        ReasonKind::ControlPlaneBusy,
                        format!(
                            "one control-plane remediation at a time ({other}'s is in progress or awaits its retry)"
                        ),
                    );
                    continue;
                }
                match self.control_plane_gate(host) {
                    Ok(why) => quorum_note = Some(why),
                    Err((kind, e)) => {
                        refuse(&mut self.out, kind, e);
                        continue;
                    }
                }
            }
            let executor = match self.choose_executor(host, None) {
                Ok(e) => e,
                Err(why) => {
                    refuse(&mut self.out, ReasonKind::Executor, why);
                    continue;
                }
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
                control_plane: guarded,
                cause: c.cause.clone(),
                forced: c.forced.clone(),
                cancel_requested: None,
                backup: None,
                powered_on_at: None,
                stay_off: c.stay_off,
                boot_before: host.agent.as_ref().and_then(|a| a.boot_id.clone()),
            };
            let mut reason = format!(
                "{name}: {}; attempt {attempt}; executor {}",
                c.cause, executor.name
            );
            if let Some(note) = quorum_note.filter(|n| !n.is_empty()) {
                reason = format!("{reason}; {note}");
            }
            if let Some(f) = &c.forced {
                reason = format!("{reason}; FORCED past policy gates: {f}");
            }
            if c.stay_off {
                reason = format!("{reason}; power off and leave off");
            }
            if c.drill {
                reason = format!("{reason}; a fence drill: a real power cycle of a healthy host");
            }
            if guarded {
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

    /// KCP and quorum rules for starting a control-plane remediation. Admitted, it says why
    /// the fence costs no quorum, with the seed (empty for a host without a voter).
    fn control_plane_gate(&self, host: &Host) -> Result<String, (ReasonKind, String)> {
        let view = self.inp.view;
        let busy = |why: String| Err((ReasonKind::ControlPlaneBusy, why));
        if self.inp.control_plane_degraded {
            return Err((ReasonKind::Degraded, "the control plane is degraded".into()));
        }
        if view.control_plane.len() < 2 {
            return Err((
                ReasonKind::Policy,
                "a control plane needs at least two hosts to be remediated".into(),
            ));
        }
        if self.inp.membership_change_planned || view.membership_in_flux() {
            return busy(
                "an etcd membership change or control-plane deletion is in progress".into(),
            );
        }
        if let Some(h) = view
            .control_plane
            .iter()
            .find(|h| h.name != host.name && h.etcd.is_none())
        {
            return busy(format!(
                "control-plane host {} is still provisioning",
                h.name
            ));
        }
        view.may_fence(host).map_err(|e| {
            (
                ReasonKind::Quorum,
                format!("{e} ({})", seeds::REMEDIATION_PRESERVES_QUORUM),
            )
        })?;
        let (healthy, voters) = (view.healthy_voter_count(), view.voter_count());
        Ok(
            match view.member_of(&host.name).filter(|m| m.member.is_voter()) {
                // Seed 004 scenario 2: the machine whose member is the one unhealthy member
                // goes; its fence takes nothing from quorum.
                Some(m) if !m.member.healthy => format!(
                    "its etcd member is already lost, so fencing it costs no quorum ({healthy} of {voters} voters stay healthy, quorum {}; {})",
                    quorum(voters),
                    seeds::REMEDIATION_SCENARIO_2
                ),
                Some(_) => format!(
                    "fencing it leaves {} of {voters} voters healthy, quorum {} ({})",
                    healthy.saturating_sub(1),
                    quorum(voters),
                    seeds::REMEDIATION_PRESERVES_QUORUM
                ),
                None => String::new(),
            },
        )
    }
}
