//! Which hosts' persisted state changed, by revision (issue 27): a backend that keeps its
//! state across rounds (the Kubernetes backend) numbers each host's change, and whoever builds
//! something per host from the state (the leader's snapshot, its observations) rebuilds only
//! the hosts changed since the revision it last saw.

use std::collections::BTreeSet;

/// Each host's latest change, by revision.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct HostRevisions {
    /// The latest revision.
    revision: u64,
    /// Everything changed at this revision (the first read, a relist): a reader from before
    /// it reads everything again.
    reset: u64,
    /// Host → the revision of its latest change.
    latest: imbl::OrdMap<String, u64>,
    /// Revision → host (the inverse of `latest`).
    log: imbl::OrdMap<u64, String>,
}

impl HostRevisions {
    /// The latest revision.
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// Notes that `host` changed.
    #[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
    pub fn note(&mut self, host: &str) {
        self.revision += 1;
        if let Some(before) = self.latest.insert(host.to_owned(), self.revision) {
            self.log.remove(&before);
        }
        self.log.insert(self.revision, host.to_owned());
    }

    /// Notes that everything changed (and forgets the log).
    #[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
    pub fn reset(&mut self) {
        self.revision += 1;
        self.reset = self.revision;
        self.latest.clear();
        self.log.clear();
    }

    /// The hosts changed after `revision`, or `None` when a reader at `revision` must read
    /// everything.
    pub fn changed_since(&self, revision: u64) -> Option<BTreeSet<&str>> {
        if revision < self.reset || revision > self.revision {
            return None;
        }
        Some(
            self.log
                .range(revision + 1..)
                .map(|(_, host)| host.as_str())
                .collect(),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reader_gets_the_hosts_changed_since_its_revision_or_everything() {
        let mut revisions = HostRevisions::default();
        revisions.reset();
        let start = revisions.revision();
        assert_eq!(revisions.changed_since(start), Some(BTreeSet::new()));
        assert_eq!(revisions.changed_since(0), None, "from before the reset");
        revisions.note("a");
        revisions.note("b");
        let middle = revisions.revision();
        revisions.note("a");
        assert_eq!(
            revisions.changed_since(start),
            Some(BTreeSet::from(["a", "b"]))
        );
        assert_eq!(revisions.changed_since(middle), Some(BTreeSet::from(["a"])));
        assert_eq!(revisions.log.len(), 2, "one entry per host");
        assert_eq!(
            revisions.changed_since(middle + 99),
            None,
            "not a revision of this log"
        );
        revisions.reset();
        assert_eq!(revisions.changed_since(middle), None);
    }
}
