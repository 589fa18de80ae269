//! What a round's observations ([`super::status`]) need about other hosts, gathered once per
//! round.

use std::collections::BTreeMap;

use metalguard_api::duration::Timestamp;

use super::status::{agent_silent, heartbeat_timeout};
use crate::backend::Judged;
use crate::control::fencing::Readiness;

/// What a round's observations need about other hosts, gathered in one pass over the judged
/// snapshot and plan: per host, the checks that find it unhealthy and the agents of other
/// hosts whose fresh report reaches its BMC. Asked per host, both were a pass over every
/// host (at 5,000 hosts, 25 million name comparisons and ~0.2 s a round).
#[derive(Debug, Default)]
pub struct RoundIndex<'a> {
    pub(super) unhealthy_in: BTreeMap<&'a str, Vec<&'a str>>,
    pub(super) reached_by: BTreeMap<&'a str, Vec<&'a str>>,
    /// Per host with a BMC, the would-be executor's latest credentialed check.
    pub(super) fencing: BTreeMap<String, Readiness>,
}

impl<'a> RoundIndex<'a> {
    /// The index of `judged` at `now`, its fencing readiness for `only` the hosts named
    /// there (`None`: every host).
    pub fn of(
        judged: &Judged<'a>,
        now: Timestamp,
        only: Option<&std::collections::BTreeSet<String>>,
    ) -> Self {
        let mut index = Self::default();
        for check in &judged.plan.health {
            for host in &check.unhealthy {
                let checks = index.unhealthy_in.entry(host.as_str()).or_default();
                if !checks.contains(&check.name.as_str()) {
                    checks.push(check.name.as_str());
                }
            }
        }
        for other in &judged.snapshot.hosts {
            let Some(agent) = other.agent.as_ref() else {
                continue;
            };
            if agent_silent(other, heartbeat_timeout(judged.policy, other), now) {
                continue;
            }
            for (target, reachable) in &agent.bmc_reachable {
                if *reachable && *target != other.name {
                    index
                        .reached_by
                        .entry(target.as_str())
                        .or_default()
                        .push(other.name.as_str());
                }
            }
        }
        // Only the hosts observed this round: a pass over every host here was most of a
        // round's observations at 5,000 hosts when a handful are observed.
        let hosts: Vec<&str> = match only {
            None => judged
                .snapshot
                .hosts
                .iter()
                .filter(|h| h.bmc_configured)
                .map(|h| h.name.as_str())
                .collect(),
            Some(only) => only
                .iter()
                .filter_map(|name| super::observe_scope::find(&judged.snapshot.hosts, name))
                .filter(|h| h.bmc_configured)
                .map(|h| h.name.as_str())
                .collect(),
        };
        index.fencing = crate::control::fencing::readiness_of(
            hosts.into_iter(),
            judged.state,
            &judged.plan.fence_executors,
        );
        index
    }

    pub(super) fn unhealthy_in(&self, host: &str) -> &[&'a str] {
        self.unhealthy_in.get(host).map_or(&[], Vec::as_slice)
    }

    pub(super) fn reached_by(&self, host: &str) -> &[&'a str] {
        self.reached_by.get(host).map_or(&[], Vec::as_slice)
    }
}
