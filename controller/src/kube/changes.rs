//! Which watched objects changed since a consumer last looked (issue 27, "work proportional
//! to change"). Every watch event goes through a [`TrackedWriter`]: it updates the store, then
//! notes the object's name for each consumer (the round's state, the inventory), so a round
//! rebuilds only the hosts whose `GuardedHost`, Node or Secret changed instead of all of them.
//!
//! The note is taken after the store holds the change: a consumer that takes the names and
//! then reads the store never misses an update (at worst it reads a newer one twice). A relist
//! (`InitDone`: the store is replaced whole, objects deleted meanwhile vanish without an event
//! of their own) marks everything of that kind changed.

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};

use kube::runtime::reflector::{Store, store::Writer};
use kube::runtime::watcher::Event;

/// The kinds whose objects are tracked one by one; the small kinds (control planes, checks,
/// fence requests) are read whole when they changed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Nodes (by name).
    Node,
    /// `GuardedHost`s (by name, in the controller's namespace).
    Host,
    /// Secrets (by name, in the credentials namespace).
    Secret,
    /// `GuardedControlPlane`s and `HostHealthCheck`s (the inventory's policy and spec).
    Policy,
    /// `FenceRequest`s.
    Fence,
}

/// What changed for one consumer since it last took its changes.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Changed {
    /// Everything is to be read again (the first look, or a relist).
    pub everything: bool,
    /// Nodes by name.
    pub nodes: BTreeSet<String>,
    /// `GuardedHost`s by name.
    pub hosts: BTreeSet<String>,
    /// Secrets by name.
    pub secrets: BTreeSet<String>,
    /// A control plane or health check changed.
    pub policy: bool,
    /// A fence request changed.
    pub fences: bool,
}

impl Changed {
    fn everything() -> Self {
        Self {
            everything: true,
            ..Self::default()
        }
    }

    fn note(&mut self, kind: Kind, name: Option<&str>) {
        let Some(name) = name else {
            match kind {
                Kind::Policy => self.policy = true,
                Kind::Fence => self.fences = true,
                _ => self.everything = true,
            }
            return;
        };
        match kind {
            Kind::Node => {
                self.nodes.insert(name.to_owned());
            }
            Kind::Host => {
                self.hosts.insert(name.to_owned());
            }
            Kind::Secret => {
                self.secrets.insert(name.to_owned());
            }
            Kind::Policy => self.policy = true,
            Kind::Fence => self.fences = true,
        }
    }
}

/// The changes of both consumers: the round's state and the inventory. Each starts with
/// everything changed.
#[derive(Debug, Clone)]
pub struct Changes(Arc<Mutex<[Changed; 2]>>);

/// A consumer of [`Changes`].
#[derive(Debug, Clone, Copy)]
pub enum Consumer {
    /// The state a round loads.
    State = 0,
    /// The inventory the tick checks.
    Inventory = 1,
}

impl Default for Changes {
    fn default() -> Self {
        Self(Arc::new(Mutex::new([
            Changed::everything(),
            Changed::everything(),
        ])))
    }
}

impl Changes {
    /// What changed for `consumer` since its last call (and forgets it).
    pub fn take(&self, consumer: Consumer) -> Changed {
        let mut all = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        std::mem::take(&mut all[consumer as usize])
    }

    fn note(&self, kind: Kind, name: Option<&str>) {
        let mut all = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        for changed in all.iter_mut() {
            changed.note(kind, name);
        }
    }
}

/// A reflector's store writer that notes each change in [`Changes`] after applying it.
pub struct TrackedWriter<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    writer: Writer<K>,
    changes: Changes,
    kind: Kind,
}

impl<K> TrackedWriter<K>
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    /// An empty store of `kind` noting into `changes`.
    pub fn new(changes: &Changes, kind: Kind) -> Self {
        Self {
            writer: Writer::default(),
            changes: changes.clone(),
            kind,
        }
    }

    /// The store's read side.
    pub fn as_reader(&self) -> Store<K> {
        self.writer.as_reader()
    }

    /// Applies one watch event to the store, then notes what it changed.
    pub fn apply_watcher_event(&mut self, event: &Event<K>) {
        self.writer.apply_watcher_event(event);
        match event {
            Event::Apply(object) | Event::Delete(object) => {
                self.changes.note(self.kind, object.meta().name.as_deref());
            }
            Event::InitDone => self.changes.note(self.kind, None),
            Event::Init | Event::InitApply(_) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::Node;

    use super::*;

    fn node(name: &str) -> Node {
        let mut node = Node::default();
        node.metadata.name = Some(name.to_owned());
        node
    }

    #[test]
    fn each_consumer_sees_each_change_once_and_a_relist_as_everything() {
        let changes = Changes::default();
        let mut nodes = TrackedWriter::<Node>::new(&changes, Kind::Node);
        assert!(changes.take(Consumer::State).everything, "the first look");
        assert_eq!(changes.take(Consumer::State), Changed::default());
        nodes.apply_watcher_event(&Event::Apply(node("a")));
        nodes.apply_watcher_event(&Event::Delete(node("b")));
        let state = changes.take(Consumer::State);
        assert_eq!(
            state.nodes,
            BTreeSet::from(["a".to_owned(), "b".to_owned()])
        );
        assert!(!state.everything);
        assert_eq!(
            changes.take(Consumer::State),
            Changed::default(),
            "taken once"
        );
        // The inventory's look is its own (and still holds its first look).
        let inventory = changes.take(Consumer::Inventory);
        assert!(inventory.everything && inventory.nodes.contains("a"));
        // A relist: the store is replaced only at InitDone, and so is everything noted.
        nodes.apply_watcher_event(&Event::Init);
        nodes.apply_watcher_event(&Event::InitApply(node("c")));
        assert_eq!(changes.take(Consumer::State), Changed::default());
        nodes.apply_watcher_event(&Event::InitDone);
        assert!(changes.take(Consumer::State).everything);
        assert_eq!(nodes.as_reader().state().len(), 1);
    }
}
