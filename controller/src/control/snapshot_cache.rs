//! The leader's snapshot kept across rounds and updated in place (issue 27): a round rebuilds
//! only the hosts whose entries in the state changed since the snapshot was last built (the
//! backend's [`HostRevisions`](crate::backend::revisions::HostRevisions)) and those whose
//! entry depends on the round itself: hosts whose agent reports (their heartbeat is judged
//! against `now`), hosts with a hold, a node lease held by another actor, a fence request, a
//! retirement or an active remediation (entries a round lays over the stored state), now or
//! at the last build. Everything is built again when the inventory or the leadership changed,
//! when a retired host left the snapshot or joined it again, and whenever the backend keeps no
//! revisions (standalone: every round reads everything anyway).
//!
//! The result equals [`build_for_round`](super::snapshot::build_for_round) over the same
//! inputs: the tests compare the two over random rounds.

use std::collections::{BTreeMap, BTreeSet};

use metalguard_api::duration::Timestamp;
use metalguard_api::snapshot::{Host, Snapshot};

use super::snapshot::{build_for_round, fresh_views, host_of, powered_off_for_retirement};
use crate::api::hearing::Hearing;
use crate::backend::State;
use crate::inventory::Inventory;

/// The snapshot of the last round, and what it was built from.
#[derive(Debug, Default)]
pub struct SnapshotCache {
    kept: Option<Kept>,
    /// How many hosts the last build made again (all of them when it built everything).
    pub visited: usize,
}

#[derive(Debug)]
struct Kept {
    /// `None` while a round has it ([`SnapshotCache::keep`] hands it back).
    snapshot: Option<Snapshot>,
    /// Host name → its position in `snapshot.hosts`.
    index: BTreeMap<String, usize>,
    /// The state's revision it was built at.
    revision: u64,
    known_since: Timestamp,
    /// The retired hosts left out.
    gone: BTreeSet<String>,
    /// The hosts whose entries depended on that round (see the module's text).
    volatile: BTreeSet<String>,
    /// The hosts that had an etcd member.
    members: BTreeSet<String>,
}

/// The retired hosts whose power-off for the retirement is verified (left out).
fn gone(inventory: &Inventory, state: &State) -> BTreeSet<String> {
    state
        .retirements
        .keys()
        .filter(|name| inventory.host(name).is_some() && powered_off_for_retirement(state, name))
        .cloned()
        .collect()
}

/// The hosts whose entries depend on the round (see the module's text).
pub(crate) fn volatile(state: &State) -> BTreeSet<String> {
    let mut hosts: BTreeSet<String> = BTreeSet::new();
    hosts.extend(state.reports.keys().cloned());
    hosts.extend(state.holds.keys().cloned());
    hosts.extend(state.node_leases.keys().cloned());
    hosts.extend(state.fence_requests.keys().cloned());
    hosts.extend(state.retirements.keys().cloned());
    hosts.extend(
        state
            .remediations
            .values()
            .filter(|r| r.phase.is_active())
            .map(|r| r.target.clone()),
    );
    hosts
}

impl SnapshotCache {
    /// Forgets the kept snapshot (the inventory changed): the next round builds everything.
    pub fn forget(&mut self) {
        self.kept = None;
    }

    /// The snapshot of this round, as [`build_for_round`] makes it. Hand it back with
    /// [`SnapshotCache::keep`] when the round is over; a round that does not builds everything
    /// the next time.
    pub fn build(
        &mut self,
        inventory: &Inventory,
        state: &State,
        (known_since, hearing): (Timestamp, &Hearing),
        now: Timestamp,
    ) -> Snapshot {
        let gone_now = gone(inventory, state);
        let volatile_now = volatile(state);
        let changes = state.changes.as_ref();
        let reusable = self.kept.take().and_then(|mut k| {
            if k.known_since != known_since || k.gone != gone_now {
                return None;
            }
            let snapshot = k.snapshot.take()?;
            let since = changes?.changed_since(k.revision)?;
            Some((k, snapshot, since))
        });
        let Some((kept, mut snapshot, since)) = reusable else {
            let snapshot = build_for_round(inventory, state, (known_since, hearing), now);
            self.visited = snapshot.hosts.len();
            let index = snapshot
                .hosts
                .iter()
                .enumerate()
                .map(|(i, h)| (h.name.clone(), i))
                .collect();
            let members = snapshot
                .hosts
                .iter()
                .filter(|h| h.etcd.is_some())
                .map(|h| h.name.clone())
                .collect();
            self.kept = Some(Kept {
                snapshot: None,
                index,
                revision: changes.map_or(0, crate::backend::revisions::HostRevisions::revision),
                known_since,
                gone: gone_now,
                volatile: volatile_now,
                members,
            });
            return snapshot;
        };
        let touched: BTreeSet<&str> = since
            .into_iter()
            .chain(volatile_now.iter().map(String::as_str))
            .chain(kept.volatile.iter().map(String::as_str))
            .collect();
        let views_since = known_since;
        self.visited = 0;
        for name in touched {
            let (Some(&i), Some(h)) = (kept.index.get(name), inventory.host(name)) else {
                continue;
            };
            snapshot.hosts[i] = host_of(h, state, (known_since, hearing), now, views_since);
            self.visited += 1;
        }
        // The etcd members, from the reporting hosts' views, in the snapshot's order.
        let mut reporting: Vec<(usize, &Host)> = state
            .reports
            .keys()
            .filter_map(|name| kept.index.get(name).map(|&i| (i, &snapshot.hosts[i])))
            .collect();
        reporting.sort_by_key(|(i, _)| *i);
        let reporting: Vec<&Host> = reporting.into_iter().map(|(_, h)| h).collect();
        let views = fresh_views(inventory, state, &reporting, now, views_since);
        let mut named: BTreeSet<String> = views
            .iter()
            .flat_map(|v| v.members.iter().map(|m| m.name.clone()))
            .collect();
        named.extend(kept.members.iter().cloned());
        let mut members = BTreeSet::new();
        let found: Vec<(usize, Option<metalguard_api::snapshot::EtcdMember>)> = named
            .iter()
            .filter_map(|name| {
                kept.index
                    .get(name)
                    .map(|&i| (i, crate::control::members::member_of(name, &views)))
            })
            .collect();
        for (i, member) in found {
            if member.is_some() {
                members.insert(snapshot.hosts[i].name.clone());
            }
            snapshot.hosts[i].etcd = member;
        }
        snapshot.observed_at = now;
        snapshot.remediations = state.remediations.values().cloned().collect();
        self.kept = Some(Kept {
            snapshot: None,
            revision: changes.map_or(0, crate::backend::revisions::HostRevisions::revision),
            volatile: volatile_now,
            members,
            ..kept
        });
        snapshot
    }

    /// Takes back the snapshot [`SnapshotCache::build`] gave out, for the next round.
    pub fn keep(&mut self, snapshot: Snapshot) {
        if let Some(kept) = self.kept.as_mut() {
            kept.snapshot = Some(snapshot);
        }
    }
}

#[cfg(test)]
#[path = "snapshot_cache_tests.rs"]
mod tests;
