//! Persisted intent with the real binary on real etcd: a fence survives a controller crash
//! without a second power-off, and an unhealthy report reaches the executor quickly.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::{Duration, Instant};

use common::*;
use metalguard_api::duration::Timestamp;
use metalguard_api::protocol::*;
use metalguard_e2e::ports::reserve_port;

#[tokio::test(flavor = "multi_thread")]
async fn a_controller_killed_after_persisting_intent_re_offers_the_same_fence_and_never_a_second() {
    let lab = Lab::start();
    let port = reserve_port().unwrap();
    let mut first = lab.controller("ctl-a", &port);
    let w1 = client(&lab.tls(), Some("w-1"));
    let w2 = client(&lab.tls(), Some("w-2"));
    wait_leader(&w1, port.port(), Duration::from_secs(15)).await;
    assert_eq!(post_report(&w2, port.port(), "w-2", "w-2").await, Ok(200));
    report_etcd_voter(&lab, port.port()).await;
    let inventory = lab.inventory("ctl-a", port.port());
    // Both possible executors (every healthy agent but the target) long-poll before the
    // fence is requested; the one the core chose receives the command.
    let cp1 = client(&lab.tls(), Some("cp-1"));
    let wait = Duration::from_secs(10);
    let (poll_cp1, poll_w1) = (
        poll(&cp1, port.port(), "cp-1", wait),
        poll(&w1, port.port(), "w-1", wait),
    );
    tokio::pin!(poll_cp1, poll_w1);
    // Let both long-polls reach the controller before the fence is requested.
    let settle = tokio::time::sleep(Duration::from_millis(300));
    tokio::select! {
        () = settle => {}
        b = &mut poll_cp1 => panic!("cp-1 got {b:?} before any fence"),
        b = &mut poll_w1 => panic!("w-1 got {b:?} before any fence"),
    }
    let requested = Instant::now();
    run(&[
        "fence",
        "w-2",
        "--reason",
        "test",
        "--force",
        "--inventory",
        inventory.to_str().unwrap(),
    ]);
    let (agent, batch) = tokio::select! {
        b = &mut poll_cp1 => ("cp-1", b),
        b = &mut poll_w1 => ("w-1", b),
    };
    eprintln!(
        "fence requested -> command at the executor's open long-poll: {:?} (woken by the etcd watch)",
        requested.elapsed()
    );
    assert_eq!(
        batch.commands.len(),
        1,
        "{batch:?}\n{}",
        first.log_tail(400)
    );
    let executor = client(&lab.tls(), Some(agent));
    let command = batch.commands[0].clone();
    let CommandKind::Fence(fence) = &command.kind else {
        panic!("expected a fence, got {command:?}");
    };
    assert_eq!(
        (fence.target.as_str(), fence.action),
        ("w-2", PowerAction::Off)
    );
    assert_eq!(fence.credentials.password.expose(), "hunter2");
    assert_eq!(
        operation_keys(&lab.etcd).len(),
        1,
        "intent is persisted before delivery"
    );

    // Crash between "intent written" and "result received"; restart.
    first.kill();
    let metrics_port = reserve_port().unwrap();
    let extra = format!("metrics_listen = \"127.0.0.1:{}\"", metrics_port.port());
    let _second = lab.controller_with("ctl-b", &port, &extra);
    wait_leader(&w1, port.port(), Duration::from_secs(15)).await;
    report_etcd_voter(&lab, port.port()).await;
    let again = poll(&executor, port.port(), agent, Duration::from_secs(10)).await;
    assert_eq!(again.commands.len(), 1, "{again:?}");
    assert_eq!(again.commands[0].operation_id, command.operation_id);
    assert_eq!(
        operation_keys(&lab.etcd).len(),
        1,
        "no second operation was created"
    );
    // Leadership terms: the new leadership offers the same intent under its own, newer term.
    assert!(command.term > 0, "{command:?}");
    let term = again.commands[0].term;
    assert!(term > command.term, "{} after {}", term, command.term);
    // An agent that refused the older leadership's offer says so; nothing is recorded and
    // the current offer stands.
    let refusal = CommandResult {
        operation_id: command.operation_id.clone(),
        outcome: Outcome::Rejected,
        started_at: Timestamp(1),
        finished_at: Timestamp(1),
        timeline: Vec::new(),
        error: Some(format!(
            "command of leadership term {} refused",
            command.term
        )),
        promoted_by: None,
        term: command.term,
    };
    let ack: ResultAck = executor
        .post(url(port.port(), &results_path(agent)))
        .json(&refusal)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(!ack.first, "{ack:?}");
    let still = poll(&executor, port.port(), agent, Duration::from_secs(1)).await;
    assert_eq!(
        still.commands.len(),
        1,
        "the offer was withdrawn: {still:?}"
    );

    // The agent reports the (single) execution; a retried post is recognised as a retry.
    let result = CommandResult {
        operation_id: command.operation_id.clone(),
        outcome: Outcome::Succeeded,
        started_at: Timestamp(1),
        finished_at: Timestamp(2),
        timeline: Vec::new(),
        error: None,
        promoted_by: None,
        term,
    };
    for first_post in [true, false] {
        let ack: ResultAck = executor
            .post(url(port.port(), &results_path(agent)))
            .json(&result)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert_eq!(ack.first, first_post);
    }
    // w-2 may not post a result for w-1's operation.
    let stolen = w2
        .post(url(port.port(), &results_path("w-2")))
        .json(&result)
        .send()
        .await
        .unwrap();
    assert_eq!(stolen.status().as_u16(), 409);

    // From now on no power-off of w-2 is ever offered again.
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        let _ = post_report(&w1, port.port(), "w-1", "w-1").await;
        let later = poll(&executor, port.port(), agent, Duration::from_secs(1)).await;
        for c in &later.commands {
            if let CommandKind::Fence(f) = &c.kind {
                assert!(
                    !(f.target == "w-2" && f.action == PowerAction::Off),
                    "a second power-off was offered: {c:?}"
                );
            }
        }
    }
    let metrics = scrape(metrics_port.port());
    assert!(
        metrics.contains(
            r#"metalguard_controller_fences_total{protocol="ipmi",outcome="succeeded"} 1"#
        ),
        "{metrics}"
    );
    assert!(
        metrics.contains("metalguard_controller_leader 1"),
        "{metrics}"
    );
    let status = run(&["status", "--inventory", inventory.to_str().unwrap()]);
    assert!(status.contains("leader: ctl-b"), "{status}");
    assert!(status.contains("w-1: agent test"), "{status}");
    assert!(status.contains("succeeded"), "{status}");
    assert!(!status.contains("hunter2"));
    // Who asked (the person running `fence`, at this host) and which certificate executed it.
    let me = std::env::var("USER")
        .ok()
        .filter(|u| !u.is_empty())
        .unwrap_or_else(|| "uid ".to_owned());
    assert!(
        status.contains(&format!("asked: fence requested by {me}"))
            && status.contains(" (cli): test"),
        "{status}"
    );
    assert!(
        status.contains(&format!("executed by {agent} (certificate serial ")),
        "{status}"
    );
}

/// The time from the report that makes a worker unhealthy past its timeout to the power-off
/// command arriving at the executor's open long-poll, over several fresh controllers.
#[tokio::test(flavor = "multi_thread")]
async fn an_unhealthy_report_reaches_the_executor_as_a_fence_within_200ms_median() {
    const SAMPLES: usize = 7;
    let lab = Lab::start();
    let w2 = client(&lab.tls(), Some("w-2"));
    let w1 = client(&lab.tls(), Some("w-1"));
    let cp1 = client(&lab.tls(), Some("cp-1"));
    let mut samples = Vec::new();
    for i in 0..SAMPLES {
        let port = reserve_port().unwrap();
        let base = std::fs::read_to_string(lab.inventory("base", port.port())).unwrap();
        let text = base.replace(
            "timeout = \"500ms\"",
            &format!("timeout = \"500ms\"\nprefix = \"/latency-{i}\""),
        ) + r#"
[[policy.health_checks]]
name = "workers"
selector = { role = "worker" }
unhealthy_conditions = [{ type = "KubeletHealthy", status = "False", timeout = "1s" }]
"#;
        let path = lab.dir.path().join(format!("latency-{i}.toml"));
        std::fs::write(&path, text).unwrap();
        let mut controller = lab.controller_from(&format!("ctl-{i}"), &path);
        wait_leader(&w1, port.port(), Duration::from_secs(15)).await;
        report_etcd_voter(&lab, port.port()).await;
        let wait = Duration::from_secs(10);
        let (poll_cp1, poll_w1) = (
            poll(&cp1, port.port(), "cp-1", wait),
            poll(&w1, port.port(), "w-1", wait),
        );
        tokio::pin!(poll_cp1, poll_w1);
        tokio::select! {
            () = tokio::time::sleep(Duration::from_millis(300)) => {}
            b = &mut poll_cp1 => panic!("cp-1 got {b:?} before any fence"),
            b = &mut poll_w1 => panic!("w-1 got {b:?} before any fence"),
        }
        let mut sick = report("w-2", 1);
        let unhealthy_since = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64
            - 5_000;
        sick.conditions = vec![metalguard_api::protocol::Condition {
            type_: "KubeletHealthy".into(),
            status: metalguard_api::snapshot::ConditionStatus::False,
            reason: "Timeout".into(),
            message: String::new(),
            last_transition: Timestamp(unhealthy_since),
        }];
        let sent = Instant::now();
        let status = w2
            .post(url(port.port(), &report_path("w-2")))
            .json(&sick)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status.as_u16(), 200);
        let batch = tokio::select! {
            b = &mut poll_cp1 => b,
            b = &mut poll_w1 => b,
        };
        let latency = sent.elapsed();
        assert!(
            matches!(&batch.commands[..], [c] if matches!(&c.kind, CommandKind::Fence(f) if f.target == "w-2" && f.action == PowerAction::Off)),
            "{batch:?}\n{}",
            controller.log_tail(60)
        );
        samples.push(latency);
        controller.kill();
    }
    samples.sort();
    let median = samples[SAMPLES / 2];
    eprintln!("report -> fence command at the executor: median {median:?}, samples {samples:?}");
    assert!(median < Duration::from_millis(200), "median {median:?}");
}
