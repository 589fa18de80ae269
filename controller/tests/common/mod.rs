//! Shared fixtures of the controller's integration tests: a lab with real etcd, a CA and
//! certificates made by the real binary, inventories, and an mTLS client playing the agent.

// Not every test binary uses every helper.
#![allow(dead_code, unreachable_pub)]

use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use metalguard_api::duration::Timestamp;
use metalguard_api::protocol::{
    AgentReport, CommandBatch, EtcdMemberView, EtcdView, commands_path, report_path,
};
use metalguard_e2e::etcd::{ClientTls, EtcdCluster};
use metalguard_e2e::ports::PortLease;
use metalguard_e2e::process::Proc;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

pub const BIN: &str = env!("CARGO_BIN_EXE_metalguard-controller");

pub struct Lab {
    pub dir: tempfile::TempDir,
    pub etcd: EtcdCluster,
    /// The controller's etcd CA and client certificate (CN `metalguard`).
    pub etcd_client: ClientTls,
}

impl Lab {
    pub fn start() -> Self {
        Self::start_with(1)
    }

    pub fn start_with(etcd_members: usize) -> Self {
        let dir = tempfile::tempdir().unwrap();
        // etcd as kubeadm runs it: TLS, client certificates required.
        let etcd = EtcdCluster::start(etcd_members).unwrap();
        let etcd_client = ClientTls {
            ca: etcd.pki().unwrap().ca().to_owned(),
            client: etcd.pki().unwrap().issue_client("metalguard").unwrap(),
        };
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
        Self {
            dir,
            etcd,
            etcd_client,
        }
    }

    /// The `[etcd]` keys naming the controller's CA, client certificate and key.
    pub fn etcd_tls_keys(&self) -> String {
        etcd_tls_keys(&self.etcd_client)
    }

    pub fn inventory(&self, name: &str, port: u16) -> PathBuf {
        self.inventory_with(name, port, "")
    }

    /// An inventory with `extra` lines in its `[controller]` table.
    pub fn inventory_with(&self, name: &str, port: u16, extra: &str) -> PathBuf {
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
timeout = "500ms"
{etcd_tls}
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
            etcd_tls = self.etcd_tls_keys(),
            creds = self.dir.path().join("bmc-creds").display(),
        );
        let path = self.dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, text).unwrap();
        path
    }

    pub fn tls(&self) -> PathBuf {
        self.dir.path().join("tls")
    }

    pub fn controller(&self, name: &str, port: &PortLease) -> Proc {
        self.controller_with(name, port, "")
    }

    pub fn controller_with(&self, name: &str, port: &PortLease, extra: &str) -> Proc {
        let inventory = self.inventory_with(name, port.port(), extra);
        self.controller_from(name, &inventory)
    }

    pub fn controller_from(&self, name: &str, inventory: &Path) -> Proc {
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

    /// The controller started with the open-file soft limit at `nofile` (a login shell's or an
    /// old init's default of 1024), whatever this test process raised its own to.
    pub fn controller_with_nofile(&self, name: &str, port: &PortLease, nofile: u64) -> Proc {
        self.controller_with_nofile_and(name, port, ("-Sn", nofile), "")
    }

    /// [`Lab::controller_with_nofile`] with `ulimit`'s option (`-Sn`: the soft limit, which the
    /// controller raises to the hard one; `-n`: both) and `extra` lines in its `[controller]`
    /// section.
    pub fn controller_with_nofile_and(
        &self,
        name: &str,
        port: &PortLease,
        (option, nofile): (&str, u64),
        extra: &str,
    ) -> Proc {
        let inventory = self.inventory_with(name, port.port(), extra);
        let mut command = Command::new("sh");
        command
            .args([
                "-c",
                &format!("ulimit {option} {nofile} && exec \"$0\" \"$@\""),
                BIN,
                "run",
                "--inventory",
                inventory.to_str().unwrap(),
                "--id",
                name,
            ])
            .env("RUST_LOG", "info");
        Proc::spawn(name, command, &self.dir.path().join(format!("{name}.log"))).unwrap()
    }
}

/// `ca_file`, `cert_file` and `key_file` lines for `tls`.
pub fn etcd_tls_keys(tls: &ClientTls) -> String {
    format!(
        "ca_file = {:?}\ncert_file = {:?}\nkey_file = {:?}\n",
        tls.ca.display().to_string(),
        tls.client.cert.display().to_string(),
        tls.client.key.display().to_string()
    )
}

pub fn run(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The rustls client configuration of an agent (`host`) or of a client without certificate.
pub fn client_config(tls: &Path, host: Option<&str>) -> rustls::ClientConfig {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(tls.join("ca.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots);
    match host {
        Some(host) => {
            let chain = CertificateDer::pem_file_iter(tls.join(format!("{host}.pem")))
                .unwrap()
                .collect::<Result<Vec<_>, _>>()
                .unwrap();
            let key = PrivateKeyDer::from_pem_file(tls.join(format!("{host}-key.pem"))).unwrap();
            builder.with_client_auth_cert(chain, key).unwrap()
        }
        None => builder.with_no_client_auth(),
    }
}

/// An agent's client: mTLS as `host`, saying this tree's release as every agent does.
pub fn client(tls: &Path, host: Option<&str>) -> reqwest::Client {
    let (name, release) = metalguard_api::skew::our_header();
    let headers = [(name.parse().unwrap(), release.parse().unwrap())]
        .into_iter()
        .collect();
    reqwest::Client::builder()
        .tls_backend_preconfigured(client_config(tls, host))
        .default_headers(headers)
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// [`client`] without the release header: an agent of the release before the exchange.
pub fn client_unversioned(tls: &Path, host: Option<&str>) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_backend_preconfigured(client_config(tls, host))
        .timeout(Duration::from_secs(20))
        .build()
        .unwrap()
}

/// How many times `key` was written since it was created (etcd's per-key `version`; 0 when
/// absent).
pub fn key_version(etcd: &EtcdCluster, key: &str) -> u64 {
    let out = etcd.etcdctl(&["get", key, "-w", "json"]).unwrap();
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    json["kvs"]
        .as_array()
        .and_then(|kvs| kvs.first())
        .and_then(|kv| kv["version"].as_u64())
        .unwrap_or(0)
}

pub fn report(host: &str, sequence: u64) -> AgentReport {
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
        holds: Vec::new(),
        seen_term: 0,
        host_identity: None,
    }
}

pub fn url(port: u16, path: &str) -> String {
    format!("https://localhost:{port}{path}")
}

pub async fn post_report(
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
pub async fn wait_leader(client: &reqwest::Client, port: u16, within: Duration) -> Duration {
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

pub async fn poll(client: &reqwest::Client, port: u16, host: &str, wait: Duration) -> CommandBatch {
    let response = client
        .get(url(port, &commands_path(host, wait)))
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200);
    response.json().await.unwrap()
}

/// cp-1's view of a healthy etcd whose only member, cp-1 (id 1), votes and leads.
pub fn single_voter_view() -> EtcdView {
    EtcdView {
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
    }
}

/// cp-1's agent reports a healthy single-voter etcd (the quorum guard needs a known voter).
pub async fn report_etcd_voter(lab: &Lab, port: u16) {
    let mut cp = report("cp-1", 1);
    cp.etcd = Some(single_voter_view());
    let status = client(&lab.tls(), Some("cp-1"))
        .post(url(port, &report_path("cp-1")))
        .json(&cp)
        .send()
        .await
        .unwrap()
        .status();
    assert_eq!(status.as_u16(), 200);
}

pub fn operation_keys(etcd: &EtcdCluster) -> Vec<String> {
    etcd.etcdctl(&["get", "--prefix", "--keys-only", "/metalguard/operations/"])
        .unwrap()
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(str::to_owned)
        .collect()
}

/// GET /metrics over plain HTTP/1.0.
pub fn scrape(port: u16) -> String {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).unwrap();
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .unwrap();
    let mut text = String::new();
    stream.read_to_string(&mut text).unwrap();
    text
}

/// w-1's stored report in etcd.
pub const W1_REPORT_KEY: &str = "/metalguard/reports/w-1";

/// A `KubeletHealthy` condition.
pub fn kubelet(
    status: metalguard_api::snapshot::ConditionStatus,
    since: u64,
    message: String,
) -> metalguard_api::protocol::Condition {
    metalguard_api::protocol::Condition {
        type_: "KubeletHealthy".into(),
        status,
        reason: "Probe".into(),
        message,
        last_transition: Timestamp(since),
    }
}

/// Posts `report` for its host; true when the controller took it.
pub async fn send(
    agent: &reqwest::Client,
    port: u16,
    report: &metalguard_api::protocol::AgentReport,
) -> bool {
    agent
        .post(url(port, &report_path(&report.host)))
        .json(report)
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}
