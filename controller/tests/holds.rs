//! Break-glass holds with the real controller binary on real etcd, the test playing the agents
//! (mTLS with each host's certificate): a posted hold is checked and stored, a hold carried
//! only by a report is stored too, `status` shows them, `release` marks them released, the
//! next report's answer names the released id, and a released id is never taken again.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::Command as Process;
use std::time::{Duration, Instant};

use common::*;
use metalguard_api::duration::Timestamp;
use metalguard_api::protocol::{HoldAck, ReportAck, holds_path, report_path};
use metalguard_api::snapshot::Hold;
use metalguard_e2e::ports::reserve_port;

/// Now, in ms: a hold made before the retention of released holds is not recorded anew.
fn now_ms() -> u64 {
    u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap()
}

fn hold(id: &str, target: &str) -> Hold {
    Hold {
        id: id.to_owned(),
        target: target.to_owned(),
        since: Timestamp(now_ms()),
        by: "alice on w-1".to_owned(),
        reason: "smoke from the PSU".to_owned(),
        action: "off".to_owned(),
    }
}

async fn post_hold(
    client: &reqwest::Client,
    port: u16,
    path_host: &str,
    hold: &Hold,
) -> (u16, String) {
    let response = client
        .post(url(port, &holds_path(path_host)))
        .json(hold)
        .send()
        .await
        .unwrap();
    (response.status().as_u16(), response.text().await.unwrap())
}

async fn report_holds(
    client: &reqwest::Client,
    port: u16,
    host: &str,
    holds: Vec<Hold>,
) -> ReportAck {
    let mut r = report(host, 1);
    r.holds = holds;
    let response = client
        .post(url(port, &report_path(host)))
        .json(&r)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    response.json().await.unwrap()
}

fn cli(args: &[&str], inventory: &Path) -> (bool, String) {
    let out = Process::new(BIN)
        .args(args)
        .arg("--inventory")
        .arg(inventory)
        .env("SUDO_USER", "bob")
        .output()
        .unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn stored(lab: &Lab, id: &str) -> Option<serde_json::Value> {
    let out = lab
        .etcd
        .etcdctl(&[
            "get",
            "--print-value-only",
            &format!("/metalguard/holds/{id}"),
        ])
        .unwrap();
    let text = out.trim();
    (!text.is_empty()).then(|| {
        // Stored sealed by a controller: `{"record": …, "seal": …}`.
        let sealed: serde_json::Value = serde_json::from_str(text).unwrap();
        assert!(sealed["seal"]["mac"].is_string(), "not sealed: {sealed}");
        sealed["record"].clone()
    })
}

async fn await_stored(lab: &Lab, id: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Some(record) = stored(lab, id) {
            return record;
        }
        assert!(Instant::now() < deadline, "hold {id} was never stored");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_hold_is_stored_shown_released_once_and_never_taken_again() {
    let lab = Lab::start();
    let port = reserve_port().unwrap();
    let _controller = lab.controller("c1", &port);
    let inventory = lab.dir.path().join("c1.toml");
    let w1 = client(&lab.tls(), Some("w-1"));
    let cp1 = client(&lab.tls(), Some("cp-1"));
    wait_leader(&w1, port.port(), Duration::from_secs(15)).await;

    // Posted by w-1 (where the break-glass fence ran) about w-2.
    let posted = hold("w-1/1000", "w-2");
    let (status, body) = post_hold(&w1, port.port(), "w-1", &posted).await;
    assert_eq!(status, 200, "{body}");
    let ack: HoldAck = serde_json::from_str(&body).unwrap();
    assert_eq!((ack.id.as_str(), ack.first), ("w-1/1000", true));
    let (status, body) = post_hold(&w1, port.port(), "w-1", &posted).await;
    assert_eq!(
        (
            status,
            serde_json::from_str::<HoldAck>(&body).unwrap().first
        ),
        (200, false)
    );
    let record = stored(&lab, "w-1/1000").expect("stored at once");
    assert_eq!(record["reported_by"], "w-1");
    assert_eq!(record["hold"]["target"], "w-2");
    assert!(record.get("released").is_none(), "{record}");

    // What is refused, and how.
    let (status, body) = post_hold(&w1, port.port(), "w-1", &hold("w-2/1000", "w-2")).await;
    assert_eq!(status, 422, "another host's id: {body}");
    assert!(body.contains("records only its own holds"), "{body}");
    let (status, body) = post_hold(&w1, port.port(), "w-1", &hold("w-1/1001", "cp-9")).await;
    assert_eq!(status, 422, "unknown target: {body}");
    assert!(body.contains("cp-9 is not an inventory host"), "{body}");
    let (status, _) = post_hold(&w1, port.port(), "w-2", &hold("w-2/1001", "cp-1")).await;
    assert_eq!(status, 403, "a path of another host than the certificate's");
    assert!(stored(&lab, "w-1/1001").is_none() && stored(&lab, "w-2/1000").is_none());

    // A hold that only a report carries (the post failed) is stored by the leader too.
    let ack = report_holds(&cp1, port.port(), "cp-1", vec![hold("cp-1/2000", "w-2")]).await;
    assert!(ack.released_holds.is_empty());
    let record = await_stored(&lab, "cp-1/2000").await;
    assert_eq!(record["reported_by"], "cp-1");

    // status, text and JSON: held, by whom, via which agent, how to release.
    let (ok, text) = cli(&["status"], &inventory);
    assert!(ok, "{text}");
    assert!(
        text.contains("w-2: HELD since")
            && text.contains("by alice on w-1 (break-glass power off: smoke from the PSU)")
            && text.contains("via agent w-1, hold w-1/1000")
            && text.contains("metalguard-controller release w-2 --reason TEXT"),
        "{text}"
    );
    let (ok, json) = cli(&["status", "--json"], &inventory);
    assert!(ok, "{json}");
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    let active = json["holds"]["active"].as_array().unwrap();
    assert_eq!(active.len(), 2, "{json}");
    assert!(
        active
            .iter()
            .all(|h| h["target"] == "w-2" && h["recorded"] == true)
    );

    // Nothing to release on a host without a hold.
    let (ok, text) = cli(&["release", "w-1", "--reason", "x"], &inventory);
    assert!(
        !ok && text.contains("host w-1 has no hold: nothing to release"),
        "{text}"
    );

    let (ok, text) = cli(&["release", "w-2", "--reason", "PSU replaced"], &inventory);
    assert!(ok, "{text}");
    assert!(
        text.contains("released hold w-1/1000 of w-2")
            && text.contains("released hold cp-1/2000 of w-2"),
        "{text}"
    );
    let record = stored(&lab, "w-1/1000").unwrap();
    assert_eq!(record["released"]["by"], "bob (cli)");
    assert_eq!(record["released"]["reason"], "PSU replaced");

    // The agent still reports it: the answer names it as released (the leader learns of the
    // release through its watch and tells the hub on its next round).
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let ack = report_holds(&w1, port.port(), "w-1", vec![posted.clone()]).await;
        if ack.released_holds == ["w-1/1000"] {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the release never reached the report's answer: {ack:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Released ids are never taken again, by post or report, and nothing is held any more.
    let (status, body) = post_hold(&w1, port.port(), "w-1", &posted).await;
    assert_eq!(status, 409, "{body}");
    assert!(body.contains("released by bob (cli)"), "{body}");
    let (ok, json) = cli(&["status", "--json"], &inventory);
    assert!(ok);
    let json: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(
        json["holds"]["active"].as_array().unwrap().is_empty(),
        "{json}"
    );
    assert_eq!(json["holds"]["released"].as_array().unwrap().len(), 2);
    let (ok, text) = cli(&["release", "w-2", "--reason", "again"], &inventory);
    assert!(!ok && text.contains("has no hold"), "{text}");
}

#[tokio::test(flavor = "multi_thread")]
async fn one_certificate_cannot_make_the_store_keep_more_holds_than_its_cap() {
    use metalguard_api::snapshot::Hold;
    let lab = Lab::start();
    let port = reserve_port().unwrap();
    // The rate limit raised so the test needs no minute per 84 posts.
    let _controller = lab.controller_with(
        "c1",
        &port,
        "[controller.limits]\nrequests_per_second = 1000\nrequest_burst = 1000\n",
    );
    let w1 = client(&lab.tls(), Some("w-1"));
    wait_leader(&w1, port.port(), Duration::from_secs(15)).await;
    let base = now_ms();
    let mut refused = Vec::new();
    for i in 0..70u64 {
        let target = ["cp-1", "w-2"][usize::from(i % 2 == 1)];
        let hold = Hold {
            since: Timestamp(base + i),
            ..hold(&format!("w-1/{}", base + i), target)
        };
        let (status, body) = post_hold(&w1, port.port(), "w-1", &hold).await;
        if status != 200 {
            refused.push((i, status, body));
        }
    }
    // 64 recorded, the rest refused naming the agent's cap; before, every one was a new key.
    assert_eq!(refused.len(), 6, "{refused:?}");
    assert!(
        refused.iter().all(|(_, status, body)| *status == 422
            && body.contains("agent w-1 brought 64 holds in force already")),
        "{refused:?}"
    );
    let keys = lab
        .etcd
        .etcdctl(&["get", "--prefix", "--keys-only", "/metalguard/holds/"])
        .unwrap();
    let stored = keys.lines().filter(|l| !l.trim().is_empty()).count();
    assert_eq!(stored, 64, "{keys}");
}
