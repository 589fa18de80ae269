//! `replace`: the runbook of docs/design-controller.md ("replace a control-plane host") on
//! the lab. An admin retires the first host and adds a spare to the inventory → the spare's
//! own agent joins it as a learner (the lab starts its etcd from the agent's environment
//! file) → caught up → promoted → the retired host's member is removed → its hook released →
//! it is powered off once through another host's agent. Every tick samples the member list:
//! voters go 3 → 4 → 3 and healthy voters (up and serving: `/health?serializable=true`) never
//! fall below the quorum of the voters of the moment. Moments without a leader (the full
//! `/health` failing on a majority, as during a leadership move) are counted apart: they cost
//! no quorum. Afterwards the lab is a cluster of the same size without the retired host (so the
//! scenario runs last).

use std::time::{Duration, Instant};

use super::{OVERHEAD, Report, unix_ms};
use crate::etcd::MemberInfo;
use crate::lab::Lab;
use crate::{HarnessError, Result, http};

/// The reason given to `retire`.
const REASON: &str = "lab: disk replacement";
/// How long the lab keeps watching after the power-off for a second one (or any other power
/// change): several plan rounds of the lab's controller.
const AFTERWARDS: Duration = Duration::from_secs(3);
/// Per-request timeout of the voters' `/health` probes while sampling.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// What the `replace` scenario saw, for tests that assert more than [`Report::ok`].
#[derive(Debug, Clone)]
pub struct ReplaceOutcome {
    /// The summary the lab prints.
    pub report: Report,
    /// The retired host.
    pub retired: String,
    /// The spare that replaced it.
    pub spare: String,
    /// Retirement → the spare's member first seen as a learner.
    pub learner_at: Option<Duration>,
    /// Retirement → the spare's member first seen voting.
    pub voter_at: Option<Duration>,
    /// Retirement → the retired host's member first seen gone (after the spare voted).
    pub removed_at: Option<Duration>,
    /// Retirement → the retired host's power-off, by its BMC's own record.
    pub powered_off_at: Option<Duration>,
    /// The bound of each of the four steps: the report interval plus [`OVERHEAD`].
    pub step_budget: Duration,
    /// Member-list samples taken, and how many of them failed (etcdctl could not answer).
    pub samples: usize,
    /// Samples that failed.
    pub failed_samples: usize,
    /// The fewest and the most voters of any sample.
    pub min_voters: usize,
    /// The most voters of any sample.
    pub max_voters: usize,
    /// Samples in which healthy voters were fewer than the quorum of the voters then, each as
    /// `"<time>: <healthy> of <voters> voters healthy (down: <names>)"`. Healthy = up and
    /// serving: `/health?serializable=true` answers true, leader or not.
    pub below_quorum: Vec<String>,
    /// Samples in which fewer than a quorum of voters answered the full `/health` (which needs
    /// a leader): the moments of a leadership move or an election, which cost no quorum.
    pub leaderless_samples: usize,
    /// Every power event of every host since the retirement, as `(host, event)`.
    pub power_events: Vec<(String, String)>,
    /// The host whose agent executed the power-off (`None` if the status did not show one).
    pub executor: Option<String>,
    /// Names of the voters at the end, sorted, and whether any learner was left.
    pub final_voters: Vec<String>,
    /// Learners left at the end.
    pub final_learners: usize,
    /// Keys written before the retirement that are missing or wrong at the end.
    pub missing: Vec<String>,
    /// Keys written.
    pub keys: usize,
}

/// Runs the `replace` scenario and returns its summary.
pub fn replace(lab: &mut Lab) -> Result<Report> {
    observe_replace(lab).map(|o| o.report)
}

/// The member list as sampled on every tick.
#[derive(Debug)]
struct MemberWatch {
    started: Instant,
    spare_peer: String,
    retired_peer: String,
    learner_at: Option<Duration>,
    voter_at: Option<Duration>,
    removed_at: Option<Duration>,
    samples: usize,
    failed: usize,
    min_voters: usize,
    max_voters: usize,
    below_quorum: Vec<String>,
    leaderless: usize,
    last: Vec<MemberInfo>,
}

impl MemberWatch {
    fn sample(&mut self, lab: &Lab) {
        let at = self.started.elapsed();
        let Ok(members) = lab.etcd().member_list() else {
            self.failed += 1;
            return;
        };
        self.samples += 1;
        let voters: Vec<&MemberInfo> = members.iter().filter(|m| !m.is_learner).collect();
        let quorum = voters.len() / 2 + 1;
        let down: Vec<&str> = voters
            .iter()
            .filter(|m| !answers(lab, m, "/health?serializable=true"))
            .map(|m| {
                if m.name.is_empty() {
                    "(unstarted)"
                } else {
                    m.name.as_str()
                }
            })
            .collect();
        let healthy = voters.len() - down.len();
        self.min_voters = self.min_voters.min(voters.len());
        self.max_voters = self.max_voters.max(voters.len());
        if healthy < quorum {
            self.below_quorum.push(format!(
                "{:.1}s: {healthy} of {} voters healthy (down: {})",
                at.as_secs_f64(),
                voters.len(),
                down.join(", ")
            ));
        }
        if voters.iter().filter(|m| answers(lab, m, "/health")).count() < quorum {
            self.leaderless += 1;
        }
        let has_peer = |m: &&MemberInfo, peer: &str| m.peer_urls.iter().any(|u| u == peer);
        match members.iter().find(|m| has_peer(m, &self.spare_peer)) {
            Some(m) if m.is_learner && self.voter_at.is_none() => {
                self.learner_at.get_or_insert(at);
            }
            Some(m) if !m.is_learner => {
                self.voter_at.get_or_insert(at);
            }
            _ => {}
        }
        if self.voter_at.is_some() && !members.iter().any(|m| has_peer(&m, &self.retired_peer)) {
            self.removed_at.get_or_insert(at);
        }
        self.last = members;
    }
}

/// Whether a member answers `path` (a `/health` variant) healthy on the metrics URL of the
/// lab member whose client URL it advertises first.
fn answers(lab: &Lab, member: &MemberInfo, path: &str) -> bool {
    let Some(addr) = member
        .client_urls
        .first()
        .and_then(|u| lab.metrics_addr_of(u))
    else {
        return false;
    };
    http::get(addr, path, PROBE_TIMEOUT)
        .is_some_and(|(status, body)| status == 200 && body.contains("\"health\":\"true\""))
}

/// Ticks (sampling the member list each time) until `done` holds or `timeout` passes.
fn wait_sampling(
    lab: &mut Lab,
    watch: &mut MemberWatch,
    what: &str,
    timeout: Duration,
    mut done: impl FnMut(&Lab, &MemberWatch) -> Result<bool>,
) -> Result<Duration> {
    lab.wait_for(what, timeout, |lab| {
        watch.sample(lab);
        done(lab, watch)
    })
}

/// The progress line of `host`'s retirement in the last status.
fn retirement_progress(lab: &Lab, host: &str) -> Option<String> {
    lab.last_status()?["retirements"][host]["progress"]
        .as_str()
        .map(str::to_owned)
}

/// The agent that executed the power-off ending `host`'s retirement, from the last status.
fn decommission_executor(lab: &Lab, host: &str) -> Option<String> {
    let prefix = format!("retire/{host}/");
    lab.last_status()?["operations"]
        .as_array()?
        .iter()
        .find(|op| op["id"].as_str().is_some_and(|id| id.starts_with(&prefix)))
        .and_then(|op| op["agent"].as_str().map(str::to_owned))
}

/// Runs the `replace` scenario and returns everything it saw.
pub fn observe_replace(lab: &mut Lab) -> Result<ReplaceOutcome> {
    lab.new_scenario();
    let t = lab.options().timings.clone();
    let retired = 0usize;
    let spare = lab
        .hosts()
        .iter()
        .position(|h| h.spare_etcd().is_some() && !h.in_inventory())
        .ok_or_else(|| {
            HarnessError::Other(
                "the replace scenario needs a spare host that is not in the inventory yet \
                 (LabOptions::spares, metalguard-lab --spares 1)"
                    .into(),
            )
        })?;
    let (retired_name, spare_name) = (
        lab.hosts()[retired].name.clone(),
        lab.hosts()[spare].name.clone(),
    );
    let spare_peer = lab.hosts()[spare]
        .spare_etcd()
        .map(crate::lab::SpareEtcd::peer_url)
        .unwrap_or_default();
    let data = lab.write_data("/lab/replace", 20)?;
    lab.timeline.add(
        "lab",
        "wrote 20 keys to etcd",
        "checked once the replacement is done",
    );
    let since = unix_ms();
    let started = Instant::now();
    let mut watch = MemberWatch {
        started,
        spare_peer,
        retired_peer: lab.etcd().member(retired).peer_url().to_owned(),
        learner_at: None,
        voter_at: None,
        removed_at: None,
        samples: 0,
        failed: 0,
        min_voters: usize::MAX,
        max_voters: 0,
        below_quorum: Vec::new(),
        leaderless: 0,
        last: Vec::new(),
    };
    watch.sample(lab);
    lab.retire(retired, REASON)?;
    let step = t.report_interval + OVERHEAD;
    wait_sampling(
        lab,
        &mut watch,
        &format!("the controller to show the retirement of {retired_name}"),
        step,
        |lab, _| Ok(retirement_progress(lab, &retired_name).is_some()),
    )?;
    lab.add_to_inventory(spare)?;
    wait_sampling(
        lab,
        &mut watch,
        &format!("{spare_name}'s member to join as a learner"),
        step,
        |_, w| Ok(w.learner_at.is_some() || w.voter_at.is_some()),
    )?;
    let started_from = lab.hosts()[spare]
        .spare_etcd()
        .and_then(|s| {
            s.watched_file()
                .file_name()
                .map(|f| f.to_string_lossy().into_owned())
        })
        .unwrap_or_default();
    lab.timeline.add(
        "lab",
        format!("{spare_name}'s member is a learner"),
        format!("added by its own agent, which then writes {started_from}, which etcd runs from"),
    );
    wait_sampling(
        lab,
        &mut watch,
        &format!("{spare_name}'s member to be promoted"),
        step,
        |_, w| Ok(w.voter_at.is_some()),
    )?;
    lab.timeline
        .add("lab", format!("{spare_name}'s member votes"), "promoted");
    wait_sampling(
        lab,
        &mut watch,
        &format!("{retired_name}'s member to be removed"),
        step,
        |_, w| Ok(w.removed_at.is_some()),
    )?;
    lab.timeline.add(
        "lab",
        format!("{retired_name}'s member is gone from the member list"),
        "",
    );
    wait_sampling(
        lab,
        &mut watch,
        &format!("{retired_name} to be powered off"),
        step,
        |lab, _| Ok(lab.power_offs_since(retired, since)? > 0),
    )?;
    wait_sampling(
        lab,
        &mut watch,
        &format!("the power-off of {retired_name} to be verified"),
        step,
        |lab, _| {
            Ok(retirement_progress(lab, &retired_name)
                .is_some_and(|p| p.starts_with("powered off (verified")))
        },
    )?;
    // Read now: in Kubernetes mode the operation lives in the retired host's GuardedHost
    // status, which goes when that GuardedHost is deleted below.
    let executor = decommission_executor(lab, &retired_name);
    // A second power-off, or any other power change, would show within a few plan rounds.
    let watched = Instant::now();
    wait_sampling(
        lab,
        &mut watch,
        "a few more plan rounds",
        AFTERWARDS + Duration::from_secs(1),
        |_, _| Ok(watched.elapsed() >= AFTERWARDS),
    )?;
    lab.remove_from_inventory(retired)?;
    lab.wait_all_healthy(Duration::from_secs(60))?;
    watch.sample(lab);
    lab.timeline.add(
        "lab",
        format!("every host in service is healthy, {spare_name} in place of {retired_name}"),
        "",
    );
    let powered_off_at = lab.hosts()[retired]
        .power_log()?
        .iter()
        .find(|e| e.at_ms >= since && e.is_off())
        .map(|e| Duration::from_millis(e.at_ms - since));
    let power_events = lab.power_events_since(since)?;
    let offs = lab.power_offs_since(retired, since)?;
    let mut final_voters: Vec<String> = watch
        .last
        .iter()
        .filter(|m| !m.is_learner)
        .map(|m| m.name.clone())
        .collect();
    final_voters.sort();
    let final_learners = watch.last.iter().filter(|m| m.is_learner).count();
    let mut expected_voters: Vec<String> = lab
        .hosts()
        .iter()
        .filter(|h| h.in_service())
        .map(|h| h.name.clone())
        .collect();
    expected_voters.sort();
    let missing = lab.check_data(&data)?;
    // The sampler sees the removal up to a sample late, the BMC's record is exact.
    let in_order = matches!(
        (watch.learner_at, watch.voter_at, watch.removed_at, powered_off_at),
        (Some(learner), Some(voter), Some(removed), Some(off))
            if learner < voter && voter <= removed && removed <= off + Duration::from_secs(1)
    );
    let ok = in_order
        && watch.below_quorum.is_empty()
        && offs == 1
        && power_events.len() == 1
        && executor.as_deref().is_some_and(|e| e != retired_name)
        && final_voters == expected_voters
        && final_learners == 0
        && missing.is_empty();
    let secs = |d: Option<Duration>| {
        d.map_or_else(
            || "never".to_owned(),
            |d| format!("{:.1}s", d.as_secs_f64()),
        )
    };
    let report = Report {
        name: "replace",
        expected: format!(
            "{spare_name} joins as a learner, is promoted, {retired_name}'s member is removed \
             and {retired_name} powered off once by another host's agent, each step within \
             {}s; healthy voters never below quorum; no data lost",
            step.as_secs()
        ),
        seen: format!(
            "learner {}, voter {}, {retired_name} removed {}, off {} (by agent {}); voters \
             {}..{} in {} samples ({} failed), below quorum {} times{}, without a leader {} \
             times; power events {:?}; voters now {}; {} of {} keys missing",
            secs(watch.learner_at),
            secs(watch.voter_at),
            secs(watch.removed_at),
            secs(powered_off_at),
            executor.as_deref().unwrap_or("?"),
            watch.min_voters,
            watch.max_voters,
            watch.samples,
            watch.failed,
            watch.below_quorum.len(),
            if watch.below_quorum.is_empty() {
                String::new()
            } else {
                format!(" {:?}", watch.below_quorum)
            },
            watch.leaderless,
            power_events,
            final_voters.join(", "),
            missing.len(),
            data.len()
        ),
        ok,
        took: started.elapsed(),
        timings: [
            ("retire → learner", watch.learner_at),
            ("retire → voter", watch.voter_at),
            ("retire → member removed", watch.removed_at),
            ("retire → powered off", powered_off_at),
        ]
        .into_iter()
        .filter_map(|(name, d)| d.map(|d| (name.to_owned(), d)))
        .collect(),
    };
    Ok(ReplaceOutcome {
        report,
        retired: retired_name,
        spare: spare_name,
        learner_at: watch.learner_at,
        voter_at: watch.voter_at,
        removed_at: watch.removed_at,
        powered_off_at,
        step_budget: step,
        samples: watch.samples,
        failed_samples: watch.failed,
        min_voters: watch.min_voters,
        max_voters: watch.max_voters,
        below_quorum: watch.below_quorum,
        leaderless_samples: watch.leaderless,
        power_events,
        executor,
        final_voters,
        final_learners,
        missing,
        keys: data.len(),
    })
}
