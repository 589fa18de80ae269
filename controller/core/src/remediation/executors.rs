//! The agents that may drive a fence this round, and the choice of one for a target.
//!
//! The plan names an executor for every host with a BMC (`fence_executors`), so the choice
//! runs once per host and round. Built as a filtered copy of every candidate per target, it
//! was quadratic when every host runs an agent: 71 % of a 5,000-host plan, and worse at
//! 20,000 (`benches/plan.rs`). Here a choice looks at few candidates: the current executor
//! by binary search, then the candidates in name order, skipping at once each run of
//! neighbours that share the target's failure domain.

use metalguard_api::snapshot::Host;

use super::no_executor_reason;

/// The candidates, sorted by name, and where each one's run of equal failure domains ends.
#[derive(Debug, Default)]
pub(crate) struct Executors<'a> {
    hosts: Vec<&'a Host>,
    /// `run_end[i]`: the first index after `i` whose failure domain differs from `hosts[i]`'s
    /// (or the length).
    run_end: Vec<usize>,
}

/// Whether `candidate` may drive `target`'s BMC: it is not the target, and its agent has not
/// reported that it cannot reach that BMC (one that has not said is kept: older agents,
/// nothing probed yet).
fn eligible(candidate: &Host, target: &Host) -> bool {
    candidate.name != target.name
        && !candidate
            .agent
            .as_ref()
            .is_some_and(|a| a.cannot_reach_bmc_of(&target.name))
}

impl<'a> Executors<'a> {
    /// The candidates `hosts` (names unique: the snapshot is validated before planning).
    pub(crate) fn new(mut hosts: Vec<&'a Host>) -> Self {
        hosts.sort_by(|a, b| a.name.cmp(&b.name));
        let mut run_end = vec![hosts.len(); hosts.len()];
        for i in (0..hosts.len().saturating_sub(1)).rev() {
            run_end[i] = if hosts[i + 1].failure_domain == hosts[i].failure_domain {
                run_end[i + 1]
            } else {
                i + 1
            };
        }
        Self { hosts, run_end }
    }

    fn position(&self, name: &str) -> Option<usize> {
        self.hosts
            .binary_search_by(|h| h.name.as_str().cmp(name))
            .ok()
    }

    /// The executor of a fence of `target`: `current` while it is eligible, else the first
    /// eligible candidate by name in another failure domain than the target's (when the
    /// target has one), else the first eligible one. `Err` says why there is none.
    pub(crate) fn choose(&self, target: &Host, current: Option<&str>) -> Result<&'a Host, String> {
        if let Some(h) = current
            .and_then(|c| self.position(c))
            .map(|i| self.hosts[i])
            .filter(|h| eligible(h, target))
        {
            return Ok(h);
        }
        if target.failure_domain.is_some() {
            let mut i = 0;
            while let Some(h) = self.hosts.get(i) {
                if h.failure_domain == target.failure_domain {
                    i = self.run_end[i];
                    continue;
                }
                if eligible(h, target) {
                    return Ok(h);
                }
                i += 1;
            }
        }
        self.hosts
            .iter()
            .copied()
            .find(|h| eligible(h, target))
            .ok_or_else(|| {
                let candidates =
                    self.hosts.len() - usize::from(self.position(&target.name).is_some());
                no_executor_reason(candidates, &target.name)
            })
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use metalguard_api::duration::Timestamp;
    use metalguard_api::snapshot::AgentReport;
    use proptest::prelude::*;

    use super::*;

    /// The choice as first written: a filtered copy of every candidate per target.
    fn by_copy<'a>(
        candidates: &[&'a Host],
        target: &Host,
        current: Option<&str>,
    ) -> Result<&'a Host, String> {
        let mut sorted = candidates.to_vec();
        sorted.sort_by(|a, b| a.name.cmp(&b.name));
        let others: Vec<&Host> = sorted
            .into_iter()
            .filter(|h| h.name != target.name)
            .collect();
        let count = others.len();
        let eligible: Vec<&Host> = others
            .into_iter()
            .filter(|h| {
                !h.agent
                    .as_ref()
                    .is_some_and(|a| a.cannot_reach_bmc_of(&target.name))
            })
            .collect();
        if let Some(c) = current
            && let Some(h) = eligible.iter().find(|h| h.name == c)
        {
            return Ok(h);
        }
        eligible
            .iter()
            .find(|h| target.failure_domain.is_some() && h.failure_domain != target.failure_domain)
            .or_else(|| eligible.first())
            .copied()
            .ok_or_else(|| no_executor_reason(count, &target.name))
    }

    fn host(i: usize, domain: Option<u8>, unreachable: &[usize]) -> Host {
        let mut h: Host = serde_json::from_value(serde_json::json!({
            "name": format!("h-{i}"), "role": "worker", "created_at": 0,
        }))
        .unwrap();
        h.failure_domain = domain.map(|d| format!("d{d}"));
        h.agent = Some(AgentReport {
            last_heartbeat: Timestamp(0),
            can_fence: true,
            bmc_reachable: unreachable
                .iter()
                .map(|t| (format!("h-{t}"), false))
                .collect::<BTreeMap<_, _>>(),
            boot_id: None,
            boot_reported_at: None,
        });
        h
    }

    proptest! {
        /// Any candidates (domains in runs or mixed, some unable to reach some BMCs), any
        /// target among them or not, any current executor: the same choice, or the same reason.
        #[test]
        fn the_choice_is_the_one_a_copy_per_target_makes(
            hosts in proptest::collection::vec(
                (proptest::option::of(0u8..3), proptest::collection::vec(0usize..12, 0..4)),
                0..12,
            ),
            candidate_mask in proptest::collection::vec(any::<bool>(), 12),
            target in 0usize..14,
            target_domain in proptest::option::of(0u8..3),
            current in proptest::option::of(0usize..14),
        ) {
            let all: Vec<Host> = hosts
                .iter()
                .enumerate()
                .map(|(i, (d, u))| host(i, *d, u))
                .collect();
            let candidates: Vec<&Host> = all
                .iter()
                .enumerate()
                .filter(|(i, _)| candidate_mask[*i])
                .map(|(_, h)| h)
                .collect();
            let target = all
                .get(target)
                .cloned()
                .unwrap_or_else(|| host(target, target_domain, &[]));
            let current = current.map(|c| format!("h-{c}"));
            let chosen = Executors::new(candidates.clone()).choose(&target, current.as_deref());
            let expected = by_copy(&candidates, &target, current.as_deref());
            prop_assert_eq!(
                chosen.map(|h| h.name.clone()),
                expected.map(|h| h.name.clone())
            );
        }
    }
}
