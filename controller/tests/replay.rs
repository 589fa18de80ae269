//! A fence request is served once (issue 28), with the real binary on real etcd: the attack
//! deleted the remediation a forced fence started and put the sealed, consumed
//! `fence-requests/<host>` back from the store's history; the leader started a new forced
//! remediation of the host. Now the request's nonce is recorded as consumed apart from the
//! remediation, and the replayed request is rejected (shown by `status`), never served.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use metalguard_e2e::ports::reserve_port;

const REQUEST_KEY: &str = "/metalguard/fence-requests/w-2";
const REMEDIATIONS: &str = "/metalguard/remediations/";

/// The remediation keys and their create revisions.
fn remediations(lab: &Lab) -> Vec<(String, i64)> {
    let out = lab
        .etcd
        .etcdctl(&["get", "--prefix", REMEDIATIONS, "-w", "json"])
        .unwrap();
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    json["kvs"]
        .as_array()
        .map(|kvs| {
            kvs.iter()
                .map(|kv| {
                    let key = kv["key"].as_str().unwrap();
                    (decode(key), kv["create_revision"].as_i64().unwrap())
                })
                .collect()
        })
        .unwrap_or_default()
}

/// etcdctl's JSON has keys in base64.
fn decode(text: &str) -> String {
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut bits = 0u32;
    let mut count = 0;
    let mut out = Vec::new();
    for byte in text.bytes().filter(|b| *b != b'=') {
        let value = ALPHABET.iter().position(|a| *a == byte).unwrap() as u32;
        bits = (bits << 6) | value;
        count += 6;
        if count >= 8 {
            count -= 8;
            out.push((bits >> count) as u8);
            bits &= (1 << count) - 1;
        }
    }
    String::from_utf8(out).unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn a_consumed_fence_request_put_back_from_history_is_rejected_not_served_again() {
    let lab = Lab::start();
    let port = reserve_port().unwrap();
    let controller = lab.controller("ctl-a", &port);
    let w1 = client(&lab.tls(), Some("w-1"));
    let w2 = client(&lab.tls(), Some("w-2"));
    wait_leader(&w1, port.port(), Duration::from_secs(15)).await;
    assert_eq!(post_report(&w2, port.port(), "w-2", "w-2").await, Ok(200));
    report_etcd_voter(&lab, port.port()).await;
    let inventory = lab.inventory("ctl-a", port.port());
    let inventory = inventory.to_str().unwrap();
    run(&[
        "fence",
        "w-2",
        "--reason",
        "test",
        "--force",
        "--inventory",
        inventory,
    ]);
    let deadline = Instant::now() + Duration::from_secs(10);
    let (remediation, created) = loop {
        if let Some(found) = remediations(&lab).into_iter().next() {
            break found;
        }
        assert!(
            Instant::now() < deadline,
            "no remediation started\n{}",
            controller.log_tail(60)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // The request as it was just before the leader consumed it (same transaction).
    let before = (created - 1).to_string();
    let sealed = lab
        .etcd
        .etcdctl(&["get", REQUEST_KEY, "--rev", &before, "--print-value-only"])
        .unwrap();
    let sealed = sealed.trim();
    assert!(sealed.contains("\"seal\""), "{sealed}");
    assert!(
        lab.etcd
            .etcdctl(&["get", REQUEST_KEY, "--print-value-only"])
            .unwrap()
            .trim()
            .is_empty(),
        "consumed"
    );

    // The attack: the remediation deleted, the consumed request put back.
    lab.etcd.etcdctl(&["del", &remediation]).unwrap();
    lab.etcd.etcdctl(&["put", REQUEST_KEY, sealed]).unwrap();
    let watch_until = Instant::now() + Duration::from_secs(4);
    while Instant::now() < watch_until {
        let again = remediations(&lab);
        assert!(
            again.is_empty(),
            "the replayed request started {again:?}\n{}",
            controller.log_tail(60)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let status = run(&["status", "--inventory", inventory]);
    assert!(
        status.contains("fence-requests/w-2") && status.contains("a replay"),
        "{status}"
    );
}
