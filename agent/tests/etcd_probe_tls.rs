//! The agent's `EtcdMemberHealthy` probe and `check-config` against an etcd run as kubeadm runs
//! it (TLS, `--client-cert-auth`), with the agent pointed at the host's kubeadm files
//! (`ca.crt`, `healthcheck-client.crt`/`.key`): over the client URL with the client
//! certificate, refused without it (and saying so), and over the plain-HTTP metrics URL.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use metalguard_e2e::etcd::EtcdCluster;
use metalguard_e2e::ports::reserve_port;
use metalguard_e2e::process::Proc;

const AGENT: &str = env!("CARGO_BIN_EXE_metalguard-agent");

/// The `[etcd]` lines of a variant.
fn etcd_section(cluster: &EtcdCluster, cert: bool, metrics: bool) -> String {
    let member = cluster.member(0);
    let pki = member.pki().unwrap();
    let mut text = format!(
        "[etcd]\nendpoints = [{:?}]\nca = {:?}\n",
        member.client_url(),
        pki.ca.display().to_string()
    );
    if cert {
        let _ = write!(
            text,
            "cert = {:?}\nkey = {:?}\n",
            pki.healthcheck_client.cert.display().to_string(),
            pki.healthcheck_client.key.display().to_string()
        );
    }
    if metrics {
        let _ = writeln!(text, "metrics_url = {:?}", member.metrics_url());
    }
    text.push_str("[etcd.probe]\nperiod = \"200ms\"\ntimeout = \"200ms\"\nfailure_threshold = 1\n");
    text
}

/// Runs the agent with `etcd` and returns the `EtcdMemberHealthy` entry of `/status` once the
/// probe has a verdict.
fn probe_verdict(dir: &Path, name: &str, etcd: &str) -> serde_json::Value {
    let port = reserve_port().unwrap();
    let config = dir.join(format!("{name}.toml"));
    std::fs::write(
        &config,
        format!(
            "host = \"cp-0\"\n[state]\ndir = \"{d}/{name}-state\"\n[metrics]\nlisten = \"127.0.0.1:{p}\"\n{etcd}",
            d = dir.display(),
            p = port.port(),
        ),
    )
    .unwrap();
    let p = port.port();
    drop(port);
    let mut command = Command::new(AGENT);
    command
        .args(["run", "--log-stderr", "--config"])
        .arg(&config);
    let _agent = Proc::spawn(name, command, &dir.join(format!("{name}.log"))).unwrap();
    let started = Instant::now();
    loop {
        if let Some(entry) = status(p).and_then(|s| {
            s["probes"]
                .as_array()?
                .iter()
                .find(|e| e["condition"] == "EtcdMemberHealthy" && !e["healthy"].is_null())
                .cloned()
        }) {
            return entry;
        }
        assert!(
            started.elapsed() < Duration::from_secs(15),
            "no verdict from {name}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn status(port: u16) -> Option<serde_json::Value> {
    let mut stream = TcpStream::connect(("127.0.0.1", port)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(
        stream,
        "GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    serde_json::from_str(text.split_once("\r\n\r\n")?.1).ok()
}

#[test]
fn the_member_probe_presents_the_client_certificate_or_reads_the_metrics_url() {
    let cluster = EtcdCluster::start(1).unwrap();
    let dir = tempfile::tempdir().unwrap();

    let with_cert = probe_verdict(
        dir.path(),
        "with-cert",
        &etcd_section(&cluster, true, false),
    );
    assert_eq!(with_cert["healthy"], true, "{with_cert}");

    // Without a client certificate etcd refuses the handshake, and the probe says so.
    let without = probe_verdict(
        dir.path(),
        "without-cert",
        &etcd_section(&cluster, false, false),
    );
    assert_eq!(without["healthy"], false, "{without}");
    assert_eq!(without["reason"], "TlsFailed", "{without}");
    let message = without["message"].as_str().unwrap();
    assert!(
        message.contains("/health") && message.contains("alert"),
        "{message}"
    );

    // kubeadm's way: the plain-HTTP metrics listener, no certificate needed.
    let metrics = probe_verdict(dir.path(), "metrics", &etcd_section(&cluster, false, true));
    assert_eq!(metrics["healthy"], true, "{metrics}");
}

#[test]
fn check_config_parses_the_etcd_files_and_names_the_one_that_is_wrong() {
    let cluster = EtcdCluster::start(1).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let check = |etcd: &str| {
        let config = dir.path().join("agent.toml");
        std::fs::write(&config, format!("host = \"cp-0\"\n{etcd}")).unwrap();
        let out = Command::new(AGENT)
            .args(["check-config", "--config"])
            .arg(&config)
            .output()
            .unwrap();
        (
            out.status.success(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let good = etcd_section(&cluster, true, false);
    let (ok, err) = check(&good);
    assert!(ok, "{err}");

    // The server's key in place of the client's: parsed, and found not to match.
    let pki = cluster.member(0).pki().unwrap();
    let swapped = good.replace(
        &pki.healthcheck_client.key.display().to_string(),
        &pki.server.key.display().to_string(),
    );
    let (ok, err) = check(&swapped);
    assert!(!ok);
    assert!(
        err.contains("etcd.key") && err.contains("does not go with etcd.cert"),
        "{err}"
    );

    // A certificate file that is no PEM, and https without a CA.
    let garbage = dir.path().join("garbage.crt");
    std::fs::write(&garbage, "not a certificate\n").unwrap();
    let bad = good.replace(
        &pki.healthcheck_client.cert.display().to_string(),
        &garbage.display().to_string(),
    );
    let (ok, err) = check(&bad);
    assert!(
        !ok && err.contains("etcd.cert") && err.contains("garbage.crt"),
        "{err}"
    );
    let no_ca = good
        .lines()
        .filter(|l| !l.starts_with("ca ="))
        .collect::<Vec<_>>()
        .join("\n");
    let (ok, err) = check(&no_ca);
    assert!(
        !ok && err.contains("etcd.ca: must be set with https://"),
        "{err}"
    );
}
