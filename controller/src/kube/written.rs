//! The objects this controller wrote, kept until its watch shows them (a round reads its own
//! writes). Each is kept without its managedFields, like the watch's copies (`run.rs`): at the
//! start every host's status is written before the watch catches up, and the API server's
//! answers with their managed fields were the largest part of the controller's peak memory
//! (heaptrack at 5,000 hosts, issue 27). Nothing reads managed fields; the resource version,
//! which says when the watch has caught up, stays.

use std::collections::BTreeMap;

use kube::ResourceExt as _;

/// Written objects by name; [`Written::insert`] is the only way in.
#[derive(Debug)]
pub struct Written<K>(BTreeMap<String, K>);

impl<K> Default for Written<K> {
    fn default() -> Self {
        Self(BTreeMap::new())
    }
}

impl<K: kube::Resource> Written<K> {
    /// Keeps `written` (as the API server answered a write of `name`) without its managedFields.
    pub fn insert(&mut self, name: String, mut written: K) {
        written.managed_fields_mut().clear();
        self.0.insert(name, written);
    }

    pub fn get(&self, name: &str) -> Option<&K> {
        self.0.get(name)
    }

    pub fn keys(&self) -> impl Iterator<Item = &String> {
        self.0.keys()
    }

    /// Keeps only the objects for which `keep` is true (those the watch has not caught up with).
    pub fn retain(&mut self, keep: impl FnMut(&String, &mut K) -> bool) {
        self.0.retain(keep);
    }
}
