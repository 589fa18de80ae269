//! Test clients playing the hosts' agents over the real agent API (mTLS with certificates
//! the controller binary issued): a thread posts every live agent's report every
//! [`REPORT_EVERY`] and collects the commands offered to it; the test decides when and how
//! each command "ran" and posts the result itself ([`Agents::finish`]). No BMC is driven:
//! what these tests check is what the Kubernetes backend does around a verified result.

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::OperationId;
use metalguard_api::protocol::{
    AgentReport, BmcReachability, Command, CommandBatch, CommandResult, Condition, EtcdMemberView,
    EtcdView, Outcome, ReportAck, commands_path, holds_path, report_path, results_path,
};
use metalguard_api::snapshot::{ConditionStatus, Hold};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// How often each live agent reports and looks for commands: within the agent API's default
/// rate of 2 reports, results and holds a second per host (every 300 ms drained the burst of
/// 20 in 15 s and a result posted after that was answered 429).
pub const REPORT_EVERY: Duration = Duration::from_millis(500);

fn now() -> Timestamp {
    Timestamp(
        u64::try_from(
            SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .unwrap()
                .as_millis(),
        )
        .unwrap(),
    )
}

/// An mTLS client for `host` (`None`: no client certificate) trusting the CA in `tls`.
pub fn agent_client(tls: &Path, host: &str) -> reqwest::blocking::Client {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(tls.join("ca.pem")).unwrap() {
        roots.add(cert.unwrap()).unwrap();
    }
    let chain = CertificateDer::pem_file_iter(tls.join(format!("{host}.pem")))
        .unwrap()
        .collect::<Result<Vec<_>, _>>()
        .unwrap();
    let key = PrivateKeyDer::from_pem_file(tls.join(format!("{host}-key.pem"))).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_client_auth_cert(chain, key)
        .unwrap();
    // Says this tree's release, as every agent does.
    let (name, release) = metalguard_api::skew::our_header();
    let headers = [(name.parse().unwrap(), release.parse().unwrap())]
        .into_iter()
        .collect();
    reqwest::blocking::Client::builder()
        .tls_backend_preconfigured(config)
        .default_headers(headers)
        .timeout(Duration::from_secs(10))
        .connect_timeout(Duration::from_secs(2))
        .build()
        .unwrap()
}

/// A command an agent was offered.
#[derive(Debug, Clone)]
pub struct Offered {
    /// The agent (host) it was offered to.
    pub agent: String,
    /// The command.
    pub command: Command,
    /// When the test client first saw it.
    pub seen_at: Instant,
}

/// A three-or-more-member etcd cluster every member's agent reports, each member healthy
/// unless marked down; the leader is the first healthy member.
#[derive(Debug, Clone, Default)]
struct EtcdCluster {
    members: Vec<String>,
    down: BTreeSet<String>,
}

#[derive(Default)]
struct Shared {
    live: BTreeSet<String>,
    etcd_voter: Option<String>,
    etcd_cluster: Option<EtcdCluster>,
    offered: BTreeMap<String, Offered>,
    last_status: BTreeMap<String, u16>,
    holds: BTreeMap<String, Vec<Hold>>,
    released: BTreeMap<String, Vec<String>>,
    /// How often each host came back (its boot ID changes with each, as a kernel's does).
    boots: BTreeMap<String, u64>,
}

/// The agents of a lab's hosts.
pub struct Agents {
    clients: BTreeMap<String, reqwest::blocking::Client>,
    url: String,
    shared: Arc<Mutex<Shared>>,
    quit: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Agents {
    /// Agents for `hosts`, all live, speaking to the controller at `url`; each reports every
    /// other one's BMC reachable.
    pub fn start(tls: &Path, url: &str, hosts: &[String]) -> Self {
        Self::probing(tls, url, hosts, hosts)
    }

    /// As [`Agents::start`], each reporting `probed` hosts' BMCs reachable (a real agent
    /// probes every BMC the controller names: every host's that has one).
    pub fn probing(tls: &Path, url: &str, hosts: &[String], probed: &[String]) -> Self {
        let clients: BTreeMap<String, reqwest::blocking::Client> = hosts
            .iter()
            .map(|h| (h.clone(), agent_client(tls, h)))
            .collect();
        let shared = Arc::new(Mutex::new(Shared {
            live: hosts.iter().cloned().collect(),
            ..Shared::default()
        }));
        let quit = Arc::new(AtomicBool::new(false));
        let thread = {
            let (clients, shared, quit, url) = (
                clients.clone(),
                shared.clone(),
                quit.clone(),
                url.to_owned(),
            );
            let all: Vec<String> = probed.to_vec();
            std::thread::spawn(move || {
                let mut sequence = 0;
                while !quit.load(Ordering::SeqCst) {
                    sequence += 1;
                    let (live, voter, cluster, holds, boots) = {
                        let s = shared.lock().unwrap();
                        let cluster = s.etcd_cluster.clone();
                        (
                            s.live.clone(),
                            s.etcd_voter.clone(),
                            cluster,
                            s.holds.clone(),
                            s.boots.clone(),
                        )
                    };
                    for host in &live {
                        let client = &clients[host];
                        let mut report = report(host, sequence, &all, voter.as_deref());
                        report.boot_id =
                            format!("{host}-boot-{}", boots.get(host).copied().unwrap_or(0));
                        if let Some(cluster) = &cluster {
                            report.etcd = cluster.view_of(host);
                        }
                        report.holds = holds.get(host).cloned().unwrap_or_default();
                        // As the real agent does: a report fits the protocol's limits (at
                        // most 512 BMC probes; with more targets the rest are left out).
                        metalguard_api::limits::fit_report(&mut report);
                        let answer = client
                            .post(format!("{url}{}", report_path(host)))
                            .json(&report)
                            .send();
                        let status = answer.as_ref().map_or(0, |r| r.status().as_u16());
                        let ack = answer
                            .ok()
                            .filter(|r| r.status().is_success())
                            .and_then(|r| r.json::<ReportAck>().ok());
                        let batch = client
                            .get(format!("{url}{}", commands_path(host, Duration::ZERO)))
                            .send()
                            .ok()
                            .filter(|r| r.status().is_success())
                            .and_then(|r| r.json::<CommandBatch>().ok());
                        let mut s = shared.lock().unwrap();
                        s.last_status.insert(host.clone(), status);
                        if let Some(ack) = ack {
                            s.released.insert(host.clone(), ack.released_holds);
                        }
                        for command in batch.map(|b| b.commands).unwrap_or_default() {
                            s.offered
                                .entry(command.operation_id.0.clone())
                                .or_insert_with(|| Offered {
                                    agent: host.clone(),
                                    command,
                                    seen_at: Instant::now(),
                                });
                        }
                    }
                    std::thread::park_timeout(REPORT_EVERY);
                }
            })
        };
        Self {
            clients,
            url: url.to_owned(),
            shared,
            quit,
            thread: Some(thread),
        }
    }

    /// Stops (`false`) or resumes (`true`) `host`'s agent (its host is off / back: back, it
    /// reports a new boot ID, as a host that booted does).
    pub fn set_live(&self, host: &str, live: bool) {
        let mut s = self.shared.lock().unwrap();
        if live {
            if s.live.insert(host.to_owned()) {
                *s.boots.entry(host.to_owned()).or_default() += 1;
            }
        } else {
            s.live.remove(host);
        }
    }

    /// `host`'s agent also reports a healthy single-member etcd whose only voter it runs.
    pub fn report_etcd_voter(&self, host: &str) {
        self.shared.lock().unwrap().etcd_voter = Some(host.to_owned());
    }

    /// The agents of `members` report the etcd cluster of those members, all healthy, from
    /// now on (each view names the reporter's member as local).
    pub fn report_etcd_cluster(&self, members: &[&str]) {
        self.shared.lock().unwrap().etcd_cluster = Some(EtcdCluster {
            members: members.iter().map(|m| (*m).to_owned()).collect(),
            down: BTreeSet::new(),
        });
    }

    /// Every view from now on shows `member` healthy or not (its member hangs or is back).
    pub fn set_member_healthy(&self, member: &str, healthy: bool) {
        let mut s = self.shared.lock().unwrap();
        let cluster = s.etcd_cluster.as_mut().expect("report_etcd_cluster first");
        if healthy {
            cluster.down.remove(member);
        } else {
            cluster.down.insert(member.to_owned());
        }
    }

    /// Wakes the reporting thread: every live agent reports now rather than at its next
    /// [`REPORT_EVERY`].
    pub fn report_now(&self) {
        if let Some(thread) = &self.thread {
            thread.thread().unpark();
        }
    }

    /// `host`'s agent carries `holds` in its reports from now on (break-glass fences run on
    /// that host).
    pub fn carry_holds(&self, host: &str, holds: Vec<Hold>) {
        self.shared
            .lock()
            .unwrap()
            .holds
            .insert(host.to_owned(), holds);
    }

    /// The hold ids the controller's last answer to `host`'s report said were released.
    pub fn released_holds(&self, host: &str) -> Vec<String> {
        self.shared
            .lock()
            .unwrap()
            .released
            .get(host)
            .cloned()
            .unwrap_or_default()
    }

    /// `host`'s agent posts `hold` (`POST /v1/hosts/{host}/holds`): the HTTP status and body.
    pub fn post_hold(&self, host: &str, hold: &Hold) -> (u16, String) {
        match self.clients[host]
            .post(format!("{}{}", self.url, holds_path(host)))
            .json(hold)
            .send()
        {
            Ok(r) => (r.status().as_u16(), r.text().unwrap_or_default()),
            Err(e) => (0, e.to_string()),
        }
    }

    /// The status the controller last answered `host`'s report with (0: no answer).
    pub fn last_report_status(&self, host: &str) -> u16 {
        self.shared
            .lock()
            .unwrap()
            .last_status
            .get(host)
            .copied()
            .unwrap_or(0)
    }

    /// Every command offered so far, by operation id.
    pub fn offered(&self) -> BTreeMap<String, Offered> {
        self.shared.lock().unwrap().offered.clone()
    }

    /// Waits until an agent is offered the command `operation_id`.
    pub fn wait_offered(&self, operation_id: &str, within: Duration) -> Offered {
        let deadline = Instant::now() + within;
        loop {
            if let Some(o) = self.offered().get(operation_id) {
                return o.clone();
            }
            assert!(
                Instant::now() < deadline,
                "no agent was offered {operation_id} within {within:?}; offered: {:?}",
                self.offered().keys().collect::<Vec<_>>()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// The offered agent posts `outcome` for `operation_id`; the HTTP status the
    /// controller answered.
    pub fn finish(&self, operation_id: &str, outcome: Outcome) -> u16 {
        let offered = self.offered()[operation_id].clone();
        let now = now();
        let result = CommandResult {
            operation_id: OperationId(operation_id.to_owned()),
            outcome,
            started_at: now,
            finished_at: now,
            timeline: Vec::new(),
            error: (outcome != Outcome::Succeeded).then(|| "the test said so".to_owned()),
            promoted_by: None,
            term: 0,
        };
        self.clients[&offered.agent]
            .post(format!("{}{}", self.url, results_path(&offered.agent)))
            .json(&result)
            .send()
            .map_or(0, |r| r.status().as_u16())
    }

    /// [`Agents::finish`] until the controller records it (200), e.g. while it regains the
    /// Lease.
    pub fn finish_until_recorded(&self, operation_id: &str, outcome: Outcome, within: Duration) {
        let deadline = Instant::now() + within;
        loop {
            let status = self.finish(operation_id, outcome);
            if status == 200 {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "the result of {operation_id} was not recorded within {within:?} (last answer {status})"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    }
}

impl Drop for Agents {
    fn drop(&mut self) {
        self.quit.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

impl EtcdCluster {
    /// The view `host`'s agent reports (`None` when `host` runs no member).
    fn view_of(&self, host: &str) -> Option<EtcdView> {
        let local = self.members.iter().position(|m| m == host)?;
        let id = |index: usize| u64::try_from(index).unwrap() + 1;
        let leader = self.members.iter().position(|m| !self.down.contains(m));
        Some(EtcdView {
            local_member_id: Some(id(local)),
            leader_id: leader.map(id),
            members: self
                .members
                .iter()
                .enumerate()
                .map(|(index, name)| EtcdMemberView {
                    id: id(index),
                    name: name.clone(),
                    peer_urls: Vec::new(),
                    client_urls: Vec::new(),
                    learner: false,
                    healthy: !self.down.contains(name),
                    alarms: Vec::new(),
                    raft_applied_index: Some(10),
                    error: None,
                })
                .collect(),
        })
    }
}

fn report(host: &str, sequence: u64, all: &[String], voter: Option<&str>) -> AgentReport {
    let now = now();
    AgentReport {
        host: host.to_owned(),
        agent_version: "kube-test".to_owned(),
        sequence,
        boot_id: "kube-test".to_owned(),
        sent_at: now,
        conditions: vec![Condition {
            type_: "KubeletHealthy".to_owned(),
            status: ConditionStatus::True,
            reason: "Healthy".to_owned(),
            message: String::new(),
            last_transition: Timestamp(1_700_000_000_000),
        }],
        etcd: (voter == Some(host)).then(|| EtcdView {
            local_member_id: Some(1),
            leader_id: Some(1),
            members: vec![EtcdMemberView {
                id: 1,
                name: host.to_owned(),
                peer_urls: Vec::new(),
                client_urls: Vec::new(),
                learner: false,
                healthy: true,
                alarms: Vec::new(),
                raft_applied_index: Some(10),
                error: None,
            }],
        }),
        bmc_reachability: all
            .iter()
            .filter(|h| *h != host)
            .map(|h| BmcReachability {
                host: h.clone(),
                reachable: true,
                checked_at: now,
                error: None,
                check: None,
            })
            .collect(),
        unacknowledged_results: Vec::new(),
        holds: Vec::new(),
        seen_term: 0,
        host_identity: None,
    }
}
