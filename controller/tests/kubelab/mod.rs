//! The shared fixture of the Kubernetes backend's real-server tests: a real kube-apiserver
//! (metalguard-e2e's [`KubeCluster`]) with `namespace.yaml`, `crds.yaml` and `rbac.yaml`
//! from `packaging/kubernetes/` applied and nothing else granted; fake kubelets for the
//! hosts' Nodes; `GuardedHost`s, BMC Secrets and a `HostHealthCheck`; the real
//! `metalguard-controller run --backend=kubernetes` authenticated as its ServiceAccount
//! (`system:serviceaccount:metalguard-system:metalguard-controller`, a static token); and
//! test clients playing the agents ([`agents`]). The audit log records every request of
//! that ServiceAccount, so a test can show what the controller asked and what RBAC said.

// Not every test binary uses every helper.
#![allow(dead_code, unreachable_pub)]

pub mod agents;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use metalguard_e2e::kube::audit::AuditEvent;
use metalguard_e2e::kube::client::ApiClient;
use metalguard_e2e::kube::kubelet::{FakeKubelet, NodeTemplate};
use metalguard_e2e::kube::{KubeCluster, KubeOptions, service_account_user};
use metalguard_e2e::ports::{PortLease, reserve_port};
use metalguard_e2e::process::Proc;
use serde_json::{Value, json};

use agents::Agents;

/// The controller's namespace (custom resources, Lease, Events).
pub const NS: &str = "metalguard-system";
/// Where the BMC credentials Secrets live.
pub const CREDENTIALS_NS: &str = metalguard_api::k8s::rbac::CREDENTIALS_NAMESPACE;
/// The controller's ServiceAccount (and Role, ClusterRole, bindings).
pub const SERVICE_ACCOUNT: &str = "metalguard-controller";
/// The controller binary under test.
pub const BIN: &str = env!("CARGO_BIN_EXE_metalguard-controller");
/// The custom resources' API path prefix in the controller's namespace.
pub const MG: &str = "/apis/metalguard.io/v1alpha1/namespaces/metalguard-system";

/// The controller's user name.
pub fn controller_user() -> String {
    service_account_user(NS, SERVICE_ACCOUNT)
}

/// What a lab holds.
#[derive(Debug, Clone)]
pub struct LabOptions {
    /// Worker hosts (label `pool: workers`, selected by the health check).
    pub workers: Vec<&'static str>,
    /// Control-plane hosts (label `pool: control-plane`).
    pub control_plane: Vec<&'static str>,
    /// The `HostHealthCheck` `workers`' spec.
    pub check: Value,
    /// Run kube-controller-manager.
    pub controller_manager: bool,
}

impl Default for LabOptions {
    fn default() -> Self {
        Self {
            workers: vec!["w-1", "w-2", "w-3"],
            control_plane: Vec::new(),
            check: check_spec(&json!(1), "Delete"),
            controller_manager: false,
        }
    }
}

/// A health check over the workers: `Ready` False or Unknown for 1 s is unhealthy.
pub fn check_spec(max_unhealthy: &Value, node_action: &str) -> Value {
    json!({
        "selector": {"matchLabels": {"pool": "workers"}},
        "unhealthyConditions": [
            {"type": "Ready", "status": "False", "timeout": "1s"},
            {"type": "Ready", "status": "Unknown", "timeout": "1s"},
        ],
        "maxUnhealthy": max_unhealthy,
        "remediation": {"nodeAction": node_action},
    })
}

/// What every test Node looks like at first registration.
pub fn node_template(host: &str) -> NodeTemplate {
    NodeTemplate::named(host)
        .label("team", "storage")
        .annotation("rack", "r7")
        .taint("dedicated", "db", "NoSchedule")
}

/// A real API server, the manifests, hosts and agents; controllers on demand.
pub struct KubeLab {
    // Drop order: agents and controllers before the cluster they talk to.
    pub agents: Agents,
    controllers: BTreeMap<String, Proc>,
    pub kubelets: BTreeMap<String, FakeKubelet>,
    pub cluster: KubeCluster,
    port: PortLease,
    dir: tempfile::TempDir,
    hosts: Vec<String>,
    started: Instant,
}

impl KubeLab {
    /// Starts everything but the controllers.
    pub fn start(options: &LabOptions) -> Self {
        let started = Instant::now();
        let cluster = KubeCluster::start(&KubeOptions {
            controller_manager: options.controller_manager,
            service_accounts: vec![(NS.to_owned(), SERVICE_ACCOUNT.to_owned())],
            audited_users: vec![controller_user()],
            ..KubeOptions::default()
        })
        .unwrap();
        eprintln!(
            "[kubelab] API server ready in {:?} (whole cluster {:?}, RSS {:?} KiB)",
            cluster.apiserver().ready_after(),
            cluster.started_in(),
            cluster.apiserver_rss_kib()
        );
        install(&cluster);
        let dir = metalguard_e2e::tools::temp_dir("kubelab").unwrap();
        let tls = dir.path().join("tls");
        run(&["certs", "init", tls.to_str().unwrap()]);
        run(&[
            "certs",
            "issue",
            "controller",
            tls.to_str().unwrap(),
            "--server",
        ]);
        let hosts: Vec<String> = options
            .workers
            .iter()
            .chain(&options.control_plane)
            .map(|h| (*h).to_owned())
            .collect();
        let admin = cluster.admin().clone();
        let mut kubelets = BTreeMap::new();
        for host in &hosts {
            run(&["certs", "issue", host, tls.to_str().unwrap()]);
            kubelets.insert(host.clone(), cluster.kubelet(&node_template(host)).unwrap());
            let control_plane = options.control_plane.contains(&host.as_str());
            create_host(&admin, host, control_plane);
        }
        admin
            .create(
                &format!("{MG}/hosthealthchecks"),
                &json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "HostHealthCheck",
                    "metadata": {"name": "workers", "namespace": NS},
                    "spec": options.check}),
            )
            .unwrap();
        let port = reserve_port().unwrap();
        let agents = Agents::start(&tls, &format!("https://localhost:{}", port.port()), &hosts);
        Self {
            agents,
            controllers: BTreeMap::new(),
            kubelets,
            cluster,
            port,
            dir,
            hosts,
            started,
        }
    }

    /// The admin client.
    pub fn admin(&self) -> &ApiClient {
        self.cluster.admin()
    }

    /// Starts `metalguard-controller run --backend=kubernetes` as the ServiceAccount, with
    /// identity `id`.
    pub fn start_controller(&mut self, id: &str) {
        self.start_controller_with(id, &[]);
    }

    /// [`KubeLab::start_controller`] with more `run` arguments.
    pub fn start_controller_with(&mut self, id: &str, extra: &[&std::ffi::OsStr]) {
        let kubeconfig = self
            .cluster
            .service_account_kubeconfig(NS, SERVICE_ACCOUNT)
            .unwrap();
        let mut command = Command::new(BIN);
        command
            .args(["run", "--backend=kubernetes", "--namespace", NS, "--id", id])
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port.port()))
            .arg("--tls-dir")
            .arg(self.dir.path().join("tls"))
            .args(extra)
            .env("KUBECONFIG", kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env(
                "RUST_LOG",
                "info,kube_runtime=debug,kube_lease_manager=debug",
            );
        let log = self.dir.path().join(format!("{id}.log"));
        let proc = Proc::spawn(id, command, &log).unwrap();
        self.controllers.insert(id.to_owned(), proc);
    }

    /// Creates a Pod object named `id` (no scheduler runs: it stays Pending) and starts
    /// controller `id` as that pod, as the Deployment's downward API would
    /// (`METALGUARD_POD_NAME`, `METALGUARD_POD_NAMESPACE`).
    pub fn start_controller_in_pod(&mut self, id: &str) {
        create_pod(self.admin(), id);
        let kubeconfig = self
            .cluster
            .service_account_kubeconfig(NS, SERVICE_ACCOUNT)
            .unwrap();
        let mut command = Command::new(BIN);
        command
            .args(["run", "--backend=kubernetes", "--namespace", NS, "--id", id])
            .arg("--listen")
            .arg(format!("127.0.0.1:{}", self.port.port()))
            .arg("--tls-dir")
            .arg(self.dir.path().join("tls"))
            .env("KUBECONFIG", kubeconfig)
            .env("METALGUARD_POD_NAME", id)
            .env("METALGUARD_POD_NAMESPACE", NS)
            .env_remove("KUBERNETES_SERVICE_HOST")
            .env("RUST_LOG", "info");
        let log = self.dir.path().join(format!("{id}.log"));
        let proc = Proc::spawn(id, command, &log).unwrap();
        self.controllers.insert(id.to_owned(), proc);
    }

    /// The labels of pod `name` in the controller's namespace.
    pub fn pod_labels(&self, name: &str) -> BTreeMap<String, String> {
        let pod = self
            .admin()
            .get(&format!("/api/v1/namespaces/{NS}/pods/{name}"))
            .unwrap();
        serde_json::from_value(pod["metadata"]["labels"].clone()).unwrap_or_default()
    }

    /// Kills controller `id`.
    pub fn kill_controller(&mut self, id: &str) {
        if let Some(mut proc) = self.controllers.remove(id) {
            proc.kill();
        }
    }

    /// The log of controller `id` (its last `lines` lines).
    pub fn controller_log(&self, id: &str, lines: usize) -> String {
        metalguard_e2e::process::tail_of(&self.dir.path().join(format!("{id}.log")), lines)
    }

    /// Every controller's log tail, for failure messages.
    fn logs(&self) -> String {
        self.controllers
            .keys()
            .map(|id| format!("--- {id} ---\n{}", self.controller_log(id, 60)))
            .collect::<Vec<_>>()
            .join("\n")
    }

    /// Waits until `check` holds; on timeout, panics with the controllers' logs.
    pub fn wait(&mut self, what: &str, within: Duration, mut check: impl FnMut(&Self) -> bool) {
        let started = Instant::now();
        loop {
            if check(self) {
                eprintln!(
                    "[kubelab] {what}: after {:?} (t={:?})",
                    started.elapsed(),
                    self.started.elapsed()
                );
                return;
            }
            for (id, proc) in &mut self.controllers {
                assert!(
                    proc.is_running(),
                    "controller {id} exited while waiting for {what}:\n{}",
                    proc.log_tail(80)
                );
            }
            assert!(
                started.elapsed() < within,
                "{what}: not within {within:?}\n{}",
                self.logs()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Waits until the agent API answers `host`'s reports with 200 (a controller leads).
    pub fn wait_leading(&mut self, host: &str, within: Duration) {
        self.wait(
            &format!("a controller leads ({host}'s reports answered 200)"),
            within,
            |lab| lab.agents.last_report_status(host) == 200,
        );
    }

    /// `GuardedHost` `name`.
    pub fn host(&self, name: &str) -> Value {
        self.admin()
            .get(&format!("{MG}/guardedhosts/{name}"))
            .unwrap()
    }

    /// The `GuardedControlPlane` `control-plane`.
    pub fn control_plane(&self) -> Value {
        self.admin()
            .get(&format!("{MG}/guardedcontrolplanes/control-plane"))
            .unwrap()
    }

    /// `status.remediation.phase` of `GuardedHost` `name` (`""` when none).
    pub fn phase(&self, name: &str) -> String {
        self.host(name)["status"]["remediation"]["phase"]
            .as_str()
            .unwrap_or("")
            .to_owned()
    }

    /// Node `name`, if it exists.
    pub fn node(&self, name: &str) -> Option<Value> {
        self.admin()
            .get_opt(&format!("/api/v1/nodes/{name}"))
            .unwrap()
    }

    /// The keys of Node `name`'s taints.
    pub fn taints(&self, name: &str) -> Vec<String> {
        self.node(name)
            .and_then(|n| n["spec"]["taints"].as_array().cloned())
            .unwrap_or_default()
            .iter()
            .map(|t| t["key"].as_str().unwrap().to_owned())
            .collect()
    }

    /// The Events in the controller's namespace, oldest first, as
    /// `(regarding kind, regarding name, type, reason, note)`.
    pub fn events(&self) -> Vec<(String, String, String, String, String)> {
        let mut events = self
            .admin()
            .list(&format!("/apis/events.k8s.io/v1/namespaces/{NS}/events"))
            .unwrap();
        events.sort_by_key(|e| e["eventTime"].as_str().unwrap_or("").to_owned());
        events
            .iter()
            .filter(|e| e["reportingController"] == "metalguard.io/controller")
            .map(|e| {
                let s = |v: &Value| v.as_str().unwrap_or("").to_owned();
                (
                    s(&e["regarding"]["kind"]),
                    s(&e["regarding"]["name"]),
                    s(&e["type"]),
                    s(&e["reason"]),
                    s(&e["note"]),
                )
            })
            .collect()
    }

    /// The reasons of the Events regarding `GuardedHost` `host`, oldest first.
    pub fn host_event_reasons(&self, host: &str) -> Vec<String> {
        self.events()
            .into_iter()
            .filter(|(kind, name, ..)| kind == "GuardedHost" && name == host)
            .map(|(_, _, _, reason, _)| reason)
            .collect()
    }

    /// Every request the controller's ServiceAccount made so far (audit log).
    pub fn controller_calls(&self) -> Vec<AuditEvent> {
        let user = controller_user();
        self.cluster
            .audit()
            .unwrap()
            .into_iter()
            .filter(|e| e.user == user)
            .collect()
    }

    /// Panics if RBAC refused any request of the controller, but those an API server that
    /// was (re)starting refused before it was ready (its RBAC caches not yet synced).
    pub fn assert_nothing_forbidden(&self) {
        let windows = self.cluster.apiserver().unready_windows();
        let (starting, refused): (Vec<_>, Vec<_>) = self
            .controller_calls()
            .into_iter()
            .filter(|e| e.code == 403 || e.decision == "forbid")
            .partition(|e| {
                e.received
                    .is_some_and(|t| windows.iter().any(|(from, to)| *from <= t && t <= *to))
            });
        if !starting.is_empty() {
            eprintln!(
                "[kubelab] {} request(s) refused while the API server was starting (not ready)",
                starting.len()
            );
        }
        assert!(
            refused.is_empty(),
            "RBAC refused the controller: {refused:#?}"
        );
    }

    /// The lab's directory (certificates, controller logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The agents' TLS directory.
    pub fn tls(&self) -> PathBuf {
        self.dir.path().join("tls")
    }

    /// The hosts.
    pub fn hosts(&self) -> &[String] {
        &self.hosts
    }
}

/// Applies `namespace.yaml`, `crds.yaml` and `rbac.yaml` (server-side, as the admin) and
/// waits until the CRDs are established.
pub fn install(cluster: &KubeCluster) {
    cluster
        .kubectl_admin(&[
            "apply",
            "--server-side",
            "-f",
            "packaging/kubernetes/namespace.yaml",
            "-f",
            "packaging/kubernetes/crds.yaml",
            "-f",
            "packaging/kubernetes/rbac.yaml",
        ])
        .unwrap();
    cluster
        .kubectl_admin(&[
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=60s",
        ])
        .unwrap();
}

/// A `GuardedHost` for `host` with its BMC Secret.
pub fn create_host(admin: &ApiClient, host: &str, control_plane: bool) {
    admin
        .create(
            &format!("/api/v1/namespaces/{CREDENTIALS_NS}/secrets"),
            &json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": format!("bmc-{host}"), "namespace": CREDENTIALS_NS},
                "stringData": {"username": "admin", "password": "hunter2"}}),
        )
        .unwrap();
    let (role, pool) = if control_plane {
        ("ControlPlane", "control-plane")
    } else {
        ("Worker", "workers")
    };
    admin
        .create(
            &format!("{MG}/guardedhosts"),
            &json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "GuardedHost",
                "metadata": {"name": host, "namespace": NS, "labels": {"pool": pool}},
                "spec": {"nodeName": host, "role": role,
                    "bmc": {"address": format!("redfish+https://bmc-{host}.invalid/redfish/v1/Systems/1"),
                        "credentialsSecret": {"name": format!("bmc-{host}")}, "insecure": true}}}),
        )
        .unwrap();
}

/// Runs the controller binary to completion (certificates); returns stdout.
pub fn run(args: &[&str]) -> String {
    let out = Command::new(BIN).args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The preDrain hook annotations (`pre-drain.hook.metalguard.io/…`) on a `GuardedHost`.
pub fn quorum_hooks(host: &Value) -> Vec<String> {
    host["metadata"]["annotations"]
        .as_object()
        .map(|a| {
            a.keys()
                .filter(|k| k.starts_with("pre-drain.hook.metalguard.io/"))
                .cloned()
                .collect()
        })
        .unwrap_or_default()
}

/// A Pod object of the controller (the Deployment's labels), never scheduled.
pub fn create_pod(admin: &ApiClient, name: &str) {
    admin
        .create(
            &format!("/api/v1/namespaces/{NS}/pods"),
            &json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": NS,
                    "labels": {"app.kubernetes.io/name": "metalguard-controller"}},
                // The namespace enforces the restricted Pod Security Standard, as the
                // Deployment's pods meet it.
                "spec": {
                    "securityContext": {"runAsNonRoot": true, "runAsUser": 65532,
                        "seccompProfile": {"type": "RuntimeDefault"}},
                    "containers": [{"name": "controller", "image": "metalguard-controller:0.2.0",
                        "securityContext": {"allowPrivilegeEscalation": false,
                            "capabilities": {"drop": ["ALL"]}}}]}}),
        )
        .unwrap();
}

/// The `GuardedControlPlane` `control-plane` over the hosts labelled `pool: control-plane`.
pub fn create_control_plane(admin: &ApiClient, replicas: u32) {
    admin
        .create(
            &format!("{MG}/guardedcontrolplanes"),
            &json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "GuardedControlPlane",
                "metadata": {"name": "control-plane", "namespace": NS},
                "spec": {"replicas": replicas,
                    "hostSelector": {"matchLabels": {"pool": "control-plane"}},
                    "etcd": {"endpoints": ["https://127.0.0.1:2379"]}}}),
        )
        .unwrap();
}
