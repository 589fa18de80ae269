//! Real nodes under the tests (issue 26): a [`KubeCluster`] with its workload controllers,
//! kube-scheduler, kube-proxy and two (or more) nodes, each a containerd and a real kubelet
//! ([`runtime::Node`]), so that the shipped Deployment runs as Pods: scheduled, started by
//! runc, probed, with projected ServiceAccount tokens and the in-cluster API at
//! `kubernetes.default.svc` (10.0.0.1, through kube-proxy).
//!
//! Data flow of [`NodeBed::start`]: take the host lock ([`host::HostLock`], one bed per host)
//! and record the host ([`host::HostState`]); start the control plane
//! ([`KubeOptions::workloads`]); pack the sandbox ("pause") image (umoci + skopeo, no
//! registry); start each node (bridge, containerd, images, kubelet); start kube-scheduler,
//! kube-proxy (iptables mode, NodePorts on 127.0.0.0/8 only) and a socat forwarder from the
//! first bridge's gateway to the loopback API server, which the `kubernetes` Service's
//! EndpointSlice names (Endpoints refuse loopback addresses); wait for every Node to be Ready.
//!
//! [`NodeBed::finish`] tears it all down in the order ../shared/KUBELET.md found leaves
//! nothing behind, and returns whatever is still different on the host (a test asserts it is
//! nothing); dropping the bed does the same without the report.

pub mod host;
pub mod runtime;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use self::host::{HostLock, HostState};
use self::runtime::{Node, NodeConfig};
use crate::kube::{KubeCluster, KubeOptions, WORKLOAD_API_ADDRESS};
use crate::ports::{PortLease, reserve_exact, reserve_port};
use crate::process::{Proc, run_capture, wait_until};
use crate::{HarnessError, Result, tools};

/// The sandbox image's reference.
pub const PAUSE_REF: &str = "localhost/metalguard-harness/pause:1";
/// The shipped Service's NodePort (`packaging/kubernetes/service.yaml`).
pub const AGENT_NODE_PORT: u16 = 30843;
/// How long a node has to register and turn Ready.
const NODE_READY: Duration = Duration::from_secs(120);
/// Prefix of the bed's bridges (`<prefix><index>`, at most 15 characters).
const BRIDGE_PREFIX: &str = "mgh-br";

/// What to start.
#[derive(Debug, Clone)]
pub struct NodeOptions {
    /// How many nodes (`mg-node-0`, `mg-node-1`, …).
    pub nodes: u8,
    /// Image archives (docker-archive or OCI) every node imports.
    pub images: Vec<PathBuf>,
    /// The kubelets' `nodeLeaseDurationSeconds` (renewed every quarter of it): short enough
    /// for the cluster's `--node-monitor-grace-period`.
    pub lease_seconds: u32,
}

impl Default for NodeOptions {
    fn default() -> Self {
        Self {
            nodes: 2,
            images: Vec::new(),
            lease_seconds: 10,
        }
    }
}

/// The running bed. Fields drop in order: processes first, the host lock last.
#[derive(Debug)]
pub struct NodeBed {
    proxy: Option<Proc>,
    socat: Option<Proc>,
    scheduler: Option<Proc>,
    nodes: Vec<Node>,
    cluster: Option<KubeCluster>,
    host: HostState,
    dir: tempfile::TempDir,
    _node_port: PortLease,
    /// Held while the bed runs (kubelet's, kube-proxy's, the scheduler's ports).
    ports: Vec<PortLease>,
    _lock: HostLock,
}

impl NodeBed {
    /// Starts the control plane, the nodes, kube-scheduler and kube-proxy; returns once every
    /// Node is Ready.
    pub fn start(options: &NodeOptions) -> Result<Self> {
        check_node_prerequisites()?;
        let lock = HostLock::take()?;
        let cluster = KubeCluster::start(&Self::cluster_options(KubeOptions {
            node_monitor_grace_period: Some(Duration::from_secs(20)),
            ..KubeOptions::default()
        }))?;
        let mut bed = Self::bring_up(options, &cluster, lock)?;
        bed.cluster = Some(cluster);
        Ok(bed)
    }

    /// What a control plane needs to have real nodes: `base` with
    /// [`KubeOptions::workloads`] and kube-controller-manager.
    pub fn cluster_options(base: KubeOptions) -> KubeOptions {
        KubeOptions {
            controller_manager: true,
            workloads: true,
            ..base
        }
    }

    /// Starts nodes, kube-scheduler and kube-proxy on `cluster`, a control plane the caller
    /// started with [`Self::cluster_options`] and stops after this bed (the lab's, whose
    /// store is the lab's etcd); returns once every Node is Ready.
    pub fn attach(options: &NodeOptions, cluster: &KubeCluster) -> Result<Self> {
        check_node_prerequisites()?;
        let lock = HostLock::take()?;
        Self::bring_up(options, cluster, lock)
    }

    fn bring_up(options: &NodeOptions, cluster: &KubeCluster, lock: HostLock) -> Result<Self> {
        let host = HostState::capture();
        let node_port = reserve_exact(AGENT_NODE_PORT)?;
        let dir = tools::temp_dir("node")?;
        let mut bed = Self {
            proxy: None,
            socat: None,
            scheduler: None,
            nodes: Vec::new(),
            cluster: None,
            host,
            dir,
            _node_port: node_port,
            ports: Vec::new(),
            _lock: lock,
        };
        let pause = bed.pack_pause()?;
        for index in 0..options.nodes {
            let name = format!("mg-node-{index}");
            let kubeconfig =
                cluster.user_kubeconfig(&format!("system:node:{name}"), &["system:nodes"])?;
            let mut images = vec![pause.clone()];
            images.extend(options.images.iter().cloned());
            let node = Node::start(NodeConfig {
                dir: bed.dir.path().join(&name),
                bridge: format!("{BRIDGE_PREFIX}{index}"),
                cgroup_root: format!("mg-harness-{}-n{index}", std::process::id()),
                pause_ref: PAUSE_REF.to_owned(),
                images,
                kubeconfig,
                ca: cluster.ca_file().to_path_buf(),
                lease_seconds: options.lease_seconds,
                name,
                index,
            })?;
            bed.nodes.push(node);
        }
        bed.start_scheduler(cluster)?;
        bed.start_api_forwarder(cluster)?;
        bed.start_proxy(cluster)?;
        bed.wait_nodes_ready(cluster)?;
        Ok(bed)
    }

    /// The control plane.
    pub fn cluster(&self) -> Result<&KubeCluster> {
        self.cluster.as_ref().ok_or_else(|| {
            HarnessError::Other(
                "the bed is torn down, or runs on a control plane it does not own".into(),
            )
        })
    }

    /// The nodes.
    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    /// Node `name`.
    pub fn node(&self, name: &str) -> Result<&Node> {
        self.nodes
            .iter()
            .find(|n| n.name() == name)
            .ok_or_else(|| HarnessError::Other(format!("no node {name}")))
    }

    /// The bed's directory (component logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Stops node `name`'s kubelet (its Pods keep running, as on a host whose kubelet died).
    pub fn stop_kubelet(&mut self, name: &str) -> Result<()> {
        let node = self
            .nodes
            .iter_mut()
            .find(|n| n.name() == name)
            .ok_or_else(|| HarnessError::Other(format!("no node {name}")))?;
        node.stop_kubelet();
        Ok(())
    }

    /// Whether every component still runs (with its log tail when one does not).
    pub fn ensure_running(&mut self) -> Result<()> {
        for node in &mut self.nodes {
            node.ensure_running()?;
        }
        for proc in [&mut self.scheduler, &mut self.proxy, &mut self.socat]
            .into_iter()
            .flatten()
        {
            proc.ensure_running()?;
        }
        Ok(())
    }

    fn pack_pause(&self) -> Result<PathBuf> {
        let binary = tools::kube_bin("pause")?;
        pack_image(
            &self.dir.path().join("pause-image"),
            &binary,
            "/pause",
            "65535:65535",
            PAUSE_REF,
        )
    }

    fn spawn(&self, name: &str, program: PathBuf, args: Vec<String>) -> Result<Proc> {
        let mut command = Command::new(program);
        command.args(args);
        Proc::spawn(name, command, &self.dir.path().join(format!("{name}.log")))
    }

    fn start_scheduler(&mut self, cluster: &KubeCluster) -> Result<()> {
        let kubeconfig = cluster.user_kubeconfig("system:kube-scheduler", &["system:masters"])?;
        let port = reserve_port()?;
        let proc = self.spawn(
            "kube-scheduler",
            tools::kube_bin("kube-scheduler")?,
            vec![
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--authentication-kubeconfig={}", kubeconfig.display()),
                format!("--authorization-kubeconfig={}", kubeconfig.display()),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={}", port.port()),
                "--leader-elect=false".into(),
                "--profiling=false".into(),
            ],
        )?;
        self.scheduler = Some(proc);
        self.ports.push(port);
        Ok(())
    }

    /// socat from the first bridge's gateway to the API server, and the `kubernetes`
    /// Service's EndpointSlice naming it.
    fn start_api_forwarder(&mut self, cluster: &KubeCluster) -> Result<()> {
        let port: u16 = cluster
            .url()
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(|| HarnessError::Other("the API server's URL has no port".into()))?;
        let proc = self.spawn(
            "socat-apiserver",
            tools::program("socat")?,
            vec![
                format!("TCP-LISTEN:{port},bind={WORKLOAD_API_ADDRESS},fork,reuseaddr"),
                format!("TCP:127.0.0.1:{port}"),
            ],
        )?;
        cluster.admin().create(
            "/apis/discovery.k8s.io/v1/namespaces/default/endpointslices",
            &json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
                "metadata": {"name": "kubernetes-mg-harness", "namespace": "default",
                    "labels": {"kubernetes.io/service-name": "kubernetes",
                               "endpointslice.kubernetes.io/managed-by": "mg-harness"}},
                "addressType": "IPv4",
                "endpoints": [{"addresses": [WORKLOAD_API_ADDRESS], "conditions": {"ready": true}}],
                "ports": [{"name": "https", "port": port, "protocol": "TCP"}]}),
        )?;
        self.socat = Some(proc);
        Ok(())
    }

    fn start_proxy(&mut self, cluster: &KubeCluster) -> Result<()> {
        let healthz = reserve_port()?;
        let metrics = reserve_port()?;
        let kubeconfig = cluster.user_kubeconfig("system:kube-proxy", &["system:masters"])?;
        let first = self
            .nodes
            .first()
            .map(|n| n.name().to_owned())
            .unwrap_or_default();
        let proc = self.spawn(
            "kube-proxy",
            tools::kube_bin("kube-proxy")?,
            vec![
                format!("--kubeconfig={}", kubeconfig.display()),
                format!("--hostname-override={first}"),
                "--proxy-mode=iptables".into(),
                "--cluster-cidr=10.244.0.0/16".into(),
                "--nodeport-addresses=127.0.0.0/8".into(),
                format!("--healthz-bind-address=127.0.0.1:{}", healthz.port()),
                format!("--metrics-bind-address=127.0.0.1:{}", metrics.port()),
                "--conntrack-max-per-core=0".into(),
                "--conntrack-tcp-timeout-established=0".into(),
                "--conntrack-tcp-timeout-close-wait=0".into(),
                "--profiling=false".into(),
            ],
        )?;
        self.proxy = Some(proc);
        self.ports.extend([healthz, metrics]);
        Ok(())
    }

    fn wait_nodes_ready(&mut self, cluster: &KubeCluster) -> Result<()> {
        let names: Vec<String> = self.nodes.iter().map(|n| n.name().to_owned()).collect();
        let waited = wait_until("every Node Ready", NODE_READY, || {
            self.ensure_running()?;
            let admin = cluster.admin();
            for name in &names {
                let Some(node) = admin.get_opt(&format!("/api/v1/nodes/{name}"))? else {
                    return Ok(false);
                };
                let ready = node["status"]["conditions"].as_array().is_some_and(|c| {
                    c.iter()
                        .any(|c| c["type"] == "Ready" && c["status"] == "True")
                });
                if !ready {
                    return Ok(false);
                }
            }
            Ok(true)
        });
        waited.map_err(|e| {
            let logs: Vec<String> = self
                .nodes
                .iter()
                .map(|n| format!("--- kubelet {} ---\n{}", n.name(), n.kubelet_log(30)))
                .collect();
            HarnessError::Other(format!("{e}\n{}", logs.join("\n")))
        })
    }

    /// Tears everything down and returns what is still different on the host: processes of
    /// the bed, cgroups, mounts, iptables chains, sysctls, fixed paths, links (empty: nothing
    /// left behind).
    pub fn finish(mut self) -> Vec<String> {
        self.teardown()
    }

    fn teardown(&mut self) -> Vec<String> {
        let mut left = Vec::new();
        // kubelets first, so that none restarts what the runtime removes.
        for node in &mut self.nodes {
            node.stop_kubelet();
        }
        if let Some(mut proxy) = self.proxy.take() {
            proxy.kill();
            if let Ok(program) = tools::kube_bin("kube-proxy") {
                let _ = Command::new(program)
                    .args(["--cleanup", "--proxy-mode=iptables"])
                    .output();
            }
        }
        for node in &mut self.nodes {
            left.extend(node.teardown());
        }
        self.nodes.clear();
        self.scheduler.take();
        if let Some(socat) = self.socat.take() {
            // Its forked children (one per connection) first, while they are still its.
            if let Some(pid) = socat.pid() {
                let _ = Command::new("pkill")
                    .args(["-KILL", "-P", &pid.to_string()])
                    .output();
            }
            drop(socat);
        }
        self.cluster.take();
        self.host.restore(BRIDGE_PREFIX);
        left.extend(self.host.differences(BRIDGE_PREFIX));
        let dir = self.dir.path().to_string_lossy().into_owned();
        if let Ok(out) = Command::new("pgrep").args(["-af", &dir]).output() {
            left.extend(
                String::from_utf8_lossy(&out.stdout)
                    .lines()
                    .map(|l| format!("process {l}")),
            );
        }
        left
    }
}

impl Drop for NodeBed {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}

/// Root, a writable cgroup hierarchy and the programs the bed runs; a clear error otherwise.
pub fn check_node_prerequisites() -> Result<()> {
    if !nix::unistd::Uid::effective().is_root() {
        return Err(HarnessError::Other(
            "real nodes need root (kubelet, containerd, bridges, iptables)".into(),
        ));
    }
    for program in [
        "containerd",
        "ctr",
        "runc",
        "socat",
        "iptables",
        "umoci",
        "skopeo",
    ] {
        tools::program(program)?;
    }
    for program in ["kubelet", "kube-scheduler", "kube-proxy", "pause"] {
        tools::kube_bin(program)?;
    }
    Ok(())
}

/// The `.log` files below `dir` (a kubelet's `podLogsDir`: one per container run).
pub fn pod_log_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path.extension().is_some_and(|e| e == "log") {
                out.push(path);
            }
        }
    }
    out
}

/// Packs `binary` as the only file of an image (entrypoint `entry`, user `user`), tagged
/// `reference`, into `dir/image.tar` (a docker-archive): umoci writes the OCI layout and
/// skopeo the archive, as `packaging/build-image.sh` does for the controller.
pub fn pack_image(
    dir: &Path,
    binary: &Path,
    entry: &str,
    user: &str,
    reference: &str,
) -> Result<PathBuf> {
    std::fs::create_dir_all(dir).map_err(HarnessError::io("creating the image directory"))?;
    let layout = dir.join("layout");
    let bundle = dir.join("bundle");
    let image = format!("{}:1", layout.display());
    let umoci = tools::program("umoci")?;
    let run = |program: &Path, args: &[String]| {
        let mut command = Command::new(program);
        command.args(args);
        run_capture(
            command,
            None,
            &format!("{} {}", program.display(), args.join(" ")),
        )
    };
    let path = |p: &Path| p.to_string_lossy().into_owned();
    run(&umoci, &["init".into(), "--layout".into(), path(&layout)])?;
    run(&umoci, &["new".into(), "--image".into(), image.clone()])?;
    run(
        &umoci,
        &[
            "unpack".into(),
            "--image".into(),
            image.clone(),
            path(&bundle),
        ],
    )?;
    let target = bundle.join("rootfs").join(entry.trim_start_matches('/'));
    std::fs::copy(binary, &target).map_err(HarnessError::io(format!(
        "copying {} into the image",
        binary.display()
    )))?;
    run(
        &umoci,
        &[
            "repack".into(),
            "--image".into(),
            image.clone(),
            path(&bundle),
        ],
    )?;
    run(
        &umoci,
        &[
            "config".into(),
            "--image".into(),
            image.clone(),
            "--os".into(),
            "linux".into(),
            "--architecture".into(),
            "amd64".into(),
            format!("--config.entrypoint={entry}"),
            format!("--config.user={user}"),
            "--config.workingdir=/".into(),
        ],
    )?;
    let archive = dir.join("image.tar");
    run(
        &tools::program("skopeo")?,
        &[
            "copy".into(),
            "--quiet".into(),
            format!("oci:{image}"),
            format!("docker-archive:{}:{reference}", archive.display()),
        ],
    )?;
    let _ = std::fs::remove_dir_all(&bundle);
    Ok(archive)
}
