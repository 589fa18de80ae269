//! The state and the inventory the leader keeps across rounds, updated only for the hosts
//! whose `GuardedHost`, Node or Secret changed ([`super::changes`]; issue 27). Each is the
//! same as the whole build from the watched objects ([`world::state`],
//! [`world::inventory`]): the tests compare the two over random changes.
//!
//! A host's records (remediations, operations, holds) are keyed by id across hosts. Two
//! hosts' statuses may carry one id (a status edited by hand, or by an attacker with write
//! access to one object): the whole build keeps the last host's by name, and so does this one
//! (each host's own records are kept, and each id's owners).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt as _;
use kube::runtime::reflector::ObjectRef;
use metalguard_api::plan::OperationId;
use metalguard_api::remediation::Remediation;

use super::changes::Changed;
use super::world::{self, World};
use crate::backend::revisions::HostRevisions;
use crate::backend::{State, StoredHold, StoredOperation};
use crate::inventory::{ControllerSettings, EtcdSettings, Inventory, InventoryHost};

/// What one host put into the state.
#[derive(Debug, Default)]
struct Entries {
    /// Its Node's name (`spec.nodeName`).
    node: String,
    remediations: BTreeMap<String, Remediation>,
    operations: BTreeMap<OperationId, StoredOperation>,
    holds: BTreeMap<String, StoredHold>,
}

/// Which hosts' records carry an id, for each kind of record.
#[derive(Debug, Default)]
struct Owners {
    remediations: BTreeMap<String, BTreeSet<String>>,
    operations: BTreeMap<OperationId, BTreeSet<String>>,
    holds: BTreeMap<String, BTreeSet<String>>,
}

/// The hosts' part of the state, kept across rounds.
#[derive(Debug)]
pub struct StateCache {
    state: State,
    entries: BTreeMap<String, Entries>,
    owners: Owners,
    /// Node name → the hosts that name it.
    node_hosts: BTreeMap<String, BTreeSet<String>>,
    revisions: HostRevisions,
}

impl Default for StateCache {
    fn default() -> Self {
        Self {
            state: State {
                nodes: Some(imbl::OrdMap::new()),
                ..State::default()
            },
            entries: BTreeMap::new(),
            owners: Owners::default(),
            node_hosts: BTreeMap::new(),
            revisions: HostRevisions::default(),
        }
    }
}

/// What an update did.
#[derive(Debug, Default)]
pub struct Update {
    /// Entries of the changed hosts that could not be read.
    pub problems: Vec<String>,
    /// How many hosts were read again.
    pub visited: usize,
}

/// Puts `id`'s record as its last owner (by name) has it into `merged`, or removes it when no
/// host carries it any more.
fn settle<K: Ord + Clone, V: Clone>(
    id: &K,
    owners: &BTreeMap<K, BTreeSet<String>>,
    entries: &BTreeMap<String, Entries>,
    pick: impl Fn(&Entries) -> &BTreeMap<K, V>,
    merged: &mut BTreeMap<K, V>,
) {
    let record = owners
        .get(id)
        .and_then(|hosts| hosts.last())
        .and_then(|host| entries.get(host))
        .and_then(|e| pick(e).get(id));
    match record {
        Some(record) => {
            merged.insert(id.clone(), record.clone());
        }
        None => {
            merged.remove(id);
        }
    }
}

/// The ids of one host's records.
struct Ids {
    remediations: Vec<String>,
    operations: Vec<OperationId>,
    holds: Vec<String>,
}

impl Ids {
    fn of(entries: &Entries) -> Self {
        Self {
            remediations: entries.remediations.keys().cloned().collect(),
            operations: entries.operations.keys().cloned().collect(),
            holds: entries.holds.keys().cloned().collect(),
        }
    }
}

/// [`own`] each of `ids` for `host`, then [`settle`] each.
fn reown<K: Ord + Clone, V: Clone>(
    ids: &[K],
    host: &str,
    owns: bool,
    owners: &mut BTreeMap<K, BTreeSet<String>>,
    (entries, pick): (
        &BTreeMap<String, Entries>,
        impl Fn(&Entries) -> &BTreeMap<K, V>,
    ),
    merged: &mut BTreeMap<K, V>,
) {
    for id in ids {
        own(owners, id, host, owns);
    }
    for id in ids {
        settle(id, owners, entries, &pick, merged);
    }
}

fn own<K: Ord + Clone>(owners: &mut BTreeMap<K, BTreeSet<String>>, id: &K, host: &str, owns: bool) {
    if owns {
        owners
            .entry(id.clone())
            .or_default()
            .insert(host.to_owned());
    } else if let Some(hosts) = owners.get_mut(id) {
        hosts.remove(host);
        if hosts.is_empty() {
            owners.remove(id);
        }
    }
}

impl StateCache {
    /// Reads again the hosts `changed` names (a `GuardedHost` by name, a Node by the hosts
    /// that name it; everything after a relist).
    pub fn update(&mut self, world: &World, changed: &Changed) -> Update {
        let names: BTreeSet<String> = if changed.everything {
            world
                .hosts
                .state()
                .iter()
                .map(|h| h.name_any())
                .chain(self.entries.keys().cloned())
                .collect()
        } else {
            let mut names = changed.hosts.clone();
            for node in &changed.nodes {
                names.extend(self.node_hosts.get(node).into_iter().flatten().cloned());
            }
            names
        };
        let mut update = Update::default();
        for name in &names {
            self.forget(name);
            if let Some(h) = world.host(name) {
                let node = world.nodes.get(&ObjectRef::new(&h.spec.node_name));
                update.problems.extend(self.add(name, &h, node.as_deref()));
            }
            update.visited += 1;
            if !changed.everything {
                self.revisions.note(name);
            }
        }
        if changed.everything {
            self.revisions.reset();
        }
        update
    }

    /// Notes that `host`'s entries differ this round from what was read (an overlay).
    pub fn note(&mut self, host: &str) {
        self.revisions.note(host);
    }

    /// The state: every host's part as last read, with the change revisions; the caller adds
    /// what is no one host's ([`world::finish_state`]).
    pub fn state(&self) -> State {
        State {
            changes: Some(self.revisions.clone()),
            ..self.state.clone()
        }
    }

    /// Marks `host` as owning (or no longer owning) the records `ids` names, then puts each
    /// record as its last owner has it into the state (or removes it).
    fn reown(&mut self, host: &str, ids: &Ids, owns: bool) {
        reown(
            &ids.remediations,
            host,
            owns,
            &mut self.owners.remediations,
            (&self.entries, |e: &Entries| &e.remediations),
            &mut self.state.remediations,
        );
        reown(
            &ids.operations,
            host,
            owns,
            &mut self.owners.operations,
            (&self.entries, |e: &Entries| &e.operations),
            &mut self.state.operations,
        );
        reown(
            &ids.holds,
            host,
            owns,
            &mut self.owners.holds,
            (&self.entries, |e: &Entries| &e.holds),
            &mut self.state.hold_records,
        );
    }

    fn forget(&mut self, name: &str) {
        let Some(entries) = self.entries.remove(name) else {
            return;
        };
        if let Some(hosts) = self.node_hosts.get_mut(&entries.node) {
            hosts.remove(name);
            if hosts.is_empty() {
                self.node_hosts.remove(&entries.node);
            }
        }
        if let Some(nodes) = self.state.nodes.as_mut() {
            nodes.remove(name);
        }
        self.state.hooks.remove(name);
        self.state.retirements.remove(name);
        self.state.bmc_check_requests.remove(name);
        let ids = Ids::of(&entries);
        self.reown(name, &ids, false);
    }

    fn add(
        &mut self,
        name: &str,
        h: &metalguard_api::k8s::GuardedHost,
        node: Option<&Node>,
    ) -> Vec<String> {
        let mut scratch = State {
            nodes: Some(imbl::OrdMap::new()),
            ..State::default()
        };
        let problems = world::host_state(name, h, node, &mut scratch);
        if let (Some(status), Some(nodes)) = (
            scratch.nodes.as_mut().and_then(|n| n.remove(name)),
            self.state.nodes.as_mut(),
        ) {
            nodes.insert(name.to_owned(), status);
        }
        self.state.hooks.append(&mut scratch.hooks);
        self.state.retirements.append(&mut scratch.retirements);
        self.state
            .bmc_check_requests
            .append(&mut scratch.bmc_check_requests);
        self.node_hosts
            .entry(h.spec.node_name.clone())
            .or_default()
            .insert(name.to_owned());
        let entries = Entries {
            node: h.spec.node_name.clone(),
            remediations: scratch.remediations,
            operations: scratch.operations,
            holds: scratch.hold_records,
        };
        let ids = Ids::of(&entries);
        self.entries.insert(name.to_owned(), entries);
        self.reown(name, &ids, true);
        problems
    }
}

/// The inventory's hosts, kept across ticks.
#[derive(Debug, Default)]
pub struct InventoryCache {
    hosts: BTreeMap<String, InventoryHost>,
    /// Secret name → the hosts whose BMC credentials it holds.
    secret_hosts: BTreeMap<String, BTreeSet<String>>,
    /// Host → its credentials Secret.
    secret_of: BTreeMap<String, String>,
}

impl InventoryCache {
    /// Reads again the hosts `changed` names (a `GuardedHost` by name, a Secret by the hosts
    /// whose credentials it holds); true when the inventory changed. A `GuardedHost` whose
    /// status alone changed makes the same entry: no new inventory.
    pub fn update(
        &mut self,
        world: &World,
        credentials_namespace: &str,
        changed: &Changed,
    ) -> bool {
        let names: BTreeSet<String> = if changed.everything {
            world
                .hosts
                .state()
                .iter()
                .map(|h| h.name_any())
                .chain(self.hosts.keys().cloned())
                .collect()
        } else {
            let mut names = changed.hosts.clone();
            for secret in &changed.secrets {
                names.extend(self.secret_hosts.get(secret).into_iter().flatten().cloned());
            }
            names
        };
        let mut different = changed.everything || changed.policy;
        for name in &names {
            if let Some(secret) = self.secret_of.remove(name)
                && let Some(hosts) = self.secret_hosts.get_mut(&secret)
            {
                hosts.remove(name);
                if hosts.is_empty() {
                    self.secret_hosts.remove(&secret);
                }
            }
            let Some(h) = world.host(name) else {
                different |= self.hosts.remove(name).is_some();
                continue;
            };
            if let Some(bmc) = &h.spec.bmc {
                let secret = bmc.credentials_secret.name.clone();
                self.secret_hosts
                    .entry(secret.clone())
                    .or_default()
                    .insert(name.clone());
                self.secret_of.insert(name.clone(), secret);
            }
            let entry = world::inventory_host(world, credentials_namespace, &h);
            if self.hosts.get(name) != Some(&entry) {
                self.hosts.insert(name.clone(), entry);
                different = true;
            }
        }
        different
    }

    /// The inventory of the hosts as last read.
    pub fn inventory(
        &self,
        world: &World,
        namespace: &str,
        controller: &ControllerSettings,
        etcd: &EtcdSettings,
    ) -> Result<Inventory, String> {
        world::assemble(
            world,
            namespace,
            self.hosts.values().cloned().collect(),
            controller,
            etcd,
        )
    }
}

#[cfg(test)]
#[path = "incremental_tests.rs"]
mod tests;
