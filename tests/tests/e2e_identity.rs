//! End to end with the real binaries: an agent's certificate is revoked and renewed while the
//! agent and the controller run. Revoking it (a line in the deny list the inventory names)
//! cuts the agent off within seconds; renewing it (`certs issue --renew` over the files the
//! agent reads) brings the same agent process back without a restart.
//!
//! Needs the workspace's binaries (`cargo build --workspace --bins`).

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use metalguard_e2e::etcd::EtcdCluster;
use metalguard_e2e::lab::test_bin_dir;
use metalguard_e2e::ports::reserve_port;
use metalguard_e2e::process::Proc;

fn controller_bin() -> PathBuf {
    test_bin_dir().join("metalguard-controller")
}

fn controller(args: &[&str]) -> String {
    let out = Command::new(controller_bin()).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// When the controller last received a report of `host` (its clock, ms), from `status --json`.
fn last_report_ms(inventory: &Path, host: &str) -> Option<u64> {
    let out = controller(&[
        "status",
        "--json",
        "--inventory",
        inventory.to_str().unwrap(),
    ]);
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    status["agents"][host]["received_at"].as_u64()
}

/// Waits until the controller has a report of `host` received after `after_ms`.
fn wait_report_after(inventory: &Path, host: &str, after_ms: u64, within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        if last_report_ms(inventory, host).is_some_and(|at| at > after_ms) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

fn write_through_rename(path: &Path, text: &str) {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[test]
fn a_revoked_agent_is_cut_off_and_a_renewed_certificate_brings_it_back_without_a_restart() {
    let etcd = EtcdCluster::start(1).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tls = d.join("tls");
    let tls_s = tls.to_str().unwrap();
    controller(&["certs", "init", tls_s]);
    controller(&["certs", "issue", "controller", tls_s, "--server"]);
    controller(&["certs", "issue", "w-1", tls_s, "--days", "30"]);
    let revoked = d.join("revoked.txt");
    std::fs::write(&revoked, "").unwrap();
    let port = reserve_port().unwrap();
    let endpoints: Vec<String> = etcd.endpoints().iter().map(|e| format!("{e:?}")).collect();
    // etcd as kubeadm runs it: the controller has its own client certificate.
    let pki = etcd.pki().unwrap();
    let client = pki.issue_client("metalguard").unwrap();
    let inventory = d.join("inventory.toml");
    std::fs::write(
        &inventory,
        format!(
            "[controller]\nlisten = \"127.0.0.1:{port}\"\ntls_dir = \"{tls}\"\nplan_interval = \"200ms\"\n\
             revoked_certificates = \"{revoked}\"\n\n\
             [etcd]\nendpoints = [{endpoints}]\nlease_ttl = \"2s\"\ntimeout = \"500ms\"\n\
             ca_file = {ca:?}\ncert_file = {cert:?}\nkey_file = {key:?}\n\n\
             [control_plane]\ndesired_replicas = 1\n\n\
             [[hosts]]\nname = \"w-1\"\nrole = \"worker\"\n",
            port = port.port(),
            tls = tls.display(),
            revoked = revoked.display(),
            endpoints = endpoints.join(", "),
            ca = pki.ca().display().to_string(),
            cert = client.cert.display().to_string(),
            key = client.key.display().to_string(),
        ),
    )
    .unwrap();
    let mut command = Command::new(controller_bin());
    command
        .args(["run", "--inventory"])
        .arg(&inventory)
        .args(["--id", "ctl"])
        .env("RUST_LOG", "info");
    let ctl = Proc::spawn("controller", command, &d.join("controller.log")).unwrap();

    let metrics = reserve_port().unwrap();
    let agent_config = d.join("w-1.toml");
    std::fs::write(
        &agent_config,
        format!(
            "host = \"w-1\"\n\
             [controller]\nurl = \"https://127.0.0.1:{port}\"\n\
             ca = \"{tls}/ca.pem\"\ncert = \"{tls}/w-1.pem\"\nkey = \"{tls}/w-1-key.pem\"\n\
             report_interval = \"1s\"\ncommand_wait = \"2s\"\n\
             [state]\ndir = \"{dir}/w-1-state\"\n\
             [metrics]\nlisten = \"127.0.0.1:{m}\"\n\
             [[probes.exec]]\nname = \"KubeletHealthy\"\ncommand = [\"/usr/bin/true\"]\n\
             period = \"500ms\"\ntimeout = \"500ms\"\n",
            port = port.port(),
            tls = tls.display(),
            dir = d.display(),
            m = metrics.port(),
        ),
    )
    .unwrap();
    drop(metrics);
    let mut command = Command::new(test_bin_dir().join("metalguard-agent"));
    command
        .args(["run", "--log-stderr", "--config"])
        .arg(&agent_config)
        .env("RUST_LOG", "info");
    let mut agent = Proc::spawn("agent w-1", command, &d.join("w-1.log")).unwrap();
    let pid = agent.pid();
    let logs = |agent: &Proc| format!("{}\n---\n{}", ctl.log_tail(40), agent.log_tail(40));

    assert!(
        wait_report_after(&inventory, "w-1", 0, Duration::from_secs(20)),
        "the agent never reported:\n{}",
        logs(&agent)
    );
    let cert = tls.join("w-1.pem");
    let shown = controller(&["certs", "show", cert.to_str().unwrap()]);
    let serial = shown
        .lines()
        .find_map(|l| l.strip_prefix("serial "))
        .unwrap()
        .to_owned();

    // Revoked: from the next tick on, neither its open connection nor a new one is heard.
    write_through_rename(&revoked, &format!("serial {serial}\n"));
    std::thread::sleep(Duration::from_secs(1));
    let cut_off = unix_ms();
    assert!(
        !wait_report_after(&inventory, "w-1", cut_off, Duration::from_secs(4)),
        "a revoked certificate still reports:\n{}",
        logs(&agent)
    );
    assert!(
        agent.log_tail(200).contains("report not delivered"),
        "{}",
        logs(&agent)
    );

    // Renewed in place: the same agent process reports again with the new pair.
    let renewed = controller(&["certs", "issue", "w-1", tls_s, "--renew"]);
    assert!(
        renewed.contains(&format!("replaces serial {serial}")),
        "{renewed}"
    );
    let renewed_at = unix_ms();
    assert!(
        wait_report_after(&inventory, "w-1", renewed_at, Duration::from_secs(15)),
        "the agent did not come back with its renewed certificate:\n{}",
        logs(&agent)
    );
    let running = agent.is_running();
    assert!(running, "{}", logs(&agent));
    assert_eq!(agent.pid(), pid, "the agent was not restarted");
    let agent_log = agent.log_tail(400);
    assert!(
        agent_log.contains("client certificate files changed: new connections use them"),
        "{agent_log}"
    );
    let controller_log = ctl.log_tail(400);
    assert!(
        controller_log.contains("revoked"),
        "the controller says why it refused: {controller_log}"
    );
}
