//! The lab's controller as a cluster runs it (issue 26, item 4): the shipped Deployment
//! (`kubectl apply -k packaging/kubernetes`, as shipped) on two real nodes of a
//! [`NodeBed`] attached to the lab's API server, the image imported from an archive
//! (`packaging/build-image.sh`), the Secret `metalguard-controller-tls` made of the lab's own
//! certificates, and the agents reaching the leader through the NodePort Service
//! (127.0.0.1:[`AGENT_NODE_PORT`], kube-proxy). The kubelets supervise the containers; the
//! lab's faults on a controller act on its container (killed, paused) through containerd.
//!
//! Replica slots are nodes: slot `i` is the Pod on `mg-node-i` (the Deployment's
//! anti-affinity keeps the two apart).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::kube::KubeCluster;
use crate::node::{AGENT_NODE_PORT, NodeBed, NodeOptions};
use crate::process::wait_until;
use crate::{HarnessError, Result};

use super::NS;

/// The controller's Lease (`controller/src/kube/run.rs`).
const LEASE: &str =
    "/apis/coordination.k8s.io/v1/namespaces/metalguard-system/leases/metalguard-controller";
/// The label the leader puts on its Pod, which the Service selects.
const LEADER_LABEL: &str = "metalguard.io/leader";
/// The Deployment's Pods.
const SELECTOR: &str = "app.kubernetes.io/name=metalguard-controller";
/// The shipped replicas (`packaging/kubernetes/deployment.yaml`), one per node.
pub const REPLICAS: u8 = 2;
/// How long the Pods have to be scheduled, started and Ready.
const PODS_READY: Duration = Duration::from_secs(180);
/// The real kubelets' Node Lease: renewed every second, well inside the lab's 4 s
/// `--node-monitor-grace-period` (kept short for the hosts' fake kubelets).
const NODE_LEASE_SECONDS: u32 = 4;

/// Two real nodes running the controller's Pods.
#[derive(Debug)]
pub struct ControllerPods {
    bed: NodeBed,
}

/// Whether this machine can run the controller as Pods: root, containerd, runc, the CNI
/// plugins, kubelet and the rest ([`crate::node::check_node_prerequisites`]), and `image`.
pub fn check(image: &Path) -> Result<()> {
    crate::node::check_node_prerequisites()?;
    if !image.is_file() {
        return Err(HarnessError::Other(format!(
            "no controller image archive at {} (packaging/build-image.sh builds it)",
            image.display()
        )));
    }
    Ok(())
}

impl ControllerPods {
    /// Starts the nodes on `cluster` (started with [`NodeBed::cluster_options`]), each
    /// importing `image`.
    pub fn start(cluster: &KubeCluster, image: &Path) -> Result<Self> {
        check(image)?;
        let bed = NodeBed::attach(
            &NodeOptions {
                nodes: REPLICAS,
                images: vec![image.to_path_buf()],
                lease_seconds: NODE_LEASE_SECONDS,
            },
            cluster,
        )?;
        Ok(Self { bed })
    }

    /// The nodes' names.
    pub fn node_names(&self) -> Vec<String> {
        self.bed
            .nodes()
            .iter()
            .map(|n| n.name().to_owned())
            .collect()
    }

    /// The URL agents reach the leader at: the Service's NodePort on the loopback.
    pub fn agent_url() -> String {
        format!("https://127.0.0.1:{AGENT_NODE_PORT}")
    }

    /// Applies the shipped manifests with the controller's serving certificate from `tls`
    /// (`controller.pem`, `controller-key.pem`, `ca.pem`), and waits for both Pods to be
    /// Ready on two nodes.
    pub fn deploy(&mut self, cluster: &KubeCluster, tls: &Path) -> Result<()> {
        create_tls_secret(cluster, tls)?;
        cluster.kubectl_admin(&["apply", "--server-side", "-k", "packaging/kubernetes"])?;
        let waited = wait_until(
            "the controller's two Pods Ready on two nodes",
            PODS_READY,
            || {
                self.bed.ensure_running()?;
                let ready: Vec<String> = pods(cluster)?
                    .iter()
                    .filter(|p| is_ready(p))
                    .map(|p| node_of(p).to_owned())
                    .collect();
                Ok(ready.len() == usize::from(REPLICAS) && ready[0] != ready[1])
            },
        );
        waited.map_err(|e| HarnessError::Other(format!("{e}\n{}", self.logs(30))))?;
        // One leader: the Lease's holder, and the only Pod the Service selects.
        let led = wait_until(
            "one controller Pod leading and labelled",
            PODS_READY,
            || {
                let holder = lease_holder(cluster).unwrap_or_default();
                let labelled: Vec<String> = pods(cluster)?
                    .iter()
                    .filter(|p| p["metadata"]["labels"][LEADER_LABEL] == "true")
                    .filter_map(|p| p["metadata"]["name"].as_str().map(str::to_owned))
                    .collect();
                Ok(!holder.is_empty() && labelled == [holder])
            },
        );
        led.map_err(|e| HarnessError::Other(format!("{e}\n{}", self.logs(30))))
    }

    /// The Pod on slot `slot`'s node that is not being deleted.
    pub fn pod_in(&self, cluster: &KubeCluster, slot: usize) -> Result<Option<Value>> {
        let node = format!("mg-node-{slot}");
        Ok(pods(cluster)?
            .into_iter()
            .find(|p| node_of(p) == node && p["metadata"]["deletionTimestamp"].is_null()))
    }

    /// The slot of the node Pod `name` runs on.
    pub fn slot_of(cluster: &KubeCluster, name: &str) -> Option<usize> {
        pods(cluster)
            .ok()?
            .iter()
            .find(|p| p["metadata"]["name"] == name)
            .and_then(|p| node_of(p).strip_prefix("mg-node-")?.parse().ok())
    }

    /// Whether slot `slot`'s controller container runs (it may be paused).
    pub fn running(&self, cluster: &KubeCluster, slot: usize) -> bool {
        self.pod_in(cluster, slot)
            .ok()
            .flatten()
            .is_some_and(|p| !p["status"]["containerStatuses"][0]["state"]["running"].is_null())
    }

    /// Kills slot `slot`'s controller container (SIGKILL to its processes, as a crash
    /// would); its kubelet starts it again. Returns the Pod's name.
    pub fn kill(&self, cluster: &KubeCluster, slot: usize) -> Result<String> {
        let (node, id, pod) = self.container(cluster, slot)?;
        self.bed.node(&node)?.kill_container(&id)?;
        Ok(pod)
    }

    /// Pauses (`true`) or resumes slot `slot`'s controller container (runc's freezer).
    pub fn pause(&self, cluster: &KubeCluster, slot: usize, paused: bool) -> Result<String> {
        let (node, id, pod) = self.container(cluster, slot)?;
        let node = self.bed.node(&node)?;
        if paused {
            node.pause_container(&id)?;
        } else {
            node.resume_container(&id)?;
        }
        Ok(pod)
    }

    /// The controller containers' log files (CRI format, one per container run).
    pub fn log_files(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = self
            .bed
            .nodes()
            .iter()
            .flat_map(|n| crate::node::pod_log_files(&n.dir().join("pod-logs")))
            .filter(|p| {
                p.to_string_lossy()
                    .contains(&format!("{NS}_metalguard-controller-"))
            })
            .collect();
        out.sort();
        out
    }

    /// The kubelets' log tails and the controllers' (for a failure).
    pub fn logs(&self, lines: usize) -> String {
        let mut out = String::new();
        for node in self.bed.nodes() {
            let _ = writeln!(
                out,
                "--- kubelet {} ---\n{}",
                node.name(),
                node.kubelet_log(lines)
            );
        }
        for log in self.log_files() {
            let _ = writeln!(
                out,
                "--- {} ---\n{}",
                log.display(),
                crate::process::tail_of(&log, lines)
            );
        }
        out
    }

    /// Whether every node's components still run.
    pub fn ensure_running(&mut self) -> Result<()> {
        self.bed.ensure_running()
    }

    /// Tears the nodes down; what they left on the host (empty: nothing).
    pub fn finish(self) -> Vec<String> {
        self.bed.finish()
    }

    fn container(&self, cluster: &KubeCluster, slot: usize) -> Result<(String, String, String)> {
        let pod = self
            .pod_in(cluster, slot)?
            .ok_or_else(|| HarnessError::Other(format!("no controller Pod on mg-node-{slot}")))?;
        let id = pod["status"]["containerStatuses"][0]["containerID"]
            .as_str()
            .and_then(|id| id.strip_prefix("containerd://"))
            .ok_or_else(|| {
                HarnessError::Other(format!(
                    "the controller Pod on mg-node-{slot} has no container"
                ))
            })?
            .to_owned();
        let name = pod["metadata"]["name"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        Ok((node_of(&pod).to_owned(), id, name))
    }
}

/// The controller's image archive named by `METALGUARD_IMAGE_ARCHIVE` (`scripts/test.sh`
/// builds it with `packaging/build-image.sh --profile dev` and exports it), or what to do.
pub fn image_archive_from_env() -> Result<PathBuf> {
    match std::env::var_os("METALGUARD_IMAGE_ARCHIVE").map(PathBuf::from) {
        Some(path) if path.is_file() => Ok(path),
        _ => Err(HarnessError::Other(format!(
            "METALGUARD_IMAGE_ARCHIVE does not name the controller's image archive: run \
             `packaging/build-image.sh --profile dev` and export \
             METALGUARD_IMAGE_ARCHIVE=target/image/metalguard-controller-{}.tar \
             (scripts/test.sh does)",
            env!("CARGO_PKG_VERSION")
        ))),
    }
}

/// Secret `metalguard-controller-tls` in cert-manager's layout (`tls.crt`, `tls.key`,
/// `ca.crt`) from `metalguard-controller certs` files in `tls` (`controller.pem`,
/// `controller-key.pem`, `ca.pem`), as the Deployment mounts it.
pub fn create_tls_secret(cluster: &KubeCluster, tls: &Path) -> Result<()> {
    let file = |key: &str, name: &str| format!("--from-file={key}={}", tls.join(name).display());
    cluster.kubectl_admin(&[
        "-n",
        NS,
        "create",
        "secret",
        "generic",
        "metalguard-controller-tls",
        &file("tls.crt", "controller.pem"),
        &file("tls.key", "controller-key.pem"),
        &file("ca.crt", "ca.pem"),
    ])?;
    Ok(())
}

/// The controller Lease's holder (a Pod's name), if it is held and readable.
pub fn lease_holder(cluster: &KubeCluster) -> Option<String> {
    let lease = cluster.admin().get_opt(LEASE).ok()??;
    lease["spec"]["holderIdentity"]
        .as_str()
        .filter(|h| !h.is_empty())
        .map(str::to_owned)
}

fn pods(cluster: &KubeCluster) -> Result<Vec<Value>> {
    cluster.admin().list(&format!(
        "/api/v1/namespaces/{NS}/pods?labelSelector={SELECTOR}"
    ))
}

/// The node a Pod is scheduled on.
pub fn node_of(pod: &Value) -> &str {
    pod["spec"]["nodeName"].as_str().unwrap_or_default()
}

/// Whether a Pod is Ready and not being deleted.
pub fn is_ready(pod: &Value) -> bool {
    pod["metadata"]["deletionTimestamp"].is_null()
        && pod["status"]["conditions"].as_array().is_some_and(|c| {
            c.iter()
                .any(|c| c["type"] == "Ready" && c["status"] == "True")
        })
}
