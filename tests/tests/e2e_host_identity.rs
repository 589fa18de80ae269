//! End to end with the real binaries: an agent reads its host's identity from `[state]
//! dmi_dir`, learns from the controller's answer that it takes the field, and keeps reporting
//! with it (the controller stores it with the report, which `status --json` shows); an agent
//! whose host has no DMI files says why once and reports the reasons instead.
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

const UUID: &str = "674523a1-ab89-efcd-a123-456789abcdef";

fn controller(args: &[&str]) -> String {
    let out = Command::new(test_bin_dir().join("metalguard-controller"))
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Waits until `proc`'s log holds every one of `lines`.
fn wait_log(proc: &Proc, lines: &[&str], within: Duration) -> bool {
    let deadline = Instant::now() + within;
    while Instant::now() < deadline {
        let log = proc.log_tail(400);
        if lines.iter().all(|l| log.contains(l)) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    false
}

/// The host identity the controller stored with `host`'s latest report (`status --json`).
fn stored_identity(inventory: &Path, host: &str) -> serde_json::Value {
    let out = controller(&[
        "status",
        "--json",
        "--inventory",
        inventory.to_str().unwrap(),
    ]);
    let status: serde_json::Value = serde_json::from_str(&out).unwrap();
    status["agents"][host]["report"]["host_identity"].clone()
}

/// Waits until the controller's stored identity of `host` satisfies `ok`.
fn wait_stored(
    inventory: &Path,
    host: &str,
    ok: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let identity = stored_identity(inventory, host);
        if ok(&identity) || Instant::now() > deadline {
            return identity;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// Starts an agent for `host` reading its DMI files from `dmi_dir`.
fn agent(d: &Path, host: &str, port: u16, dmi_dir: &Path) -> Proc {
    let metrics = reserve_port().unwrap();
    let config = d.join(format!("{host}.toml"));
    std::fs::write(
        &config,
        format!(
            "host = \"{host}\"\n\
             [controller]\nurl = \"https://127.0.0.1:{port}\"\n\
             ca = \"{tls}/ca.pem\"\ncert = \"{tls}/{host}.pem\"\nkey = \"{tls}/{host}-key.pem\"\n\
             report_interval = \"1s\"\ncommand_wait = \"2s\"\n\
             [state]\ndir = \"{dir}/{host}-state\"\ndmi_dir = \"{dmi}\"\n\
             [metrics]\nlisten = \"127.0.0.1:{m}\"\n\
             [[probes.exec]]\nname = \"KubeletHealthy\"\ncommand = [\"/usr/bin/true\"]\n\
             period = \"500ms\"\ntimeout = \"500ms\"\n",
            tls = d.join("tls").display(),
            dir = d.display(),
            dmi = dmi_dir.display(),
            m = metrics.port(),
        ),
    )
    .unwrap();
    drop(metrics);
    let mut command = Command::new(test_bin_dir().join("metalguard-agent"));
    command
        .args(["run", "--log-stderr", "--config"])
        .arg(&config)
        .env("RUST_LOG", "info");
    Proc::spawn(
        format!("agent {host}"),
        command,
        &d.join(format!("{host}.log")),
    )
    .unwrap()
}

#[test]
fn agents_send_their_host_identity_once_the_controller_takes_it_and_say_why_a_field_is_absent() {
    let etcd = EtcdCluster::start(1).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let tls = d.join("tls");
    let tls_s = tls.to_str().unwrap();
    controller(&["certs", "init", tls_s]);
    controller(&["certs", "issue", "controller", tls_s, "--server"]);
    controller(&["certs", "issue", "w-1", tls_s]);
    controller(&["certs", "issue", "w-2", tls_s]);
    let port = reserve_port().unwrap();
    let endpoints: Vec<String> = etcd.endpoints().iter().map(|e| format!("{e:?}")).collect();
    let pki = etcd.pki().unwrap();
    let client = pki.issue_client("metalguard").unwrap();
    let inventory = d.join("inventory.toml");
    std::fs::write(
        &inventory,
        format!(
            "[controller]\nlisten = \"127.0.0.1:{port}\"\ntls_dir = \"{tls}\"\nplan_interval = \"200ms\"\n\n\
             [etcd]\nendpoints = [{endpoints}]\nlease_ttl = \"2s\"\ntimeout = \"500ms\"\n\
             ca_file = {ca:?}\ncert_file = {cert:?}\nkey_file = {key:?}\n\n\
             [control_plane]\ndesired_replicas = 1\n\n\
             [[hosts]]\nname = \"w-1\"\nrole = \"worker\"\n\n\
             [[hosts]]\nname = \"w-2\"\nrole = \"worker\"\n",
            port = port.port(),
            tls = tls.display(),
            endpoints = endpoints.join(", "),
            ca = pki.ca().display().to_string(),
            cert = client.cert.display().to_string(),
            key = client.key.display().to_string(),
        ),
    )
    .unwrap();
    let mut command = Command::new(test_bin_dir().join("metalguard-controller"));
    command
        .args(["run", "--inventory"])
        .arg(&inventory)
        .args(["--id", "ctl"])
        .env("RUST_LOG", "info");
    let ctl = Proc::spawn("controller", command, &d.join("controller.log")).unwrap();

    // w-1's host exports its identity as the kernel does; w-2's has no DMI files at all.
    let dmi: PathBuf = d.join("dmi-w-1");
    std::fs::create_dir_all(&dmi).unwrap();
    std::fs::write(dmi.join("product_uuid"), format!("{UUID}\n")).unwrap();
    std::fs::write(dmi.join("product_serial"), "MXQ-W-1\n").unwrap();
    let empty = d.join("dmi-w-2");
    std::fs::create_dir_all(&empty).unwrap();
    let mut w1 = agent(d, "w-1", port.port(), &dmi);
    let mut w2 = agent(d, "w-2", port.port(), &empty);
    let logs = |agent: &Proc| format!("{}\n---\n{}", ctl.log_tail(40), agent.log_tail(60));

    assert!(
        wait_log(
            &w1,
            &[
                UUID,
                "MXQ-W-1",
                "host identity read",
                "the controller takes this host's identity; sending it from now on",
            ],
            Duration::from_secs(30),
        ),
        "{}",
        logs(&w1)
    );
    // The reports carrying it are taken: the controller stores the identity with the report.
    let stored = wait_stored(&inventory, "w-1", |i| i["uuid"] == UUID);
    assert_eq!(stored["uuid"], UUID, "{stored}\n{}", logs(&w1));
    assert_eq!(stored["serial_number"], "MXQ-W-1", "{stored}");
    assert!(
        !w1.log_tail(400)
            .contains("a report with this host's identity was refused"),
        "{}",
        logs(&w1)
    );

    assert!(
        wait_log(
            &w2,
            &[
                "host identity field absent",
                "product_uuid: no such file",
                "product_serial: no such file",
            ],
            Duration::from_secs(30),
        ),
        "{}",
        logs(&w2)
    );
    let stored = wait_stored(&inventory, "w-2", |i| i["uuid_absent"].is_string());
    assert!(
        stored["uuid_absent"]
            .as_str()
            .is_some_and(|why| why.ends_with("/product_uuid: no such file (no DMI tables here, or the kernel does not export this one)")),
        "{stored}\n{}",
        logs(&w2)
    );
    assert!(stored.get("uuid").is_none(), "{stored}");
    assert!(w1.is_running() && w2.is_running());
}
