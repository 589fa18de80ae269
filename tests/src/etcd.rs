//! A cluster of real `etcd` processes, on 127.0.0.1 unless [`EtcdOptions::placements`] puts
//! members on other addresses or in network namespaces (the lab's netns mode).
//!
//! By default the cluster runs as kubeadm runs it ([`EtcdSecurity::ClientCertTls`]): client
//! and peer URLs are `https://`, both require a client certificate signed by the cluster's
//! CA (`--client-cert-auth`, `--peer-client-cert-auth`), and the certificates are generated
//! per cluster in kubeadm's layout ([`crate::etcd_pki`]). [`EtcdSecurity::PlainHttp`] is the
//! explicit exception. Either way every member also serves `/health` and `/metrics` over plain
//! HTTP on its own metrics URL (`--listen-metrics-urls`, kubeadm's `http://127.0.0.1:2381`),
//! which the harness's health checks read.
//!
//! Each member has its own data directory under the cluster's temporary directory and its
//! own reserved client, peer and metrics ports. Membership is driven with `etcdctl` (a client
//! independent of metalguard's code under test; with TLS it presents a client certificate with
//! CN `root`). Election and heartbeat timings are etcd's defaults unless [`EtcdOptions`] says
//! otherwise.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde::Deserialize;

use crate::etcd_pki::{CertFiles, EtcdPki, MemberPki, ROOT_CLIENT_CN};
use crate::ports::{PortLease, reserve_port};
use crate::process::{Proc, run_capture, wait_until};
use crate::{HarnessError, Result, http, netns, tools};

/// How long [`EtcdCluster::start`] waits for a new cluster to become healthy.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`EtcdCluster::add_learner`] retries etcd's "unhealthy cluster" refusal.
const RECONFIG_SETTLE: Duration = Duration::from_secs(15);
/// Per-request timeout of the harness's own health probes.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// `etcdctl --command-timeout` of [`EtcdCluster::etcdctl`].
const ETCDCTL_TIMEOUT: Duration = Duration::from_secs(5);

/// Options for a cluster.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// Number of voting members to start.
    pub members: usize,
    /// `--quota-backend-bytes` (for NOSPACE tests).
    pub quota_backend_bytes: Option<u64>,
    /// `--heartbeat-interval` in milliseconds (etcd's default is 100).
    pub heartbeat_interval: Duration,
    /// `--election-timeout` in milliseconds (etcd's default is 1000).
    pub election_timeout: Duration,
    /// Extra arguments for every member.
    pub extra_args: Vec<String>,
    /// Member names in start order (then `m<N>`); the local lab names members after hosts.
    pub names: Vec<String>,
    /// Where members run, in start order (then [`Placement::default`]).
    pub placements: Vec<Placement>,
    /// How clients and peers talk to the members (default: TLS with client certificates).
    pub security: EtcdSecurity,
}

/// How clients and peers reach the members.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EtcdSecurity {
    /// kubeadm's setup: `https://` client and peer URLs, client certificates required on
    /// both (`--client-cert-auth`, `--peer-client-cert-auth`), one CA for all.
    #[default]
    ClientCertTls,
    /// `http://` everywhere, no authentication: only for tests that say so in their name or
    /// their module documentation.
    PlainHttp,
}

impl EtcdSecurity {
    fn scheme(self) -> &'static str {
        match self {
            Self::ClientCertTls => "https",
            Self::PlainHttp => "http",
        }
    }
}

/// Where a member runs: the address it listens on (client and peer) and the network
/// namespace its process starts in (`None`: the caller's).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Placement {
    /// Listen and advertise address.
    pub address: Ipv4Addr,
    /// Network namespace (as `ip netns` names it).
    pub netns: Option<String>,
}

impl Default for Placement {
    fn default() -> Self {
        Self {
            address: Ipv4Addr::LOCALHOST,
            netns: None,
        }
    }
}

impl Default for EtcdOptions {
    fn default() -> Self {
        Self {
            members: 3,
            quota_backend_bytes: None,
            heartbeat_interval: Duration::from_millis(100),
            election_timeout: Duration::from_secs(1),
            extra_args: Vec::new(),
            names: Vec::new(),
            placements: Vec::new(),
            security: EtcdSecurity::default(),
        }
    }
}

/// What the harness did to a member last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemberState {
    /// Running normally.
    Running,
    /// Frozen with SIGSTOP.
    Hung,
    /// Killed; its data directory is kept.
    Killed,
}

/// Ports and a data directory for a host whose etcd the code under test starts itself (for
/// example the agent's learner join).
#[derive(Debug)]
pub struct HostSlot {
    /// Member name.
    pub name: String,
    /// `https://<address>:<client port>` (`http://` for a plain-HTTP cluster).
    pub client_url: String,
    /// `https://<address>:<peer port>` (`http://` for a plain-HTTP cluster).
    pub peer_url: String,
    /// `http://<address>:<metrics port>`: `/health` and `/metrics` without TLS.
    pub metrics_url: String,
    /// Data directory (does not exist yet).
    pub data_dir: PathBuf,
    /// The member's certificates in kubeadm's layout (`None` for a plain-HTTP cluster).
    pub pki: Option<MemberPki>,
    placement: Placement,
    client: PortLease,
    peer: PortLease,
    metrics: PortLease,
}

impl HostSlot {
    /// Where the member runs.
    pub fn placement(&self) -> &Placement {
        &self.placement
    }

    /// The `ETCD_*` variables a member in this slot needs beyond its name, URLs, data directory
    /// and initial cluster: its metrics URL and, with TLS, its certificates and the
    /// client-certificate requirements.
    pub fn extra_env(&self) -> Vec<(String, String)> {
        let mut env = vec![(
            "ETCD_LISTEN_METRICS_URLS".to_owned(),
            self.metrics_url.clone(),
        )];
        if let Some(pki) = &self.pki {
            env.extend(pki.etcd_env());
        }
        env
    }

    fn metrics_addr(&self) -> SocketAddr {
        SocketAddr::from((self.placement.address, self.metrics.port()))
    }

    /// The client port.
    pub fn client_port(&self) -> u16 {
        self.client.port()
    }

    /// The peer port.
    pub fn peer_port(&self) -> u16 {
        self.peer.port()
    }
}

/// One member of the cluster.
#[derive(Debug)]
pub struct EtcdMember {
    slot: HostSlot,
    initial_cluster: String,
    proc: Option<Proc>,
    state: MemberState,
}

impl EtcdMember {
    /// Member name (`m0`, `m1`, ...).
    pub fn name(&self) -> &str {
        &self.slot.name
    }
    /// Client URL.
    pub fn client_url(&self) -> &str {
        &self.slot.client_url
    }
    /// Peer URL.
    pub fn peer_url(&self) -> &str {
        &self.slot.peer_url
    }
    /// Data directory.
    pub fn data_dir(&self) -> &Path {
        &self.slot.data_dir
    }
    /// Process id while the process exists (running or hung).
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().and_then(Proc::pid)
    }
    /// What the harness did to the member last.
    pub fn state(&self) -> MemberState {
        self.state
    }
    /// The member's log file.
    pub fn log_path(&self) -> PathBuf {
        self.slot.data_dir.with_extension("log")
    }
    /// Plain-HTTP metrics URL (`/health`, `/metrics`).
    pub fn metrics_url(&self) -> &str {
        &self.slot.metrics_url
    }
    /// The member's certificates in kubeadm's layout (`None` for a plain-HTTP cluster).
    pub fn pki(&self) -> Option<&MemberPki> {
        self.slot.pki.as_ref()
    }
    /// Address of the plain-HTTP metrics listener (`/health`).
    pub fn metrics_addr(&self) -> SocketAddr {
        self.slot.metrics_addr()
    }
}

/// A member as `etcdctl member list -w json` reports it.
#[derive(Debug, Clone, Deserialize)]
pub struct MemberInfo {
    /// Member id (decimal in etcdctl's JSON).
    #[serde(rename = "ID")]
    pub id: u64,
    /// Name; empty for a member that was added but never started.
    #[serde(default)]
    pub name: String,
    /// Peer URLs.
    #[serde(rename = "peerURLs", default)]
    pub peer_urls: Vec<String>,
    /// Client URLs; empty before the member started.
    #[serde(rename = "clientURLs", default)]
    pub client_urls: Vec<String>,
    /// Whether the member is a learner.
    #[serde(rename = "isLearner", default)]
    pub is_learner: bool,
}

impl MemberInfo {
    /// The id in hex, as `etcdctl member promote/remove` take it.
    pub fn id_hex(&self) -> String {
        format!("{:x}", self.id)
    }
}

#[derive(Debug, Deserialize)]
struct MemberList {
    #[serde(default)]
    members: Vec<MemberInfo>,
}

/// A running etcd cluster. Dropping it kills every member and removes its directories.
#[derive(Debug)]
pub struct EtcdCluster {
    // Field order matters: members (and their processes) drop before the directory.
    members: Vec<EtcdMember>,
    options: EtcdOptions,
    next_index: usize,
    tls: Option<ClusterTls>,
    dir: tempfile::TempDir,
}

/// The CA of a TLS cluster and the harness's own client certificate.
#[derive(Debug)]
struct ClusterTls {
    pki: EtcdPki,
    root_client: CertFiles,
}

/// The files a client needs to reach a TLS cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientTls {
    /// The CA that signed the members' certificates.
    pub ca: PathBuf,
    /// The client certificate and key.
    pub client: CertFiles,
}

impl EtcdCluster {
    /// Starts `members` voting members with default options and waits until all are healthy.
    pub fn start(members: usize) -> Result<Self> {
        Self::start_with(EtcdOptions {
            members,
            ..EtcdOptions::default()
        })
    }

    /// Starts a cluster with `options` and waits until every member is healthy.
    pub fn start_with(options: EtcdOptions) -> Result<Self> {
        if options.members == 0 {
            return Err(HarnessError::Other(
                "an etcd cluster needs at least one member".into(),
            ));
        }
        let dir = tools::temp_dir("etcd")?;
        let tls = match options.security {
            EtcdSecurity::ClientCertTls => {
                let pki = EtcdPki::create(&dir.path().join("pki"))?;
                let root_client = pki.issue_client(ROOT_CLIENT_CN)?;
                Some(ClusterTls { pki, root_client })
            }
            EtcdSecurity::PlainHttp => None,
        };
        let mut cluster = Self {
            members: Vec::new(),
            options,
            next_index: 0,
            tls,
            dir,
        };
        let slots: Vec<HostSlot> = (0..cluster.options.members)
            .map(|_| cluster.reserve_host())
            .collect::<Result<_>>()?;
        let initial_cluster = slots
            .iter()
            .map(|s| format!("{}={}", s.name, s.peer_url))
            .collect::<Vec<_>>()
            .join(",");
        for slot in slots {
            let member = EtcdMember {
                slot,
                initial_cluster: initial_cluster.clone(),
                proc: None,
                state: MemberState::Killed,
            };
            cluster.members.push(member);
        }
        for i in 0..cluster.members.len() {
            cluster.spawn(i, "new")?;
        }
        cluster.wait_healthy(START_TIMEOUT)?;
        Ok(cluster)
    }

    /// Starts `members` voting members over plain HTTP (no TLS, no client certificates) and
    /// waits until all are healthy. Only for tests whose subject is not the transport.
    pub fn start_plain_http(members: usize) -> Result<Self> {
        Self::start_with(EtcdOptions {
            members,
            security: EtcdSecurity::PlainHttp,
            ..EtcdOptions::default()
        })
    }

    /// Reserves ports, a data directory and (with TLS) certificates for a further host (`m<N>`)
    /// without starting it.
    pub fn reserve_host(&mut self) -> Result<HostSlot> {
        let name = self
            .options
            .names
            .get(self.next_index)
            .cloned()
            .unwrap_or_else(|| format!("m{}", self.next_index));
        let placement = self
            .options
            .placements
            .get(self.next_index)
            .cloned()
            .unwrap_or_default();
        self.next_index += 1;
        let client = reserve_port()?;
        let peer = reserve_port()?;
        let metrics = reserve_port()?;
        let address = placement.address;
        let scheme = self.options.security.scheme();
        let pki = match &self.tls {
            Some(tls) => Some(tls.pki.issue_member(&name, address)?),
            None => None,
        };
        Ok(HostSlot {
            client_url: format!("{scheme}://{address}:{}", client.port()),
            peer_url: format!("{scheme}://{address}:{}", peer.port()),
            metrics_url: format!("http://{address}:{}", metrics.port()),
            data_dir: self.dir.path().join(&name),
            pki,
            name,
            placement,
            client,
            peer,
            metrics,
        })
    }

    /// How clients reach the members.
    pub fn security(&self) -> EtcdSecurity {
        self.options.security
    }

    /// The cluster's CA, which issues further member and client certificates (`None` for a
    /// plain-HTTP cluster).
    pub fn pki(&self) -> Option<&EtcdPki> {
        self.tls.as_ref().map(|t| &t.pki)
    }

    /// The CA and the harness's own client certificate (CN `root`), as `etcdctl` uses them
    /// (`None` for a plain-HTTP cluster).
    pub fn client_tls(&self) -> Option<ClientTls> {
        self.tls.as_ref().map(|t| ClientTls {
            ca: t.pki.ca().to_owned(),
            client: t.root_client.clone(),
        })
    }

    /// The cluster's temporary directory.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The options the cluster was started with.
    pub fn options(&self) -> &EtcdOptions {
        &self.options
    }

    /// Client URLs of every member the harness started (whatever their state).
    pub fn endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .map(|m| m.client_url().to_owned())
            .collect()
    }

    /// Client URLs of the members that are running (not hung, not killed).
    pub fn running_endpoints(&self) -> Vec<String> {
        self.members
            .iter()
            .filter(|m| m.state == MemberState::Running)
            .map(|m| m.client_url().to_owned())
            .collect()
    }

    /// Member `i`.
    pub fn member(&self, i: usize) -> &EtcdMember {
        &self.members[i]
    }

    /// Number of members the harness started.
    pub fn len(&self) -> usize {
        self.members.len()
    }

    /// Whether the cluster has no members (never true after start).
    pub fn is_empty(&self) -> bool {
        self.members.is_empty()
    }

    fn spawn(&mut self, i: usize, state: &str) -> Result<()> {
        let etcd = tools::etcd_bin()?;
        let member = &self.members[i];
        let mut command = netns::command_in(member.slot.placement.netns.as_deref(), &etcd)?;
        command
            .arg("--name")
            .arg(member.name())
            .arg("--data-dir")
            .arg(member.data_dir())
            .arg("--listen-client-urls")
            .arg(member.client_url())
            .arg("--advertise-client-urls")
            .arg(member.client_url())
            .arg("--listen-peer-urls")
            .arg(member.peer_url())
            .arg("--initial-advertise-peer-urls")
            .arg(member.peer_url())
            .arg("--initial-cluster")
            .arg(&member.initial_cluster)
            .arg("--initial-cluster-state")
            .arg(state)
            .arg("--initial-cluster-token")
            .arg(self.dir.path().file_name().map_or_else(
                || "mg-harness".to_owned(),
                |n| n.to_string_lossy().into_owned(),
            ))
            .arg("--heartbeat-interval")
            .arg(self.options.heartbeat_interval.as_millis().to_string())
            .arg("--election-timeout")
            .arg(self.options.election_timeout.as_millis().to_string())
            .arg("--listen-metrics-urls")
            .arg(member.metrics_url())
            .arg("--logger")
            .arg("zap")
            .args(member.pki().map(MemberPki::etcd_flags).unwrap_or_default())
            .args(&self.options.extra_args);
        if let Some(quota) = self.options.quota_backend_bytes {
            command.arg("--quota-backend-bytes").arg(quota.to_string());
        }
        let log = member.log_path();
        let proc = Proc::spawn(format!("etcd {}", member.name()), command, &log)?;
        let member = &mut self.members[i];
        member.proc = Some(proc);
        member.state = MemberState::Running;
        Ok(())
    }

    /// Kills member `i` (SIGKILL); its data directory stays.
    pub fn kill(&mut self, i: usize) {
        let member = &mut self.members[i];
        if let Some(mut proc) = member.proc.take() {
            proc.kill();
        }
        member.state = MemberState::Killed;
    }

    /// Freezes member `i` (SIGSTOP): its sockets stay open, it answers nothing.
    pub fn hang(&mut self, i: usize) -> Result<()> {
        let member = &mut self.members[i];
        member
            .proc
            .as_ref()
            .ok_or_else(|| not_running(member))?
            .freeze()?;
        member.state = MemberState::Hung;
        Ok(())
    }

    /// Thaws member `i` (SIGCONT).
    pub fn resume(&mut self, i: usize) -> Result<()> {
        let member = &mut self.members[i];
        member
            .proc
            .as_ref()
            .ok_or_else(|| not_running(member))?
            .thaw()?;
        member.state = MemberState::Running;
        Ok(())
    }

    /// Kills member `i` if needed and starts it again from its data directory.
    pub fn restart(&mut self, i: usize) -> Result<()> {
        self.kill(i);
        self.spawn(i, "existing")
    }

    /// Adds a learner with `etcdctl member add --learner`, starts it and waits until it serves
    /// `/health` and the voters' member list shows it started (under its name: a learner
    /// that already serves `/health` can still be nameless there, seen on etcd 3.4, and a
    /// nameless member reads as never started). Returns its index.
    pub fn add_learner(&mut self) -> Result<usize> {
        let slot = self.reserve_host()?;
        let peer_urls = format!("--peer-urls={}", slot.peer_url);
        let args = ["member", "add", &slot.name, "--learner", &peer_urls];
        // etcd refuses membership changes ("unhealthy cluster") until every member has been
        // connected for its health interval (5 s), e.g. right after the cluster started.
        let deadline = Instant::now() + RECONFIG_SETTLE;
        let output = loop {
            match self.etcdctl(&args) {
                Err(HarnessError::Command { detail, .. })
                    if detail.contains("unhealthy cluster") && Instant::now() < deadline =>
                {
                    std::thread::sleep(Duration::from_millis(250));
                }
                other => break other?,
            }
        };
        let initial_cluster = output
            .lines()
            .find_map(|line| line.strip_prefix("ETCD_INITIAL_CLUSTER="))
            .map(|v| v.trim_matches('"').to_owned())
            .ok_or_else(|| HarnessError::Command {
                command: "etcdctl member add --learner".into(),
                detail: format!("no ETCD_INITIAL_CLUSTER in output: {output}"),
            })?;
        self.members.push(EtcdMember {
            slot,
            initial_cluster,
            proc: None,
            state: MemberState::Killed,
        });
        let index = self.members.len() - 1;
        self.spawn(index, "existing")?;
        let addr = self.members[index].metrics_addr();
        wait_until("the learner to serve /health", START_TIMEOUT, || {
            self.check_alive(index)?;
            Ok(http::get(addr, "/health", PROBE_TIMEOUT).is_some())
        })?;
        let voters: Vec<String> = self.members[..index]
            .iter()
            .filter(|m| m.state == MemberState::Running)
            .map(|m| m.client_url().to_owned())
            .collect();
        let name = self.members[index].name().to_owned();
        wait_until(
            "the learner to show started in the member list",
            START_TIMEOUT,
            || {
                self.check_alive(index)?;
                Ok(self.member_list_at(&voters).is_ok_and(|list| {
                    list.iter()
                        .any(|m| m.name == name && !m.client_urls.is_empty())
                }))
            },
        )?;
        Ok(index)
    }

    fn check_alive(&mut self, i: usize) -> Result<()> {
        match self.members[i].proc.as_mut() {
            Some(proc) => proc.ensure_running(),
            None => Err(not_running(&self.members[i])),
        }
    }

    /// Waits until every running member answers `/health` with `"health":"true"`.
    pub fn wait_healthy(&mut self, timeout: Duration) -> Result<()> {
        let started = Instant::now();
        let running: Vec<usize> = (0..self.members.len())
            .filter(|&i| self.members[i].state == MemberState::Running)
            .collect();
        for i in running {
            let addr = self.members[i].metrics_addr();
            let left = timeout.saturating_sub(started.elapsed());
            let what = format!("etcd {} to report healthy", self.members[i].name());
            wait_until(&what, left, || {
                self.check_alive(i)?;
                Ok(is_healthy(addr))
            })?;
        }
        Ok(())
    }

    /// Whether member `i` answers `/health` with `"health":"true"` right now.
    pub fn is_healthy(&self, i: usize) -> bool {
        is_healthy(self.members[i].metrics_addr())
    }

    /// Runs `etcdctl` against the running members and returns its stdout.
    pub fn etcdctl(&self, args: &[&str]) -> Result<String> {
        self.etcdctl_at(&self.running_endpoints(), ETCDCTL_TIMEOUT, args)
    }

    /// Runs `etcdctl` against `endpoints` only (for example a majority cut off from one
    /// member) with `timeout` per command and returns its stdout.
    pub fn etcdctl_at(
        &self,
        endpoints: &[String],
        timeout: Duration,
        args: &[&str],
    ) -> Result<String> {
        etcdctl_with(endpoints, self.client_tls().as_ref(), timeout, args)
    }

    /// The flags that give `etcdctl` the harness's client certificate, for commands a person
    /// copies (empty for a plain-HTTP cluster).
    pub fn etcdctl_tls_flags(&self) -> String {
        self.client_tls().map_or_else(String::new, |t| {
            format!(
                "--cacert={} --cert={} --key={}",
                t.ca.display(),
                t.client.cert.display(),
                t.client.key.display()
            )
        })
    }

    /// Writes `key=value`.
    pub fn put(&self, key: &str, value: &str) -> Result<()> {
        self.etcdctl(&["put", key, value]).map(drop)
    }

    /// Writes a probe key until a write succeeds (for example after a leader was frozen and a
    /// new one must be elected) or `timeout` passes.
    pub fn wait_writable(&self, timeout: Duration) -> Result<()> {
        wait_until("the cluster to accept writes", timeout, || {
            Ok(self.put("/metalguard-harness/probe", "1").is_ok())
        })
    }

    /// Reads `key` (linearizable), `None` when absent.
    pub fn get(&self, key: &str) -> Result<Option<String>> {
        let out = self.etcdctl(&["get", key, "--print-value-only"])?;
        let value = out.strip_suffix('\n').unwrap_or(&out);
        Ok(if out.is_empty() {
            None
        } else {
            Some(value.to_owned())
        })
    }

    /// The member list as etcd reports it.
    pub fn member_list(&self) -> Result<Vec<MemberInfo>> {
        self.member_list_at(&self.running_endpoints())
    }

    /// The member list as `endpoints` report it.
    fn member_list_at(&self, endpoints: &[String]) -> Result<Vec<MemberInfo>> {
        let out = self.etcdctl_at(
            endpoints,
            ETCDCTL_TIMEOUT,
            &["member", "list", "-w", "json"],
        )?;
        let list: MemberList = serde_json::from_str(&out).map_err(|e| HarnessError::Command {
            command: "etcdctl member list -w json".into(),
            detail: format!("unparsable output ({e}): {out}"),
        })?;
        Ok(list.members)
    }
}

/// Runs `etcdctl` against `endpoints` with `tls` (if any) and `timeout` per command and
/// returns its stdout.
pub fn etcdctl_with(
    endpoints: &[String],
    tls: Option<&ClientTls>,
    timeout: Duration,
    args: &[&str],
) -> Result<String> {
    let mut command = Command::new(tools::etcdctl_bin()?);
    command.env("ETCDCTL_API", "3");
    if let Some(tls) = tls {
        command
            .arg(format!("--cacert={}", tls.ca.display()))
            .arg(format!("--cert={}", tls.client.cert.display()))
            .arg(format!("--key={}", tls.client.key.display()));
    }
    command
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .arg("--dial-timeout=2s")
        .arg(format!("--command-timeout={}ms", timeout.as_millis()))
        .args(args);
    run_capture(command, None, &format!("etcdctl {}", args.join(" ")))
}

fn is_healthy(addr: SocketAddr) -> bool {
    http::get(addr, "/health", PROBE_TIMEOUT)
        .is_some_and(|(status, body)| status == 200 && body.contains("\"health\":\"true\""))
}

fn not_running(member: &EtcdMember) -> HarnessError {
    HarnessError::Other(format!("etcd {} is not running", member.name()))
}
