//! `break-glass`: a person fences a healthy host by hand, straight through its BMC, from
//! another host (`metalguard-agent fence HOST --direct`, with that host's agent configuration)
//! while the controller runs. The fence records a hold first (on the executing host, and in
//! the controller's store); the controller then leaves the host off — it is silent far longer
//! than the heartbeat timeout and nothing powers it on — and `status` says who holds it. Once
//! `metalguard-controller release HOST` hands it back, the controller remediates the silent
//! host (powers it on) and it is healthy again; the executing agent deletes its hold record.
//! In Kubernetes mode the hold is in the held `GuardedHost`'s `status.holds`, the release goes
//! through `spec.holdRelease` (`release --kubeconfig`), and the planner's refusal is read from
//! the leader's `Refused` Event.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

use super::{OVERHEAD, Report, unix_ms};
use crate::lab::Lab;
use crate::{HarnessError, Result};

/// The reason given to the break-glass fence.
const REASON: &str = "lab: BMC shows ECC storms, keep it off";
/// The user the fence records (as `sudo` would set it).
const OPERATOR: &str = "lab-operator";

/// What the `break-glass` scenario saw, for tests that assert more than [`Report::ok`].
#[derive(Debug, Clone)]
pub struct BreakGlassOutcome {
    /// The summary the lab prints.
    pub report: Report,
    /// The host fenced by hand.
    pub target: String,
    /// The host the fence ran on (its agent configuration, its hold record).
    pub executor: String,
    /// What the fence command wrote on stderr (its hold and the controller's answer).
    pub fence_stderr: String,
    /// Whether the fence command exited 0.
    pub fence_ok: bool,
    /// How long the lab watched the held host after its power-off.
    pub watched: Duration,
    /// Power events of the held host from the fence until the release (`off`, `on`, or
    /// `"<kind> <value>"`).
    pub while_held: Vec<String>,
    /// The `status` text lines about the hold, read while it stood.
    pub status_lines: Vec<String>,
    /// The hold as `status --json` showed it while it stood (`holds.active[0]`).
    pub status_hold: Value,
    /// The planner's refusal of kind `hold` about the held host, as `status --json` showed it
    /// while the hold stood (`None`: the planner did not refuse it for the hold).
    pub refusal_while_held: Option<String>,
    /// Remediations of the held host started before the release (there must be none: the
    /// planner, not only the executor, leaves a held host alone).
    pub started_while_held: Vec<String>,
    /// What `release` printed.
    pub release_output: String,
    /// Power events of the target after the release.
    pub after_release: Vec<String>,
    /// Release → the host powered on, healthy, no remediation active.
    pub back_after: Option<Duration>,
    /// The remediations of the target started after the release, as `(id, phase)`.
    pub remediations: Vec<(String, String)>,
    /// Whether the executing host's local hold record was deleted after the release.
    pub record_deleted: bool,
    /// Power events of every other host during the scenario.
    pub others: Vec<(String, String)>,
}

/// Runs the `break-glass` scenario and returns its summary.
pub fn break_glass(lab: &mut Lab) -> Result<Report> {
    observe_break_glass(lab).map(|o| o.report)
}

/// The hold files on `host`'s agent state directory.
fn hold_files(lab: &Lab, host: usize) -> Vec<PathBuf> {
    std::fs::read_dir(lab.hosts()[host].dir().join("agent-state").join("holds"))
        .map(|entries| {
            entries
                .filter_map(std::result::Result::ok)
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "json"))
                .collect()
        })
        .unwrap_or_default()
}

/// Power events of host `i` from `since_ms` until before `until_ms`: `off`, `on`, or
/// `"<kind> <value>"` for anything else.
fn events_of(lab: &Lab, i: usize, since_ms: u64, until_ms: u64) -> Result<Vec<String>> {
    Ok(lab.hosts()[i]
        .power_log()?
        .into_iter()
        .filter(|e| e.at_ms >= since_ms && e.at_ms < until_ms)
        .map(|e| {
            if e.is_off() {
                "off".to_owned()
            } else if e.is_on() {
                "on".to_owned()
            } else {
                format!("{} {}", e.kind, e.value)
            }
        })
        .collect())
}

/// Runs the scenario and returns everything it saw.
#[allow(clippy::too_many_lines)] // one story, told in order
pub fn observe_break_glass(lab: &mut Lab) -> Result<BreakGlassOutcome> {
    lab.new_scenario();
    let started = Instant::now();
    let since = unix_ms();
    let serving = lab.in_service();
    let [target, executor, ..] = serving[..] else {
        return Err(HarnessError::Other(
            "break-glass needs two hosts in service".into(),
        ));
    };
    let name = lab.hosts()[target].name.clone();
    let by_host = lab.hosts()[executor].name.clone();
    let t = lab.options().timings.clone();

    // The person, on the executing host: the break-glass fence with that host's agent config.
    let host = &lab.hosts()[target];
    let mut fence = Command::new(lab.options().bin_dir.join("metalguard-agent"));
    fence
        .args(["fence", &name, "--direct", "--reason", REASON, "--bmc"])
        .arg(host.bmc_address())
        .arg("--credentials")
        .arg(host.credentials_dir())
        .args(host.bmc_trust_args())
        .arg("--config")
        .arg(lab.hosts()[executor].agent_config_path())
        .env("SUDO_USER", OPERATOR);
    let out = fence
        .output()
        .map_err(HarnessError::io("running metalguard-agent fence"))?;
    let fence_ok = out.status.success();
    let fence_stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    lab.timeline.add(
        &format!("admin on {by_host}"),
        format!("metalguard-agent fence {name} --direct"),
        fence_stderr
            .lines()
            .find(|l| l.starts_with("hold ") && l.contains("recorded by the controller"))
            .unwrap_or("(the controller did not confirm the hold)")
            .trim()
            .to_owned(),
    );
    lab.wait_for(
        &format!("{name} to be powered off"),
        Duration::from_secs(30),
        |lab| Ok(lab.power_offs_since(target, since)? > 0),
    )?;

    // Held: watched far beyond the heartbeat timeout; status says who holds it.
    let watched = t.heartbeat_timeout.max(t.unhealthy_timeout) + OVERHEAD;
    lab.timeline.add(
        "lab",
        format!("watching {name} for {}s", watched.as_secs()),
        format!(
            "silent for more than {}s: without the hold the controller would power it on",
            t.heartbeat_timeout.as_secs()
        ),
    );
    lab.idle(watched)?;
    let status_text = lab.controller_cli(&["status"])?;
    let status_lines: Vec<String> = status_text
        .lines()
        .filter(|l| l.contains("HELD") || l.contains("NOT OFFERED"))
        .map(|l| l.trim().to_owned())
        .collect();
    let status = lab.status()?;
    let status_hold = status["holds"]["active"][0].clone();
    // The planner's refusal of kind `hold`: in the dry-run plan of `status`, or, in
    // Kubernetes mode (whose status has no plan), the leader's `Refused` Event about the host.
    let refusal_while_held = match lab.kube() {
        None => status["plan"]["refusals"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|r| r["subject"] == name.as_str() && r["kind"] == "hold")
            .and_then(|r| r["reason"].as_str().map(str::to_owned)),
        Some(kube) => kube
            .refusals_of(&name)?
            .into_iter()
            .find(|note| note.contains(": held since ")),
    };
    lab.timeline.add(
        "status",
        "says",
        status_lines.first().cloned().unwrap_or_default(),
    );
    let released_at = unix_ms();
    let while_held = events_of(lab, target, since, released_at)?;

    // The release: the controller brings the silent host back.
    let release_output = lab.controller_cli(&["release", &name, "--reason", "lab: done"])?;
    lab.timeline.add(
        "admin",
        format!("metalguard-controller release {name}"),
        release_output.lines().next().unwrap_or_default().to_owned(),
    );
    let back_after = lab
        .wait_for(
            &format!("{name} to be powered on and healthy again"),
            Duration::from_secs(60),
            |lab| {
                Ok(lab.hosts()[target].bmc_power_on()?
                    && lab.host_healthy(target)
                    && lab.active_remediations().is_empty())
            },
        )
        .ok();
    let deleted = lab
        .wait_for(
            &format!("{by_host}'s agent to delete its hold record"),
            Duration::from_secs(10),
            |lab| Ok(hold_files(lab, executor).is_empty()),
        )
        .is_ok();
    let after_release = events_of(lab, target, released_at, u64::MAX)?;
    let remediations: Vec<(String, String)> = lab
        .remediations()
        .into_iter()
        .filter(|(_, t, _)| *t == name)
        .map(|(id, _, phase)| (id, phase))
        .collect();
    // Kubernetes keeps a remediation's start to the second: there, one that started in the
    // second of the release counts as after it.
    let held_until = if lab.kube().is_some() {
        released_at - released_at % 1000
    } else {
        released_at
    };
    let started_while_held: Vec<String> = lab
        .last_status()
        .and_then(|s| s["remediations"].as_array().cloned())
        .unwrap_or_default()
        .iter()
        .filter(|r| {
            r["target"] == name.as_str() && r["started_at"].as_u64().is_some_and(|t| t < held_until)
        })
        .filter_map(|r| r["id"].as_str().map(str::to_owned))
        .collect();
    let others: Vec<(String, String)> = lab
        .power_events_since(since)?
        .into_iter()
        .filter(|(h, _)| *h != name)
        .collect();

    let offs_while_held = while_held.iter().filter(|e| *e == "off").count();
    let changes_while_held = while_held.len() - offs_while_held;
    let status_ok = status_lines
        .iter()
        .any(|l| l.contains(&format!("{name}: HELD")) && l.contains(OPERATOR));
    let ok = fence_ok
        && offs_while_held == 1
        && changes_while_held == 0
        && status_ok
        && refusal_while_held.is_some()
        && started_while_held.is_empty()
        && back_after.is_some()
        && after_release.iter().any(|e| e == "on")
        && deleted
        && others.is_empty();
    let report = Report {
        name: "break-glass",
        expected: format!(
            "{name} fenced by hand stays off for {}s (held by {OPERATOR} on {by_host}), status says so; \
             after release it is powered on and healthy; no other power change",
            watched.as_secs()
        ),
        seen: format!(
            "fence exit ok: {fence_ok}; while held {offs_while_held} power-off and {changes_while_held} other power events, \
             {} remediation started, planner refusal of kind hold: {}; status: {}; \
             after release: {} (power events: {}); hold record deleted: {deleted}; other hosts' power events {}",
            started_while_held.len(),
            refusal_while_held.is_some(),
            status_lines
                .first()
                .map_or("(no hold shown)", String::as_str),
            back_after.map_or("never healthy".to_owned(), |d| format!(
                "healthy after {:.1}s",
                d.as_secs_f64()
            )),
            after_release.join(", "),
            others.len()
        ),
        ok,
        took: started.elapsed(),
        timings: back_after
            .map(|d| vec![("release → healthy".to_owned(), d)])
            .unwrap_or_default(),
    };
    Ok(BreakGlassOutcome {
        report,
        target: name,
        executor: by_host,
        fence_stderr,
        fence_ok,
        watched,
        while_held,
        status_lines,
        status_hold,
        refusal_while_held,
        started_while_held,
        release_output,
        after_release,
        back_after,
        remediations,
        record_deleted: deleted,
        others,
    })
}

impl BreakGlassOutcome {
    /// What the scenario expects of cp-1 fenced by hand from cp-2, in either backend, that
    /// did not hold (empty: all did). `heartbeat` is the lab's agent heartbeat timeout.
    pub fn unmet(&self, heartbeat: Duration) -> Vec<String> {
        let mut unmet = Vec::new();
        let mut check = |ok: bool, what: &str| {
            if !ok {
                unmet.push(what.to_owned());
            }
        };
        check(
            (self.target.as_str(), self.executor.as_str()) == ("cp-1", "cp-2"),
            "cp-1 fenced from cp-2",
        );
        // The fence recorded the hold on cp-2 and in the controller before the BMC powered off.
        check(self.fence_ok, "the fence command succeeded");
        check(
            self.fence_stderr.contains("hold cp-2/")
                && self.fence_stderr.contains("recorded by the controller"),
            "the hold recorded on cp-2 and by the controller",
        );
        // Held: one power-off (the person's), nothing else, well beyond the heartbeat timeout.
        check(
            self.watched >= heartbeat * 3,
            "watched 3 heartbeat timeouts",
        );
        check(
            self.while_held == ["off"],
            "one power-off and nothing else while held",
        );
        // status says it is held, by whom, through which agent, and how to release it.
        check(
            self.status_lines.iter().any(|l| {
                l.starts_with("cp-1: HELD")
                    && l.contains("by lab-operator on cp-2")
                    && l.contains("via agent cp-2")
                    && l.contains("metalguard-controller release cp-1")
            }),
            "status shows cp-1 held by lab-operator on cp-2 via agent cp-2, with the release command",
        );
        let hold = &self.status_hold;
        check(
            hold["by"] == "lab-operator on cp-2"
                && hold["reported_by"] == "cp-2"
                && hold["recorded"] == true
                && hold["action"] == "off",
            "status --json shows the recorded hold (by, reported_by, action)",
        );
        // The planner itself left cp-1 alone (not only the executor and the agent behind it).
        check(
            self.refusal_while_held
                .as_deref()
                .is_some_and(|r| r.contains("metalguard-controller release cp-1")),
            "the planner refused cp-1 for the hold, naming the release command",
        );
        check(
            self.started_while_held.is_empty(),
            "no remediation started while held",
        );
        // Released: the controller remediates the silent host and it comes back.
        check(
            self.release_output.contains("released hold cp-2/"),
            "release names the hold",
        );
        check(
            self.back_after.is_some(),
            "cp-1 healthy again after the release",
        );
        check(
            self.after_release.iter().any(|e| e == "on"),
            "cp-1 powered on after the release",
        );
        check(
            !self.remediations.is_empty()
                && self.remediations.iter().all(|(_, phase)| phase == "done"),
            "cp-1's remediations all done",
        );
        check(self.record_deleted, "cp-2 deleted its hold record");
        check(self.others.is_empty(), "no other host's power changed");
        check(self.report.ok, "the report is ok");
        unmet
    }
}
