//! One node of [`super::NodeBed`]: a containerd with its CRI plugin (Debian's 1.6, runc, the
//! Debian CNI plugins on a bridge of its own) and a real kubelet registered as a Node.
//!
//! Per node, as ../shared/KUBELET.md found two kubelets on one host need: containerd's root,
//! state and socket; kubelet's root dir, cert dir, ports, `podLogsDir` and `cgroupRoot`
//! (created beforehand in every cgroup v1 hierarchy); a bridge and a /24 of 10.244.0.0/16.
//! The quirks of this machine kind are pinned here: `failCgroupV1: false` (cgroup v1),
//! `restrict_oom_score_adj = true` (root lacks CAP_SYS_RESOURCE, so runc cannot lower a
//! sandbox's `oom_score_adj`), image garbage collection off (the images are imported, never
//! pulled).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::json;

use super::host;
use crate::ports::{PortLease, reserve_port};
use crate::process::{Proc, run_capture, wait_until};
use crate::tls::write_file;
use crate::{HarnessError, Result, tools};

/// Where Debian's containernetworking-plugins installs the CNI plugins.
pub const CNI_BIN_DIR: &str = "/usr/lib/cni";
/// The containerd namespace the CRI plugin (and so kubelet) uses.
pub const CRI_NAMESPACE: &str = "k8s.io";
/// How long containerd has to answer after it starts.
const CONTAINERD_READY: Duration = Duration::from_secs(30);
/// SIGTERM to SIGKILL for kubelet and containerd.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// What a node is started with.
#[derive(Debug, Clone)]
pub struct NodeConfig {
    /// The Node's name (`system:node:NAME` is its kubelet's identity).
    pub name: String,
    /// Its index: bridge `<prefix><index>`, Pod subnet `10.244.<index>.0/24`.
    pub index: u8,
    /// Its directory.
    pub dir: PathBuf,
    /// The bridge's name.
    pub bridge: String,
    /// The cgroup (in every hierarchy) kubelet puts the node's Pods under.
    pub cgroup_root: String,
    /// The sandbox image's reference (containerd's `sandbox_image`).
    pub pause_ref: String,
    /// Image archives imported before kubelet starts (the sandbox image first).
    pub images: Vec<PathBuf>,
    /// kubelet's kubeconfig (`system:node:NAME` in `system:nodes`).
    pub kubeconfig: PathBuf,
    /// The cluster CA (kubelet's client CA for the API server's requests).
    pub ca: PathBuf,
    /// kubelet's `nodeLeaseDurationSeconds`.
    pub lease_seconds: u32,
}

/// The gateway (the host's address on the node's bridge) of node `index`.
pub fn gateway(index: u8) -> String {
    format!("10.244.{index}.1")
}

/// The Pod subnet of node `index`.
pub fn subnet(index: u8) -> String {
    format!("10.244.{index}.0/24")
}

/// A running node.
#[derive(Debug)]
pub struct Node {
    config: NodeConfig,
    kubelet: Option<Proc>,
    containerd: Option<Proc>,
    /// Held while the bed runs (kubelet's, kube-proxy's, the scheduler's ports).
    ports: Vec<PortLease>,
}

impl Node {
    /// Creates the bridge, starts containerd, imports the images and starts kubelet (which
    /// registers the Node; the bed waits for it to be Ready).
    pub fn start(config: NodeConfig) -> Result<Self> {
        let dir = config.dir.clone();
        std::fs::create_dir_all(dir.join("cni"))
            .map_err(HarnessError::io("creating the node's directory"))?;
        let mut node = Self {
            config,
            kubelet: None,
            containerd: None,
            ports: Vec::new(),
        };
        node.create_bridge()?;
        node.write_cni()?;
        node.start_containerd()?;
        for image in node.config.images.clone() {
            let archive = image.to_string_lossy().into_owned();
            node.ctr(&["images", "import", &archive])?;
        }
        host::create_cgroup(&node.config.cgroup_root)?;
        node.start_kubelet()?;
        Ok(node)
    }

    /// The Node's name.
    pub fn name(&self) -> &str {
        &self.config.name
    }

    /// containerd's socket.
    pub fn socket(&self) -> PathBuf {
        self.config.dir.join("containerd.sock")
    }

    /// The node's directory (logs: `containerd.log`, `kubelet.log`, `pod-logs/`).
    pub fn dir(&self) -> &Path {
        &self.config.dir
    }

    /// `ctr -a SOCKET -n k8s.io ARGS...`, its stdout.
    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        let mut command = Command::new(tools::program("ctr")?);
        command
            .arg("--address")
            .arg(self.socket())
            .arg("--namespace")
            .arg(CRI_NAMESPACE)
            .args(args);
        run_capture(command, None, &format!("ctr {}", args.join(" ")))
    }

    /// The host pid of container `id` (a Pod status's `containerd://ID` without the scheme).
    pub fn container_pid(&self, id: &str) -> Result<u32> {
        let listing = self.ctr(&["tasks", "ls"])?;
        listing
            .lines()
            .skip(1)
            .find_map(|line| {
                let mut fields = line.split_whitespace();
                (fields.next() == Some(id))
                    .then(|| fields.next().and_then(|p| p.parse().ok()))
                    .flatten()
            })
            .ok_or_else(|| {
                HarnessError::Other(format!("no running task {id} on node {}", self.name()))
            })
    }

    /// Kills container `id`'s processes (SIGKILL), as a crash would.
    pub fn kill_container(&self, id: &str) -> Result<()> {
        self.ctr(&["tasks", "kill", "--all", "--signal", "SIGKILL", id])
            .map(drop)
    }

    /// Pauses container `id` (runc's freezer: every process stopped, its sockets still
    /// accept connections in the kernel), as a hung process would be.
    pub fn pause_container(&self, id: &str) -> Result<()> {
        self.ctr(&["tasks", "pause", id]).map(drop)
    }

    /// Resumes a paused container.
    pub fn resume_container(&self, id: &str) -> Result<()> {
        self.ctr(&["tasks", "resume", id]).map(drop)
    }

    /// kubelet's log tail.
    pub fn kubelet_log(&self, lines: usize) -> String {
        crate::process::tail_of(&self.config.dir.join("kubelet.log"), lines)
    }

    /// Whether kubelet and containerd still run (with a log tail when not).
    pub fn ensure_running(&mut self) -> Result<()> {
        for proc in [&mut self.containerd, &mut self.kubelet]
            .into_iter()
            .flatten()
        {
            proc.ensure_running()?;
        }
        Ok(())
    }

    fn create_bridge(&self) -> Result<()> {
        let bridge = &self.config.bridge;
        let address = format!("{}/24", gateway(self.config.index));
        for args in [
            vec!["link", "add", bridge.as_str(), "type", "bridge"],
            vec!["addr", "add", address.as_str(), "dev", bridge.as_str()],
            vec!["link", "set", bridge.as_str(), "up"],
        ] {
            let mut command = Command::new("ip");
            command.args(&args);
            run_capture(command, None, &format!("ip {}", args.join(" ")))?;
        }
        Ok(())
    }

    fn write_cni(&self) -> Result<()> {
        let conf = json!({
            "cniVersion": "0.4.0",
            "name": format!("mg-harness-{}", self.config.name),
            "plugins": [
                {"type": "bridge", "bridge": self.config.bridge, "isGateway": true,
                 "ipMasq": false, "hairpinMode": true,
                 "ipam": {"type": "host-local",
                          "dataDir": self.config.dir.join("cni-ipam"),
                          "ranges": [[{"subnet": subnet(self.config.index)}]],
                          "routes": [{"dst": "0.0.0.0/0"}]}},
                {"type": "portmap", "capabilities": {"portMappings": true}}
            ]
        });
        write_file(
            &self.config.dir.join("cni/10-bridge.conflist"),
            conf.to_string().as_bytes(),
            0o644,
        )
    }

    fn start_containerd(&mut self) -> Result<()> {
        for needed in ["runc", "containerd-shim-runc-v2"] {
            tools::program(needed)?;
        }
        if !Path::new(CNI_BIN_DIR).join("bridge").exists() {
            return Err(HarnessError::MissingProgram {
                program: format!("{CNI_BIN_DIR}/bridge"),
                hint: "apt install containernetworking-plugins (scripts/setup.sh does)".into(),
            });
        }
        let dir = &self.config.dir;
        let text = format!(
            "version = 2\n\
             root = \"{dir}/containerd-root\"\n\
             state = \"{dir}/containerd-state\"\n\
             [grpc]\n  address = \"{dir}/containerd.sock\"\n\
             [ttrpc]\n  address = \"{dir}/containerd.sock.ttrpc\"\n\
             [debug]\n  address = \"\"\n\
             [metrics]\n  address = \"\"\n\
             [plugins.\"io.containerd.internal.v1.opt\"]\n  path = \"{dir}/opt\"\n\
             [plugins.\"io.containerd.grpc.v1.cri\"]\n\
             \x20 restrict_oom_score_adj = true\n\
             \x20 sandbox_image = \"{pause}\"\n\
             \x20 stream_server_address = \"127.0.0.1\"\n\
             \x20 stream_server_port = \"0\"\n\
             \x20 [plugins.\"io.containerd.grpc.v1.cri\".cni]\n\
             \x20   bin_dir = \"{CNI_BIN_DIR}\"\n\
             \x20   conf_dir = \"{dir}/cni\"\n\
             \x20 [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc]\n\
             \x20   runtime_type = \"io.containerd.runc.v2\"\n\
             \x20 [plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.runc.options]\n\
             \x20   SystemdCgroup = false\n",
            dir = dir.display(),
            pause = self.config.pause_ref,
        );
        let config = dir.join("containerd.toml");
        write_file(&config, text.as_bytes(), 0o644)?;
        let mut command = Command::new(tools::program("containerd")?);
        command.arg("--config").arg(&config);
        let mut proc = Proc::spawn(
            format!("containerd ({})", self.config.name),
            command,
            &dir.join("containerd.log"),
        )?;
        let socket = self.socket();
        let waited = wait_until("containerd answers on its socket", CONTAINERD_READY, || {
            proc.ensure_running()?;
            Ok(socket.exists() && self.ctr(&["version"]).is_ok())
        });
        if let Err(e) = waited {
            return Err(HarnessError::Other(format!(
                "{e}; containerd's log ends:\n{}",
                proc.log_tail(20)
            )));
        }
        self.containerd = Some(proc);
        Ok(())
    }

    fn start_kubelet(&mut self) -> Result<()> {
        let port = reserve_port()?;
        let healthz = reserve_port()?;
        let dir = &self.config.dir;
        let config = json!({
            "apiVersion": "kubelet.config.k8s.io/v1beta1",
            "kind": "KubeletConfiguration",
            "failCgroupV1": false,
            "cgroupDriver": "cgroupfs",
            "cgroupRoot": format!("/{}", self.config.cgroup_root),
            "containerRuntimeEndpoint": format!("unix://{}", self.socket().display()),
            "address": "127.0.0.1",
            "port": port.port(),
            "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1",
            "healthzPort": healthz.port(),
            "authentication": {"anonymous": {"enabled": false}, "webhook": {"enabled": true},
                               "x509": {"clientCAFile": self.config.ca}},
            "authorization": {"mode": "Webhook"},
            "clusterDomain": "cluster.local",
            "clusterDNS": [],
            "resolvConf": "/etc/resolv.conf",
            "failSwapOn": false,
            "cgroupsPerQOS": true,
            "enforceNodeAllocatable": ["pods"],
            "imageGCHighThresholdPercent": 100,
            "imageGCLowThresholdPercent": 99,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "serializeImagePulls": false,
            "rotateCertificates": false,
            "serverTLSBootstrap": false,
            "podLogsDir": dir.join("pod-logs"),
            // Renewed every quarter of it: the harness's node-monitor grace is seconds, not 40.
            "nodeLeaseDurationSeconds": self.config.lease_seconds,
            "nodeStatusUpdateFrequency": "4s",
            "nodeStatusReportFrequency": "10s",
            "shutdownGracePeriod": "0s",
        });
        let path = dir.join("kubelet.json");
        write_file(&path, config.to_string().as_bytes(), 0o644)?;
        let mut command = Command::new(tools::kube_bin("kubelet")?);
        command
            .arg(format!("--config={}", path.display()))
            .arg(format!("--kubeconfig={}", self.config.kubeconfig.display()))
            .arg(format!("--hostname-override={}", self.config.name))
            .arg(format!("--root-dir={}", dir.join("kubelet").display()))
            .arg(format!("--cert-dir={}", dir.join("kubelet-pki").display()))
            .arg("--v=1");
        let proc = Proc::spawn(
            format!("kubelet ({})", self.config.name),
            command,
            &dir.join("kubelet.log"),
        )?;
        self.kubelet = Some(proc);
        self.ports.extend([port, healthz]);
        Ok(())
    }

    /// Stops kubelet (SIGTERM, then SIGKILL).
    pub fn stop_kubelet(&mut self) {
        if let Some(mut proc) = self.kubelet.take() {
            proc.terminate(STOP_GRACE);
        }
    }

    /// Removes every container and sandbox, stops containerd and kills what is left of the
    /// node: its shims, its Pods' processes (the cgroup), its mounts and its bridge. Returns
    /// what could not be removed.
    pub fn teardown(&mut self) -> Vec<String> {
        self.stop_kubelet();
        let mut left = Vec::new();
        if self.containerd.is_some() {
            if let Ok(list) = self.ctr(&["tasks", "ls", "-q"]) {
                for id in list.lines() {
                    let _ = self.ctr(&["tasks", "kill", "--signal", "SIGKILL", id]);
                }
                for id in list.lines() {
                    let _ = wait_until("a task to stop", Duration::from_secs(5), || {
                        Ok(self.ctr(&["tasks", "delete", id]).is_ok())
                    });
                }
            }
            if let Ok(list) = self.ctr(&["containers", "ls", "-q"]) {
                for id in list.lines() {
                    let _ = self.ctr(&["containers", "delete", id]);
                }
            }
        }
        if let Some(mut proc) = self.containerd.take() {
            proc.terminate(STOP_GRACE);
        }
        // Shims whose task could not be deleted name the node's socket on their command line.
        let socket = self.socket();
        // (`--` first: a pattern that starts with `-` would be read as pkill's options.)
        let _ = Command::new("pkill")
            .args(["-KILL", "-f", "--"])
            .arg(format!("-address {}", socket.display()))
            .output();
        left.extend(
            host::remove_cgroup(&self.config.cgroup_root)
                .into_iter()
                .map(|d| format!("cgroup {} (not removable)", d.display())),
        );
        host::unmount_below(&self.config.dir);
        left.extend(
            host::mounts_below(&self.config.dir)
                .into_iter()
                .map(|m| format!("mount {m}")),
        );
        let _ = Command::new("ip")
            .args(["link", "del", &self.config.bridge])
            .output();
        left
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.teardown();
    }
}
