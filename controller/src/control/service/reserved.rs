//! Reserved condition types in reports: `Ready` and the kubelet's node conditions
//! ([`metalguard_api::protocol::RESERVED_CONDITION_TYPES`]) are ignored by the snapshot
//! ([`crate::control::snapshot`] judges `Ready` itself); the loop tells people so once per change of what
//! a host's agent reports, not on every report.

use std::collections::{BTreeMap, BTreeSet};

use super::Controller;
use crate::backend::Backend;
use crate::control::metrics::label;

impl<B: Backend> Controller<B> {
    /// Logs (and counts) when the reserved condition types a host's agent reports change:
    /// they are ignored ([`crate::control::snapshot`] judges `Ready` itself), once per change.
    pub(super) fn note_reserved_conditions(
        &mut self,
        report: &metalguard_api::protocol::AgentReport,
    ) {
        let Some(change) = self.reserved_seen.observe(report) else {
            return;
        };
        for condition in &change.added {
            self.metrics
                .reserved_conditions_ignored
                .get_or_create(&label("condition", condition))
                .inc();
        }
        if change.now.is_empty() {
            tracing::info!(host = %report.host, "agent no longer reports reserved condition types");
        } else {
            let list = change.now.iter().cloned().collect::<Vec<_>>().join(", ");
            tracing::warn!(host = %report.host, conditions = %list, "agent reports reserved condition types; they are ignored: the controller judges Ready from the other conditions");
        }
    }
}

/// The reserved condition types ([`metalguard_api::protocol::RESERVED_CONDITION_TYPES`]) each
/// host's agent reported last, so that ignoring them is told once per change, not per report.
#[derive(Debug, Default)]
pub(super) struct ReservedSeen(BTreeMap<String, BTreeSet<String>>);

/// A change in the reserved types one agent reports.
#[derive(Debug, PartialEq, Eq)]
pub(super) struct ReservedChange {
    /// Types it reports now and did not before.
    added: Vec<String>,
    /// Every reserved type it reports now (empty: it stopped).
    now: BTreeSet<String>,
}

impl ReservedSeen {
    /// The change `report` brings for its host, if any.
    fn observe(
        &mut self,
        report: &metalguard_api::protocol::AgentReport,
    ) -> Option<ReservedChange> {
        let now: BTreeSet<String> = report
            .conditions
            .iter()
            .filter(|c| metalguard_api::protocol::is_reserved_condition(&c.type_))
            .map(|c| c.type_.clone())
            .collect();
        let before = self.0.get(&report.host).cloned().unwrap_or_default();
        if before == now {
            return None;
        }
        let added = now.difference(&before).cloned().collect();
        if now.is_empty() {
            self.0.remove(&report.host);
        } else {
            self.0.insert(report.host.clone(), now.clone());
        }
        Some(ReservedChange { added, now })
    }
}

#[cfg(test)]
mod tests {
    use metalguard_api::duration::Timestamp;

    use super::*;

    #[test]
    fn reserved_conditions_are_told_once_per_change() {
        use metalguard_api::protocol::Condition;
        use metalguard_api::snapshot::ConditionStatus;
        let with = |types: &[&str]| {
            let mut stored = crate::testkit::stored_report("cp-1", 1, None);
            stored.report.conditions = types
                .iter()
                .map(|t| Condition {
                    type_: (*t).into(),
                    status: ConditionStatus::True,
                    reason: "r".into(),
                    message: String::new(),
                    last_transition: Timestamp(1),
                })
                .collect();
            stored.report
        };
        let mut seen = ReservedSeen::default();
        assert_eq!(seen.observe(&with(&["EtcdMemberHealthy"])), None);
        let first = seen
            .observe(&with(&["Ready", "EtcdMemberHealthy"]))
            .unwrap();
        assert_eq!(first.added, ["Ready"]);
        assert_eq!(
            seen.observe(&with(&["Ready", "EtcdMemberHealthy"])),
            None,
            "the same again: not told"
        );
        let more = seen.observe(&with(&["Ready", "DiskPressure"])).unwrap();
        assert_eq!(more.added, ["DiskPressure"]);
        assert_eq!(more.now.len(), 2);
        let gone = seen.observe(&with(&["EtcdMemberHealthy"])).unwrap();
        assert!(gone.added.is_empty() && gone.now.is_empty());
        assert_eq!(seen.observe(&with(&[])), None);
    }
}
