//! The checker: safety rules over a soak's [history](super::history), as one pure function.
//!
//! Data flow: the history's entries → [`check`] puts them in time order and indexes them once
//! (`timeline`: fault spans, power changes, fences executed and intents, etcd samples, host
//! health) → each rule module reads the index and returns its violations (`power`: fences,
//! each judged by the decision behind it that `decision` finds; `quorum`: etcd's quorum;
//! `terms`: leadership terms; `recovery`: hosts coming back; lost acknowledged writes
//! here) → a [`Verdict`] with the violations in time order, the [`Stats`] and what could not
//! be judged.
//!
//! How the rules read the history (each module says more):
//! - A host is off from a `power` entry `off` of its BMC to its next `on`; hosts start on.
//!   A BMC that lies ([`BmcLying`](super::history::FaultKind::BmcLying)) still records the
//!   power changes it claims, and they count like any other: fencing a host is judged by the
//!   decision, not by whether the host obeyed.
//! - A power-off is judged by the decision behind it: the latest fence of the host an agent
//!   executed (`off` or `reboot`) at most [`Params::fault_grace`] before it (the time a fence
//!   takes from decision to BMC), and the latest intent of that fence's op at or before the
//!   execution. A fault that afflicts the host justifies the power-off if it was in place
//!   when the intent was persisted or had ended at most [`Params::decision_grace`] before:
//!   a controller that decides from a stale view after the host recovered is caught.
//! - With no decision found (a person's fence, a log line lost) the power-off is judged by
//!   itself, noted in [`Verdict::unjudged`]: a fault in place at the power-off or ended at
//!   most [`Params::fault_grace`] before justifies it.
//! - A power-off is judged for quorum by the latest etcd sample at most
//!   [`Params::sample_window`] before it; with none there it is not judged (and said so).
//! - A fault's recovery bound runs from the fault's start.
//!
//! The checker assumes only that times do not decrease; a history out of order is checked in
//! time order (a stable sort) and says so in [`Verdict::unjudged`]. Entries with the same `t`
//! are a batch whose order between sources is unknown; the entries of one source keep their
//! order. The sources are: the nemesis (faults), each host's BMC (its power changes), each
//! agent (its commands and terms), each controller, the etcd observer, the lab's health judge,
//! the leader's store (remediations) and the workload. The verdict does not depend on how
//! the entries of one batch from different sources are interleaved (a property test shuffles
//! them): rules compare times with `<=` where order within a millisecond is unknown, power
//! changes of one millisecond are applied together, and violations and notes are sorted.

use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use super::history::{Entry, Event};

mod decision;
mod power;
mod quorum;
mod recovery;
mod stats;
mod terms;
mod timeline;

#[cfg(test)]
mod props;
#[cfg(test)]
pub(crate) mod testkit;
#[cfg(test)]
mod tests;

pub use stats::{Stats, WorkloadStats};

/// How long a fence may take from decision to the BMC's power log: the executor's quorum
/// check, at most 10 s, then the fence call, 3 s to connect and 10 s for the request, with
/// room for the command's delivery. It bounds how far before a power-off the fence behind it
/// was executed, and, for a power-off whose decision is not found, how long after a host
/// fault ended the power-off is still justified.
pub const DEFAULT_FAULT_GRACE: Duration = Duration::from_secs(30);
/// How long after a host fault ended a decision to fence the host is still justified: the
/// time a controller's view takes to see the recovery. With the lab's timings that is one
/// report interval (1 s), the etcd probe's failure threshold (two 500 ms periods) and a
/// plan round (250 ms), about 2.25 s; 5 s leaves room. A decision later than that was taken
/// from a stale view (issue 24 fenced a host 5.5 s after it recovered).
pub const DEFAULT_DECISION_GRACE: Duration = Duration::from_secs(5);
/// How long etcd may be seen without quorum before it is a violation: a new etcd leader is
/// elected within a few election timeouts (1 s each by default) when the old one hangs, and
/// a sample's linearizable read may time out meanwhile.
pub const DEFAULT_QUORUM_GRACE: Duration = Duration::from_secs(5);
/// How long after a host fault began the host must be healthy again (or handed to a person):
/// the schedule's faults last at most 40 s, then come detection, the fence, a verified
/// power-on with retries, the boot and the member's rejoin.
pub const DEFAULT_RECOVERY_BOUND: Duration = Duration::from_secs(300);
/// How far before a power-off the etcd sample that judges it may be: two of the observer's
/// one-second sampling periods.
pub const DEFAULT_SAMPLE_WINDOW: Duration = Duration::from_secs(2);

/// The checker's tolerances.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Params {
    /// How long a fence may take from decision to the BMC (and, with no decision found, how
    /// long after a host fault ended a power-off of that host is still justified).
    pub fault_grace: Duration,
    /// How long after a host fault ended a decision to fence that host is still justified.
    pub decision_grace: Duration,
    /// How long etcd may be seen without quorum before it is a violation.
    pub quorum_grace: Duration,
    /// How long after a host fault began the host must be healthy again.
    pub recovery_bound: Duration,
    /// How far before a power-off the etcd sample that judges it may be.
    pub sample_window: Duration,
}

impl Default for Params {
    fn default() -> Self {
        Self {
            fault_grace: DEFAULT_FAULT_GRACE,
            decision_grace: DEFAULT_DECISION_GRACE,
            quorum_grace: DEFAULT_QUORUM_GRACE,
            recovery_bound: DEFAULT_RECOVERY_BOUND,
            sample_window: DEFAULT_SAMPLE_WINDOW,
        }
    }
}

/// A safety rule of the soak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Rule {
    /// A host was powered off with no fault on it to justify the decision to fence it.
    UnjustifiedPowerOff,
    /// Two or more hosts were off at the same time.
    TwoHostsOff,
    /// A host was powered off while the other voters could not keep quorum.
    QuorumCut,
    /// etcd had no quorum for longer than the grace while the nemesis stayed within tolerance.
    QuorumLost,
    /// etcd had no quorum while the nemesis took more members than etcd tolerates (driver bug).
    ScheduleExceeded,
    /// An agent executed a command of a term older than one it had seen.
    OlderTermExecuted,
    /// A faulted host neither came back nor was handed to a person within the bound.
    NoRecovery,
    /// An acknowledged write was not found at the end.
    AckedLost,
    /// A controller replica crashed: it panicked (exit code 101) or a signal the nemesis did
    /// not send ended it. An exit with an error (the API server out of reach at start-up) is
    /// by design and only counted.
    ControllerCrashed,
}

impl Rule {
    /// Every rule, in the order they are documented.
    pub const ALL: [Rule; 9] = [
        Rule::UnjustifiedPowerOff,
        Rule::TwoHostsOff,
        Rule::QuorumCut,
        Rule::QuorumLost,
        Rule::ScheduleExceeded,
        Rule::OlderTermExecuted,
        Rule::NoRecovery,
        Rule::AckedLost,
        Rule::ControllerCrashed,
    ];

    /// The rule's stable kebab-case name (the same as in the JSON verdict).
    pub fn name(self) -> &'static str {
        match self {
            Rule::UnjustifiedPowerOff => "unjustified-power-off",
            Rule::TwoHostsOff => "two-hosts-off",
            Rule::QuorumCut => "quorum-cut",
            Rule::QuorumLost => "quorum-lost",
            Rule::ScheduleExceeded => "schedule-exceeded",
            Rule::OlderTermExecuted => "older-term-executed",
            Rule::NoRecovery => "no-recovery",
            Rule::AckedLost => "acked-lost",
            Rule::ControllerCrashed => "controller-crashed",
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One broken rule.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Violation {
    /// Which rule.
    pub rule: Rule,
    /// When (milliseconds since the soak started).
    pub t: u64,
    /// What happened, naming the host, op or term and the numbers.
    pub message: String,
}

/// The checker's answer.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Verdict {
    /// Every violation, in time order.
    pub violations: Vec<Violation>,
    /// Counts over the whole history.
    pub stats: Stats,
    /// What the history did not let the checker judge, each with the reason.
    pub unjudged: Vec<String>,
}

impl Verdict {
    /// Whether no rule was broken.
    pub fn passed(&self) -> bool {
        self.violations.is_empty()
    }

    /// The violations of one rule.
    pub fn of_rule(&self, rule: Rule) -> impl Iterator<Item = &Violation> {
        self.violations.iter().filter(move |v| v.rule == rule)
    }
}

/// What the checker could not judge, each note with the time it concerns (for sorting).
type Notes = Vec<(u64, String)>;

/// Checks a history against every rule.
pub fn check(history: &[Entry], params: &Params) -> Verdict {
    let mut notes = Notes::new();
    let ordered = order_by_time(history, &mut notes);
    let index = timeline::Timeline::index(&ordered, &mut notes);

    let mut violations = Vec::new();
    violations.extend(power::find_unjustified_power_offs(
        &index, params, &mut notes,
    ));
    violations.extend(power::find_hosts_off_together(&index));
    violations.extend(power::find_quorum_cuts(&index, params, &mut notes));
    violations.extend(quorum::find_quorum_losses(&index, params));
    violations.extend(terms::find_older_terms_executed(&ordered));
    violations.extend(recovery::find_missing_recoveries(
        &index, params, &mut notes,
    ));
    violations.extend(find_lost_acks(&ordered));
    violations.extend(find_controller_crashes(&ordered));
    violations.sort_by(|a, b| (a.t, a.rule, &a.message).cmp(&(b.t, b.rule, &b.message)));
    notes.sort();

    Verdict {
        violations,
        stats: Stats::count(&ordered),
        unjudged: notes.into_iter().map(|(_, note)| note).collect(),
    }
}

/// The entries in time order: as given when `t` never decreases (the recorder's promise),
/// otherwise stably sorted, with a note (dated 0, so it comes first).
fn order_by_time<'h>(history: &'h [Entry], notes: &mut Notes) -> Vec<&'h Entry> {
    let mut ordered: Vec<&Entry> = history.iter().collect();
    if let Some(i) = history.windows(2).position(|w| w[1].t < w[0].t) {
        notes.push((
            0,
            format!(
                "history out of time order at entry {} ({} after {}); checked in time order",
                i + 2,
                format_time(history[i + 1].t),
                format_time(history[i].t),
            ),
        ));
        ordered.sort_by_key(|e| e.t);
    }
    ordered
}

/// Rule acked-lost: every acknowledged key the final read did not find.
fn find_lost_acks(ordered: &[&Entry]) -> Vec<Violation> {
    ordered
        .iter()
        .filter_map(|e| match &e.event {
            Event::Workload { lost, .. } => Some((e.t, lost)),
            _ => None,
        })
        .flat_map(|(t, lost)| {
            lost.iter().map(move |key| Violation {
                rule: Rule::AckedLost,
                t,
                message: format!("acknowledged key {key} was not found by the final read"),
            })
        })
        .collect()
}

/// The exit code of a Rust program that panicked.
const PANIC_EXIT_CODE: i32 = 101;

/// Rule controller-crashed: every controller exit by a panic or a signal.
fn find_controller_crashes(ordered: &[&Entry]) -> Vec<Violation> {
    ordered
        .iter()
        .filter_map(|e| match &e.event {
            Event::ControllerExit {
                controller,
                code,
                signal,
                last_line,
                ..
            } => {
                let how = match (code, signal) {
                    (Some(PANIC_EXIT_CODE), _) => "panicked (exit code 101)".to_owned(),
                    (_, Some(signal)) => format!("was ended by signal {signal}"),
                    _ => return None,
                };
                Some(Violation {
                    rule: Rule::ControllerCrashed,
                    t: e.t,
                    message: format!("{controller} {how}; its log ends: {last_line}"),
                })
            }
            _ => None,
        })
        .collect()
}

/// A soak time (milliseconds since the start) as `m:ss.mmm`.
pub fn format_time(t_ms: u64) -> String {
    format!(
        "{}:{:02}.{:03}",
        t_ms / 60_000,
        (t_ms / 1000) % 60,
        t_ms % 1000
    )
}

/// A duration in seconds for a message (`5 s`, `5.5 s`).
fn seconds(d: Duration) -> String {
    format!("{} s", d.as_secs_f64())
}

/// A duration in the history's unit (milliseconds), saturating.
fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
