//! Starting new remediations: candidates, retry accounting, policy and safety gates.

use std::collections::{BTreeMap, HashSet};

use metalguard_api::duration::format_duration;
use metalguard_api::plan::{Action, ActionKind, OperationId, RemediationStep};
use metalguard_api::remediation::{Remediation, RemediationPhase as P, remediation_id};
use metalguard_api::snapshot::{Host, Role};

use super::{ADMIN_CAUSE, Candidate, Planner, RemediationOutput};
use crate::health::{UnhealthyReason, selects};

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
            // Not unhealthy by any check (unhealthy hosts are candidates already): fencing a
            // healthy host is a person's call, made explicit with --force and a reason.
            let unhealthy = by_host.contains_key(h.name.as_str());
            let blocked_by = blocked_by.or_else(|| {
                (!unhealthy).then(|| format!(
                    "{} is healthy by every health check: fencing a healthy host needs --force with a reason",
                    h.name
                ))
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

    pub(super) fn start_new(&mut self, active: &[&Remediation]) {
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
                out.refuse(name, why);
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
                        l.seq.saturating_add(1),
                        l.attempt.saturating_add(1),
                        Some(l.phase_since.after(settings.retry_period)),
                    ),
                    P::Cancelled { .. } => (l.seq.saturating_add(1), l.attempt, None),
                    _ if now < l.phase_since.after(settings.min_healthy_period) => (
                        l.seq.saturating_add(1),
                        l.attempt.saturating_add(1),
                        Some(l.phase_since.after(settings.retry_period)),
                    ),
                    _ => (l.seq.saturating_add(1), 1, None),
                },
            };
            let forced = c.forced.is_some();
            if attempt > settings.max_retry + 1 && !forced {
                let l_failed = latest.filter(|l| matches!(l.phase, P::Failed { .. }));
                let why = format!(
                    "{} attempts failed or did not last {} (maxRetry {})",
                    attempt.saturating_sub(1),
                    format_duration(settings.min_healthy_period),
                    settings.max_retry
                );
                let may_reprovision = settings.allow_reprovision
                    && host.role == Role::Worker
                    && !host.externally_provisioned;
                if let Some(l) = l_failed {
                    let Some(executor) = self.choose_executor(host, Some(&l.executor)) else {
                        refuse(
                            &mut self.out,
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
        view.may_fence(host).map_err(|e| e.to_string())
    }
}
