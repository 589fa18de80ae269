//! Snapshot validation: inconsistencies that make every decision unsafe.
//!
//! A snapshot with duplicate host names, duplicate etcd member ids or duplicate remediation ids
//! cannot be planned from (lookups would pick one arbitrarily), so `plan` refuses to act on it
//! at all. An even or zero desired replica count only stops control-plane decisions (see
//! [`crate::quorum::validate_desired`]).

use std::collections::HashSet;

use metalguard_api::snapshot::Snapshot;

/// Why a snapshot cannot be planned from.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotError {
    /// Two hosts share a name.
    #[error("host name {0} appears more than once")]
    DuplicateHost(String),
    /// Two members share an id.
    #[error("etcd member {0:x} appears more than once")]
    DuplicateMember(u64),
    /// Two remediations share an id.
    #[error("remediation id {0} appears more than once")]
    DuplicateRemediation(String),
}

/// Checks the invariants every snapshot must hold before planning.
pub fn validate_snapshot(snapshot: &Snapshot) -> Result<(), SnapshotError> {
    let mut names = HashSet::with_capacity(snapshot.hosts.len());
    for h in &snapshot.hosts {
        if !names.insert(h.name.as_str()) {
            return Err(SnapshotError::DuplicateHost(h.name.clone()));
        }
    }
    let mut ids = HashSet::new();
    let members = snapshot
        .hosts
        .iter()
        .filter_map(|h| h.etcd.as_ref())
        .chain(&snapshot.orphan_members);
    for m in members {
        if !ids.insert(m.id) {
            return Err(SnapshotError::DuplicateMember(m.id));
        }
    }
    let mut rids = HashSet::new();
    for r in &snapshot.remediations {
        if !rids.insert(r.id.as_str()) {
            return Err(SnapshotError::DuplicateRemediation(r.id.clone()));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{NOW, cluster, member, policy};

    #[test]
    fn duplicates_are_rejected_and_nothing_is_planned() {
        let mut s = cluster(3, 1);
        assert_eq!(validate_snapshot(&s), Ok(()));
        s.orphan_members.push(member(2, false, false));
        assert_eq!(
            validate_snapshot(&s),
            Err(SnapshotError::DuplicateMember(2))
        );
        s.orphan_members.clear();
        let mut dup = s.hosts[3].clone();
        dup.node = None; // would be "unhealthy" if planned
        s.hosts.push(dup);
        let err = validate_snapshot(&s).unwrap_err();
        assert_eq!(err.to_string(), "host name w-0 appears more than once");
        let p = crate::plan(&s, &policy(), NOW);
        assert!(p.actions.is_empty());
        assert_eq!(
            p.degraded.as_deref(),
            Some("snapshot is invalid: host name w-0 appears more than once; nothing is planned")
        );
    }
}
