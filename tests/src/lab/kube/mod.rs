//! The lab in Kubernetes mode ([`super::LabBackend::Kubernetes`]): the lab's own etcd members
//! are also the store of a real kube-apiserver, as kubeadm's stacked etcd is (the API server
//! presents an `apiserver-etcd-client` certificate signed by the etcd CA), with
//! kube-controller-manager's node-lifecycle controller on a short grace period. Each host has
//! a fake kubelet coupled to its power and freeze state: a frozen or powered-off host's
//! kubelet stops heartbeating (its Node goes `Ready=Unknown`), a booted or thawed host's
//! registers again.
//!
//! metalguard runs as in `controller/tests/kubelab/`: `namespace.yaml`, `crds.yaml` and
//! `rbac.yaml` applied, a BMC Secret and a `GuardedHost` per host, a `HostHealthCheck`
//! mirroring the standalone lab's check, and `metalguard-controller run --backend=kubernetes`
//! as its ServiceAccount (static token). The agents are the lab's real ones, pointed at it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use super::host::LabHost;
use super::timeline::Timeline;
use super::{Timings, ms};

mod observe;
pub mod pods;
use crate::etcd::EtcdCluster;
use crate::kube::client::ApiClient;
use crate::kube::kubelet::{FakeKubelet, NodeTemplate};
use crate::kube::{ExternalEtcd, ExternalEtcdTls, KubeCluster, KubeOptions};
use crate::{HarnessError, Result};

/// The namespace of the custom resources, the Lease and the Events.
pub const NS: &str = "metalguard-system";
/// The namespace of the BMC Secrets.
pub const CREDENTIALS_NS: &str = "metalguard-bmc";
/// The controller's ServiceAccount.
pub const SERVICE_ACCOUNT: &str = "metalguard-controller";
/// A label the lab sets on each Node as an administrator would: the kubelet does not set it,
/// so a Node that registers again has it only if metalguard restored it from its backup.
pub const ZONE_LABEL: &str = "topology.kubernetes.io/zone";
/// The common name of the API server's etcd client certificate (kubeadm's
/// `apiserver-etcd-client`).
const APISERVER_ETCD_CN: &str = "kube-apiserver-etcd-client";
/// The custom resources' path in the controller's namespace.
const MG: &str = "/apis/metalguard.io/v1alpha1/namespaces/metalguard-system";
/// kube-controller-manager's `--node-monitor-grace-period`: a silent kubelet's Node goes
/// `Ready=Unknown` this long after its last Lease renewal (40 s in a real cluster).
pub const NODE_MONITOR_GRACE_PERIOD: Duration = Duration::from_secs(4);
/// How long the lab's own reads (narration, health, readiness) wait for the API server: the
/// lab is single-threaded and couples power to the hosts on every tick, so it must not wait
/// out a stalled request ([`APISERVER_ETCD_STALL`]).
pub const READ_TIMEOUT: Duration = Duration::from_millis(1500);
/// The lab's reader (in `system:masters`).
const LAB_READER: &str = "metalguard-lab";

/// How long kube-apiserver's requests may stall on a hung (SIGSTOPped) etcd member: its etcd
/// client sends gRPC keepalive pings after 30 s without activity and gives a connection up
/// 10 s after an unanswered one (`keepaliveTime`, `keepaliveTimeout` in
/// `k8s.io/apiserver/pkg/storage/storagebackend/factory/etcd3.go`, not configurable), and the
/// kernel of a hung host still acknowledges TCP, so nothing else notices. Requests the
/// round-robin balancer sends to that member wait until then: the controller's Lease read and
/// status writes, the kubelets' heartbeats. A member that is powered off costs nothing (its
/// connections are reset). Scenarios that freeze a host allow this much more time in
/// Kubernetes mode, twice: the API server holds more than one etcd client, and they notice
/// one after the other.
pub const APISERVER_ETCD_STALL: Duration = Duration::from_secs(2 * 40);

/// The Lease the Kubernetes backend holds while it leads (`LEASE_SECONDS` in
/// `controller/src/kube/run.rs`; not configurable): a controller that crashed is replaced only
/// once it ran out.
pub const CONTROLLER_LEASE: Duration = Duration::from_secs(15);

/// The Kubernetes side of a lab. Dropping it stops the kubelets, then the API server and
/// kube-controller-manager (the etcd members are the lab's).
#[derive(Debug)]
pub struct KubeSide {
    kubelets: BTreeMap<String, FakeKubelet>,
    /// Hosts that booted or thawed while the API server could not register their Node.
    registrations_due: BTreeSet<String>,
    /// The `Ready` status of each Node as last told (`None`: no Node).
    told_ready: BTreeMap<String, Option<String>>,
    told_healthy: BTreeMap<String, String>,
    told_zone: BTreeMap<String, Option<String>>,
    /// The uid of each Node as last told: a new uid is a new object, the old one was deleted.
    told_uid: BTreeMap<String, String>,
    /// Nodes and `GuardedHost`s as last read.
    nodes: BTreeMap<String, Value>,
    guarded: BTreeMap<String, Value>,
    controller_kubeconfig: PathBuf,
    /// The lab's reads, bounded by [`READ_TIMEOUT`].
    reader: ApiClient,
    /// The controller's Pods on real nodes ([`super::LabOptions::controller_image`]); torn
    /// down before the API server.
    pods: Option<pods::ControllerPods>,
    cluster: KubeCluster,
}

/// The taint that keeps Pods off the hosts' Nodes when real nodes run the controller: their
/// kubelets are the lab's fakes, which run nothing.
const FAKE_KUBELET_TAINT: &str = "lab.metalguard.io/fake-kubelet";

fn node_template(name: &str, real_nodes: bool) -> NodeTemplate {
    let template = NodeTemplate::named(name).label("node-role.kubernetes.io/control-plane", "");
    if real_nodes {
        template.taint(FAKE_KUBELET_TAINT, "true", "NoSchedule")
    } else {
        template
    }
}

impl KubeSide {
    /// Starts kube-apiserver on `etcd` and kube-controller-manager, installs metalguard's
    /// manifests, and registers `hosts` (Secret, `GuardedHost`, Node with its kubelet). With
    /// `controller_image`, also two real nodes that will run the controller's Pods
    /// ([`Self::deploy_controller`]).
    pub fn start(
        etcd: &EtcdCluster,
        hosts: &[LabHost],
        timings: &Timings,
        timeline: &mut Timeline,
        controller_image: Option<&Path>,
    ) -> Result<Self> {
        let tls = match etcd.pki() {
            Some(pki) => {
                let client = pki.issue_client(APISERVER_ETCD_CN)?;
                Some(ExternalEtcdTls {
                    ca: pki.ca().to_owned(),
                    cert: client.cert,
                    key: client.key,
                })
            }
            None => None,
        };
        let mut options = KubeOptions {
            controller_manager: true,
            node_monitor_grace_period: Some(NODE_MONITOR_GRACE_PERIOD),
            service_accounts: vec![(NS.to_owned(), SERVICE_ACCOUNT.to_owned())],
            external_etcd: Some(ExternalEtcd {
                servers: etcd.endpoints(),
                tls,
            }),
            ..KubeOptions::default()
        };
        if controller_image.is_some() {
            options = crate::node::NodeBed::cluster_options(options);
        }
        let cluster = KubeCluster::start(&options)?;
        timeline.add(
            "lab",
            format!(
                "started kube-apiserver and kube-controller-manager in {:.1}s",
                cluster.started_in().as_secs_f64()
            ),
            format!(
                "the API server's store is the lab's etcd ({} members, client certificate CN {APISERVER_ETCD_CN}); Nodes go NotReady {}s after their kubelet stops",
                etcd.endpoints().len(),
                NODE_MONITOR_GRACE_PERIOD.as_secs()
            ),
        );
        let controller_kubeconfig = cluster.service_account_kubeconfig(NS, SERVICE_ACCOUNT)?;
        let reader = cluster.client_as_within(LAB_READER, &["system:masters"], READ_TIMEOUT)?;
        let pods = match controller_image {
            Some(image) => {
                let pods = pods::ControllerPods::start(&cluster, image)?;
                timeline.add(
                    "lab",
                    format!("started real nodes {} for the controller's Pods", pods.node_names().join(", ")),
                    format!(
                        "containerd, runc, CNI bridge and kubelet each, kube-scheduler, kube-proxy (NodePorts on 127.0.0.1); image {} imported",
                        image.display()
                    ),
                );
                Some(pods)
            }
            None => None,
        };
        let mut side = Self {
            kubelets: BTreeMap::new(),
            registrations_due: BTreeSet::new(),
            told_ready: BTreeMap::new(),
            told_healthy: BTreeMap::new(),
            told_zone: BTreeMap::new(),
            told_uid: BTreeMap::new(),
            nodes: BTreeMap::new(),
            guarded: BTreeMap::new(),
            controller_kubeconfig,
            reader,
            pods,
            cluster,
        };
        side.install()?;
        for host in hosts.iter().filter(|h| h.in_inventory()) {
            side.add_host(host)?;
        }
        side.create_check(timings)?;
        side.create_control_plane(hosts.iter().filter(|h| h.in_inventory()).count(), etcd)?;
        timeline.add(
            "lab",
            "applied namespace.yaml, crds.yaml and rbac.yaml; one BMC Secret, GuardedHost and Node per host; HostHealthCheck control-plane",
            format!(
                "each Node labelled {ZONE_LABEL} by the lab (not by its kubelet): back after a fence only if metalguard restores it"
            ),
        );
        Ok(side)
    }

    fn install(&self) -> Result<()> {
        self.cluster.kubectl_admin(&[
            "apply",
            "--server-side",
            "-f",
            "packaging/kubernetes/namespace.yaml",
            "-f",
            "packaging/kubernetes/crds.yaml",
            "-f",
            "packaging/kubernetes/rbac.yaml",
        ])?;
        self.cluster.kubectl_admin(&[
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=60s",
        ])?;
        Ok(())
    }

    /// Adds `host`: its BMC Secret, its `GuardedHost` (role `ControlPlane`, label `pool:
    /// control-plane`), its Node (fake kubelet) with the lab's zone label.
    pub fn add_host(&mut self, host: &LabHost) -> Result<()> {
        let name = host.name.as_str();
        let admin = self.cluster.admin();
        admin.create(
            &format!("/api/v1/namespaces/{CREDENTIALS_NS}/secrets"),
            &json!({"apiVersion": "v1", "kind": "Secret",
                "metadata": {"name": secret_name(name), "namespace": CREDENTIALS_NS},
                "stringData": {"username": host.bmc_username(), "password": host.bmc_password()}}),
        )?;
        let mut bmc = json!({
            "address": host.bmc_address(),
            "credentialsSecret": {"name": secret_name(name)},
        });
        if let Some(ca) = host.bmc_ca_file() {
            let pem = std::fs::read_to_string(&ca)
                .map_err(HarnessError::io(format!("reading {}", ca.display())))?;
            bmc["caBundle"] = json!(pem);
        }
        admin.create(
            &format!("{MG}/guardedhosts"),
            &json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "GuardedHost",
                "metadata": {"name": name, "namespace": NS, "labels": {"pool": "control-plane"}},
                "spec": {"nodeName": name, "role": "ControlPlane", "bmc": bmc}}),
        )?;
        let kubelet = self
            .cluster
            .kubelet(&node_template(name, self.pods.is_some()))?;
        admin.merge_patch(
            &format!("/api/v1/nodes/{name}"),
            &json!({"metadata": {"labels": {ZONE_LABEL: zone_of(name)}}}),
        )?;
        self.kubelets.insert(name.to_owned(), kubelet);
        Ok(())
    }

    /// Removes `name` (retired and powered off): its `GuardedHost`, its Secret, its Node (as
    /// an administrator does after `kubeadm reset`), and its kubelet.
    pub fn remove_host(&mut self, name: &str) -> Result<()> {
        if let Some(kubelet) = self.kubelets.remove(name) {
            kubelet.stop();
        }
        self.registrations_due.remove(name);
        let admin = self.cluster.admin();
        admin.delete(&format!("{MG}/guardedhosts/{name}"))?;
        admin.delete(&format!(
            "/api/v1/namespaces/{CREDENTIALS_NS}/secrets/{}",
            secret_name(name)
        ))?;
        admin.delete(&format!("/api/v1/nodes/{name}"))?;
        Ok(())
    }

    /// The `HostHealthCheck` over the control plane, with the standalone lab's timings:
    /// `Ready` not `True` for the unhealthy timeout, or the agent silent for the heartbeat
    /// timeout; as there, an agent silent that long executes nothing and its etcd view no
    /// longer counts (`executorHeartbeatTimeout`).
    fn create_check(&self, t: &Timings) -> Result<()> {
        self.cluster.admin().create(
            &format!("{MG}/hosthealthchecks"),
            &json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "HostHealthCheck",
            "metadata": {"name": "control-plane", "namespace": NS},
            "spec": {
                "selector": {"matchLabels": {"pool": "control-plane"}},
                "unhealthyConditions": [
                    {"type": "Ready", "status": "False", "timeout": ms(t.unhealthy_timeout)},
                    {"type": "Ready", "status": "Unknown",
                        "timeout": ms(t.ready_unknown_timeout.unwrap_or(t.unhealthy_timeout))},
                ],
                "agentHeartbeatTimeout": ms(t.heartbeat_timeout),
                "remediation": {
                    "nodeAction": "Delete",
                    "maxRetries": t.max_retry,
                    "retryPeriod": ms(t.retry_period),
                    "minHealthyPeriod": "20s",
                    "executorHeartbeatTimeout": ms(t.heartbeat_timeout),
                },
            }}),
        )?;
        Ok(())
    }

    /// The `GuardedControlPlane` over the hosts labelled `pool: control-plane`: `replicas`
    /// voters, as the standalone lab's `[control_plane] desired_replicas`.
    fn create_control_plane(&self, replicas: usize, etcd: &EtcdCluster) -> Result<()> {
        self.cluster.admin().create(
            &format!("{MG}/guardedcontrolplanes"),
            &json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "GuardedControlPlane",
                "metadata": {"name": "control-plane", "namespace": NS},
                "spec": {"replicas": replicas,
                    "hostSelector": {"matchLabels": {"pool": "control-plane"}},
                    "etcd": {"endpoints": etcd.endpoints()}}}),
        )?;
        Ok(())
    }

    /// `metalguard-controller run --backend=kubernetes` as the ServiceAccount.
    pub fn controller_command(
        &self,
        bin: &Path,
        listen: &str,
        tls_dir: &Path,
        id: &str,
    ) -> Command {
        let mut command = Command::new(bin);
        command
            .args(["run", "--backend=kubernetes", "--namespace", NS, "--id", id])
            .args(["--listen", listen])
            .arg("--tls-dir")
            .arg(tls_dir)
            .env("KUBECONFIG", &self.controller_kubeconfig)
            .env_remove("KUBERNETES_SERVICE_HOST");
        command
    }

    /// The controller's Pods, when real nodes run them.
    pub fn controller_pods(&self) -> Option<&pods::ControllerPods> {
        self.pods.as_ref()
    }

    /// The same, to check its nodes.
    pub fn controller_pods_mut(&mut self) -> Option<&mut pods::ControllerPods> {
        self.pods.as_mut()
    }

    /// Deploys the shipped Deployment with the lab's controller certificate from `tls` and
    /// waits for its two Pods to be Ready (a no-op without real nodes).
    pub fn deploy_controller(&mut self, tls: &Path, timeline: &mut Timeline) -> Result<()> {
        let Some(pods) = self.pods.as_mut() else {
            return Ok(());
        };
        let started = std::time::Instant::now();
        pods.deploy(&self.cluster, tls)?;
        timeline.add(
            "lab",
            format!(
                "the controller runs as the shipped Deployment's 2 Pods, Ready after {:.1}s",
                started.elapsed().as_secs_f64()
            ),
            format!(
                "kubectl apply -k packaging/kubernetes as shipped, Secret metalguard-controller-tls from the lab's certificates; in-cluster configuration; agents reach the leader through the NodePort Service at {}",
                pods::ControllerPods::agent_url()
            ),
        );
        Ok(())
    }

    /// The admin's kubeconfig (what `fence`, `status` and `retire --kubeconfig` use).
    pub fn admin_kubeconfig(&self) -> &Path {
        self.cluster.admin_kubeconfig()
    }

    /// The API server and its helpers.
    pub fn cluster(&self) -> &KubeCluster {
        &self.cluster
    }

    /// The notes of the controller's `Refused` Events about `GuardedHost` `host`, oldest
    /// first: the planner's refusals, as this backend tells them (its status has no plan).
    pub fn refusals_of(&self, host: &str) -> Result<Vec<String>> {
        let mut events = self
            .cluster
            .admin()
            .list(&format!("/apis/events.k8s.io/v1/namespaces/{NS}/events"))?;
        events.sort_by_key(|e| e["eventTime"].as_str().unwrap_or("").to_owned());
        Ok(events
            .iter()
            .filter(|e| {
                e["reportingController"] == "metalguard.io/controller"
                    && e["reason"] == "Refused"
                    && e["regarding"]["kind"] == "GuardedHost"
                    && e["regarding"]["name"] == host
            })
            .filter_map(|e| e["note"].as_str().map(str::to_owned))
            .collect())
    }

    /// Host `name` froze or lost power: its kubelet stops heartbeating.
    pub fn host_stopped(&mut self, name: &str) {
        self.registrations_due.remove(name);
        if let Some(k) = self.kubelets.get(name) {
            k.stop();
        }
    }

    /// Host `name` booted or thawed: its kubelet registers its Node again (now, or on a
    /// later tick if the API server does not answer).
    pub fn host_started(&mut self, name: &str) {
        self.registrations_due.insert(name.to_owned());
        self.register_due();
    }

    /// Registers the Nodes of hosts that came back; returns the names registered.
    pub fn register_due(&mut self) -> Vec<String> {
        let mut done = Vec::new();
        let real_nodes = self.pods.is_some();
        for name in self.registrations_due.clone() {
            if let Some(k) = self.kubelets.get(&name)
                && k.register_again(&node_template(&name, real_nodes)).is_ok()
            {
                self.registrations_due.remove(&name);
                done.push(name);
            }
        }
        done
    }

    /// The labels of Node `name` now (`None` when it does not exist).
    pub fn node_labels_now(&self, name: &str) -> Result<Option<BTreeMap<String, String>>> {
        Ok(self
            .cluster
            .admin()
            .get_opt(&format!("/api/v1/nodes/{name}"))?
            .map(|node| {
                serde_json::from_value(node["metadata"]["labels"].clone()).unwrap_or_default()
            }))
    }

    /// The zone label the lab gave Node `name`.
    pub fn zone_label(name: &str) -> String {
        zone_of(name)
    }

    /// Gives `a`'s and `b`'s `GuardedHost`s each other's `spec.bmc` (address, credentials
    /// Secret, CA), as a copy-paste error would; doing it again puts each back.
    pub fn swap_bmcs(&self, a: &str, b: &str) -> Result<()> {
        let admin = self.cluster.admin();
        let path = |name: &str| format!("{MG}/guardedhosts/{name}");
        let bmc_a = admin.get(&path(a))?["spec"]["bmc"].clone();
        let bmc_b = admin.get(&path(b))?["spec"]["bmc"].clone();
        // A merge patch keeps keys it does not name: the ones only the old value had go.
        let replacing = |old: &Value, new: &Value| {
            let mut value = new.clone();
            if let (Some(old), Some(fields)) = (old.as_object(), value.as_object_mut()) {
                for key in old.keys() {
                    fields.entry(key.clone()).or_insert(Value::Null);
                }
            }
            json!({"spec": {"bmc": value}})
        };
        admin.merge_patch(&path(a), &replacing(&bmc_a, &bmc_b))?;
        admin.merge_patch(&path(b), &replacing(&bmc_b, &bmc_a))?;
        Ok(())
    }

    /// Writes `password` (the wrong one, or the right one back) into host `name`'s BMC
    /// Secret, as an administrator would: again while the API server cannot write, up to
    /// [`APISERVER_ETCD_STALL`]. Just after a frozen member resumes, etcd may answer a write
    /// with "request timed out" (a 500; seen once when `bad-bmc` put the right password back
    /// the moment cp-3 resumed), and a stalled API server may not answer at all.
    pub fn set_bmc_password(&self, name: &str, password: &str) -> Result<()> {
        let path = format!(
            "/api/v1/namespaces/{CREDENTIALS_NS}/secrets/{}",
            secret_name(name)
        );
        let change = json!({"stringData": {"password": password}});
        let deadline = std::time::Instant::now() + APISERVER_ETCD_STALL;
        loop {
            match self.cluster.admin().merge_patch(&path, &change) {
                Ok(_) => return Ok(()),
                Err(e) if cannot_write_yet(&e) && std::time::Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(500));
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// Which checks of the API server's `/readyz?verbose` fail (e.g. `etcd`), or why it did
    /// not answer. Not bounded by [`READ_TIMEOUT`]: without etcd's quorum the answer takes
    /// seconds (its etcd check waits out its own timeout).
    pub fn failing_readyz_checks(&self) -> Vec<String> {
        match self
            .cluster
            .admin()
            .call("GET", "/readyz?verbose", None, "")
        {
            Ok(answer) => answer
                .body
                .as_str()
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.strip_prefix("[-]"))
                .map(|l| l.split_whitespace().next().unwrap_or(l).to_owned())
                .collect(),
            Err(e) => vec![format!("no answer: {e}")],
        }
    }
}

fn secret_name(host: &str) -> String {
    format!("bmc-{host}")
}

fn zone_of(host: &str) -> String {
    format!("lab-{host}")
}

/// Fails unless `controller` was built with the Kubernetes backend (its default feature):
/// `metalguard-controller crd` exists only then.
pub fn require_kube_backend(controller: &Path) -> Result<()> {
    let ok = Command::new(controller)
        .arg("crd")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Ok(())
    } else {
        Err(HarnessError::Other(format!(
            "{} has no Kubernetes backend (built with --no-default-features?): build it with `cargo build -p metalguard-controller`",
            controller.display()
        )))
    }
}

/// How long the lab's `status --kubeconfig` may take before the lab gives up on it for this
/// tick (see [`READ_TIMEOUT`]).
pub const STATUS_DEADLINE: Duration = Duration::from_secs(3);

/// Runs `command` with stdout and stderr in files under `dir`; returns stdout, or an error
/// when it fails or is still running after `deadline` (then it is killed).
pub fn run_within(
    mut command: Command,
    dir: &Path,
    deadline: Duration,
    what: &str,
) -> Result<String> {
    let out = dir.join("status.out");
    let err = dir.join("status.err");
    let file = |p: &Path| {
        std::fs::File::create(p).map_err(HarnessError::io(format!("creating {}", p.display())))
    };
    let mut child = command
        .stdin(std::process::Stdio::null())
        .stdout(file(&out)?)
        .stderr(file(&err)?)
        .spawn()
        .map_err(HarnessError::io(format!("starting {what}")))?;
    let started = std::time::Instant::now();
    let status = loop {
        if let Some(status) = child
            .try_wait()
            .map_err(HarnessError::io(format!("waiting for {what}")))?
        {
            break status;
        }
        if started.elapsed() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return Err(HarnessError::Timeout {
                what: what.to_owned(),
                after: deadline,
            });
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let read = |p: &Path| std::fs::read_to_string(p).unwrap_or_default();
    if status.success() {
        Ok(read(&out))
    } else {
        Err(HarnessError::Command {
            command: what.to_owned(),
            detail: format!("{status}: {}", read(&err).trim()),
        })
    }
}

/// Whether the API server's refusal of a write is its store's, for now: 500 (etcd's "request
/// timed out"), 503 or 504, 429, or no answer at all.
fn cannot_write_yet(error: &HarnessError) -> bool {
    match error.api_status() {
        Some(status) => matches!(status, 429 | 500 | 503 | 504),
        None => !matches!(error, HarnessError::MissingProgram { .. }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_command_past_its_deadline_is_killed_and_reported_as_a_timeout() {
        let dir = tempfile::tempdir().unwrap();
        let mut command = Command::new("sh");
        command
            .args(["-c", "echo $$ > pid; exec sleep 30"])
            .current_dir(dir.path());
        let started = std::time::Instant::now();
        let error =
            run_within(command, dir.path(), Duration::from_millis(300), "sleep").unwrap_err();
        assert!(matches!(error, HarnessError::Timeout { .. }), "{error}");
        assert!(started.elapsed() < Duration::from_secs(5));
        let pid = std::fs::read_to_string(dir.path().join("pid")).unwrap();
        assert!(
            !Path::new(&format!("/proc/{}", pid.trim())).exists(),
            "sleep {} still runs",
            pid.trim()
        );
    }

    #[test]
    fn a_command_within_its_deadline_gives_its_output_or_its_error() {
        let dir = tempfile::tempdir().unwrap();
        let mut ok = Command::new("sh");
        ok.args(["-c", "echo hello"]);
        assert_eq!(
            run_within(ok, dir.path(), Duration::from_secs(10), "echo").unwrap(),
            "hello\n"
        );
        let mut failing = Command::new("sh");
        failing.args(["-c", "echo nope >&2; exit 3"]);
        let error = run_within(failing, dir.path(), Duration::from_secs(10), "failing")
            .unwrap_err()
            .to_string();
        assert!(error.contains("nope"), "{error}");
    }

    #[test]
    fn only_a_store_that_cannot_write_yet_is_waited_for() {
        let api = |status| HarnessError::Api {
            what: "PATCH /x".into(),
            status,
            message: "m".into(),
        };
        assert!(cannot_write_yet(&api(500)));
        assert!(cannot_write_yet(&api(503)));
        assert!(cannot_write_yet(&HarnessError::Other("no answer".into())));
        assert!(!cannot_write_yet(&api(422)));
        assert!(!cannot_write_yet(&api(403)));
    }
}
