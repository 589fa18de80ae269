//! The real `metalguard-controller` binary against real etcd: mTLS identity, leader election
//! and hand-over, and persisted intent surviving a controller crash.
//!
//! The agent side is played by the test with an mTLS HTTP client, so the controller's own
//! behaviour (which commands it offers, under which operation ids) is what is asserted.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metalguard_api::duration::Timestamp;
use metalguard_api::protocol::{
    AgentReport, CommandBatch, CommandKind, CommandResult, EtcdMemberView, EtcdView, Outcome,
    PowerAction, ResultAck, commands_path, report_path, results_path,
};
use metalguard_e2e::etcd::EtcdCluster;
use metalguard_e2e::ports::{PortLease, reserve_port};
use metalguard_e2e::process::Proc;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

const BIN: &str = env!("CARGO_BIN_EXE_metalguard-controller");

struct Lab {
    dir: tempfile::TempDir,
    etcd: EtcdCluster,
}

impl Lab {
    fn start() -> Self {
        Self::start_with(1)
    }

    fn start_with(etcd_members: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let etcd = EtcdCluster::start(etcd_members).unwrap();
        let tls = dir.path().join("tls");
        run(&["certs", "init", tls.to_str().unwrap()]);
        run(&[
            "certs",
            "issue",
            "controller",
            tls.to_str().unwrap(),
            "--server",
        ]);
        for host in ["cp-1", "w-1", "w-2"] {
            run(&["certs", "issue", host, tls.to_str().unwrap()]);
        }
        let creds = dir.path().join("bmc-creds");
        std::fs::create_dir(&creds).unwrap();
        for (file, value) in [("username", "admin"), ("password", "hunter2")] {
            let path = creds.join(file);
            std::fs::write(&path, value).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        Self { dir, etcd }
    }

    fn inventory(&self, name: &str, port: u16) -> PathBuf {
        self.inventory_with(name, port, "")
    }

    /// An inventory with `extra` lines in its `[controller]` table.
    fn inventory_with(&self, name: &str, port: u16, extra: &str) -> PathBuf {
        let endpoints: Vec<String> = self
            .etcd
            .endpoints()
            .iter()
            .map(|e| format!("{e:?}"))
            .collect();
        let text = format!(
            r#"
[controller]
listen = "127.0.0.1:{port}"
tls_dir = "{tls}"
plan_interval = "200ms"
{extra}

[etcd]
endpoints = [{endpoints}]
lease_ttl = "2s"
timeout = "1s"

[control_plane]
desired_replicas = 1

[[hosts]]
name = "cp-1"
role = "control-plane"

[[hosts]]
name = "w-1"
role = "worker"
bmc = {{ address = "ipmi://127.0.0.1:1623", credentials_dir = "{creds}" }}

[[hosts]]
name = "w-2"
role = "worker"
bmc = {{ address = "ipmi://127.0.0.1:2623", credentials_dir = "{creds}" }}
"#,
            tls = self.tls().display(),
            endpoints = endpoints.join(", "),
            creds = self.dir.path().join("bmc-creds").display(),
        );
        let path = self.dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        path
    }

    fn tls(&self) -> PathBuf {
        self.dir.path().join("tls")
    }

    fn controller(&self, name: &str, port: &PortLease) -> Proc {
        self.controller_with(name, port, "")
    }

    fn controller_with(&self, name: &str, port: &PortLease, extra: &str) -> Proc {
        let inventory = self.inventory_with(name, port.port(), extra);
        self.controller_from(name, &inventory)
    }

    fn controller_from(&self, name: &str, inventory: &Path) -> Proc {
        let mut command = Command::new(BIN);
        command
            .args([
                "run",
                "--inventory",
                inventory.to_str().unwrap(),
                "--id",
                name,
            ])
            .env("RUST_LOG", "info,metalguard_controller::service=debug");
        Proc::spawn(name, command, &self.dir.path().join(format!("{name}.log"))).unwrap()
    }
}

fn run(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn client(tls: &Path, host: Option<&str>) -> reqwest::Client {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(tls.join("ca.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    let config = match host {
        Some(host) => {
            let chain = CertificateDer::pem_file_iter(tls.join(format!("{host}.pem")))
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_file(tls.join(format!("{host}-key.pem"))).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    };
    reqwest::Client::builder()
        .tls_backend_preconfigured(config)
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

fn report(host: &str, sequence: u64) -> AgentReport {
    AgentReport {
        host: host.to_owned(),
        agent_version: "test".to_owned(),
        sequence,
        boot_id: "b".to_owned(),
        sent_at: Timestamp(0),
        conditions: Vec::new(),
        etcd: None,
        bmc_reachability: Vec::new(),
        unacknowledged_results: Vec::new(),
    }
}

fn url(port: u16, path: &str) -> String {
    format!("https://localhost:{port}{path}")
}

async fn post_report(
    client: &reqwest::Client,
    port: u16,
    path_host: &str,
    body_host: &str,
) -> Result<u16, String> {
    client
        .post(url(port, &report_path(path_host)))
        .json(&report(body_host, 1))
        .send()
        .await
        .map(|r| r.status().as_u16())
        .map_err(|e| format!("{e:?}"))
}

/// Waits until the controller on `port` leads (answers 200 to a report).
async fn wait_leader(client: &reqwest::Client, port: u16, within: Duration) -> Duration {
    let started = Instant::now();
    loop {
        if post_report(client, port, "w-1", "w-1").await == Ok(200) {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < within,
            "controller on {port} did not lead within {within:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn poll(client: &reqwest::Client, port: u16, host: &str, wait: Duration) -> CommandBatch {
    let response = client
        .get(url(port, &commands_path(host, wait)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    response.json().await.unwrap()
}

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

/// cp-1's agent reports a healthy single-voter etcd (the quorum guard needs a known voter).
async fn report_etcd_voter(lab: &Lab, port: u16) {
    let mut cp = report("cp-1", 1);
    cp.etcd = Some(EtcdView {
        local_member_id: Some(1),
        leader_id: Some(1),
        members: vec![EtcdMemberView {
            id: 1,
            name: "cp-1".to_owned(),
            peer_urls: Vec::new(),
            client_urls: Vec::new(),
            learner: false,
            healthy: true,
            alarms: Vec::new(),
            raft_applied_index: Some(10),
            error: None,
        }],
    });
    let status = client(&lab.tls(), Some("cp-1"))
        .post(url(port, &report_path("cp-1")))
        .json(&cp)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status.as_u16(), 200);
}

fn operation_keys(etcd: &EtcdCluster) -> Vec<String> {
    etcd.etcdctl(&["get", "--prefix", "--keys-only", "/metalguard/operations/"])
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

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
        "fence requested -> command at the executor's open long-poll: {:?} (plan interval 200ms)",
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
    let _second = lab.controller("ctl-b", &port);
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

    // The agent reports the (single) execution; a retried post is recognised as a retry.
    let result = CommandResult {
        operation_id: command.operation_id.clone(),
        outcome: Outcome::Succeeded,
        started_at: Timestamp(1),
        finished_at: Timestamp(2),
        timeline: Vec::new(),
        error: None,
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
    let status = run(&["status", "--inventory", inventory.to_str().unwrap()]);
    assert!(status.contains("leader: ctl-b"), "{status}");
    assert!(status.contains("w-1: agent test"), "{status}");
    assert!(status.contains("succeeded"), "{status}");
    assert!(!status.contains("hunter2"));
}

/// GET /metrics over plain HTTP/1.0.
fn scrape(port: u16) -> String {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
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
            "timeout = \"1s\"",
            &format!("timeout = \"1s\"\nprefix = \"/latency-{i}\""),
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
