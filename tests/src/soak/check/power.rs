//! Rules over the power changes BMCs recorded: unjustified-power-off, two-hosts-off and
//! quorum-cut.

use std::collections::BTreeMap;
use std::time::Duration;

use super::decision::{self, Behind};
use super::timeline::{Decided, PowerChange, Sample, Timeline};
use super::{Notes, Params, Rule, Violation, format_time, millis, seconds};
use crate::soak::history::Power;

/// Rule unjustified-power-off, judged by the decision behind each power-off (see
/// [`decision`](super::decision)): the fence of the host executed last at or before it (at
/// most `fault_grace` before) and the intent of that fence's op. The power-off is justified
/// iff a fault that afflicts the host was in place when the intent was persisted or had
/// ended at most `decision_grace` before: a controller that decides to fence a host from a
/// stale view after it recovered is caught, however soon the fence then lands.
///
/// With no decision found (a person's fence, or a log line lost) the power-off is judged by
/// itself instead, noted in `notes`: a fault that afflicts the host in place at that moment
/// or ended at most `fault_grace` before (the time a fence takes from decision to BMC).
///
/// Either way a fault that starts in the judged moment's own millisecond counts (their
/// order is unknown). A lying BMC's power-off counts like any other: it records what
/// metalguard asked for, and asking was wrong unless the host had a fault; BMC faults
/// themselves justify nothing.
pub(super) fn find_unjustified_power_offs(
    index: &Timeline<'_>,
    params: &Params,
    notes: &mut Notes,
) -> Vec<Violation> {
    let mut violations = Vec::new();
    for off in power_offs(index) {
        let behind = decision::find_decision(index, off, params.fault_grace);
        if let Behind::Decided(decided) = &behind {
            if decided
                .iter()
                .any(|d| was_afflicted(index, off.host, d.t, params.decision_grace))
            {
                continue;
            }
            if let Some(latest) = decided.last() {
                violations.push(stale_decision(index, off, latest, params));
            }
            continue;
        }
        let why = behind.missing().unwrap_or_default();
        notes.push((
            off.t,
            format!(
                "power-off of {} at {}: the decision behind it could not be found ({why}); \
                 judged by the faults at the power-off instead",
                off.host,
                format_time(off.t)
            ),
        ));
        if !was_afflicted(index, off.host, off.t, params.fault_grace) {
            violations.push(Violation {
                rule: Rule::UnjustifiedPowerOff,
                t: off.t,
                message: format!(
                    "{} was powered off with no host fault on it in place or ended within {} \
                     before (no decision behind it found)",
                    off.host,
                    seconds(params.fault_grace)
                ),
            });
        }
    }
    violations
}

/// Whether a fault that afflicts `host` was in place at `t` or ended at most `grace` before.
fn was_afflicted(index: &Timeline<'_>, host: &str, t: u64, grace: Duration) -> bool {
    index
        .host_faults(host)
        .any(|f| f.is_recent_at(t, millis(grace)))
}

/// The violation of a power-off decided with no fault on the host to justify it, naming
/// the fault it was measured against: the one on the host that ended last before the
/// decision.
fn stale_decision(
    index: &Timeline<'_>,
    off: &PowerChange<'_>,
    decided: &Decided<'_>,
    params: &Params,
) -> Violation {
    let against = index
        .host_faults(off.host)
        .filter(|f| f.start <= decided.t)
        .max_by_key(|f| (f.end, f.id))
        .map_or_else(
            || "no fault".to_owned(),
            |f| match f.end {
                Some(end) => format!(
                    "fault {} ({}), ended at {}",
                    f.id,
                    f.kind.name(),
                    format_time(end)
                ),
                None => format!("fault {} ({}), in place", f.id, f.kind.name()),
            },
        );
    Violation {
        rule: Rule::UnjustifiedPowerOff,
        t: off.t,
        message: format!(
            "{} was powered off for op {} that {} decided at {}, with no host fault on it in \
             place then or ended within {} before (measured against {against})",
            off.host,
            decided.op,
            decided.controller,
            format_time(decided.t),
            seconds(params.decision_grace)
        ),
    }
}

/// Rule two-hosts-off: each time the number of hosts whose last recorded state is off
/// reaches two or more (all hosts start on). Power changes with the same time are applied
/// together, since their order between hosts is unknown (one host's changes keep the order
/// of its BMC's log).
pub(super) fn find_hosts_off_together(index: &Timeline<'_>) -> Vec<Violation> {
    let mut off_since: BTreeMap<&str, u64> = BTreeMap::new();
    let mut violations = Vec::new();
    let mut together = false;
    for batch in index.powers.chunk_by(|a, b| a.t == b.t) {
        for change in batch {
            match change.state {
                Power::Off => {
                    off_since.entry(change.host).or_insert(change.t);
                }
                Power::On => {
                    off_since.remove(change.host);
                }
            }
        }
        let now_together = off_since.len() >= 2;
        if now_together && !together {
            let hosts: Vec<String> = off_since
                .iter()
                .map(|(host, since)| format!("{host} since {}", format_time(*since)))
                .collect();
            violations.push(Violation {
                rule: Rule::TwoHostsOff,
                t: batch[0].t,
                message: format!(
                    "{} hosts were off at the same time: {}",
                    off_since.len(),
                    hosts.join(", ")
                ),
            });
        }
        together = now_together;
    }
    violations
}

/// Rule quorum-cut: a power-off while the latest etcd sample at most `sample_window` before
/// it showed fewer healthy voters besides the host than a quorum of that sample's voters
/// (`voters / 2 + 1`). A sample in the power-off's own millisecond counts as before it (the
/// host's own member is not counted anyway). A power-off with no such sample, or whose
/// sample lists no voters, is noted as not judged.
///
/// A sample in which no member answered `/health` was taken while etcd had no leader (every
/// member's `/health` is a linearizable read through one): an election after the leader
/// hung, which says nothing of which members are up (the 2-hour standalone soak, 78:18: a
/// sample taken 230 ms after the leader's member hung showed all five unhealthy, the next
/// four healthy). Such a power-off is judged by the first sample after it instead, when that
/// one has a leader: did the cut leave a quorum? Leaderless after it too, the sample before
/// judges (a cut into a quorum loss).
pub(super) fn find_quorum_cuts(
    index: &Timeline<'_>,
    params: &Params,
    notes: &mut Notes,
) -> Vec<Violation> {
    let window = millis(params.sample_window);
    let mut violations = Vec::new();
    for off in power_offs(index) {
        let Some(sample) = latest_sample_within(&index.samples, off.t, window) else {
            notes.push((
                off.t,
                format!(
                    "power-off of {} at {}: no etcd sample in the {window} ms before it to \
                     judge its quorum",
                    off.host,
                    format_time(off.t)
                ),
            ));
            continue;
        };
        if sample.voters() == 0 {
            notes.push((
                off.t,
                format!(
                    "power-off of {} at {}: the etcd sample before it lists no voters",
                    off.host,
                    format_time(off.t)
                ),
            ));
            continue;
        }
        let leaderless = |s: &Sample<'_>| !s.members.iter().any(|m| m.healthy);
        let sample = match first_sample_after(&index.samples, off.t, window) {
            Some(after) if leaderless(sample) && !leaderless(after) => after,
            _ => sample,
        };
        let healthy = sample.healthy_voters_besides(off.host);
        if healthy < sample.quorum_size() {
            violations.push(Violation {
                rule: Rule::QuorumCut,
                t: off.t,
                message: format!(
                    "{} was powered off while etcd's latest sample (at {}) showed {healthy} \
                     healthy voters besides it, fewer than the quorum of {} of {} voters",
                    off.host,
                    format_time(sample.t),
                    sample.quorum_size(),
                    sample.voters()
                ),
            });
        }
    }
    violations
}

/// The first sample taken after `t` and at most `window` after it.
fn first_sample_after<'s, 'h>(
    samples: &'s [Sample<'h>],
    t: u64,
    window: u64,
) -> Option<&'s Sample<'h>> {
    let from = samples.partition_point(|s| s.t <= t);
    samples[from..]
        .first()
        .filter(|s| s.t <= t.saturating_add(window))
}

/// The latest sample taken at or before `t` and at most `window` before it.
fn latest_sample_within<'s, 'h>(
    samples: &'s [Sample<'h>],
    t: u64,
    window: u64,
) -> Option<&'s Sample<'h>> {
    let upto = samples.partition_point(|s| s.t <= t);
    samples[..upto]
        .last()
        .filter(|s| s.t >= t.saturating_sub(window))
}

fn power_offs<'a, 'h>(index: &'a Timeline<'h>) -> impl Iterator<Item = &'a PowerChange<'h>> {
    index.powers.iter().filter(|p| p.state == Power::Off)
}
