//! Counts over a whole history, for the report.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::soak::history::{Entry, Event, FaultKind, Power};

/// Counts over a whole history.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Stats {
    /// Faults injected, by kind.
    pub faults_by_kind: BTreeMap<FaultKind, u64>,
    /// Power-offs recorded by the BMCs, per host.
    pub power_offs: BTreeMap<String, u64>,
    /// Power-ons recorded by the BMCs, per host.
    pub power_ons: BTreeMap<String, u64>,
    /// Power-offs in all.
    pub power_offs_total: u64,
    /// Power-ons in all.
    pub power_ons_total: u64,
    /// Commands the agents executed.
    pub commands_executed: u64,
    /// Commands the agents refused as older than a term they had seen.
    pub commands_refused_older_term: u64,
    /// Power cuts the agents' own quorum check refused.
    pub power_cuts_refused: u64,
    /// Controller replicas that exited on their own and were started again.
    pub controller_exits: u64,
    /// Leaderships begun.
    pub leaderships: u64,
    /// The highest term a leadership began in.
    pub highest_term: u64,
    /// Newer terms the agents saw.
    pub terms_seen: u64,
    /// Remediations by the last phase the history shows for each.
    pub remediations_by_phase: BTreeMap<String, u64>,
    /// The workload's outcome, if the history has it.
    pub workload: Option<WorkloadStats>,
    /// The time of the history's last entry.
    pub duration: Duration,
}

/// The workload's outcome, summed over its `Workload` entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct WorkloadStats {
    /// Writes acknowledged.
    pub acked: u64,
    /// Writes that failed or got no answer.
    pub failed: u64,
    /// Acknowledged keys not found at the end.
    pub lost: u64,
}

impl Stats {
    /// Counts the entries (in time order).
    pub fn count(ordered: &[&Entry]) -> Self {
        let mut stats = Stats::default();
        let mut last_phase: BTreeMap<&str, &str> = BTreeMap::new();
        for entry in ordered {
            match &entry.event {
                Event::FaultStart { fault, .. } => {
                    bump(stats.faults_by_kind.entry(*fault).or_default(), 1);
                }
                Event::Power { host, state } => {
                    let (per_host, total) = match state {
                        Power::Off => (&mut stats.power_offs, &mut stats.power_offs_total),
                        Power::On => (&mut stats.power_ons, &mut stats.power_ons_total),
                    };
                    bump(per_host.entry(host.clone()).or_default(), 1);
                    bump(total, 1);
                }
                Event::CommandExecuted { .. } => bump(&mut stats.commands_executed, 1),
                Event::CommandRefused { .. } => bump(&mut stats.commands_refused_older_term, 1),
                Event::PowerCutRefused { .. } => bump(&mut stats.power_cuts_refused, 1),
                Event::TermSeen { .. } => bump(&mut stats.terms_seen, 1),
                Event::ControllerExit { .. } => bump(&mut stats.controller_exits, 1),
                Event::Leader { term, .. } => {
                    bump(&mut stats.leaderships, 1);
                    stats.highest_term = stats.highest_term.max(*term);
                }
                Event::Remediation { id, phase, .. } => {
                    last_phase.insert(id, phase);
                }
                Event::Workload {
                    acked,
                    failed,
                    lost,
                } => {
                    let w = stats.workload.get_or_insert_default();
                    bump(&mut w.acked, *acked);
                    bump(&mut w.failed, *failed);
                    bump(&mut w.lost, u64::try_from(lost.len()).unwrap_or(u64::MAX));
                }
                _ => {}
            }
        }
        for phase in last_phase.into_values() {
            bump(
                stats
                    .remediations_by_phase
                    .entry(phase.to_string())
                    .or_default(),
                1,
            );
        }
        stats.duration = Duration::from_millis(ordered.last().map_or(0, |e| e.t));
        stats
    }
}

/// Adds to a count, saturating (a history is untrusted input).
fn bump(count: &mut u64, by: u64) {
    *count = count.saturating_add(by);
}
