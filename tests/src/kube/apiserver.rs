//! kube-apiserver as envtest starts it (controller-runtime's flags, DOMAIN §3): RBAC
//! authorization, client-certificate and static-token authentication, service-account keys,
//! on a reserved loopback port; optionally an audit log of chosen users.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant, SystemTime};

use super::client::ApiClient;
use crate::ports::PortLease;
use crate::process::{Proc, wait_until};
use crate::{HarnessError, Result, tools};

/// How long the API server may take to become ready (1.75 s on a quiet machine; the CI
/// machines are loaded).
pub const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// The running API server. Dropping it kills the process.
#[derive(Debug)]
pub struct ApiServer {
    proc: Option<Proc>,
    args: Vec<OsString>,
    port: PortLease,
    log: PathBuf,
    started: usize,
    last_ready_after: Duration,
    unready: Vec<(SystemTime, SystemTime)>,
}

impl ApiServer {
    /// Starts kube-apiserver with `args` (the port flags are added here) and waits until
    /// `/readyz` answers 200 to `probe`.
    pub fn start(
        dir: &Path,
        port: PortLease,
        args: Vec<OsString>,
        probe: &ApiClient,
    ) -> Result<Self> {
        let mut server = Self {
            proc: None,
            args,
            port,
            log: dir.join("kube-apiserver.log"),
            started: 0,
            last_ready_after: Duration::ZERO,
            unready: Vec::new(),
        };
        server.spawn(probe)?;
        Ok(server)
    }

    fn spawn(&mut self, probe: &ApiClient) -> Result<()> {
        let mut command = Command::new(tools::kube_bin("kube-apiserver")?);
        command
            .args(&self.args)
            .arg(format!("--secure-port={}", self.port.port()))
            .arg("--bind-address=127.0.0.1")
            .arg("--advertise-address=127.0.0.1");
        let started = Instant::now();
        let started_at = SystemTime::now();
        self.started += 1;
        let mut proc = Proc::spawn(
            format!("kube-apiserver#{}", self.started),
            command,
            &self.log,
        )?;
        let waited = wait_until("kube-apiserver /readyz", READY_TIMEOUT, || {
            proc.ensure_running()?;
            Ok(probe
                .call("GET", "/readyz", None, "")
                .is_ok_and(|a| a.status == 200))
        });
        if let Err(error) = waited {
            return Err(match error {
                HarnessError::Timeout { .. } => {
                    HarnessError::Other(format!("{error}; log tail:\n{}", proc.log_tail(30)))
                }
                other => other,
            });
        }
        self.last_ready_after = started.elapsed();
        self.unready.push((started_at, SystemTime::now()));
        self.proc = Some(proc);
        Ok(())
    }

    /// `https://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port.port())
    }

    /// How long the last start took until `/readyz` said ok.
    pub fn ready_after(&self) -> Duration {
        self.last_ready_after
    }

    /// From each start of the process until `/readyz` said ok. A starting API server already
    /// serves requests, and until its informers have synced RBAC refuses what it will allow a
    /// moment later (seen here: one 403 ~100 ms before "Caches are synced").
    pub fn unready_windows(&self) -> &[(SystemTime, SystemTime)] {
        &self.unready
    }

    /// The process id.
    pub fn pid(&self) -> Option<u32> {
        self.proc.as_ref().and_then(Proc::pid)
    }

    /// Kills the API server (its clients' connections and watches break).
    pub fn kill(&mut self) {
        if let Some(mut proc) = self.proc.take() {
            proc.kill();
        }
    }

    /// Stops the API server (SIGSTOP, every thread stopped): its clients' connections stay
    /// open and their requests wait, as behind a member that hangs (a frozen etcd member stalls
    /// kube-apiserver this way, docs/design-kubernetes.md).
    pub fn freeze(&self) -> Result<()> {
        self.proc
            .as_ref()
            .ok_or_else(|| HarnessError::Other("kube-apiserver is not running".into()))?
            .freeze()
    }

    /// Lets a frozen API server run again (SIGCONT).
    pub fn thaw(&self) -> Result<()> {
        self.proc
            .as_ref()
            .ok_or_else(|| HarnessError::Other("kube-apiserver is not running".into()))?
            .thaw()
    }

    /// Starts it again with the same flags and port (after [`ApiServer::kill`]).
    pub fn restart(&mut self, probe: &ApiClient) -> Result<()> {
        self.kill();
        self.spawn(probe)
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }
}
