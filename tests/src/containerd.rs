//! A private containerd (Debian's 1.6, with runc): the container runtime the controller's image
//! is imported into and run by (issue 26, item 1).
//!
//! Its root, state, sockets and the FIFOs of `ctr run` are in a `mg-harness-containerd-`
//! directory; its CRI plugin is off (no kubelet talks to it). What containerd and runc put
//! elsewhere on the host, and [`Containerd`]'s drop removes: the per-namespace runc state
//! (`/run/containerd/runc/NS`), the shims' socket directory (`/run/containerd/s`, and
//! `/run/containerd` itself when this harness created it), the cgroup `/NS` that `ctr run`
//! nests each container under in every hierarchy, and any mount left under the root. The
//! namespace is `mg-harness-PID`, so two test processes never share one.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::process::{Proc, run_capture, wait_until};
use crate::{HarnessError, Result, tools};

/// How long containerd has to answer after it starts.
const READY_TIMEOUT: Duration = Duration::from_secs(30);
/// SIGTERM to SIGKILL when it stops.
const STOP_GRACE: Duration = Duration::from_secs(10);
/// containerd's state directory for shims and runc, fixed in containerd 1.6 whatever the
/// configuration says.
const HOST_RUN_DIR: &str = "/run/containerd";

/// A running containerd with its own root, state and socket.
#[derive(Debug)]
pub struct Containerd {
    dir: tempfile::TempDir,
    proc: Option<Proc>,
    namespace: String,
    ctr: PathBuf,
    /// Whether `/run/containerd` was absent before this harness started containerd.
    created_host_run_dir: bool,
    /// `/run/containerd` is shared with the node bed's containerds: one at a time.
    _lock: crate::node::host::HostLock,
}

impl Containerd {
    /// Starts containerd and waits until `ctr version` answers through its socket.
    pub fn start() -> Result<Self> {
        let lock = crate::node::host::HostLock::take()?;
        let containerd = tools::program("containerd")?;
        let ctr = tools::program("ctr")?;
        for needed in ["runc", "containerd-shim-runc-v2"] {
            tools::program(needed)?;
        }
        let dir = tools::temp_dir("containerd")?;
        let root = dir.path();
        let config = root.join("config.toml");
        let text = format!(
            "version = 2\n\
             root = \"{root}/root\"\n\
             state = \"{root}/state\"\n\
             disabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
             [grpc]\n  address = \"{root}/containerd.sock\"\n\
             [ttrpc]\n  address = \"{root}/containerd.sock.ttrpc\"\n\
             [debug]\n  address = \"\"\n\
             [metrics]\n  address = \"\"\n",
            root = root.display()
        );
        std::fs::write(&config, text).map_err(HarnessError::io("writing containerd's config"))?;
        std::fs::create_dir_all(root.join("fifo"))
            .map_err(HarnessError::io("creating the FIFO directory"))?;
        let created_host_run_dir = !Path::new(HOST_RUN_DIR).exists();
        let mut command = Command::new(containerd);
        command.arg("--config").arg(&config);
        let mut proc = Proc::spawn("containerd", command, &root.join("containerd.log"))?;
        let socket = root.join("containerd.sock");
        let namespace = format!("mg-harness-{}", std::process::id());
        let ready = wait_until("containerd answers on its socket", READY_TIMEOUT, || {
            proc.ensure_running()?;
            Ok(socket.exists() && ctr_in(&ctr, &socket, &namespace, &["version"]).is_ok())
        });
        let this = Self {
            namespace,
            dir,
            proc: Some(proc),
            ctr,
            created_host_run_dir,
            _lock: lock,
        };
        ready.map_err(|e| HarnessError::Command {
            command: "containerd".to_owned(),
            detail: format!("{e}; its log ends:\n{}", this.log_tail(20)),
        })?;
        Ok(this)
    }

    /// The gRPC socket `ctr -a` takes.
    pub fn socket(&self) -> PathBuf {
        self.dir.path().join("containerd.sock")
    }

    /// The namespace every `ctr` call of this harness uses.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// containerd's log.
    pub fn log_tail(&self, lines: usize) -> String {
        crate::process::tail_of(&self.dir.path().join("containerd.log"), lines)
    }

    /// Runs `ctr -a SOCKET -n NAMESPACE ARGS...` and returns its stdout.
    pub fn ctr(&self, args: &[&str]) -> Result<String> {
        ctr_in(&self.ctr, &self.socket(), &self.namespace, args)
    }

    /// Imports an image archive (docker-archive or OCI) and returns the references it added.
    pub fn import(&self, archive: &Path) -> Result<Vec<String>> {
        let archive = archive.to_string_lossy();
        self.ctr(&["images", "import", archive.as_ref()])?;
        Ok(self
            .ctr(&["images", "ls", "-q"])?
            .lines()
            .map(str::to_owned)
            .collect())
    }

    /// Runs `image` as container `id` to completion with `args` as its whole command line,
    /// host network, read-only root filesystem, and returns what it printed.
    pub fn run(&self, image: &str, id: &str, args: &[&str]) -> Result<String> {
        let fifo = self.dir.path().join("fifo");
        let fifo = fifo.to_string_lossy();
        let mut all = vec![
            "run",
            "--rm",
            "--net-host",
            "--read-only",
            "--fifo-dir",
            fifo.as_ref(),
            image,
            id,
        ];
        all.extend_from_slice(args);
        self.ctr(&all)
    }

    /// Mounts under this containerd's root still present (`/proc/self/mountinfo`).
    pub fn mounts(&self) -> Vec<String> {
        mounts_under(self.dir.path())
    }

    fn teardown(&mut self) {
        // Containers first, so that no shim outlives containerd.
        if let Ok(list) = self.ctr(&["tasks", "ls", "-q"]) {
            for id in list.lines() {
                let _ = self.ctr(&["tasks", "kill", "--signal", "SIGKILL", id]);
                let _ = self.ctr(&["tasks", "delete", "--force", id]);
            }
        }
        if let Ok(list) = self.ctr(&["containers", "ls", "-q"]) {
            for id in list.lines() {
                let _ = self.ctr(&["containers", "delete", id]);
            }
        }
        if let Some(mut proc) = self.proc.take() {
            proc.terminate(STOP_GRACE);
        }
        // Deepest first, so that nested mounts come off before their parents.
        let mut mounts = mounts_under(self.dir.path());
        mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
        for mount in mounts {
            let _ = Command::new("umount").arg("-l").arg(&mount).output();
        }
        // The cgroup `/NS` `ctr run` nests each container under, in every hierarchy.
        let _ = crate::node::host::remove_cgroup(&self.namespace);
        let run = Path::new(HOST_RUN_DIR);
        let _ = std::fs::remove_dir_all(run.join("runc").join(&self.namespace));
        if self.created_host_run_dir {
            let _ = std::fs::remove_dir_all(run);
        }
    }
}

impl Drop for Containerd {
    fn drop(&mut self) {
        self.teardown();
    }
}

/// `ctr --address SOCKET --namespace NAMESPACE ARGS...`, its stdout.
fn ctr_in(ctr: &Path, socket: &Path, namespace: &str, args: &[&str]) -> Result<String> {
    let mut command = Command::new(ctr);
    command
        .arg("--address")
        .arg(socket)
        .arg("--namespace")
        .arg(namespace)
        .args(args);
    run_capture(command, None, &format!("ctr {}", args.join(" ")))
}

/// Mount points at or below `dir`, as `/proc/self/mountinfo` lists them.
fn mounts_under(dir: &Path) -> Vec<String> {
    let prefix = dir.to_string_lossy().into_owned();
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .filter(|point| point.starts_with(&prefix))
        .map(str::to_owned)
        .collect()
}

/// Cgroup directories named `namespace` left in any hierarchy (for a test's final check).
pub fn namespace_cgroups(namespace: &str) -> Vec<PathBuf> {
    crate::node::host::cgroups_left(namespace)
}
