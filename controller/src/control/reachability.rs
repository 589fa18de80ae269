//! `status`: which agents reach each BMC, from the `bmc_reachability` of their stored reports.
//!
//! An agent probes, without credentials, the BMCs the controller listed in its report
//! answers (every other inventory host's); the executor choice passes over an agent whose
//! latest fresh report says it cannot reach the target's BMC. This view lets a person check,
//! before a fence is needed, that some agent can.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use metalguard_api::duration::Timestamp;

use crate::backend::State;
use crate::inventory::Inventory;

/// One line per inventory host with a BMC: the agents whose latest report reached it, and
/// those that did not with their error. Reports older than the policy's executor heartbeat
/// timeout are marked stale (the executor choice ignores those agents altogether).
pub fn render(inventory: &Inventory, state: &State, now: Timestamp) -> String {
    let heartbeat = inventory.policy.remediation.executor_heartbeat_timeout;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "bmc reachability (agents' latest probes, no credentials):"
    );
    for host in inventory.hosts.iter().filter(|h| h.bmc.is_some()) {
        let mut reached = Vec::new();
        let mut failed = Vec::new();
        for (agent, stored) in state.reports.iter().filter(|(a, _)| **a != host.name) {
            let Some(probe) = stored
                .report
                .bmc_reachability
                .iter()
                .find(|r| r.host == host.name)
            else {
                continue;
            };
            let age_note = if stored.received_at.after(heartbeat) > now {
                ""
            } else {
                " (stale report)"
            };
            if probe.reachable {
                reached.push(format!("{agent}{age_note}"));
            } else {
                let why = probe.error.as_deref().unwrap_or("no reason given");
                failed.push(format!("{agent}{age_note}: {why}"));
            }
        }
        let address = host.bmc.as_ref().map_or("", |b| b.address.as_str());
        if reached.is_empty() && failed.is_empty() {
            let _ = writeln!(out, "  {} ({address}): no agent reported on it", host.name);
            continue;
        }
        let reached = if reached.is_empty() {
            "NO agent".to_owned()
        } else {
            reached.join(", ")
        };
        let _ = writeln!(out, "  {} ({address}): reached by {reached}", host.name);
        for line in failed {
            let _ = writeln!(out, "    NOT reached by {line}");
        }
    }
    out
}

/// Per inventory host with a BMC, how many other hosts' agents reached that BMC in their
/// latest report, counting only reports fresh enough for the executor choice (received within
/// the policy's executor heartbeat timeout). Zero means no agent can fence the host now.
pub fn count_reaching_agents<'a>(
    inventory: &'a Inventory,
    state: &State,
    now: Timestamp,
) -> BTreeMap<&'a str, usize> {
    let heartbeat = inventory.policy.remediation.executor_heartbeat_timeout;
    // One pass over the fresh reports (each agent probes every BMC): per host and round, a
    // search of every report was hosts x agents x BMCs, 125 million comparisons at 5,000.
    let mut reached: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
    for (agent, stored) in &state.reports {
        if stored.received_at.after(heartbeat) <= now {
            continue;
        }
        for probe in stored
            .report
            .bmc_reachability
            .iter()
            .filter(|r| r.reachable)
        {
            if probe.host != *agent {
                reached.entry(&probe.host).or_default().insert(agent);
            }
        }
    }
    inventory
        .hosts
        .iter()
        .filter(|h| h.bmc.is_some())
        .map(|host| {
            let count = reached.get(host.name.as_str()).map_or(0, BTreeSet::len);
            (host.name.as_str(), count)
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use metalguard_api::protocol::BmcReachability;

    use super::*;
    use crate::backend::StoredReport;

    const INVENTORY: &str = r#"
[etcd]
endpoints = ["http://127.0.0.1:2379"]

[control_plane]
desired_replicas = 1

[[hosts]]
name = "cp-1"
role = "control-plane"

[[hosts]]
name = "w-1"
role = "worker"

[[hosts]]
name = "w-2"
role = "worker"
bmc = { address = "ipmi://10.0.0.2", credentials_dir = "/nonexistent" }

[[hosts]]
name = "w-3"
role = "worker"
bmc = { address = "ipmi://10.0.0.3", credentials_dir = "/nonexistent" }
"#;

    fn stored(host: &str, received_at: u64, probes: &[(&str, Option<&str>)]) -> StoredReport {
        let mut stored = crate::testkit::stored_report(host, received_at, None);
        stored.report.bmc_reachability = probes
            .iter()
            .map(|(target, error)| BmcReachability {
                host: (*target).into(),
                reachable: error.is_none(),
                checked_at: Timestamp(received_at),
                error: error.map(str::to_owned),
                check: None,
            })
            .collect();
        stored
    }

    #[test]
    fn each_bmc_lists_who_reaches_it_and_why_others_do_not() {
        let inventory =
            Inventory::parse(std::path::Path::new("i.toml"), INVENTORY).expect("inventory");
        let mut state = State::default();
        let now = Timestamp(1_000_000);
        state.reports.insert(
            "cp-1".into(),
            stored(
                "cp-1",
                now.0 - 1_000,
                &[("w-2", Some("bmc 10.0.0.2:623 refused ipmi"))],
            ),
        );
        state
            .reports
            .insert("w-1".into(), stored("w-1", now.0 - 1_000, &[("w-2", None)]));
        assert_eq!(
            count_reaching_agents(&inventory, &state, now),
            BTreeMap::from([("w-2", 1), ("w-3", 0)])
        );
        let text = render(&inventory, &state, now);
        assert_eq!(
            text,
            "bmc reachability (agents' latest probes, no credentials):\n  \
             w-2 (ipmi://10.0.0.2): reached by w-1\n    \
             NOT reached by cp-1: bmc 10.0.0.2:623 refused ipmi\n  \
             w-3 (ipmi://10.0.0.3): no agent reported on it\n"
        );
        // Only cp-1, long silent, says anything about w-2: nobody fresh reaches it.
        state.reports.remove("w-1");
        let later = Timestamp(now.0 + 3_600_000);
        assert_eq!(
            count_reaching_agents(&inventory, &state, later),
            BTreeMap::from([("w-2", 0), ("w-3", 0)]),
            "a stale report counts for nothing"
        );
        let text = render(&inventory, &state, later);
        assert!(
            text.contains("w-2 (ipmi://10.0.0.2): reached by NO agent\n    NOT reached by cp-1 (stale report): "),
            "{text}"
        );
    }
}
