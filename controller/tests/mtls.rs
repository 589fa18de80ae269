//! The real binary's agent API and offline subcommands: a certificate speaks only for its own
//! host, a client without one is refused, `check-config` names files and problems without
//! secrets, and `plan --snapshot` prints a plan or names what is wrong with the snapshot.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;
use std::time::Duration;

use common::*;
use metalguard_api::protocol::*;
use metalguard_e2e::ports::reserve_port;

#[tokio::test(flavor = "multi_thread")]
async fn a_certificate_speaks_only_for_its_own_host_and_no_certificate_is_refused() {
    let lab = Lab::start();
    let port = reserve_port().unwrap();
    let _controller = lab.controller("ctl-a", &port);
    let w1 = client(&lab.tls(), Some("w-1"));
    wait_leader(&w1, port.port(), Duration::from_secs(15)).await;

    assert_eq!(post_report(&w1, port.port(), "w-2", "w-2").await, Ok(403));
    assert_eq!(post_report(&w1, port.port(), "w-1", "w-2").await, Ok(403));
    let poll_other = w1
        .get(url(port.port(), &commands_path("w-2", Duration::ZERO)))
        .send()
        .await
        .unwrap();
    assert_eq!(poll_other.status().as_u16(), 403);

    let anonymous = client(&lab.tls(), None);
    let refused = post_report(&anonymous, port.port(), "w-1", "w-1").await;
    assert!(
        refused.is_err(),
        "a client without a certificate got {refused:?}"
    );
}

#[test]
fn check_config_names_the_file_and_problem_and_never_the_secret() {
    let lab = Lab::start();
    let inventory = lab.inventory("check", 1);
    let ok = run(&["check-config", "--inventory", inventory.to_str().unwrap()]);
    assert!(ok.contains("is valid"), "{ok}");
    let password = lab.dir.path().join("bmc-creds/password");
    std::fs::set_permissions(&password, std::fs::Permissions::from_mode(0o644)).unwrap();
    let out = Command::new(BIN)
        .args(["check-config", "--inventory", inventory.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains(password.to_str().unwrap()) && stderr.contains("644"),
        "{stderr}"
    );
    assert!(
        stderr.contains("host w-1") && stderr.contains("host w-2"),
        "{stderr}"
    );
    assert!(!stderr.contains("hunter2"));
}

#[test]
fn plan_prints_the_plan_with_reasons_and_names_a_bad_snapshot() {
    let dir = tempfile::tempdir().unwrap();
    let snapshot = metalguard_api::snapshot::Snapshot {
        control_plane: metalguard_api::snapshot::ControlPlaneSpec {
            desired_replicas: 3,
            failure_domains: Vec::new(),
        },
        ..Default::default()
    };
    let path = dir.path().join("snapshot.json");
    std::fs::write(&path, serde_json::to_string(&snapshot).unwrap()).unwrap();
    let out = run(&["plan", "--snapshot", path.to_str().unwrap()]);
    assert!(out.starts_with("plan at"), "{out}");
    assert!(
        out.contains("DEGRADED"),
        "an empty cluster has no voter: {out}"
    );

    std::fs::write(&path, r#"{"observed_at": 0, "bogus": 1}"#).unwrap();
    let bad = Command::new(BIN)
        .args(["plan", "--snapshot", path.to_str().unwrap()])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(!bad.status.success());
    assert!(
        stderr.contains("snapshot.json") && stderr.contains("bogus"),
        "{stderr}"
    );
}

/// `run` with `inventory`: whether it stopped by itself within a few seconds, and stderr.
fn run_briefly(inventory: &std::path::Path) -> (Option<bool>, String) {
    let mut child = Command::new(BIN)
        .args(["run", "--inventory", inventory.to_str().unwrap()])
        .stderr(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break Some(status.success());
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            child.wait().unwrap();
            break None;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut stderr).unwrap();
    (status, stderr)
}

#[test]
fn private_keys_others_may_read_are_refused_by_check_config_and_run() {
    let lab = Lab::start();
    let inventory = lab.inventory("keys", reserve_port().unwrap().port());
    let inv = inventory.to_str().unwrap();
    let ok = Command::new(BIN)
        .args(["check-config", "--inventory", inv])
        .output()
        .unwrap();
    assert!(
        ok.status.success(),
        "{}",
        String::from_utf8_lossy(&ok.stderr)
    );
    assert!(
        String::from_utf8_lossy(&ok.stderr).contains("ca-key.pem is on this host"),
        "a CA key next to the controller's is worth a warning"
    );
    for file in ["controller-key.pem", "ca-key.pem", "hmac.key"] {
        let path = lab.tls().join(file);
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let out = Command::new(BIN)
            .args(["check-config", "--inventory", inv])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{file}: {stderr}");
        assert!(
            stderr.contains(path.to_str().unwrap()) && stderr.contains("644"),
            "{file}: {stderr}"
        );
        let (stopped, stderr) = run_briefly(&inventory);
        assert_eq!(
            stopped,
            Some(false),
            "run started with {file} readable by all: {stderr}"
        );
        assert!(stderr.contains(path.to_str().unwrap()), "{file}: {stderr}");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
}
