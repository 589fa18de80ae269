//! The lab's scenarios. Each starts from a healthy lab, narrates into the lab's timeline,
//! checks its expected outcome, and leaves the lab healthy again where it can.

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::Lab;
use crate::{HarnessError, Result};

mod replace;
pub use replace::{ReplaceOutcome, observe_replace, replace};

mod partition;
pub use partition::{MajorityWrites, PartitionOutcome, observe_partition, partition};

mod break_glass;
pub use break_glass::{BreakGlassOutcome, break_glass, observe_break_glass};

mod locked_account;
pub use locked_account::locked_account;

/// Slack on top of the configured timeouts: report and plan periods, a fence with its
/// verifying reads, and the time a host needs to boot (etcd rejoins, the agent reports).
/// The measured figures are in docs/benchmarks.md.
pub const OVERHEAD: Duration = Duration::from_secs(15);

/// What a scenario saw.
#[derive(Debug, Clone)]
pub struct Report {
    /// Scenario name.
    pub name: &'static str,
    /// The outcome it expects.
    pub expected: String,
    /// What happened.
    pub seen: String,
    /// Whether the outcome matched.
    pub ok: bool,
    /// How long it ran.
    pub took: Duration,
    /// Phase timings worth recording (name, time since the failure).
    pub timings: Vec<(String, Duration)>,
}

/// Every scenario name, in demo order.
pub const ALL: [&str; 5] = [
    "hang",
    "double-failure",
    "admin-fence",
    "bad-bmc",
    "replace",
];

/// Runs a scenario by name.
pub fn run(lab: &mut Lab, name: &str) -> Result<Report> {
    match name {
        "hang" => hang(lab, 0),
        "partition" => partition(lab, 0),
        "double-failure" => double_failure(lab),
        "admin-fence" => admin_fence(lab),
        "bad-bmc" => bad_bmc(lab),
        "swapped-bmc" => swapped_bmc(lab),
        "rotate-credentials" => rotate_credentials(lab),
        "locked-account" => locked_account(lab),
        "drill" => drill(lab),
        "node-lease" => node_lease(lab),
        "controller-crash" => controller_crash(lab),
        "replace" => replace(lab),
        "break-glass" => break_glass(lab),
        other => Err(HarnessError::Other(format!(
            "unknown scenario {other} (one of {}, controller-crash, partition, break-glass, swapped-bmc, rotate-credentials, locked-account, drill, node-lease)",
            ALL.join(", ")
        ))),
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The host whose operations executed the fence of `target`, from the last status.
fn fence_executor(lab: &Lab, target: &str) -> Option<String> {
    lab.last_status()?["operations"]
        .as_array()?
        .iter()
        .find(|op| op["kind"]["type"] == "fence" && op["kind"]["target"] == target)
        .and_then(|op| op["agent"].as_str().map(str::to_owned))
}

/// `hang`: freeze a host → its peers see it gone → the guard allows fencing it → another
/// host's agent powers it off → verified → on again → healthy.
pub fn hang(lab: &mut Lab, target: usize) -> Result<Report> {
    lab.new_scenario();
    let name = lab.hosts()[target].name.clone();
    let t = lab.options().timings.clone();
    let data = lab.write_data("/lab/hang", 20)?;
    lab.timeline
        .add("lab", "wrote 20 keys to etcd", "checked after recovery");
    let since = unix_ms();
    let started = Instant::now();
    lab.freeze(target)?;
    let detect = t.heartbeat_timeout.max(t.unhealthy_timeout);
    let budget = detect + OVERHEAD + lab.frozen_member_stall();
    let fenced = lab.wait_for(&format!("{name} to be powered off"), budget, |lab| {
        Ok(lab.power_offs_since(target, since)? > 0)
    })?;
    let Recovery {
        fenced,
        healthy,
        offs,
        others,
    } = recover(lab, target, since, started, fenced)?;
    let missing = lab.check_data(&data)?;
    let executor = fence_executor(lab, &name).unwrap_or_else(|| "?".into());
    let node = node_outcome(lab, &name)?;
    let ok = offs == 1
        && others.is_empty()
        && missing.is_empty()
        && executor != name
        && node.as_ref().is_none_or(NodeOutcome::ok);
    Ok(Report {
        name: "hang",
        expected: format!(
            "{name} fenced once by another host's agent within {}s, healthy again, no data lost{}",
            budget.as_secs(),
            if node.is_some() {
                "; its Node NotReady, deleted, back with its labels"
            } else {
                ""
            }
        ),
        seen: format!(
            "fenced by agent {executor} after {:.1}s ({offs} power-off), healthy after {:.1}s, \
             other hosts' power events {}, {} of {} keys missing{}",
            fenced.as_secs_f64(),
            healthy.as_secs_f64(),
            others.len(),
            missing.len(),
            data.len(),
            node.map(|n| format!("; {n}")).unwrap_or_default()
        ),
        ok,
        took: started.elapsed(),
        timings: vec![
            ("failure → verified off".into(), fenced),
            ("failure → healthy".into(), healthy),
        ],
    })
}

/// What happened to a fenced host's Node (Kubernetes mode), from the timeline and the API.
#[derive(Debug, Clone)]
pub struct NodeOutcome {
    /// The Node went `Ready=Unknown` or `False` (the kubelet stopped).
    pub not_ready: bool,
    /// The Node was deleted (the check's `nodeAction: Delete`).
    pub deleted: bool,
    /// The lab's zone label, which no kubelet sets, is on the Node now.
    pub labels_back: bool,
}

impl NodeOutcome {
    /// NotReady, deleted and back with its labels.
    pub fn ok(&self) -> bool {
        self.not_ready && self.deleted && self.labels_back
    }
}

impl std::fmt::Display for NodeOutcome {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "Node NotReady: {}, deleted: {}, back with its labels: {}",
            self.not_ready, self.deleted, self.labels_back
        )
    }
}

/// In Kubernetes mode, what the timeline and the API server say of Node `name` in this
/// scenario; `None` in standalone mode.
fn node_outcome(lab: &Lab, name: &str) -> Result<Option<NodeOutcome>> {
    let Some(kube) = lab.kube() else {
        return Ok(None);
    };
    let told = |what: &str| lab.timeline.find("kubernetes", what).is_some();
    let labels = kube.node_labels_now(name)?.unwrap_or_default();
    Ok(Some(NodeOutcome {
        not_ready: told(&format!("Node {name} Ready=Unknown"))
            || told(&format!("Node {name} Ready=False")),
        deleted: told(&format!("Node {name} is gone")),
        labels_back: labels.get(super::kube::ZONE_LABEL)
            == Some(&super::KubeSide::zone_label(name)),
    }))
}

/// What a fenced host's recovery showed.
pub(super) struct Recovery {
    /// Failure → the power-off, by the BMC's own record.
    pub fenced: Duration,
    /// Failure → the host healthy again with no remediation active.
    pub healthy: Duration,
    /// Power-offs of the target since the failure.
    pub offs: usize,
    /// Power events of every other host since the failure.
    pub others: Vec<(String, String)>,
}

/// Once a power-off of `target` was seen `waited` after the failure (at `since`, Unix ms;
/// `started`, the same moment): waits for the host to be healthy again and collects what the
/// BMCs recorded.
pub(super) fn recover(
    lab: &mut Lab,
    target: usize,
    since: u64,
    started: Instant,
    waited: Duration,
) -> Result<Recovery> {
    let name = lab.hosts()[target].name.clone();
    let fenced = lab.hosts()[target]
        .power_log()?
        .iter()
        .find(|e| e.at_ms >= since && e.is_off())
        .map_or(waited, |e| Duration::from_millis(e.at_ms - since));
    let healthy = lab.wait_for(
        &format!("{name} to be healthy again"),
        Duration::from_secs(60),
        |lab| {
            Ok(lab.host_healthy(target)
                && lab.active_remediations().is_empty()
                && lab.hosts()[target].bmc_power_on()?)
        },
    )?;
    let healthy = started.elapsed().min(waited + healthy);
    lab.timeline
        .add("lab", format!("{name} is healthy again"), "");
    let offs = lab.power_offs_since(target, since)?;
    let others = lab
        .power_events_since(since)?
        .into_iter()
        .filter(|(h, _)| *h != name)
        .collect();
    Ok(Recovery {
        fenced,
        healthy,
        offs,
        others,
    })
}

/// `double-failure`: two of three hosts hang at once → nothing is fenced; the controller
/// and `status` say why.
pub fn double_failure(lab: &mut Lab) -> Result<Report> {
    lab.new_scenario();
    let started = Instant::now();
    let since = unix_ms();
    let t = lab.options().timings.clone();
    let targets = [0usize, 1];
    for &i in &targets {
        lab.freeze(i)?;
    }
    let window = t.heartbeat_timeout.max(t.unhealthy_timeout) + OVERHEAD;
    lab.timeline.add(
        "lab",
        format!("watching for {}s", window.as_secs()),
        "a fence now would be wrong: it cannot restore quorum",
    );
    lab.idle(window)?;
    // Without etcd's quorum the API server cannot serve: no Lease, no status, no decision.
    // Its own readiness checks say why.
    let why = if let Some(kube) = lab.kube() {
        let failing = kube.failing_readyz_checks();
        if failing.iter().any(|c| c.starts_with("etcd")) {
            format!(
                "the API server is not ready, failing checks: {}",
                failing.join(", ")
            )
        } else {
            String::new()
        }
    } else {
        let status_text = match lab.controller_cli(&["status"]) {
            Ok(text) => text,
            Err(e) => e.to_string(),
        };
        status_text
            .lines()
            .find(|l| l.contains("fences nothing") || l.contains("short-circuit"))
            .unwrap_or("")
            .trim()
            .to_owned()
    };
    lab.timeline.add("status", "says", why.clone());
    let events = lab.power_events_since(since)?;
    for &i in &targets {
        lab.thaw(i)?;
    }
    let recovery = Duration::from_secs(90) + lab.frozen_member_stall();
    lab.wait_all_healthy(recovery)?;
    lab.timeline
        .add("lab", "both hosts resumed; every host healthy", "");
    let ok = events.is_empty() && !why.is_empty();
    Ok(Report {
        name: "double-failure",
        expected: "nothing fenced; status says why".into(),
        seen: format!(
            "{} power events in {}s; status: {}",
            events.len(),
            window.as_secs(),
            if why.is_empty() {
                "(no reason shown)"
            } else {
                &why
            }
        ),
        ok,
        took: started.elapsed(),
        timings: Vec::new(),
    })
}

/// Waits, with the budget of every attempt and retry, until host `name`'s remediation needs a
/// person; returns its reason and how long that took.
fn wait_needs_person(lab: &mut Lab, name: &str) -> Result<(String, Duration)> {
    let t = lab.options().timings.clone();
    let budget = t.heartbeat_timeout.max(t.unhealthy_timeout)
        + (t.retry_period + Duration::from_secs(10)) * (t.max_retry + 1)
        + OVERHEAD
        + lab.frozen_member_stall();
    let mut reason = String::new();
    let waited = lab.wait_for(&format!("{name} to need a person"), budget, |lab| {
        let Some(status) = lab.last_status() else {
            return Ok(false);
        };
        let found = status["remediations"].as_array().and_then(|l| {
            l.iter()
                .find(|r| r["target"] == name && r["phase"]["phase"] == "needs-person")
        });
        if let Some(r) = found {
            r["phase"]["reason"]
                .as_str()
                .unwrap_or_default()
                .clone_into(&mut reason);
            return Ok(true);
        }
        Ok(false)
    })?;
    Ok((reason, waited))
}

/// `bad-bmc`: someone changes the password of a host's BMC and the controller is not told →
/// `status` says a fence of it would fail (`credentials-refused`, from the read-only check of
/// the agent that would fence it) while the host is still healthy → the host hangs →
/// remediation fails after its retries → the host needs a person, with the reason; nothing
/// else is touched.
pub fn bad_bmc(lab: &mut Lab) -> Result<Report> {
    lab.new_scenario();
    let started = Instant::now();
    let since = unix_ms();
    // The last host in service (a spare on standby is not in the inventory): a Redfish BMC.
    let target = lab.in_service().last().copied().unwrap_or(0);
    let name = lab.hosts()[target].name.clone();
    lab.change_bmc_password(target, &format!("changed-{}", unix_ms() % 100_000))?;
    // Known before it is needed: within the controller's re-read of the credentials (10 s)
    // and one check period, with the host healthy.
    let refused = |lab: &mut Lab| {
        Ok(lab
            .last_status()
            .is_some_and(|s| s["fencing"][&name]["failure"] == "credentials-refused"))
    };
    let noticed = lab.wait_for(
        &format!("status to say a fence of {name} would fail"),
        Duration::from_secs(10) + lab.options().timings.bmc_check_period * 3,
        refused,
    )?;
    let healthy_meanwhile = lab.host_healthy(target);
    lab.timeline.add(
        "lab",
        format!("status: a fence of {name} would fail (credentials-refused), {noticed:.1?} after the password changed"),
        "the would-be executor's read-only check",
    );
    // Kubernetes mode: mirrored onto the host's Node, with its agent's conditions.
    let node_condition = if lab.kube().is_some() {
        let node_path = format!("/api/v1/nodes/{name}");
        let seen = lab.wait_for(
            &format!("{name}'s Node to say MetalguardFencingReady=False"),
            Duration::from_secs(30),
            |lab| {
                Ok(lab.kube().is_some_and(|k| {
                    k.cluster().admin().get(&node_path).is_ok_and(|node| {
                        node["status"]["conditions"].as_array().is_some_and(|cs| {
                            cs.iter().any(|c| {
                                c["type"] == "MetalguardFencingReady"
                                    && c["status"] == "False"
                                    && c["reason"] == "CredentialsRefused"
                            })
                        })
                    })
                }))
            },
        );
        format!(
            "; Node MetalguardFencingReady=False (CredentialsRefused): {}",
            seen.is_ok()
        )
    } else {
        String::new()
    };
    lab.freeze(target)?;
    let (reason, waited) = wait_needs_person(lab, &name)?;
    let events = lab.power_events_since(since)?;
    // The person: thaw the host and give the controller the new password.
    lab.thaw(target)?;
    lab.set_known_password(target, None)?;
    let ok = events.is_empty()
        && !reason.is_empty()
        && healthy_meanwhile
        && !node_condition.ends_with("false");
    Ok(Report {
        name: "bad-bmc",
        expected: format!(
            "a fence of {name} reported as one that would fail while it is healthy; then it ends in needs-a-person with the reason; no power change anywhere"
        ),
        seen: format!(
            "not ready (credentials-refused) after {:.1}s, healthy meanwhile: {healthy_meanwhile}{node_condition}; needs-a-person after {:.1}s: {reason}; {} power events",
            noticed.as_secs_f64(),
            waited.as_secs_f64(),
            events.len()
        ),
        ok,
        took: started.elapsed(),
        timings: Vec::new(),
    })
}

/// `swapped-bmc`: the inventory gives two hosts each other's BMC (address and valid
/// credentials: a copied line) → `status` says the BMC answers for another machine, from the
/// would-be executor's read-only check, while the host is healthy → one of them hangs → the
/// executing agent reads the identity of the system behind the BMC it was given, finds the
/// other host, and refuses; the
/// remediation ends with a person, with both identities in the reason, and no host's power
/// changes (the healthy one behind that BMC least of all).
pub fn swapped_bmc(lab: &mut Lab) -> Result<Report> {
    lab.new_scenario();
    let started = Instant::now();
    let since = unix_ms();
    let serving = lab.in_service();
    let target = serving.last().copied().unwrap_or(0);
    let other = serving.first().copied().unwrap_or(0);
    let name = lab.hosts()[target].name.clone();
    lab.swap_bmcs(target, other, true)?;
    // Known before it is needed: the agent that would fence the host reads the identity
    // behind the BMC it was given in its read-only check, with the host healthy.
    let mismatch = |lab: &mut Lab| {
        Ok(lab
            .last_status()
            .is_some_and(|s| s["fencing"][&name]["failure"] == "identity-mismatch"))
    };
    let noticed = lab.wait_for(
        &format!("status to say {name}'s BMC answers for another machine"),
        Duration::from_secs(10) + lab.options().timings.bmc_check_period * 3,
        mismatch,
    )?;
    let healthy_meanwhile = lab.host_healthy(target);
    lab.freeze(target)?;
    let (reason, waited) = wait_needs_person(lab, &name)?;
    let events = lab.power_events_since(since)?;
    // The person: fix the inventory and thaw the host.
    lab.swap_bmcs(target, other, false)?;
    lab.thaw(target)?;
    let (uuid_target, _) = lab.hosts()[target].bmc_identity();
    let (uuid_other, _) = lab.hosts()[other].bmc_identity();
    let names_both = [uuid_target, uuid_other]
        .iter()
        .all(|u| u.as_deref().is_some_and(|u| reason.contains(u)));
    let ok = events.is_empty() && names_both && healthy_meanwhile;
    Ok(Report {
        name: "swapped-bmc",
        expected: format!(
            "status says {name}'s BMC answers for another machine while it is healthy; then it ends in needs-a-person with both identities in the reason; no power change anywhere"
        ),
        seen: format!(
            "not ready (identity-mismatch) after {:.1}s, healthy meanwhile: {healthy_meanwhile}; needs-a-person after {:.1}s: {reason}; {} power events",
            noticed.as_secs_f64(),
            waited.as_secs_f64(),
            events.len()
        ),
        ok,
        took: started.elapsed(),
        timings: Vec::new(),
    })
}

/// `rotate-credentials`: the password of a host's BMC is rotated the safe way round and
/// checked at every step. The controller is given the new password first (the BMC still
/// takes the old one) → `status` says the rotation's new credentials are refused, while
/// fences keep the old ones: the host hangs and is fenced and recovered with them. Then the
/// BMC's password is changed → the would-be executor's check with the new credentials passes
/// and they are in use: the host hangs again and is fenced and recovered with them.
pub fn rotate_credentials(lab: &mut Lab) -> Result<Report> {
    let started = Instant::now();
    let target = lab.in_service().last().copied().unwrap_or(0);
    let name = lab.hosts()[target].name.clone();
    let budget = Duration::from_secs(10) + lab.options().timings.bmc_check_period * 3;
    let new = format!("rotated-{}", unix_ms() % 100_000);
    lab.new_scenario();
    lab.set_known_password(target, Some(&new))?;
    let refused_new = |lab: &mut Lab| {
        Ok(lab.last_status().is_some_and(|s| {
            let f = &s["fencing"][&name];
            f["failure"] == "credentials-refused"
                && f["detail"]
                    .as_str()
                    .is_some_and(|d| d.contains("with the rotation's new credentials"))
        }))
    };
    let pending = lab.wait_for(
        &format!("status to say the new credentials of {name}'s BMC are refused"),
        budget,
        refused_new,
    )?;
    let with_old = hang(lab, target)?;
    lab.change_bmc_password(target, &new)?;
    // The person then confirms at once, as the runbook says: the agent's own checks of the
    // candidate back off after each refusal (period × 2^n, sparing the BMC's lockout
    // counter), so how soon they try again depends on how long the first fence took; a
    // person's check passes the backoff once, within a period of the agent's last login.
    let changed = Instant::now();
    let period = lab.options().timings.bmc_check_period;
    let (confirmed, answer) = lab.check_bmc_cli(&name, period * 2 + Duration::from_secs(10))?;
    let answered = changed.elapsed();
    lab.timeline.add(
        "admin",
        format!("metalguard-controller check-bmc {name} (after the BMC's change)"),
        locked_account::last_line(&answer),
    );
    if !confirmed {
        return Err(HarnessError::Other(format!(
            "check-bmc {name} failed after the BMC took the new password:\n{answer}"
        )));
    }
    let ready = |lab: &mut Lab| {
        Ok(lab
            .last_status()
            .is_some_and(|s| s["fencing"][&name]["state"] == "ready"))
    };
    lab.wait_for(
        &format!("status to say a fence of {name} would work with the new credentials"),
        Duration::from_secs(15),
        ready,
    )?;
    let rotated = changed.elapsed();
    let with_new = hang(lab, target)?;
    Ok(Report {
        name: "rotate-credentials",
        expected: format!(
            "new credentials for {name}'s BMC reported refused while the BMC still takes the old ones, and a fence then works with the old ones; once the BMC takes the new ones, ready again and a fence works with them"
        ),
        seen: format!(
            "new credentials refused after {:.1}s; fence with the old ones: {}; check-bmc passed {:.1}s after the BMC's change, ready in {:.1}s; fence with the new ones: {}",
            pending.as_secs_f64(),
            with_old.seen,
            answered.as_secs_f64(),
            rotated.as_secs_f64(),
            with_new.seen
        ),
        ok: with_old.ok && with_new.ok,
        took: started.elapsed(),
        timings: vec![
            ("rotation → new credentials refused".into(), pending),
            ("bmc changed → check-bmc passed".into(), answered),
            ("bmc changed → ready".into(), rotated),
        ],
    })
}

/// The line of a `fence` or `drill` command's output that gives the verdict.
fn verdict_line(out: &str) -> String {
    out.lines()
        .find(|l| l.contains("verdict"))
        .unwrap_or("")
        .trim()
        .to_owned()
}

/// `admin-fence`: an admin fences a healthy host → the verdict is shown (refused: it is
/// healthy); with `--force` and a reason it proceeds, is recorded, and the host comes back.
pub fn admin_fence(lab: &mut Lab) -> Result<Report> {
    lab.new_scenario();
    let started = Instant::now();
    let since = unix_ms();
    let serving = lab.in_service();
    let target = serving[1.min(serving.len() - 1)];
    let name = lab.hosts()[target].name.clone();
    let out = lab.fence_cli(&[&name, "--reason", "lab: suspected memory errors"])?;
    let verdict = verdict_line(&out);
    lab.timeline.add(
        "admin",
        format!("metalguard-controller fence {name}"),
        verdict.clone(),
    );
    lab.idle(Duration::from_secs(3))?;
    let unforced_offs = lab.power_offs_since(target, since)?;
    let out = lab.fence_cli(&[
        &name,
        "--force",
        "--reason",
        "lab: suspected memory errors, checked by a person",
    ])?;
    let forced_verdict = verdict_line(&out);
    lab.timeline.add(
        "admin",
        format!("metalguard-controller fence {name} --force"),
        forced_verdict.clone(),
    );
    let fenced = lab.wait_for(
        &format!("{name} to be powered off"),
        Duration::from_secs(30),
        |lab| Ok(lab.power_offs_since(target, since)? > 0),
    )?;
    lab.wait_all_healthy(Duration::from_secs(60))?;
    let recorded = lab
        .last_status()
        .and_then(|s| s["remediations"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .any(|r| r["target"] == name.as_str() && r["forced"].as_str().is_some());
    let offs = lab.power_offs_since(target, since)?;
    let ok = unforced_offs == 0 && offs == 1 && recorded && verdict.contains("refused");
    Ok(Report {
        name: "admin-fence",
        expected: "unforced: refused with the guard's verdict; forced: fenced once, recorded"
            .into(),
        seen: format!(
            "unforced: {verdict:?}, {unforced_offs} power-off; forced: off after {:.1}s, \
             {offs} power-off in all, recorded as forced: {recorded}",
            fenced.as_secs_f64()
        ),
        ok,
        took: started.elapsed(),
        timings: Vec::new(),
    })
}

/// `drill`: an operator runs a fence drill of a healthy host (`metalguard-controller drill`)
/// → the quorum guard allows it, the host is power-cycled once through the fence path by
/// another host's agent and comes back healthy; the remediation is recorded as a drill (its
/// refusals, while another host is unhealthy or the quorum guard says no, are unit tests of
/// the core).
pub fn drill(lab: &mut Lab) -> Result<Report> {
    lab.new_scenario();
    let started = Instant::now();
    let since = unix_ms();
    let serving = lab.in_service();
    let target = serving[1.min(serving.len() - 1)];
    let name = lab.hosts()[target].name.clone();
    let out = lab.drill_cli(&[&name, "--reason", "lab: the monthly fence drill"])?;
    let verdict = verdict_line(&out);
    lab.timeline.add(
        "admin",
        format!("metalguard-controller drill {name}"),
        verdict.clone(),
    );
    let fenced = lab.wait_for(
        &format!("{name} to be powered off by the drill"),
        Duration::from_secs(30),
        |lab| Ok(lab.power_offs_since(target, since)? > 0),
    )?;
    lab.wait_all_healthy(Duration::from_secs(60) + lab.frozen_member_stall())?;
    let recorded = lab
        .last_status()
        .and_then(|s| s["remediations"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .any(|r| {
            r["target"] == name.as_str()
                && r["cause"]
                    .as_str()
                    .is_some_and(|c| c.starts_with("fence drill requested by"))
        });
    let offs = lab.power_offs_since(target, since)?;
    let others: usize = serving
        .iter()
        .filter(|&&i| i != target)
        .map(|&i| lab.power_offs_since(i, since))
        .sum::<Result<usize>>()?;
    Ok(Report {
        name: "drill",
        expected: format!(
            "{name} power-cycled once by the drill, healthy again, recorded as a drill; no other host touched"
        ),
        seen: format!(
            "{verdict:?}; off after {:.1}s, {offs} power-off of {name}, {others} of other hosts, recorded as a drill: {recorded}",
            fenced.as_secs_f64()
        ),
        // Standalone prints the decision computed from the store, Kubernetes the leader's.
        ok: offs == 1
            && others == 0
            && recorded
            && (verdict.contains("proceeds") || verdict.contains("accepted")),
        took: started.elapsed(),
        timings: vec![("drill asked → verified off".into(), fenced)],
    })
}

/// `node-lease` (Kubernetes mode): another actor (Node Maintenance) holds a host's node lease
/// `medik8s-leases/node-<name>` → the host hangs and is not fenced, and `status` says who
/// holds the lease → the other actor lets go (deletes it) → metalguard takes the lease
/// (holder `metalguard`), fences the host once and brings it back → the lease is released.
pub fn node_lease(lab: &mut Lab) -> Result<Report> {
    lab.new_scenario();
    let started = Instant::now();
    let since = unix_ms();
    let target = lab.in_service().last().copied().unwrap_or(0);
    let name = lab.hosts()[target].name.clone();
    let Some(kube) = lab.kube() else {
        return Err(HarnessError::Other(
            "node-lease needs the Kubernetes backend (--kubernetes)".into(),
        ));
    };
    let admin = kube.cluster().admin();
    let leases = "/apis/coordination.k8s.io/v1/namespaces/medik8s-leases/leases";
    let lease_path = format!("{leases}/node-{name}");
    let now = crate::kube::time::rfc3339_micros(SystemTime::now());
    admin.create(
        leases,
        &serde_json::json!({
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": {"name": format!("node-{name}")},
            "spec": {
                "holderIdentity": "node-maintenance",
                "leaseDurationSeconds": 3600,
                "acquireTime": now,
                "renewTime": now,
            }
        }),
    )?;
    lab.timeline.add(
        "lab",
        format!("node-maintenance takes the node lease medik8s-leases/node-{name}"),
        "another actor is disrupting the host",
    );
    lab.freeze(target)?;
    let t = lab.options().timings.clone();
    let detect = t.heartbeat_timeout.max(t.unhealthy_timeout) + lab.frozen_member_stall();
    let refused = lab.wait_for(
        &format!("status to say {name}'s node lease is held by node-maintenance"),
        detect + Duration::from_secs(30),
        |lab| {
            // This backend tells the planner's refusals as Events (its status has no plan).
            Ok(lab.kube().is_some_and(|k| {
                k.refusals_of(&name).is_ok_and(|notes| {
                    notes
                        .iter()
                        .any(|n| n.contains("is held by node-maintenance"))
                })
            }))
        },
    )?;
    // Several rounds with the host hung and its lease held: no power change.
    lab.idle(Duration::from_secs(5))?;
    let offs_while_held = lab.power_offs_since(target, since)?;
    let Some(kube) = lab.kube() else {
        return Err(HarnessError::Other("the lab lost its cluster".into()));
    };
    kube.cluster().admin().delete(&lease_path)?;
    lab.timeline.add(
        "lab",
        format!("node-maintenance lets go: the node lease of {name} is deleted"),
        "",
    );
    let fenced = lab.wait_for(
        &format!("{name} to be powered off once its lease is free"),
        Duration::from_secs(60),
        |lab| Ok(lab.power_offs_since(target, since)? > 0),
    )?;
    let holder_during = lab.kube().and_then(|k| {
        k.cluster()
            .admin()
            .get_opt(&lease_path)
            .ok()
            .flatten()
            .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
    });
    lab.timeline.add(
        "lab",
        format!(
            "the node lease of {name} is held by {}",
            holder_during.as_deref().unwrap_or("nobody")
        ),
        "",
    );
    lab.thaw(target)?;
    lab.wait_all_healthy(Duration::from_secs(120) + lab.frozen_member_stall())?;
    let released = lab.wait_for(
        &format!("the node lease of {name} to be released"),
        Duration::from_secs(60),
        |lab| {
            Ok(lab.kube().is_some_and(|k| {
                k.cluster()
                    .admin()
                    .get_opt(&lease_path)
                    .is_ok_and(|l| l.is_none())
            }))
        },
    );
    let offs = lab.power_offs_since(target, since)?;
    let ok = offs_while_held == 0
        && offs == 1
        && holder_during.as_deref() == Some("metalguard")
        && released.is_ok();
    Ok(Report {
        name: "node-lease",
        expected: format!(
            "{name} hung with its node lease held by node-maintenance: not fenced, status says who holds it; once free: metalguard takes the lease, fences once, releases it after the recovery"
        ),
        seen: format!(
            "refusal seen after {:.1}s, {offs_while_held} power-off while held; off {:.1}s after the lease was freed, lease holder then {holder_during:?}; {offs} power-off in all; released: {}",
            refused.as_secs_f64(),
            fenced.as_secs_f64(),
            released.is_ok()
        ),
        ok,
        took: started.elapsed(),
        timings: Vec::new(),
    })
}

/// The phase of the newest remediation of `target` in the last status, if any.
fn remediation_phase(lab: &Lab, target: &str) -> Option<(String, String)> {
    lab.remediations()
        .into_iter()
        .filter(|(_, t, _)| t == target)
        .max_by_key(|(id, _, _)| {
            id.rsplit('/')
                .next()
                .and_then(|n| n.parse::<u64>().ok())
                .unwrap_or(0)
        })
        .map(|(id, _, phase)| (id, phase))
}

/// `controller-crash`: a host hangs; the controller is killed (SIGKILL) while its power-off
/// is in flight (intent persisted and sent, result not yet received: the lab's Redfish BMCs
/// take seconds to change power, see [`super::LabOptions::redfish_power_delay`]), and again
/// once the power-off is verified; each new controller takes the lease over and finishes the
/// same remediation: one power-off, one power-on, one remediation, no data lost.
pub fn controller_crash(lab: &mut Lab) -> Result<Report> {
    lab.new_scenario();
    if !lab.options().redfish_power_delay {
        return Err(HarnessError::Other(
            "controller-crash needs a lab whose Redfish BMCs take time to change power \
             (LabOptions::redfish_power_delay)"
                .into(),
        ));
    }
    let target = lab
        .hosts()
        .iter()
        .rposition(|h| h.bmc_kind() == super::BmcKind::Redfish && h.in_service())
        .ok_or_else(|| HarnessError::Other("the lab has no Redfish host".into()))?;
    let name = lab.hosts()[target].name.clone();
    let t = lab.options().timings.clone();
    let data = lab.write_data("/lab/controller-crash", 20)?;
    let since = unix_ms();
    let started = Instant::now();
    lab.freeze(target)?;
    let detect = t.heartbeat_timeout.max(t.unhealthy_timeout);
    // First crash: the power-off is persisted and sent; the BMC is still changing power.
    let sent = format!("sends power off of {name}");
    lab.wait_for(
        &format!("the controller to send the power-off of {name}"),
        detect + OVERHEAD + lab.frozen_member_stall(),
        |lab| Ok(lab.timeline.find("controller", &sent).is_some()),
    )?;
    let offs_at_kill = lab.power_offs_since(target, since)?;
    let first_phase = remediation_phase(lab, &name).map_or_else(|| "?".to_owned(), |p| p.1);
    lab.timeline.add(
        "lab",
        format!(
            "the power-off of {name} is in flight ({offs_at_kill} power-off at the BMC so far)"
        ),
        "crash the controller now",
    );
    lab.kill_controller();
    lab.idle(Duration::from_secs(1))?;
    lab.start_controller()?;
    // Second crash: after the verified power-off, before the host is back.
    lab.wait_for(
        &format!("{name} to be powered off"),
        lab.leader_lease() + detect + OVERHEAD + lab.frozen_member_stall(),
        |lab| Ok(lab.power_offs_since(target, since)? > 0),
    )?;
    let mut second_phase = String::new();
    if let Some((_, phase)) = remediation_phase(lab, &name) {
        second_phase = phase;
    }
    lab.timeline.add(
        "lab",
        format!("{name} is off; the remediation is at {second_phase}"),
        "crash the controller again",
    );
    lab.kill_controller();
    lab.idle(Duration::from_secs(1))?;
    lab.start_controller()?;
    let healthy = lab.wait_for(
        &format!("{name} to be healthy again"),
        lab.leader_lease() + Duration::from_secs(60),
        |lab| {
            Ok(lab.host_healthy(target)
                && lab.active_remediations().is_empty()
                && lab.hosts()[target].bmc_power_on()?)
        },
    )?;
    let offs = lab.power_offs_since(target, since)?;
    let ons = lab.hosts()[target]
        .power_log()?
        .iter()
        .filter(|e| e.at_ms >= since && e.is_on())
        .count();
    let others = lab
        .power_events_since(since)?
        .into_iter()
        .filter(|(h, _)| *h != name)
        .count();
    let ids: Vec<(String, String)> = lab
        .remediations()
        .into_iter()
        .filter(|(_, t, _)| *t == name)
        .map(|(id, _, phase)| (id, phase))
        .collect();
    let done = ids.iter().filter(|(_, phase)| phase == "done").count();
    let missing = lab.check_data(&data)?;
    let ok = offs_at_kill == 0
        && offs == 1
        && ons == 1
        && others == 0
        && done == 1
        && missing.is_empty();
    Ok(Report {
        name: "controller-crash",
        expected: format!(
            "{name} fenced once and back, one remediation finished by the third controller, \
             no data lost"
        ),
        seen: format!(
            "killed with the power-off in flight ({first_phase}, {offs_at_kill} off at the BMC) \
             and at {second_phase}; {offs} power-off, {ons} power-on, \
             {others} other power events; remediations {ids:?}; healthy {:.1}s after the \
             second restart; {} of {} keys missing",
            healthy.as_secs_f64(),
            missing.len(),
            data.len()
        ),
        ok,
        took: started.elapsed(),
        timings: vec![("second restart → healthy".into(), healthy)],
    })
}
