//! Which hosts a round observes (issue 27): a host's observed status ([`super::status`]) is
//! derived again only when something it is derived from may have changed since the last
//! round:
//! - its `GuardedHost` or Node (the state's revisions, our own writes included);
//! - what a round lays over the stored state: its agent's report, a hold, a node lease, a
//!   fence or BMC check request, a retirement, an active remediation (now or last round);
//! - its etcd member, as the agents' views name it (now or last round);
//! - the health checks that find it unhealthy;
//! - the fence executor the plan chose for it, and what any agent reports of its BMC (its
//!   reachability and credentialed check, not the time of the probe), and whether that agent
//!   turned silent or spoke again;
//! - a write of its status that failed.
//!
//! Everything is observed when the state keeps no revisions, at the first round, after a
//! leadership change, and every [`RESYNC`] in any case (a safety net, as controllers resync
//! their caches). The tests run rounds both ways and compare what is written.

use std::collections::{BTreeMap, BTreeSet};

use metalguard_api::protocol::BmcCheck;
use metalguard_api::snapshot::Host;

use super::status;
use crate::backend::Judged;

/// How often every host is observed whatever changed.
pub const RESYNC: std::time::Duration = std::time::Duration::from_secs(600);

/// What the observations read of one probe: reachable, its error, its check.
type Probe = (bool, Option<String>, Option<BmcCheck>);

/// What the last round's observations were derived from.
#[derive(Debug, Default)]
pub struct ObserveScope {
    /// The state's revision then; `None`: observe everything next.
    revision: Option<u64>,
    volatile: BTreeSet<String>,
    members: BTreeSet<String>,
    unhealthy: BTreeMap<String, Vec<String>>,
    executors: BTreeMap<String, String>,
    /// Per reporting agent: whether it was silent, and its probes by target.
    agents: BTreeMap<String, (bool, BTreeMap<String, Probe>)>,
    /// Hosts whose status write failed: observed again.
    retry: BTreeSet<String>,
    /// When every host was last observed.
    everything_at: Option<metalguard_api::duration::Timestamp>,
    /// Tests: observe every host every round (the reference the scope is compared with).
    #[cfg(test)]
    pub everything: bool,
}

/// The hosts whose entries a round lays over the stored state, and those with a BMC check
/// request (its answer is in another host's report).
fn volatile(judged: &Judged<'_>) -> BTreeSet<String> {
    let mut hosts = crate::control::snapshot_cache::volatile(judged.state);
    hosts.extend(judged.state.bmc_check_requests.keys().cloned());
    hosts
}

/// `name`'s entry in the snapshot (sorted by name in this backend; searched otherwise).
pub fn find<'a>(hosts: &'a [Host], name: &str) -> Option<&'a Host> {
    match hosts.binary_search_by(|h| h.name.as_str().cmp(name)) {
        Ok(i) => hosts.get(i),
        Err(_) => hosts.iter().find(|h| h.name == name),
    }
}

impl ObserveScope {
    /// Observe every host at the next round (a new leadership).
    pub fn forget(&mut self) {
        self.revision = None;
    }

    /// A status write of `host` failed: observe it again next round.
    pub fn retry(&mut self, host: &str) {
        self.retry.insert(host.to_owned());
    }

    /// The hosts to observe this round; `None` for every host.
    pub fn hosts(&mut self, judged: &Judged<'_>) -> Option<BTreeSet<String>> {
        let now = judged.snapshot.observed_at;
        let changes = judged.state.changes.as_ref();
        #[cfg(not(test))]
        let resync = self.everything_at.is_none_or(|at| now.since(at) >= RESYNC);
        #[cfg(test)]
        let resync = self.everything || self.everything_at.is_none_or(|at| now.since(at) >= RESYNC);
        let mut touched: Option<BTreeSet<String>> = self
            .revision
            .filter(|_| !resync)
            .and_then(|r| changes?.changed_since(r))
            .map(|c| c.into_iter().map(str::to_owned).collect());
        if touched.is_none() {
            self.everything_at = Some(now);
        }
        self.revision = changes.map(crate::backend::revisions::HostRevisions::revision);
        let mut touch = |host: &str| {
            if let Some(t) = touched.as_mut() {
                t.insert(host.to_owned());
            }
        };
        for host in std::mem::take(&mut self.retry) {
            touch(&host);
        }
        let volatile = volatile(judged);
        for host in volatile.iter().chain(&self.volatile) {
            touch(host);
        }
        self.volatile = volatile;
        let members: BTreeSet<String> = judged
            .state
            .reports
            .values()
            .filter_map(|r| r.report.etcd.as_ref())
            .flat_map(|view| view.members.iter().map(|m| m.name.clone()))
            .collect();
        for host in members.iter().chain(&self.members) {
            touch(host);
        }
        self.members = members;
        let mut unhealthy: BTreeMap<String, Vec<String>> = BTreeMap::new();
        for check in &judged.plan.health {
            for host in &check.unhealthy {
                unhealthy
                    .entry(host.clone())
                    .or_default()
                    .push(check.name.clone());
            }
        }
        for host in unhealthy.keys().chain(self.unhealthy.keys()) {
            if unhealthy.get(host) != self.unhealthy.get(host) {
                touch(host);
            }
        }
        self.unhealthy = unhealthy;
        let executors = &judged.plan.fence_executors;
        if *executors != self.executors {
            for host in executors.keys().chain(self.executors.keys()) {
                if executors.get(host) != self.executors.get(host) {
                    touch(host);
                }
            }
            self.executors.clone_from(executors);
        }
        let mut reporting: BTreeSet<&str> = BTreeSet::new();
        for (agent, stored) in &judged.state.reports {
            reporting.insert(agent);
            let silent = find(&judged.snapshot.hosts, agent).is_none_or(|h| {
                status::agent_silent(h, status::heartbeat_timeout(judged.policy, h), now)
            });
            let (was_silent, probes) = self.agents.entry(agent.clone()).or_default();
            let everything = *was_silent != silent;
            *was_silent = silent;
            let mut seen: BTreeSet<&str> = BTreeSet::new();
            for p in &stored.report.bmc_reachability {
                seen.insert(&p.host);
                let same = probes
                    .get(&p.host)
                    .is_some_and(|(reachable, error, check)| {
                        *reachable == p.reachable && *error == p.error && *check == p.check
                    });
                if !same || everything {
                    touch(&p.host);
                }
                if !same {
                    probes.insert(
                        p.host.clone(),
                        (p.reachable, p.error.clone(), p.check.clone()),
                    );
                }
            }
            if probes.len() != seen.len() || everything {
                probes.retain(|host, _| {
                    let keep = seen.contains(host.as_str());
                    if !keep || everything {
                        touch(host);
                    }
                    keep
                });
            }
        }
        self.agents.retain(|agent, (_, probes)| {
            let keep = reporting.contains(agent.as_str());
            if !keep {
                for host in probes.keys() {
                    touch(host);
                }
            }
            keep
        });
        touched
    }
}
