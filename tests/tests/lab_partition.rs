//! End to end: a network partition of one host, with real network namespaces. A three-host
//! lab runs every host in its own namespace (its etcd member and agent listen on its own
//! address in 198.18.0.0/15; the controller and the BMC emulators on the lab bridge). The
//! current etcd leader's link goes down — the hardest case, as the majority must elect a new
//! leader — while its processes keep running. The controller must fence it, through another
//! host's agent, within the configured timeouts plus the scenario overhead; the majority must
//! keep accepting writes; after the repair the host must come back with every key present;
//! and once the lab is dropped no namespace or link of it may be left.
//!
//! Needs root (`ip netns`, veth, bridge): as any other user it fails, it does not skip.
//! Runs in the nextest test group `lab` (binary name `lab*`), one lab at a time.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use metalguard_e2e::lab::scenarios::{self, PartitionOutcome};
use metalguard_e2e::lab::{Lab, LabOptions};
use metalguard_e2e::netns;

fn effective_uid() -> u32 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").unwrap().uid()
}

/// The index of the member etcd reports as leader (`etcdctl endpoint status`).
fn etcd_leader(lab: &Lab) -> usize {
    let out = lab
        .etcd()
        .etcdctl(&["endpoint", "status", "-w", "json"])
        .unwrap();
    let statuses: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    let leader = statuses[0]["Status"]["leader"].as_u64().unwrap();
    let endpoint = statuses
        .iter()
        .find(|s| s["Status"]["header"]["member_id"].as_u64() == Some(leader))
        .and_then(|s| s["Endpoint"].as_str())
        .unwrap_or_else(|| panic!("no endpoint reports the leader {leader:x}: {out}"));
    lab.etcd()
        .endpoints()
        .iter()
        .position(|e| e == endpoint)
        .unwrap_or_else(|| panic!("leader endpoint {endpoint} is not a lab member"))
}

/// Every way the outcome can differ from the expected one.
fn failures(outcome: &PartitionOutcome) -> Vec<String> {
    let mut failed = Vec::new();
    if outcome.power_offs != 1 {
        failed.push(format!(
            "{} power-offs of {}, expected exactly one",
            outcome.power_offs, outcome.target
        ));
    }
    if !outcome.other_power_events.is_empty() {
        failed.push(format!(
            "power events on other hosts: {:?}",
            outcome.other_power_events
        ));
    }
    match outcome.executor.as_deref() {
        None => failed.push("the status shows no fence operation".into()),
        Some(e) if e == outcome.target => {
            failed.push(format!("{e} fenced itself; another host's agent must"));
        }
        Some(_) => {}
    }
    if outcome.fenced_after > outcome.fence_budget {
        failed.push(format!(
            "fenced after {:.1}s, beyond the configured timeouts + overhead ({:.0}s)",
            outcome.fenced_after.as_secs_f64(),
            outcome.fence_budget.as_secs_f64()
        ));
    }
    if outcome.writes.succeeded_after_grace == 0 {
        failed.push(format!(
            "no write through the majority issued after the {:.1}s election grace succeeded \
             during the partition",
            outcome.writes.grace.as_secs_f64()
        ));
    }
    if !outcome.writes.failed_after_grace.is_empty() {
        failed.push(format!(
            "writes through the majority failed after the {:.1}s election grace: {:?}",
            outcome.writes.grace.as_secs_f64(),
            outcome.writes.failed_after_grace
        ));
    }
    if !outcome.missing.is_empty() {
        failed.push(format!(
            "{} of {} keys missing after recovery: {:?}",
            outcome.missing.len(),
            outcome.keys,
            outcome.missing
        ));
    }
    if !outcome.report.ok {
        failed.push(format!(
            "the scenario's own verdict: {}",
            outcome.report.seen
        ));
    }
    failed
}

#[test]
fn a_partitioned_leader_is_fenced_by_a_peer_while_the_majority_keeps_serving() {
    let uid = effective_uid();
    assert!(
        uid == 0,
        "this test creates network namespaces, veth pairs and a bridge and needs root; \
         running as uid {uid} (run it as root, e.g. in the project's container)"
    );
    let mut options = LabOptions::new(3, metalguard_e2e::lab::test_bin_dir());
    options.netns = true;
    // The timeline as it grows: the test harness shows it when the lab fails to start too.
    options.live = true;
    let mut lab = match Lab::start(options) {
        Ok(lab) => lab,
        Err(e) => panic!("the lab did not start: {e}"),
    };
    let tag = lab.network().unwrap().tag().to_owned();
    assert!(
        !netns::leftovers(&tag).unwrap().is_empty(),
        "the lab's namespaces and links are not listed under {tag}: the leftover check below would prove nothing"
    );
    let target = etcd_leader(&lab);
    let outcome = match scenarios::observe_partition(&mut lab, target) {
        Ok(outcome) => outcome,
        Err(e) => panic!(
            "the partition scenario failed: {e}\n--- timeline\n{}\n--- logs\n{}",
            lab.timeline.render(),
            lab.logs()
        ),
    };
    let failed = failures(&outcome);
    if !failed.is_empty() {
        lab.keep_dir();
    }
    assert!(
        failed.is_empty(),
        "partition of {} (the etcd leader):\n  {}\n--- timeline\n{}\n--- logs\n{}",
        outcome.target,
        failed.join("\n  "),
        lab.timeline.render(),
        lab.logs()
    );
    println!("{}", outcome.report.seen);
    drop(lab);
    let left = netns::leftovers(&tag).unwrap();
    assert!(
        left.is_empty(),
        "namespaces or links of the lab left after it was dropped: {left:?}"
    );
}
