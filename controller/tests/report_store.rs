//! Which reports reach etcd (issue 16): unchanged ones once per heartbeat interval, changes at
//! most once a second, while every report still counts as a heartbeat — a silent agent is
//! fenced at its timeout — and the etcd writes per agent per minute, measured
//! (`scripts/bench-report-writes.sh`).

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use metalguard_api::snapshot::ConditionStatus;
use metalguard_e2e::ports::reserve_port;

#[tokio::test(flavor = "multi_thread")]
async fn unchanged_reports_are_stored_once_per_heartbeat_interval_and_a_silent_agent_is_still_fenced()
 {
    use metalguard_api::protocol::{CommandKind, PowerAction};
    let lab = Lab::start();
    let port = reserve_port().unwrap();
    let p = port.port();
    // Heartbeat timeout 4 s: unchanged reports are stored once a second (a quarter of it).
    let text = std::fs::read_to_string(lab.inventory("base", p)).unwrap()
        + "\n[[policy.health_checks]]\nname = \"workers\"\nselector = { role = \"worker\" }\n\
           agent_heartbeat_timeout = \"4s\"\n";
    let inventory = lab.dir.path().join("heartbeat.toml");
    std::fs::write(&inventory, text).unwrap();
    let controller = lab.controller_from("ctl-h", &inventory);
    let (cp1, w1, w2) = (
        client(&lab.tls(), Some("cp-1")),
        client(&lab.tls(), Some("w-1")),
        client(&lab.tls(), Some("w-2")),
    );
    wait_leader(&w1, p, Duration::from_secs(15)).await;
    let mut voter = report("cp-1", 1);
    voter.etcd = Some(single_voter_view());
    let before = key_version(&lab.etcd, W1_REPORT_KEY);
    // Everyone reports twice a second, unchanged, for 6 s.
    let started = Instant::now();
    let mut sequence = 1;
    while started.elapsed() < Duration::from_secs(6) {
        sequence += 1;
        voter.sequence = sequence;
        assert!(send(&cp1, p, &voter).await);
        assert!(send(&w1, p, &report("w-1", sequence)).await);
        assert!(send(&w2, p, &report("w-2", sequence)).await);
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let writes = key_version(&lab.etcd, W1_REPORT_KEY) - before;
    eprintln!("w-1: {} reports in 6 s, {writes} stored", sequence - 1);
    assert!(
        (3..=8).contains(&writes),
        "{writes} writes of w-1's report in 6 s"
    );
    assert!(
        operation_keys(&lab.etcd).is_empty(),
        "an agent that kept reporting was taken for silent\n{}",
        controller.log_tail(40)
    );
    // w-1 falls silent; the others go on. It is fenced through another agent once its
    // heartbeat is 4 s old.
    let silent = Instant::now();
    let fence = loop {
        sequence += 1;
        voter.sequence = sequence;
        assert!(send(&cp1, p, &voter).await);
        assert!(send(&w2, p, &report("w-2", sequence)).await);
        let offered: Vec<_> = [
            poll(&cp1, p, "cp-1", Duration::ZERO).await,
            poll(&w2, p, "w-2", Duration::ZERO).await,
        ]
        .into_iter()
        .flat_map(|b| b.commands)
        .collect();
        if let Some(c) = offered.into_iter().find(|c| {
            matches!(&c.kind, CommandKind::Fence(f) if f.target == "w-1" && f.action == PowerAction::Off)
        }) {
            break c;
        }
        assert!(
            silent.elapsed() < Duration::from_secs(15),
            "silent w-1 was never fenced\n{}",
            controller.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    let after = silent.elapsed();
    eprintln!(
        "silent w-1 fenced {after:?} after its last report ({})",
        fence.operation_id
    );
    assert!(
        after >= Duration::from_millis(3_500),
        "fenced after {after:?}"
    );
    assert!(after <= Duration::from_secs(8), "fenced after {after:?}");
}

/// etcd writes of one agent's report per minute, for three kinds of agent, over
/// `METALGUARD_BENCH_SECONDS` (default 20 s): one reporting every second unchanged (the lab's
/// report interval), one whose condition flips on every report, once a second, and one
/// posting a changing report every 5 ms (up to 200 a second). Printed for docs/benchmarks.md
/// (`scripts/bench-report-writes.sh`).
#[tokio::test(flavor = "multi_thread")]
async fn etcd_writes_per_agent_per_minute() {
    let seconds: u64 = std::env::var("METALGUARD_BENCH_SECONDS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let lab = Lab::start();
    let port = reserve_port().unwrap();
    let p = port.port();
    let controller = lab.controller("ctl-b", &port);
    let (steady, flapping, flood) = (
        client(&lab.tls(), Some("cp-1")),
        client(&lab.tls(), Some("w-1")),
        client(&lab.tls(), Some("w-2")),
    );
    wait_leader(&flapping, p, Duration::from_secs(15)).await;
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let keys = ["cp-1", "w-1", "w-2"].map(|h| format!("/metalguard/reports/{h}"));
    let before = keys.clone().map(|k| key_version(&lab.etcd, &k));
    let run = Duration::from_secs(seconds);
    let started = Instant::now();
    let flooder = {
        let flood = flood.clone();
        tokio::spawn(async move {
            let (mut sent, mut taken) = (0u64, 0u64);
            while started.elapsed() < run {
                sent += 1;
                let mut r = report("w-2", sent);
                let status = if sent.is_multiple_of(2) {
                    ConditionStatus::True
                } else {
                    ConditionStatus::False
                };
                r.conditions = vec![kubelet(status, sent, String::new())];
                taken += u64::from(send(&flood, p, &r).await);
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (sent, taken)
        })
    };
    let mut second = 0u64;
    while started.elapsed() < run {
        second += 1;
        assert!(send(&steady, p, &report("cp-1", second)).await);
        let mut r = report("w-1", second);
        let status = if second.is_multiple_of(2) {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        };
        r.conditions = vec![kubelet(status, second, String::new())];
        assert!(send(&flapping, p, &r).await);
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let (flood_sent, flood_taken) = flooder.await.unwrap();
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let per_minute = |i: usize| {
        let writes = key_version(&lab.etcd, &keys[i]) - before[i];
        let count = f64::from(u32::try_from(writes).unwrap());
        (writes, count * 60.0 / run.as_secs_f64())
    };
    let (steady_w, steady_m) = per_minute(0);
    let (flap_w, flap_m) = per_minute(1);
    let (flood_w, flood_m) = per_minute(2);
    eprintln!(
        "over {seconds} s:\n  steady (1 report/s, unchanged): {second} reports, {steady_w} etcd writes = {steady_m:.1}/min\n  \
         flapping (1 report/s, each a change): {second} reports, {flap_w} etcd writes = {flap_m:.1}/min\n  \
         flood (every 5 ms, each a change): {flood_sent} sent, {flood_taken} accepted, {flood_w} etcd writes = {flood_m:.1}/min"
    );
    let minutes = run.as_secs_f64() / 60.0;
    assert!(
        steady_m <= 60.0 / 15.0 + 1.0 / minutes,
        "{steady_m}/min\n{}",
        controller.log_tail(20)
    );
    assert!(flap_m <= 61.0 + 1.0 / minutes, "{flap_m}/min");
    assert!(flood_m <= 61.0 + 1.0 / minutes, "{flood_m}/min");
}
