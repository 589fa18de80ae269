//! The controller against etcd as kubeadm runs it (TLS, client certificates required): `run`,
//! `status`, `fence` and `retire` with a black-holed endpoint among three, and each way the
//! connection can fail named per endpoint (wrong CA, no client certificate, a certificate of
//! another CA, nothing listening, plain HTTP to a TLS port).

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::fmt::Write as _;
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use metalguard_e2e::blackhole::BlackHole;
use metalguard_e2e::etcd::ClientTls;
use metalguard_e2e::etcd_pki::EtcdPki;
use metalguard_e2e::ports::reserve_port;

/// Runs the CLI; returns (success, stdout, stderr, how long it took).
fn cli(args: &[&str]) -> (bool, String, String, Duration) {
    let started = Instant::now();
    let out = Command::new(BIN).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
        started.elapsed(),
    )
}

/// The lab's inventory `name` with its `[etcd]` endpoints and TLS keys replaced.
fn inventory_with_etcd(
    lab: &Lab,
    name: &str,
    port: u16,
    endpoints: &[String],
    tls: &str,
) -> PathBuf {
    let listed = |list: &[String]| {
        list.iter()
            .map(|e| format!("{e:?}"))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let text = std::fs::read_to_string(lab.inventory(name, port))
        .unwrap()
        .replace(&listed(&lab.etcd.endpoints()), &listed(endpoints))
        .replace(&lab.etcd_tls_keys(), tls);
    let path = lab.dir.path().join(format!("{name}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

fn status_of(inventory: &Path) -> (bool, String, String, Duration) {
    cli(&["status", "--inventory", inventory.to_str().unwrap()])
}

#[tokio::test(flavor = "multi_thread")]
async fn status_fence_and_retire_work_with_one_endpoint_a_black_hole() {
    let lab = Lab::start_with(3);
    let hole = BlackHole::start().unwrap();
    let port = reserve_port().unwrap();
    // The black hole first: every client must get past it.
    let hole_url = format!("https://{}", hole.tcp_addr());
    let endpoints = vec![
        hole_url.clone(),
        lab.etcd.endpoints()[0].clone(),
        lab.etcd.endpoints()[1].clone(),
    ];
    let inventory =
        inventory_with_etcd(&lab, "holed", port.port(), &endpoints, &lab.etcd_tls_keys());
    let _controller = lab.controller_from("ctl-a", &inventory);
    let w1 = client(&lab.tls(), Some("w-1"));
    let led = wait_leader(&w1, port.port(), Duration::from_secs(20)).await;
    eprintln!("the controller leads {led:?} after start with a black-holed first endpoint");
    report_etcd_voter(&lab, port.port()).await;

    let (ok, out, err, took) = status_of(&inventory);
    eprintln!("status took {took:?}:\n{out}{err}");
    assert!(ok, "{out}{err}");
    assert!(out.contains("leader: ctl-a"), "{out}");
    let hole_line = out
        .lines()
        .find(|l| l.trim_start().starts_with(&hole_url))
        .unwrap_or_else(|| panic!("no line for the black hole:\n{out}"));
    assert!(
        hole_line.contains(": timeout: no answer within 500ms"),
        "{hole_line}"
    );
    for good in &endpoints[1..] {
        let line = out
            .lines()
            .find(|l| l.trim_start().starts_with(good.as_str()))
            .unwrap();
        assert!(
            line.contains(": member ") && line.contains("leader "),
            "{line}"
        );
    }
    // Every endpoint asked at once and the load moving on after one timeout: well within
    // three timeouts plus process start.
    assert!(took < Duration::from_secs(4), "status took {took:?}");

    let (ok, json, err, _) = cli(&[
        "status",
        "--json",
        "--inventory",
        inventory.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(
        doc["etcd_endpoints"][0]["failure"]["kind"], "timeout",
        "{doc}"
    );
    assert!(
        doc["etcd_endpoints"][1]["answer"]["member_id"].is_string(),
        "{doc}"
    );
    let (ok, json, err, _) = cli(&[
        "status",
        "--json",
        "--no-endpoint-probes",
        "--inventory",
        inventory.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert!(
        doc["etcd_endpoints"].is_null() && doc["leader"] == "ctl-a",
        "{doc}"
    );

    // fence and retire reach etcd through the same endpoints (the fence a power-off-only
    // one: the flag travels through the store to the leader's remediation).
    let (ok, out, err, _) = cli(&[
        "fence",
        "w-2",
        "--reason",
        "test",
        "--force",
        "--power-off",
        "--inventory",
        inventory.to_str().unwrap(),
    ]);
    assert!(ok && out.contains("fence of w-2 requested"), "{out}{err}");
    let (ok, out, err, _) = cli(&[
        "retire",
        "cp-1",
        "--reason",
        "disk",
        "--inventory",
        inventory.to_str().unwrap(),
    ]);
    assert!(
        ok && out.contains("retirement of cp-1 requested"),
        "{out}{err}"
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, out, _, _) = status_of(&inventory);
        if out.contains("remediation/w-2/") && out.contains("cp-1: retired") {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the leader never planned both:\n{out}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        operation_keys(&lab.etcd)
            .iter()
            .any(|k| k.contains("remediation/w-2/")),
        "the fence's intent was persisted"
    );
    let (ok, json, err, _) = cli(&[
        "status",
        "--json",
        "--no-endpoint-probes",
        "--inventory",
        inventory.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    let doc: serde_json::Value = serde_json::from_str(&json).unwrap();
    let remediation = doc["remediations"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["target"] == "w-2")
        .unwrap_or_else(|| panic!("{doc}"));
    assert_eq!(remediation["stay_off"], true, "{remediation}");
}

#[test]
fn each_way_of_failing_is_named_with_its_endpoint() {
    let lab = Lab::start();
    let endpoint = lab.etcd.endpoints()[0].clone();
    let other_dir = tempfile::tempdir().unwrap();
    // Another CA, with the name kubeadm gives every etcd CA.
    let other = EtcdPki::create(other_dir.path()).unwrap();
    let ours = &lab.etcd_client;
    let keys = |ca: &Path, client: Option<(&Path, &Path)>| {
        let mut text = format!("ca_file = {:?}\n", ca.display().to_string());
        if let Some((cert, key)) = client {
            let _ = write!(
                text,
                "cert_file = {:?}\nkey_file = {:?}\n",
                cert.display().to_string(),
                key.display().to_string()
            );
        }
        text
    };
    let failure = |name: &str, endpoints: &[String], tls: &str| {
        let inventory = inventory_with_etcd(&lab, name, 1, endpoints, tls);
        let (ok, out, err, took) = status_of(&inventory);
        assert!(!ok, "{name}: status succeeded:\n{out}");
        eprintln!("--- {name} ({took:?})\n{err}");
        err
    };
    let one = std::slice::from_ref(&endpoint);

    let err = failure(
        "wrong-ca",
        one,
        &keys(other.ca(), Some((&ours.client.cert, &ours.client.key))),
    );
    assert!(
        err.contains(&format!(
            "{endpoint}: tls: etcd's server certificate is not trusted (BadSignature)"
        )),
        "{err}"
    );

    let err = failure("no-client-cert", one, &keys(&ours.ca, None));
    assert!(
        err.contains(&format!(
            "{endpoint}: tls: etcd requires a client certificate"
        )),
        "{err}"
    );

    let foreign = other.issue_client("metalguard").unwrap();
    let err = failure(
        "foreign-client-cert",
        one,
        &keys(&ours.ca, Some((&foreign.cert, &foreign.key))),
    );
    assert!(
        err.contains(&format!(
            "{endpoint}: tls: etcd refused the client certificate"
        )),
        "{err}"
    );

    let dead = format!("https://127.0.0.1:{}", reserve_port().unwrap().port());
    let err = failure(
        "nothing-listens",
        std::slice::from_ref(&dead),
        &lab.etcd_tls_keys(),
    );
    assert!(err.contains(&format!("{dead}: unreachable: ")), "{err}");

    let plain = endpoint.replace("https://", "http://");
    let err = failure("http-to-tls", std::slice::from_ref(&plain), "");
    assert!(
        err.contains(&format!(
            "{plain}: unreachable: the server closed the connection"
        )) && err.contains("write https://"),
        "{err}"
    );

    // Every endpoint tried is listed, each with its own failure.
    let err = failure(
        "two-bad",
        &[dead.clone(), endpoint.clone()],
        &keys(&ours.ca, None),
    );
    assert!(
        err.contains(&format!("{dead}: unreachable")) && err.contains(&format!("{endpoint}: tls")),
        "{err}"
    );
}

#[test]
fn check_config_names_the_etcd_file_that_is_wrong() {
    let lab = Lab::start();
    let good = lab.inventory("good", 1);
    let (ok, out, err, _) = cli(&["check-config", "--inventory", good.to_str().unwrap()]);
    assert!(ok, "{out}{err}");

    // A key readable by others, and the CA file naming the client certificate.
    let loose = lab.dir.path().join("loose.key");
    std::fs::copy(&lab.etcd_client.client.key, &loose).unwrap();
    std::fs::set_permissions(&loose, std::fs::Permissions::from_mode(0o644)).unwrap();
    let bad = ClientTls {
        ca: lab.etcd_client.client.cert.clone(),
        client: metalguard_e2e::etcd_pki::CertFiles {
            cert: lab.etcd_client.client.cert.clone(),
            key: loose.clone(),
        },
    };
    let inventory =
        inventory_with_etcd(&lab, "bad", 1, &lab.etcd.endpoints(), &etcd_tls_keys(&bad));
    let (ok, _, err, _) = cli(&["check-config", "--inventory", inventory.to_str().unwrap()]);
    assert!(!ok);
    assert!(
        err.contains(&format!("etcd.key_file {}: has mode 0644", loose.display())),
        "{err}"
    );
    assert!(
        err.contains("etcd.ca_file") && err.contains("is not a CA certificate"),
        "{err}"
    );

    // https without a CA is refused when the inventory loads, by every subcommand.
    let no_ca = inventory_with_etcd(&lab, "no-ca", 1, &lab.etcd.endpoints(), "");
    for args in [
        vec!["check-config"],
        vec!["status"],
        vec!["fence", "w-1", "--reason", "x"],
    ] {
        let mut args = args.clone();
        args.extend(["--inventory", no_ca.to_str().unwrap()]);
        let (ok, _, err, _) = cli(&args);
        assert!(
            !ok && err.contains("etcd.ca_file is not set"),
            "{args:?}: {err}"
        );
    }
}
