//! The Kubernetes backend at scale (issue 18, item 3): the real `metalguard-controller run
//! --backend=kubernetes` (this profile's build: release under `cargo bench`) on a real
//! kube-apiserver with 5 control-plane hosts and 5,000 worker Nodes, 2 % of them NotReady.
//! Every worker has a `GuardedHost` and a BMC Secret (the health check selects them all, so
//! every round plans over 5,005 hosts); five test clients play the control-plane hosts'
//! agents (reports over the agent mTLS API, every power command "succeeds" when offered),
//! each reporting every host's BMC reachable, as a real agent probes every BMC the controller
//! names (`BENCH_PROBE_ALL=0`: only the control plane's, as the first runs).
//!
//! Phases, each measured on its own:
//! 1. **rest**: the 100 NotReady workers exceed `maxUnhealthy: 1%`, so remediation is
//!    short-circuited; nothing should be written.
//! 2. **remediation**: `maxUnhealthy` becomes `40%`; remediations run (one at a time: the
//!    Kubernetes backend's `maxConcurrent` is the default 1). A powered-off host's Node is
//!    deleted by the controller; after the verified power-on this program registers the Node
//!    again, Ready, as its kubelet would.
//!
//! Nodes are the size a kubelet writes (issue 27, item 3): 50 images, addresses, `nodeInfo`,
//! capacity and allocatable, five conditions, the kubelet's labels and annotations
//! (`BENCH_KUBELET_NODES=0` writes the small Nodes of the first runs). Throughout, a pool of
//! threads posts the Nodes' conditions with fresh heartbeats, as a kubelet does, at
//! `BENCH_NODE_UPDATES_PER_SECOND` (default: every Node once per the kubelet's default
//! `nodeStatusReportFrequency` of 5 minutes, 17/s at 5,000; the kubelet's 10 s heartbeats go
//! to Leases in `kube-node-lease`, which the controller does not watch).
//!
//! Measured per phase: every plan round's time (the controller's `metalguard_rounds` debug
//! line: load of the state from the watch caches, plan, persist), every tick's inventory check
//! and Lease read, the controller's resident memory (`/proc/PID/status` every 250 ms), and
//! every request of its ServiceAccount (the API server's audit log) by verb and resource.
//!
//! Run by `scripts/bench-kube-scale.sh`; `cargo test` builds this target but only
//! `cargo bench` (which passes `--bench`) runs it. Sizes: `BENCH_WORKERS`, `BENCH_UNHEALTHY`,
//! `BENCH_REST_SECONDS`, `BENCH_REMEDIATION_SECONDS`; `BENCH_MARKDOWN=FILE` writes the tables,
//! `BENCH_CONTROLLER_LOG=FILE` keeps the controller's log (with the `round parts` lines).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]
// Statistics over counts and microseconds far below 2^52.
#![allow(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss
)]

#[path = "../tests/kubelab/mod.rs"]
mod kubelab;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use kubelab::agents::Agents;
use kubelab::{BIN, CREDENTIALS_NS, MG, NS, SERVICE_ACCOUNT, controller_user};
use metalguard_api::protocol::{CommandKind, Outcome, PowerAction};
use metalguard_e2e::kube::audit::AuditEvent;
use metalguard_e2e::kube::client::ApiClient;
use metalguard_e2e::kube::time::{parse_rfc3339, rfc3339};
use metalguard_e2e::kube::{KubeCluster, KubeOptions};
use metalguard_e2e::process::Proc;
use serde_json::{Value, json};

/// Threads that create the objects.
const CREATORS: usize = 4;
/// Threads of the Node heartbeat pool.
const HEARTBEATERS: usize = 2;
/// Rest begins once the controller wrote nothing but its Lease for this long.
const QUIET: Duration = Duration::from_secs(5);
/// How often the controller's memory is sampled.
const RSS_EVERY: Duration = Duration::from_millis(250);

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

struct Sizes {
    workers: usize,
    control_plane: usize,
    unhealthy: usize,
    rest: Duration,
    remediation: Duration,
    node_updates_per_second: f64,
}

fn worker(i: usize) -> String {
    format!("w-{i:04}")
}

/// The unhealthy workers: spread evenly.
fn unhealthy(sizes: &Sizes) -> BTreeSet<String> {
    let step = sizes.workers / sizes.unhealthy.max(1);
    (0..sizes.unhealthy).map(|i| worker(i * step)).collect()
}

/// The five conditions a kubelet (and its network plugin) keep on a Node, `Ready` as given,
/// every heartbeat now.
fn conditions(ready: bool, since: SystemTime) -> Value {
    let now = rfc3339(SystemTime::now());
    let since = rfc3339(since);
    let (status, reason, message) = if ready {
        ("True", "KubeletReady", "kubelet is posting ready status")
    } else {
        (
            "False",
            "KubeletNotReady",
            "container runtime network not ready",
        )
    };
    let quiet = |type_: &str, reason: &str, message: &str| {
        json!({"type": type_, "status": "False", "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": since})
    };
    json!([
        quiet("NetworkUnavailable", "CalicoIsUp", "Calico is running on this node"),
        quiet("MemoryPressure", "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
        quiet("DiskPressure", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
        quiet("PIDPressure", "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
        {"type": "Ready", "status": status, "reason": reason, "message": message,
            "lastHeartbeatTime": now, "lastTransitionTime": since},
    ])
}

/// Whether the bench writes Nodes the size of a real kubelet's (`BENCH_KUBELET_NODES`,
/// default on; `0` writes the small Nodes of the first runs: 2 labels, 1 annotation, one
/// condition).
fn kubelet_nodes() -> bool {
    env_or("BENCH_KUBELET_NODES", 1) != 0
}

/// A Node's status as a kubelet posts it: addresses, capacity and allocatable, `nodeInfo`,
/// daemon endpoints, 50 images (a kubelet reports at most 50, the largest first) and the five
/// conditions.
fn kubelet_status(name: &str, index: usize, ready: bool, since: SystemTime) -> Value {
    let images: Vec<Value> = (0..50)
        .map(|i| {
            let repo = format!("registry.example.com/platform/service-{i:02}");
            json!({"names": [format!("{repo}@sha256:{:064x}", (index * 50 + i) as u128 * 0x9e37_79b9_7f4a_7c15),
                             format!("{repo}:v1.{i}.{}", index % 7)],
                   "sizeBytes": 400_000_000 - i * 7_000_000})
        })
        .collect();
    let resources = |cpu: &str, memory: &str, storage: &str| {
        json!({"cpu": cpu, "memory": memory, "ephemeral-storage": storage, "pods": "110",
            "hugepages-1Gi": "0", "hugepages-2Mi": "0"})
    };
    json!({
        "conditions": conditions(ready, since),
        "addresses": [
            {"type": "InternalIP", "address": format!("10.{}.{}.{}", 20 + index / 65_536, (index / 256) % 256, index % 256)},
            {"type": "Hostname", "address": name}],
        "capacity": resources("64", "263855480Ki", "1921725720Ki"),
        "allocatable": resources("63500m", "261553528Ki", "1771079210172"),
        "daemonEndpoints": {"kubeletEndpoint": {"Port": 10250}},
        "nodeInfo": {
            "machineID": format!("{:032x}", index as u128 * 0x1234_5678_9abc_def1),
            "systemUUID": format!("4c4c4544-0047-3510-8052-{:012x}", index),
            "bootID": format!("{:08x}-8f1e-4f2a-9c55-{:012x}", index, index * 31),
            "kernelVersion": "6.1.0-27-amd64", "osImage": "Debian GNU/Linux 12 (bookworm)",
            "containerRuntimeVersion": "containerd://1.7.24", "kubeletVersion": "v1.37.2",
            "kubeProxyVersion": "v1.37.2", "operatingSystem": "linux", "architecture": "amd64"},
        "images": images,
    })
}

/// Registers Node `name` as a kubelet does: create, then its whole status.
fn register_node(admin: &ApiClient, name: &str, ready: bool, since: SystemTime) {
    let index = name
        .rsplit('-')
        .next()
        .and_then(|n| n.parse::<usize>().ok())
        .unwrap_or(0);
    let (node, status) = if kubelet_nodes() {
        (
            json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name,
                    "labels": {"kubernetes.io/hostname": name, "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64", "beta.kubernetes.io/os": "linux",
                        "beta.kubernetes.io/arch": "amd64", "node.kubernetes.io/instance-type": "r650",
                        "topology.kubernetes.io/zone": format!("rack-{}", index % 12), "team": "storage"},
                    "annotations": {"node.alpha.kubernetes.io/ttl": "0",
                        "volumes.kubernetes.io/controller-managed-attach-detach": "true",
                        "projectcalico.org/IPv4Address": format!("10.{}.{}.{}/16", 20 + index / 65_536, (index / 256) % 256, index % 256),
                        "rack": "r7"}},
                "spec": {"podCIDR": format!("10.{}.{}.0/24", 128 + index / 256, index % 256),
                    "podCIDRs": [format!("10.{}.{}.0/24", 128 + index / 256, index % 256)],
                    "providerID": format!("metal://{name}")}}),
            json!({"status": kubelet_status(name, index, ready, since)}),
        )
    } else {
        (
            json!({"apiVersion": "v1", "kind": "Node",
                "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "team": "storage"},
                    "annotations": {"rack": "r7"}}}),
            json!({"status": {"conditions": [conditions(ready, since)[4].clone()]}}),
        )
    };
    match admin.create("/api/v1/nodes", &node) {
        Ok(_) => {}
        Err(e) if e.api_status() == Some(409) => {}
        Err(e) => panic!("creating Node {name}: {e}"),
    }
    admin
        .strategic_patch(&format!("/api/v1/nodes/{name}/status"), &status)
        .unwrap();
}

/// A kubelet's periodic status post: every condition's heartbeat (the rest of its status is
/// unchanged, so the kubelet's patch carries only the conditions).
fn heartbeat(ready: bool, since: SystemTime) -> Value {
    if kubelet_nodes() {
        json!({"status": {"conditions": conditions(ready, since)}})
    } else {
        json!({"status": {"conditions": [conditions(ready, since)[4].clone()]}})
    }
}

/// Creates every host's Secret, `GuardedHost` and Node from [`CREATORS`] threads.
fn create_everything(admin: &ApiClient, hosts: &[(String, bool)], sick: &BTreeSet<String>) {
    let an_hour_ago = SystemTime::now() - Duration::from_secs(3600);
    let chunk = hosts.len().div_ceil(CREATORS);
    std::thread::scope(|scope| {
        for part in hosts.chunks(chunk) {
            scope.spawn(move || {
                for (host, control_plane) in part {
                    kubelab::create_host(admin, host, *control_plane);
                    register_node(admin, host, !sick.contains(host), an_hour_ago);
                }
            });
        }
    });
}

/// Which hosts the heartbeat pool treats apart: those powered off (no kubelet posts), and
/// those a remediation brought back (their kubelet posts Ready from then on).
#[derive(Default)]
struct Fenced {
    away: BTreeSet<String>,
    healed: BTreeSet<String>,
}

/// Refreshes the Nodes' `Ready` heartbeat at a fixed overall rate, skipping Nodes whose host
/// is powered off; a Node the controller deleted meanwhile is skipped too. A host a
/// remediation brought back posts Ready: before, the pool went on posting the NotReady it
/// started with, and when its round through the Nodes met the remediations' (both go in
/// name order) it turned a host back NotReady between its re-registration and the
/// controller's look, and that remediation waited out its node deadline (a run on
/// 2026-11-29 finished 3 remediations in 120 s, one then waiting).
struct HeartbeatPool {
    quit: Arc<AtomicBool>,
    threads: Vec<std::thread::JoinHandle<u64>>,
}

impl HeartbeatPool {
    fn start(
        admin: &ApiClient,
        nodes: Vec<(String, bool)>,
        fenced: &Arc<Mutex<Fenced>>,
        per_second: f64,
    ) -> Self {
        let quit = Arc::new(AtomicBool::new(false));
        let since = SystemTime::now() - Duration::from_secs(3600);
        let nodes = Arc::new(nodes);
        let threads = (0..HEARTBEATERS)
            .map(|t| {
                let (admin, quit, fenced, nodes) =
                    (admin.clone(), quit.clone(), fenced.clone(), nodes.clone());
                std::thread::spawn(move || {
                    let every = Duration::from_secs_f64(HEARTBEATERS as f64 / per_second);
                    let mut next = Instant::now();
                    let mut sent = 0;
                    let mine: Vec<&(String, bool)> =
                        nodes.iter().skip(t).step_by(HEARTBEATERS).collect();
                    for (name, ready) in mine.iter().cycle() {
                        if quit.load(Ordering::SeqCst) {
                            break;
                        }
                        next += every;
                        if let Some(wait) = next.checked_duration_since(Instant::now()) {
                            std::thread::sleep(wait);
                        }
                        let ready = {
                            let fenced = fenced.lock().unwrap();
                            if fenced.away.contains(name) {
                                continue;
                            }
                            *ready || fenced.healed.contains(name)
                        };
                        let patch = heartbeat(ready, since);
                        if admin
                            .strategic_patch(&format!("/api/v1/nodes/{name}/status"), &patch)
                            .is_ok()
                        {
                            sent += 1;
                        }
                    }
                    sent
                })
            })
            .collect();
        Self { quit, threads }
    }

    fn stop(self) -> u64 {
        self.quit.store(true, Ordering::SeqCst);
        self.threads.into_iter().map(|t| t.join().unwrap()).sum()
    }
}

/// Samples `VmRSS` of a process.
struct RssSampler {
    quit: Arc<AtomicBool>,
    samples: Arc<Mutex<Vec<(SystemTime, u64)>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

impl RssSampler {
    fn start(pid: u32) -> Self {
        let quit = Arc::new(AtomicBool::new(false));
        let samples = Arc::new(Mutex::new(Vec::new()));
        let thread = {
            let (quit, samples) = (quit.clone(), samples.clone());
            std::thread::spawn(move || {
                while !quit.load(Ordering::SeqCst) {
                    if let Some(kib) = proc_status_kib(pid, "VmRSS:") {
                        samples.lock().unwrap().push((SystemTime::now(), kib));
                    }
                    std::thread::sleep(RSS_EVERY);
                }
            })
        };
        Self {
            quit,
            samples,
            thread: Some(thread),
        }
    }

    fn between(&self, from: SystemTime, to: SystemTime) -> Vec<u64> {
        self.samples
            .lock()
            .unwrap()
            .iter()
            .filter(|(at, _)| *at >= from && *at <= to)
            .map(|(_, kib)| *kib)
            .collect()
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.quit.store(true, Ordering::SeqCst);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One line of the controller's `metalguard_rounds` target.
#[derive(Debug)]
enum Timing {
    Round {
        at: SystemTime,
        load_us: u64,
        execute_us: u64,
        changed: bool,
    },
    Tick {
        at: SystemTime,
        inventory_us: u64,
        campaign_us: u64,
    },
}

fn strip_ansi(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for c in chars.by_ref() {
                if c.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

fn field(line: &str, name: &str) -> Option<String> {
    line.split_whitespace()
        .find_map(|w| w.strip_prefix(&format!("{name}=")))
        .map(str::to_owned)
}

fn timings(log: &std::path::Path) -> Vec<Timing> {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    text.lines()
        .map(strip_ansi)
        .filter(|l| l.contains("metalguard_rounds"))
        .filter_map(|l| {
            let stamp = l.split_whitespace().next()?;
            // "2026-11-25T18:30:00.123456Z": whole seconds are enough for the window; keep
            // the fraction by hand.
            let (whole, fraction) = stamp.trim_end_matches('Z').split_once('.')?;
            let at = parse_rfc3339(&format!("{whole}Z"))?
                + Duration::from_secs_f64(format!("0.{fraction}").parse().ok()?);
            let num = |n: &str| field(&l, n).and_then(|v| v.parse::<u64>().ok());
            if l.contains("plan round") {
                Some(Timing::Round {
                    at,
                    load_us: num("load_us")?,
                    execute_us: num("execute_us")?,
                    changed: field(&l, "changed")? == "true",
                })
            } else if l.contains(" tick") {
                Some(Timing::Tick {
                    at,
                    inventory_us: num("inventory_us")?,
                    campaign_us: num("campaign_us")?,
                })
            } else {
                None
            }
        })
        .collect()
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = (p * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn median(sorted: &[f64]) -> f64 {
    match sorted.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => sorted[n / 2],
        n => f64::midpoint(sorted[n / 2 - 1], sorted[n / 2]),
    }
}

fn sorted(mut v: Vec<f64>) -> Vec<f64> {
    v.sort_by(f64::total_cmp);
    v
}

/// A request counted once: a watch when it started, anything else when it completed.
fn counted(e: &AuditEvent) -> bool {
    if e.verb == "watch" {
        e.stage == "ResponseStarted"
    } else {
        e.stage == "ResponseComplete"
    }
}

const WRITES: &[&str] = &["create", "update", "patch", "delete", "deletecollection"];

struct Phase {
    name: String,
    from: SystemTime,
    to: SystemTime,
}

fn report_phase(
    out: &mut String,
    phase: &Phase,
    timings: &[Timing],
    rss: &RssSampler,
    calls: &[AuditEvent],
) -> (usize, usize) {
    let within = |at: SystemTime| at >= phase.from && at <= phase.to;
    let mut total = Vec::new();
    let (mut load, mut execute) = (Vec::new(), Vec::new());
    let mut changed = 0;
    let (mut inventory, mut campaign) = (Vec::new(), Vec::new());
    for t in timings {
        match t {
            Timing::Round {
                at,
                load_us,
                execute_us,
                changed: c,
            } if within(*at) => {
                total.push((load_us + execute_us) as f64 / 1000.0);
                load.push(*load_us as f64 / 1000.0);
                execute.push(*execute_us as f64 / 1000.0);
                changed += usize::from(*c);
            }
            Timing::Tick {
                at,
                inventory_us,
                campaign_us,
            } if within(*at) => {
                inventory.push(*inventory_us as f64 / 1000.0);
                campaign.push(*campaign_us as f64 / 1000.0);
            }
            _ => {}
        }
    }
    let seconds = phase.to.duration_since(phase.from).unwrap().as_secs_f64();
    let rounds = total.len();
    let _ = writeln!(
        out,
        "\n### {} ({seconds:.0} s, {rounds} plan rounds of which {changed} wrote, {} ticks)\n",
        phase.name,
        inventory.len()
    );
    let _ = writeln!(out, "| time per round (ms) | median | p90 | p99 | max |");
    let _ = writeln!(out, "|---|---:|---:|---:|---:|");
    for (label, v) in [
        ("plan round (load + plan + persist)", total),
        ("  of which load (state from the watch caches)", load),
        ("  of which plan + persist", execute),
        ("tick: inventory check (and rebuild)", inventory),
        ("tick: Lease read", campaign),
    ] {
        let v = sorted(v);
        let _ = writeln!(
            out,
            "| {label} | {:.2} | {:.2} | {:.2} | {:.2} |",
            median(&v),
            percentile(&v, 0.9),
            percentile(&v, 0.99),
            v.last().copied().unwrap_or(f64::NAN)
        );
    }
    let samples = rss.between(phase.from, phase.to);
    let steady = sorted(samples.iter().map(|k| *k as f64).collect());
    let _ = writeln!(
        out,
        "\nRSS of the controller ({} samples): median {:.1} MiB, peak {:.1} MiB\n",
        steady.len(),
        median(&steady) / 1024.0,
        steady.last().copied().unwrap_or(f64::NAN) / 1024.0
    );
    let mut by: BTreeMap<(String, String), usize> = BTreeMap::new();
    for e in calls
        .iter()
        .filter(|e| counted(e) && e.received.is_some_and(within))
    {
        *by.entry((e.verb.clone(), e.resource.clone())).or_default() += 1;
    }
    let _ = writeln!(
        out,
        "| API requests (verb resource) | count | per plan round |"
    );
    let _ = writeln!(out, "|---|---:|---:|");
    let mut writes = 0;
    for ((verb, resource), n) in &by {
        if WRITES.contains(&verb.as_str()) {
            writes += n;
        }
        let _ = writeln!(
            out,
            "| {verb} {resource} | {n} | {:.3} |",
            *n as f64 / rounds.max(1) as f64
        );
    }
    (rounds, writes)
}

fn main() {
    if !std::env::args().any(|a| a == "--bench") {
        eprintln!("kube_scale: runs under `cargo bench` only (scripts/bench-kube-scale.sh)");
        return;
    }
    let sizes = Sizes {
        workers: env_or("BENCH_WORKERS", 5000),
        control_plane: 5,
        unhealthy: env_or("BENCH_UNHEALTHY", 100),
        rest: Duration::from_secs(env_or("BENCH_REST_SECONDS", 60)),
        remediation: Duration::from_secs(env_or("BENCH_REMEDIATION_SECONDS", 180)),
        node_updates_per_second: 0.0,
    };
    // Each Node once per the kubelet's default `nodeStatusReportFrequency` (5 minutes).
    let sizes = Sizes {
        node_updates_per_second: env_or(
            "BENCH_NODE_UPDATES_PER_SECOND",
            (sizes.workers + sizes.control_plane) as f64 / 300.0,
        ),
        ..sizes
    };
    let started = Instant::now();
    let say = |what: &str| {
        eprintln!(
            "[kube_scale +{:>6.1}s] {what}",
            started.elapsed().as_secs_f64()
        );
    };

    let cluster = KubeCluster::start(&KubeOptions {
        service_accounts: vec![(NS.to_owned(), SERVICE_ACCOUNT.to_owned())],
        audited_users: vec![controller_user()],
        ..KubeOptions::default()
    })
    .unwrap();
    say(&format!("API server ready at {}", cluster.url()));
    kubelab::install(&cluster);
    let admin = cluster.admin().clone();
    let dir = metalguard_e2e::tools::temp_dir("kube-scale").unwrap();
    let tls = dir.path().join("tls");
    kubelab::run(&["certs", "init", tls.to_str().unwrap()]);
    kubelab::run(&[
        "certs",
        "issue",
        "controller",
        tls.to_str().unwrap(),
        "--server",
    ]);
    let control_plane: Vec<String> = (1..=sizes.control_plane)
        .map(|i| format!("cp-{i}"))
        .collect();
    for host in &control_plane {
        kubelab::run(&["certs", "issue", host, tls.to_str().unwrap()]);
    }
    let sick = unhealthy(&sizes);
    let hosts: Vec<(String, bool)> = control_plane
        .iter()
        .map(|h| (h.clone(), true))
        .chain((0..sizes.workers).map(|i| (worker(i), false)))
        .collect();
    create_everything(&admin, &hosts, &sick);
    let check = json!({
        "selector": {"matchLabels": {"pool": "workers"}},
        "unhealthyConditions": [
            {"type": "Ready", "status": "False", "timeout": "5s"},
            {"type": "Ready", "status": "Unknown", "timeout": "5s"},
        ],
        "maxUnhealthy": "1%",
        "remediation": {"nodeAction": "Delete"},
    });
    admin
        .create(
            &format!("{MG}/hosthealthchecks"),
            &json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "HostHealthCheck",
                "metadata": {"name": "workers", "namespace": NS}, "spec": check}),
        )
        .unwrap();
    let node_bytes = serde_json::to_vec(&admin.get("/api/v1/nodes/w-0001").unwrap())
        .unwrap()
        .len();
    say(&format!(
        "{} GuardedHosts, Secrets in {CREDENTIALS_NS} and Nodes ({} NotReady, {node_bytes} bytes of JSON each); API server RSS {:?} KiB",
        hosts.len(),
        sick.len(),
        cluster.apiserver_rss_kib()
    ));

    let fenced = Arc::new(Mutex::new(Fenced::default()));
    let pool = HeartbeatPool::start(
        &admin,
        hosts
            .iter()
            .map(|(h, _)| (h.clone(), !sick.contains(h)))
            .collect(),
        &fenced,
        sizes.node_updates_per_second,
    );

    let port = metalguard_e2e::ports::reserve_port().unwrap();
    let url = format!("https://localhost:{}", port.port());
    // A real agent probes every BMC the controller names (every host's that has one):
    // `BENCH_PROBE_ALL=0` has the agents report only the control plane's, as the first runs.
    let probed: Vec<String> = if env_or("BENCH_PROBE_ALL", 1) != 0 {
        hosts.iter().map(|(h, _)| h.clone()).collect()
    } else {
        control_plane.clone()
    };
    let agents = Agents::probing(&tls, &url, &control_plane, &probed);
    let kubeconfig = cluster
        .service_account_kubeconfig(NS, SERVICE_ACCOUNT)
        .unwrap();
    let log = dir.path().join("controller.log");
    // METALGUARD_CONTROLLER_BIN measures another build (e.g. the tree before a change).
    let bin = std::env::var("METALGUARD_CONTROLLER_BIN").unwrap_or_else(|_| BIN.to_owned());
    say(&format!("controller binary {bin}"));
    let mut command = Command::new(bin);
    command
        .args([
            "run",
            "--backend=kubernetes",
            "--namespace",
            NS,
            "--id",
            "controller-0",
        ])
        .arg("--listen")
        .arg(format!("127.0.0.1:{}", port.port()))
        .arg("--tls-dir")
        .arg(&tls)
        .env("KUBECONFIG", kubeconfig)
        .env_remove("KUBERNETES_SERVICE_HOST")
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info,metalguard_rounds=debug");
    let controller_started = SystemTime::now();
    let mut controller = Proc::spawn("metalguard-controller", command, &log).unwrap();
    let pid = controller.pid().unwrap();
    let rss = RssSampler::start(pid);
    let deadline = Instant::now() + Duration::from_secs(120);
    while agents.last_report_status("cp-1") != 200 {
        assert!(
            controller.is_running(),
            "the controller exited:\n{}",
            controller.log_tail(40)
        );
        assert!(
            Instant::now() < deadline,
            "no leader within 120 s:\n{}",
            controller.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    say(&format!(
        "the controller leads ({:.1} s after its start)",
        controller_started.elapsed().unwrap().as_secs_f64()
    ));
    let check_status = |admin: &ApiClient| {
        admin
            .get(&format!("{MG}/hosthealthchecks/workers"))
            .unwrap()["status"]
            .clone()
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while check_status(&admin)["conditions"][0]["reason"] != "TooManyUnhealthy" {
        assert!(
            Instant::now() < deadline,
            "no short-circuit verdict:\n{}",
            controller.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    let first_verdict = controller_started.elapsed().unwrap();
    say(&format!(
        "short-circuited {:.1} s after the controller's start: {}",
        first_verdict.as_secs_f64(),
        check_status(&admin)
    ));
    // The first rounds write every host's status once; rest begins when the controller has
    // written nothing but its Lease for QUIET.
    let last_write = || {
        cluster
            .audit()
            .unwrap()
            .iter()
            .filter(|e| {
                e.user == controller_user()
                    && counted(e)
                    && WRITES.contains(&e.verb.as_str())
                    && e.resource != "leases"
            })
            .filter_map(|e| e.received)
            .max()
    };
    let deadline = Instant::now() + Duration::from_secs(300);
    loop {
        let quiet = last_write()
            .and_then(|at| SystemTime::now().duration_since(at).ok())
            .is_some_and(|d| d >= QUIET);
        if quiet || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    let settled = SystemTime::now();
    say("initial writes over (nothing but the Lease written for 5 s)");

    // Phase 1: rest.
    std::thread::sleep(sizes.rest);
    let rest = Phase {
        name: format!(
            "rest: {} NotReady, short-circuited (maxUnhealthy 1%)",
            sick.len()
        ),
        from: settled,
        to: SystemTime::now(),
    };
    say("rest measured; remediation allowed (maxUnhealthy 40%)");

    // Phase 2: remediation.
    let remediation_from = SystemTime::now();
    admin
        .merge_patch(
            &format!("{MG}/hosthealthchecks/workers"),
            &json!({"spec": {"maxUnhealthy": "40%"}}),
        )
        .unwrap();
    let mut handled: BTreeSet<String> = BTreeSet::new();
    let mut powered = (0, 0);
    let mut unrecorded = 0;
    let end = Instant::now() + sizes.remediation;
    while Instant::now() < end {
        assert!(
            controller.is_running(),
            "the controller exited:\n{}",
            controller.log_tail(40)
        );
        for (id, offered) in agents.offered() {
            if handled.contains(&id) {
                continue;
            }
            let CommandKind::Fence(fence) = &offered.command.kind else {
                continue;
            };
            if fence.action == PowerAction::Off {
                fenced.lock().unwrap().away.insert(fence.target.clone());
            }
            // A result the controller did not take (busy, not leading) is posted again on
            // the next pass.
            let answer = agents.finish(&id, Outcome::Succeeded);
            if answer != 200 {
                unrecorded += 1;
                continue;
            }
            handled.insert(id.clone());
            match fence.action {
                PowerAction::Off => powered.0 += 1,
                PowerAction::On => {
                    {
                        let mut fenced = fenced.lock().unwrap();
                        fenced.healed.insert(fence.target.clone());
                        fenced.away.remove(&fence.target);
                    }
                    register_node(&admin, &fence.target, true, SystemTime::now());
                    powered.1 += 1;
                }
                // Remediation powers off and on; a reboot is not offered here.
                PowerAction::Reboot => {}
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let remediation = Phase {
        name: "remediation: maxUnhealthy 40%, one remediation at a time".to_owned(),
        from: remediation_from,
        to: SystemTime::now(),
    };
    let hosts_now = admin.list(&format!("{MG}/guardedhosts")).unwrap();
    let mut phases: BTreeMap<String, usize> = BTreeMap::new();
    for h in &hosts_now {
        if let Some(p) = h["status"]["remediation"]["phase"].as_str() {
            *phases.entry(p.to_owned()).or_default() += 1;
        }
    }
    say(&format!(
        "remediation window over: power-offs {} power-ons {} recorded ({unrecorded} results not taken at once); remediations by phase {phases:?}",
        powered.0, powered.1
    ));
    let heartbeats = pool.stop();
    let peak = proc_status_kib(pid, "VmHWM:");
    let calls: Vec<AuditEvent> = cluster
        .audit()
        .unwrap()
        .into_iter()
        .filter(|e| e.user == controller_user())
        .collect();
    let timings = timings(&log);
    controller.kill();
    if let Ok(keep) = std::env::var("BENCH_CONTROLLER_LOG") {
        std::fs::copy(&log, keep).unwrap();
    }

    let mut out = String::new();
    let _ = writeln!(
        out,
        "{} workers ({} NotReady) + {} control-plane hosts, every one a GuardedHost with a BMC Secret; \
         Nodes of {node_bytes} bytes (JSON) each; Node status refreshes: {heartbeats} in all ({:.1}/s asked); \
         agent reports: {} agents every {:?}, each probing {} BMCs. First verdict {:.1} s after the controller's start.",
        sizes.workers,
        sick.len(),
        sizes.control_plane,
        sizes.node_updates_per_second,
        control_plane.len(),
        kubelab::agents::REPORT_EVERY,
        probed.len(),
        first_verdict.as_secs_f64()
    );
    let sync = Phase {
        name: "start: controller start → initial lists, first verdict, every host's status written once"
            .to_owned(),
        from: controller_started,
        to: settled,
    };
    let mut sync_out = String::new();
    report_phase(&mut sync_out, &sync, &timings, &rss, &calls);
    out.push_str(&sync_out);
    let (_, rest_writes) = report_phase(&mut out, &rest, &timings, &rss, &calls);
    let (_, remediation_writes) = report_phase(&mut out, &remediation, &timings, &rss, &calls);
    let done = phases.get("Done").copied().unwrap_or(0);
    let lapses = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .matches("leadership expired without a renewal")
        .count();
    let _ = writeln!(
        out,
        "\nPower results recorded: {} off, {} on ({unrecorded} posts not taken at once); \
         leadership lapses in the controller's log: {lapses}.",
        powered.0, powered.1
    );
    let _ = writeln!(
        out,
        "\nWrites: rest {rest_writes}; remediation {remediation_writes} for {done} remediations Done \
         ({:.1} per Done remediation; {} more in progress at the end).\n\
         Peak RSS of the whole run (VmHWM): {:.1} MiB.",
        remediation_writes as f64 / done.max(1) as f64,
        phases.values().sum::<usize>() - done,
        peak.unwrap_or(0) as f64 / 1024.0
    );
    eprintln!("{out}");
    if let Ok(path) = std::env::var("BENCH_MARKDOWN") {
        std::fs::write(path, &out).unwrap();
    }
    drop(agents);
}
