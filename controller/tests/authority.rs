//! Who may make an agent act, tried as an attacker with the real binary on real etcd: a
//! record written into the controller's etcd prefix by hand is never offered (no password
//! leaves the controller for it), and a certificate signed by the cluster CA for a host that is
//! not in the inventory is refused on every agent endpoint.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use metalguard_api::duration::Timestamp;
use metalguard_api::protocol::*;
use metalguard_e2e::ports::reserve_port;

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// An operation record as the controller stores it, written with etcdctl instead.
fn forged_fence(id: &str, agent: &str, target: &str) -> String {
    serde_json::json!({
        "id": id,
        "agent": agent,
        "kind": { "type": "fence", "target": target, "action": "off" },
        "remediation_id": null,
        "step": "power-off",
        "created_at": unix_ms(),
    })
    .to_string()
}

/// Long-polls as `host` for `within`; returns every answer's status and body.
async fn answers(
    client: &reqwest::Client,
    port: u16,
    host: &str,
    within: Duration,
) -> Vec<(u16, String)> {
    let deadline = Instant::now() + within;
    let mut seen = Vec::new();
    while Instant::now() < deadline {
        let response = client
            .get(url(port, &commands_path(host, Duration::from_secs(1))))
            .send()
            .await
            .unwrap();
        let status = response.status().as_u16();
        seen.push((status, response.text().await.unwrap()));
        if status != 200 {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    seen
}

#[tokio::test(flavor = "multi_thread")]
async fn operations_written_into_etcd_by_hand_are_never_offered_and_no_password_leaves() {
    let lab = Lab::start();
    run(&["certs", "issue", "mallory", lab.tls().to_str().unwrap()]);
    let port = reserve_port().unwrap();
    let metrics_port = reserve_port().unwrap();
    let extra = format!("metrics_listen = \"127.0.0.1:{}\"", metrics_port.port());
    let controller = lab.controller_with("ctl-a", &port, &extra);
    let w1 = client(&lab.tls(), Some("w-1"));
    let mallory = client(&lab.tls(), Some("mallory"));
    wait_leader(&w1, port.port(), Duration::from_secs(15)).await;
    report_etcd_voter(&lab, port.port()).await;
    assert_eq!(post_report(&w1, port.port(), "w-1", "w-1").await, Ok(200));

    // A power-off of the healthy w-2 for the inventory agent w-1, and one of w-1 for an agent
    // that is not in the inventory, both put by hand under the operations prefix.
    lab.etcd
        .put(
            "/metalguard/operations/forged-1",
            &forged_fence("forged-1", "w-1", "w-2"),
        )
        .unwrap();
    lab.etcd
        .put(
            "/metalguard/operations/forged-2",
            &forged_fence("forged-2", "mallory", "w-1"),
        )
        .unwrap();

    // And a forced fence request for w-2 and a retirement of cp-1, as `fence --force` and
    // `retire` would write them, but by hand.
    let request = serde_json::json!({
        "requested_at": unix_ms(),
        "requested_by": "admin (cli): maintenance",
        "force_reason": "maintenance",
    });
    lab.etcd
        .put("/metalguard/fence-requests/w-2", &request.to_string())
        .unwrap();
    let retirement = serde_json::json!({"requested_at": unix_ms(), "reason": "disk"});
    lab.etcd
        .put("/metalguard/retirements/cp-1", &retirement.to_string())
        .unwrap();

    let cp1 = client(&lab.tls(), Some("cp-1"));
    let (to_w1, to_mallory, to_cp1) = tokio::join!(
        answers(&w1, port.port(), "w-1", Duration::from_secs(3)),
        answers(&mallory, port.port(), "mallory", Duration::from_secs(3)),
        answers(&cp1, port.port(), "cp-1", Duration::from_secs(3)),
    );
    let log = controller.log_tail(200);
    for (status, body) in to_w1.iter().chain(&to_mallory).chain(&to_cp1) {
        assert!(
            !body.contains("hunter2"),
            "a BMC password was sent for a forged operation ({status}): {body}\n{log}"
        );
        assert!(
            !body.contains("forged-") && !body.contains("\"fence\""),
            "a forged operation or request was acted on ({status}): {body}\n{log}"
        );
    }
    assert!(to_w1.iter().all(|(status, _)| *status == 200), "{to_w1:?}");

    // The leader says so: in its log, its metrics and `status`.
    let inventory = lab.inventory("ctl-a", port.port());
    let status = run(&["status", "--inventory", inventory.to_str().unwrap()]);
    for key in [
        "operations/forged-1",
        "operations/forged-2",
        "fence-requests/w-2",
        "retirements/cp-1",
    ] {
        assert!(status.contains(key), "{key} not listed:\n{status}");
    }
    assert!(status.contains("REJECTED"), "{status}");
    assert!(!status.contains("remediation/w-2"), "{status}");
    let metrics = scrape(metrics_port.port());
    for (kind, count) in [("operation", 2), ("fence-request", 1), ("retirement", 1)] {
        let line = format!("metalguard_controller_rejected_records{{kind=\"{kind}\"}} {count}");
        assert!(metrics.contains(&line), "{line}\n{metrics}");
    }
    // A real retirement is blocked by the forged one until a person deletes it, and says so.
    let out = std::process::Command::new(BIN)
        .args(["retire", "cp-1", "--reason", "disk", "--inventory"])
        .arg(&inventory)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && stderr.contains("not believed"),
        "{stderr}"
    );
    let log = controller.log_tail(400);
    assert!(
        log.contains("record rejected") && log.contains("forged-1"),
        "{log}"
    );
    assert!(!log.contains("hunter2"), "{log}");
    // Nothing a controller wrote was disturbed: the leader still leads and plans.
    assert_eq!(post_report(&w1, port.port(), "w-1", "w-1").await, Ok(200));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_certificate_of_a_host_outside_the_inventory_is_refused_on_every_endpoint() {
    let lab = Lab::start();
    run(&["certs", "issue", "mallory", lab.tls().to_str().unwrap()]);
    let port = reserve_port().unwrap();
    let _controller = lab.controller("ctl-a", &port);
    let w1 = client(&lab.tls(), Some("w-1"));
    wait_leader(&w1, port.port(), Duration::from_secs(15)).await;
    let mallory = client(&lab.tls(), Some("mallory"));

    assert_eq!(
        post_report(&mallory, port.port(), "mallory", "mallory").await,
        Ok(403)
    );
    // Refused before its body is read: a body that does not parse gets the 403, not a 422
    // listing the schema (issue 28).
    for path in [
        report_path("mallory"),
        results_path("mallory"),
        holds_path("mallory"),
    ] {
        let answer = mallory
            .post(url(port.port(), &path))
            .header("content-type", "application/json")
            .body("{\"not\": \"a report\"")
            .send()
            .await
            .unwrap();
        let status = answer.status().as_u16();
        let body = answer.text().await.unwrap();
        assert_eq!(status, 403, "{path}: {body}");
        assert!(
            body.contains("mallory") && !body.contains("expected"),
            "{path}: {body}"
        );
    }
    let poll = mallory
        .get(url(port.port(), &commands_path("mallory", Duration::ZERO)))
        .send()
        .await
        .unwrap();
    assert_eq!(poll.status().as_u16(), 403);
    let result = CommandResult {
        operation_id: metalguard_api::plan::OperationId("x".into()),
        outcome: Outcome::Succeeded,
        started_at: Timestamp(1),
        finished_at: Timestamp(2),
        timeline: Vec::new(),
        error: None,
        promoted_by: None,
        term: 0,
    };
    let posted = mallory
        .post(url(port.port(), &results_path("mallory")))
        .json(&result)
        .send()
        .await
        .unwrap();
    assert_eq!(posted.status().as_u16(), 403);
    let inventory = lab.inventory("ctl-a", port.port());
    let status = run(&["status", "--inventory", inventory.to_str().unwrap()]);
    assert!(
        !status.contains("mallory"),
        "its report was stored:\n{status}"
    );
}

/// The serial `certs show` prints for `host`'s certificate.
fn serial_of(lab: &Lab, host: &str) -> String {
    let cert = lab.tls().join(format!("{host}.pem"));
    let shown = run(&["certs", "show", cert.to_str().unwrap()]);
    shown
        .lines()
        .find_map(|l| l.strip_prefix("serial "))
        .unwrap()
        .to_owned()
}

fn write_through_rename(path: &std::path::Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_certificate_is_refused_at_the_handshake_and_on_connections_already_open() {
    let lab = Lab::start();
    let revoked = lab.dir.path().join("revoked.txt");
    std::fs::write(&revoked, "# revoked agent certificates\n").unwrap();
    let port = reserve_port().unwrap();
    let extra = format!("revoked_certificates = \"{}\"", revoked.display());
    let controller = lab.controller_with("ctl-a", &port, &extra);
    let w1 = client(&lab.tls(), Some("w-1"));
    let open = client(&lab.tls(), Some("w-2"));
    wait_leader(&w1, port.port(), Duration::from_secs(15)).await;
    assert_eq!(post_report(&open, port.port(), "w-2", "w-2").await, Ok(200));

    let serial = serial_of(&lab, "w-2");
    write_through_rename(
        &revoked,
        &format!("serial {serial}  # w-2's stolen laptop copy\n"),
    );
    // The list is re-read on the next tick (200 ms here).
    let deadline = Instant::now() + Duration::from_secs(5);
    let on_open = loop {
        let answer = post_report(&open, port.port(), "w-2", "w-2").await;
        if answer != Ok(200) || Instant::now() > deadline {
            break answer;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    // An open connection is answered 403 (or, if the pool opened a new one, refused).
    assert!(
        on_open == Ok(403) || on_open.is_err(),
        "{on_open:?}\n{}",
        controller.log_tail(50)
    );
    let fresh = client(&lab.tls(), Some("w-2"));
    let refused = post_report(&fresh, port.port(), "w-2", "w-2").await;
    assert!(
        refused.is_err(),
        "a new connection with the revoked certificate got {refused:?}"
    );
    assert_eq!(post_report(&w1, port.port(), "w-1", "w-1").await, Ok(200));

    // A bad edit keeps the list in force; a renewed certificate is not on it.
    write_through_rename(&revoked, &format!("serial {serial}\nsomething else\n"));
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert!(
        post_report(&fresh, port.port(), "w-2", "w-2")
            .await
            .is_err()
    );
    run(&[
        "certs",
        "issue",
        "w-2",
        lab.tls().to_str().unwrap(),
        "--renew",
    ]);
    let renewed = client(&lab.tls(), Some("w-2"));
    assert_eq!(
        post_report(&renewed, port.port(), "w-2", "w-2").await,
        Ok(200)
    );
    let log = controller.log_tail(200);
    assert!(
        log.contains("revoked client certificate refused at the handshake")
            && log.contains("revoked certificates file changed but cannot be read"),
        "{log}"
    );
}

/// Waits until `status` satisfies `want`.
async fn await_status(inventory: &std::path::Path, want: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let text = run(&["status", "--inventory", inventory.to_str().unwrap()]);
        if want(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "status never got there:\n{text}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn the_hmac_key_rotates_while_the_controller_runs_and_nothing_is_lost() {
    let lab = Lab::start();
    let port = reserve_port().unwrap();
    let controller = lab.controller("ctl-a", &port);
    let w1 = client(&lab.tls(), Some("w-1"));
    wait_leader(&w1, port.port(), Duration::from_secs(15)).await;
    report_etcd_voter(&lab, port.port()).await;
    let inventory = lab.inventory("ctl-a", port.port());
    let inv = inventory.to_str().unwrap();
    // A record sealed with the first key that nobody rewrites by itself.
    run(&["retire", "cp-1", "--reason", "disk", "--inventory", inv]);
    await_status(&inventory, |s| s.contains("cp-1: retired")).await;

    let file = lab.tls().join("hmac.key");
    let file = file.to_str().unwrap();
    let key_id = |out: &str, word: &str| {
        out.split_whitespace()
            .skip_while(|w| *w != word)
            .nth(1)
            .unwrap()
            .trim_end_matches(':')
            .to_owned()
    };
    let first = run(&["certs", "hmac-key", file, "--add"]);
    let new = key_id(&first, "Add");
    let old = key_id(&first, "holds").trim_end_matches(',').to_owned();
    assert_ne!(old, new, "{first}");
    run(&["certs", "hmac-key", file, "--promote", &new]);
    // The leader seals the old records again with the new key; nothing is rejected meanwhile.
    let text = await_status(&inventory, |s| {
        !s.contains("sealed with an older hmac key") && s.contains("cp-1: retired")
    })
    .await;
    assert!(!text.contains("REJECTED"), "{text}");
    run(&["certs", "hmac-key", file, "--remove", &old]);
    tokio::time::sleep(Duration::from_millis(500)).await;
    let text = await_status(&inventory, |s| s.contains("cp-1: retired")).await;
    assert!(!text.contains("REJECTED"), "{text}");
    let log = controller.log_tail(300);
    assert!(
        log.contains("hmac key file reloaded")
            && log.contains("records sealed again with the signing key"),
        "{log}"
    );
}
