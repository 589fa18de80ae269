//! Leadership with the real binary on real etcd: one leader of two, hand-over on kill and on
//! SIGTERM, and no acting without etcd quorum.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use metalguard_e2e::etcd::EtcdCluster;
use metalguard_e2e::ports::reserve_port;

#[tokio::test(flavor = "multi_thread")]
async fn exactly_one_of_two_controllers_leads_and_a_killed_leader_is_replaced_within_the_lease() {
    let lab = Lab::start();
    let (port_a, port_b) = (reserve_port().unwrap(), reserve_port().unwrap());
    let mut a = lab.controller("ctl-a", &port_a);
    let mut b = lab.controller("ctl-b", &port_b);
    let w1 = client(&lab.tls(), Some("w-1"));
    // Wait until one leads, then check the other does not.
    let started = Instant::now();
    let (leader_port, follower_port, leader_is_a) = loop {
        let sa = post_report(&w1, port_a.port(), "w-1", "w-1").await;
        let sb = post_report(&w1, port_b.port(), "w-1", "w-1").await;
        match (sa, sb) {
            (Ok(200), Ok(200)) => panic!("both controllers lead"),
            (Ok(200), _) => break (port_a.port(), port_b.port(), true),
            (_, Ok(200)) => break (port_b.port(), port_a.port(), false),
            _ => {}
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no controller leads"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    for _ in 0..10 {
        assert_eq!(post_report(&w1, follower_port, "w-1", "w-1").await, Ok(503));
        assert_eq!(post_report(&w1, leader_port, "w-1", "w-1").await, Ok(200));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The follower's 503 closes the connection, so that an agent behind the leader-only
    // Service is balanced afresh on its next try; the leader's answers keep it alive.
    for (port, status, connection) in [
        (follower_port, 503, Some("close")),
        (leader_port, 200, None),
    ] {
        let answer = w1
            .post(url(port, &metalguard_api::protocol::report_path("w-1")))
            .json(&report("w-1", 1))
            .send()
            .await
            .unwrap();
        assert_eq!(answer.status().as_u16(), status);
        let header = answer
            .headers()
            .get(reqwest::header::CONNECTION)
            .map(|v| v.to_str().unwrap());
        assert_eq!(header, connection, "Connection header of the {status}");
    }
    if leader_is_a {
        a.kill();
    } else {
        b.kill();
    }
    let handover = wait_leader(&w1, follower_port, Duration::from_secs(6)).await;
    eprintln!("hand-over after the leader was killed took {handover:?} (lease 2s)");
    assert!(
        handover < Duration::from_millis(3500),
        "hand-over took {handover:?}"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn without_etcd_quorum_the_leader_stops_acting_and_resumes_when_quorum_returns() {
    let mut lab = Lab::start_with(3);
    let (port, metrics_port) = (reserve_port().unwrap(), reserve_port().unwrap());
    let extra = format!("metrics_listen = \"127.0.0.1:{}\"", metrics_port.port());
    let controller = lab.controller_with("ctl-a", &port, &extra);
    let w1 = client(&lab.tls(), Some("w-1"));
    wait_leader(&w1, port.port(), Duration::from_secs(15)).await;
    let metrics = scrape(metrics_port.port());
    assert!(
        metrics.contains("metalguard_controller_leader 1"),
        "{metrics}"
    );
    assert!(
        metrics.contains("metalguard_controller_store_unavailable 0"),
        "{metrics}"
    );

    lab.etcd.kill(1);
    lab.etcd.kill(2);
    let lost = Instant::now();
    loop {
        if post_report(&w1, port.port(), "w-1", "w-1").await == Ok(503) {
            break;
        }
        assert!(
            lost.elapsed() < Duration::from_secs(8),
            "still acting without quorum\n{}",
            controller.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    eprintln!("stopped acting {:?} after quorum was lost", lost.elapsed());
    tokio::time::sleep(Duration::from_millis(500)).await;
    let metrics = scrape(metrics_port.port());
    assert!(
        metrics.contains("metalguard_controller_leader 0"),
        "{metrics}"
    );
    assert!(
        metrics.contains("metalguard_controller_store_unavailable 1"),
        "{metrics}"
    );
    assert!(controller.log_tail(200).contains("cannot act"));

    lab.etcd.restart(1).unwrap();
    lab.etcd.restart(2).unwrap();
    lab.etcd.wait_healthy(Duration::from_secs(20)).unwrap();
    wait_leader(&w1, port.port(), Duration::from_secs(20)).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_leader_stopped_with_sigterm_resigns_and_the_other_takes_over_before_the_lease_ends() {
    let lab = Lab::start();
    let (port_a, port_b) = (reserve_port().unwrap(), reserve_port().unwrap());
    let mut a = lab.controller("ctl-a", &port_a);
    let w1 = client(&lab.tls(), Some("w-1"));
    wait_leader(&w1, port_a.port(), Duration::from_secs(15)).await;
    let _b = lab.controller("ctl-b", &port_b);
    // b is up and following.
    let started = Instant::now();
    while post_report(&w1, port_b.port(), "w-1", "w-1").await != Ok(503) {
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "ctl-b never answered"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let stopping = Instant::now();
    tokio::task::block_in_place(|| a.terminate(Duration::from_secs(5)));
    let handover = wait_leader(&w1, port_b.port(), Duration::from_secs(5)).await;
    let total = stopping.elapsed();
    eprintln!("resign hand-over: {total:?} from SIGTERM (lease 2s)");
    assert!(
        a.log_tail(20).contains("resigned leadership"),
        "{}",
        a.log_tail(20)
    );
    assert!(
        total < Duration::from_millis(1500),
        "took {total:?} ({handover:?} after exit)"
    );
}

/// Limits that let a test report as a leadership probe, ten times a second.
const PROBE_RATE: &str = "[controller.limits]\nrequests_per_second = 50\nrequest_burst = 100\n";

/// Keeps reporting for 6 s after `fault` and counts refusals.
async fn refusals_after(fault: impl FnOnce(&mut EtcdCluster)) -> (usize, String) {
    let mut lab = Lab::start_with(3);
    let port = reserve_port().unwrap();
    // The probe reports ten times a second, five times what one agent may sustain.
    let controller = lab.controller_with("ctl-a", &port, PROBE_RATE);
    let w1 = client(&lab.tls(), Some("w-1"));
    wait_leader(&w1, port.port(), Duration::from_secs(15)).await;
    fault(&mut lab.etcd);
    let started = Instant::now();
    let mut refused = 0;
    while started.elapsed() < Duration::from_secs(6) {
        if post_report(&w1, port.port(), "w-1", "w-1").await != Ok(200) {
            refused += 1;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    (refused, controller.log_tail(40))
}

#[tokio::test(flavor = "multi_thread")]
async fn one_dead_etcd_follower_does_not_disturb_leadership() {
    // The first-listed follower: a naive client keeps trying it.
    let (refused, log) = refusals_after(|etcd| {
        let i = a_follower(etcd);
        etcd.kill(i);
    })
    .await;
    assert_eq!(refused, 0, "leadership flapped\n{log}");
}

/// The index of an etcd member that is not the raft leader, preferring the first listed.
/// (A hung raft leader makes etcd itself unavailable for ~1 s until a new election, and the
/// controller rightly stops acting then.)
fn a_follower(etcd: &EtcdCluster) -> usize {
    let out = etcd.etcdctl(&["endpoint", "status", "-w", "json"]).unwrap();
    let statuses: serde_json::Value = serde_json::from_str(&out).unwrap();
    let endpoints = etcd.endpoints();
    statuses
        .as_array()
        .unwrap()
        .iter()
        .filter(|s| s["Status"]["header"]["member_id"] != s["Status"]["leader"])
        .filter_map(|s| endpoints.iter().position(|e| *e == s["Endpoint"]))
        .min()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn one_hung_etcd_follower_does_not_disturb_leadership() {
    let (refused, log) = refusals_after(|etcd| {
        let i = a_follower(etcd);
        etcd.hang(i).unwrap();
    })
    .await;
    assert_eq!(refused, 0, "leadership flapped\n{log}");
}
