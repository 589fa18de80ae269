//! The history indexed once for the rules: each fault as a span, power changes, the fences
//! that power a host off and the intents behind them, etcd samples, host health changes and
//! the remediations handed to a person.

use std::collections::BTreeMap;

use super::{Notes, format_time};
use crate::soak::history::{Entry, Event, FaultKind, MemberSample, Power};

/// A fault from its start to its end (if it ended).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct FaultSpan<'h> {
    pub id: u64,
    pub kind: FaultKind,
    pub target: &'h str,
    pub start: u64,
    pub end: Option<u64>,
}

impl FaultSpan<'_> {
    /// Whether the fault is in place at `t`: started at or before it, not yet ended.
    pub fn is_active_at(&self, t: u64) -> bool {
        self.start <= t && self.end.is_none_or(|end| t < end)
    }

    /// Whether the fault is in place at `t` or ended at most `grace_ms` before it.
    pub fn is_recent_at(&self, t: u64, grace_ms: u64) -> bool {
        self.start <= t && self.end.is_none_or(|end| t <= end.saturating_add(grace_ms))
    }
}

/// One power change a BMC recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct PowerChange<'h> {
    pub t: u64,
    pub host: &'h str,
    pub state: Power,
}

/// A fence that powers its target off (action `off` or `reboot`), as an agent executed it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct FenceExecuted<'h> {
    pub t: u64,
    pub agent: &'h str,
    pub op: &'h str,
    pub target: &'h str,
}

/// An intent a controller persisted: when a controller decided an operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Decided<'h> {
    pub t: u64,
    pub controller: &'h str,
    pub op: &'h str,
}

/// One etcd sample.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Sample<'h> {
    pub t: u64,
    pub members: &'h [MemberSample],
    pub quorum: bool,
}

impl Sample<'_> {
    /// How many voters the sample shows.
    pub fn voters(&self) -> usize {
        self.members.iter().filter(|m| m.voter).count()
    }

    /// How many voters a quorum needs, counting this sample's voters.
    pub fn quorum_size(&self) -> usize {
        self.voters() / 2 + 1
    }

    /// How many voters may be away with quorum kept.
    pub fn tolerance(&self) -> usize {
        self.voters().saturating_sub(1) / 2
    }

    /// How many healthy voters the sample shows besides `host`'s member.
    pub fn healthy_voters_besides(&self, host: &str) -> usize {
        self.members
            .iter()
            .filter(|m| m.voter && m.healthy && m.name != host)
            .count()
    }
}

/// The history, indexed.
#[derive(Debug, Default)]
pub(super) struct Timeline<'h> {
    /// Every fault, in the order they started.
    pub faults: Vec<FaultSpan<'h>>,
    /// Every power change, in time order.
    pub powers: Vec<PowerChange<'h>>,
    /// Every fence that powers a host off, in time order.
    pub fences: Vec<FenceExecuted<'h>>,
    /// Every intent, by operation id, each op's in time order.
    pub intents: BTreeMap<&'h str, Vec<Decided<'h>>>,
    /// Every etcd sample, in time order.
    pub samples: Vec<Sample<'h>>,
    /// Each host's health changes, in time order.
    pub health: BTreeMap<&'h str, Vec<(u64, bool)>>,
    /// When a remediation of each host entered `needs-person`.
    pub needs_person: BTreeMap<&'h str, Vec<u64>>,
    /// The time of the history's last entry.
    pub last_t: Option<u64>,
}

/// The remediation phase that hands a host to a person.
pub(super) const NEEDS_PERSON: &str = "needs-person";

impl<'h> Timeline<'h> {
    /// Indexes entries already in time order; fault ends that match no start (or a fault
    /// that already ended) are noted in `notes` and ignored.
    pub fn index(ordered: &[&'h Entry], notes: &mut Notes) -> Self {
        let mut index = Timeline {
            last_t: ordered.last().map(|e| e.t),
            ..Timeline::default()
        };
        let mut open: BTreeMap<u64, usize> = BTreeMap::new();
        for entry in ordered {
            let t = entry.t;
            match &entry.event {
                Event::FaultStart { id, fault, target } => {
                    if let Some(earlier) = open.insert(*id, index.faults.len()) {
                        index.faults[earlier].end = Some(t);
                        notes.push((
                            t,
                            format!(
                                "fault {id} started again at {} before it ended; the first \
                                 start is taken to end there",
                                format_time(t)
                            ),
                        ));
                    }
                    index.faults.push(FaultSpan {
                        id: *id,
                        kind: *fault,
                        target,
                        start: t,
                        end: None,
                    });
                }
                Event::FaultEnd { id, .. } => match open.remove(id) {
                    Some(i) => index.faults[i].end = Some(t),
                    None => notes.push((
                        t,
                        format!(
                            "fault {id} ended at {} but was not in place; the end is ignored",
                            format_time(t)
                        ),
                    )),
                },
                Event::Power { host, state } => index.powers.push(PowerChange {
                    t,
                    host,
                    state: *state,
                }),
                Event::CommandExecuted {
                    agent,
                    op,
                    target: Some(target),
                    action: Some(action),
                    ..
                } if action == "off" || action == "reboot" => {
                    index.fences.push(FenceExecuted {
                        t,
                        agent,
                        op,
                        target,
                    });
                }
                Event::Intent { controller, op, .. } => {
                    index
                        .intents
                        .entry(op)
                        .or_default()
                        .push(Decided { t, controller, op });
                }
                Event::EtcdSample { members, quorum } => index.samples.push(Sample {
                    t,
                    members,
                    quorum: *quorum,
                }),
                Event::HostHealth { host, healthy } => {
                    index.health.entry(host).or_default().push((t, *healthy));
                }
                Event::Remediation { target, phase, .. } if phase == NEEDS_PERSON => {
                    index.needs_person.entry(target).or_default().push(t);
                }
                _ => {}
            }
        }
        index
    }

    /// The faults that afflict `host` (and so may justify fencing it).
    pub fn host_faults<'a>(&'a self, host: &'a str) -> impl Iterator<Item = &'a FaultSpan<'h>> {
        self.faults
            .iter()
            .filter(move |f| f.kind.afflicts_host() && f.target == host)
    }

    /// The hosts whose etcd member a fault in place at `t` takes away, by name.
    pub fn hosts_without_member_at(&self, t: u64) -> Vec<&'h str> {
        let mut hosts: Vec<&str> = self
            .faults
            .iter()
            .filter(|f| f.kind.takes_member() && f.is_active_at(t))
            .map(|f| f.target)
            .collect();
        hosts.sort_unstable();
        hosts.dedup();
        hosts
    }
}
