//! The API server's own etcd: one etcd 3.6 process (the release Kubernetes 1.34+ ships with),
//! plain HTTP or TLS with client certificates, on reserved loopback ports. Separate from
//! [`crate::etcd`], which runs the etcd that metalguard guards.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use super::pki::{CertFiles, Pki};
use crate::ports::{PortLease, reserve_port};
use crate::process::{Proc, run_capture, wait_until};
use crate::{HarnessError, Result, http, tools};

/// How long etcd may take to answer its first health check.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// `etcdctl --command-timeout`.
const ETCDCTL_TIMEOUT: &str = "10s";

/// TLS material of a TLS etcd: its serving pair (also the client pair the API server and
/// `etcdctl` present) and the CA.
#[derive(Debug, Clone)]
pub struct StoreTls {
    /// Serving and client certificate.
    pub pair: CertFiles,
    /// The CA file.
    pub ca: PathBuf,
}

/// A running etcd for the API server. Dropping it kills the process.
#[derive(Debug)]
pub struct Store {
    proc: Proc,
    client: PortLease,
    _peer: PortLease,
    tls: Option<StoreTls>,
}

impl Store {
    /// Starts etcd in `dir` (TLS with certificates from `pki` when `tls`) and waits until
    /// it is healthy.
    pub fn start(dir: &Path, pki: &Pki, tls: bool) -> Result<Self> {
        let bin = tools::etcd36_bin()?;
        let client = reserve_port()?;
        let peer = reserve_port()?;
        let tls = if tls {
            Some(StoreTls {
                pair: pki.serving("etcd")?,
                ca: pki.ca_file().to_path_buf(),
            })
        } else {
            None
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        let client_url = format!("{scheme}://127.0.0.1:{}", client.port());
        let peer_url = format!("http://127.0.0.1:{}", peer.port());
        let mut command = Command::new(bin);
        command
            .arg("--name=kube-store")
            .arg(format!("--data-dir={}", dir.join("etcd-data").display()))
            .arg(format!("--listen-client-urls={client_url}"))
            .arg(format!("--advertise-client-urls={client_url}"))
            .arg(format!("--listen-peer-urls={peer_url}"))
            .arg(format!("--initial-advertise-peer-urls={peer_url}"))
            .arg(format!("--initial-cluster=kube-store={peer_url}"))
            .arg("--initial-cluster-state=new")
            // Test data: losing it in a crash loses nothing (envtest does the same).
            .arg("--unsafe-no-fsync=true")
            .arg("--logger=zap")
            .arg("--log-level=warn");
        if let Some(t) = &tls {
            command
                .arg(format!("--cert-file={}", t.pair.cert.display()))
                .arg(format!("--key-file={}", t.pair.key.display()))
                .arg(format!("--trusted-ca-file={}", t.ca.display()))
                .arg("--client-cert-auth=true");
        }
        let proc = Proc::spawn("kube-etcd", command, &dir.join("etcd.log"))?;
        let mut store = Self {
            proc,
            client,
            _peer: peer,
            tls,
        };
        store.wait_healthy()?;
        Ok(store)
    }

    fn wait_healthy(&mut self) -> Result<()> {
        let addr = self.client.addr();
        let plain = self.tls.is_none();
        let url = self.url();
        let proc = &mut self.proc;
        let tls = &self.tls;
        wait_until(
            "etcd 3.6 of the API server to be healthy",
            START_TIMEOUT,
            || {
                proc.ensure_running()?;
                if plain {
                    Ok(http::get(addr, "/health", Duration::from_millis(500))
                        .is_some_and(|(status, body)| status == 200 && body.contains("true")))
                } else {
                    Ok(etcdctl(&url, tls.as_ref(), &["endpoint", "health"]).is_ok())
                }
            },
        )
    }

    /// The client URL (`--etcd-servers` of the API server).
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://127.0.0.1:{}", self.client.port())
    }

    /// The TLS material, when etcd serves TLS.
    pub fn tls(&self) -> Option<&StoreTls> {
        self.tls.as_ref()
    }

    /// Runs `etcdctl` against this etcd; returns stdout.
    pub fn etcdctl(&self, args: &[&str]) -> Result<String> {
        etcdctl(&self.url(), self.tls.as_ref(), args)
    }

    /// The current revision of the store (the API server's newest resourceVersion).
    pub fn revision(&self) -> Result<u64> {
        let out = self.etcdctl(&["endpoint", "status", "-w", "json"])?;
        let status: Value = serde_json::from_str(&out)
            .map_err(|e| HarnessError::Other(format!("etcdctl endpoint status output: {e}")))?;
        status[0]["Status"]["header"]["revision"]
            .as_u64()
            .ok_or_else(|| HarnessError::Other(format!("no revision in {out}")))
    }

    /// Compacts the history up to the current revision (physically): every resourceVersion
    /// older than now is gone, so a watch from one gets 410 Gone. Returns the revision.
    pub fn compact(&self) -> Result<u64> {
        let revision = self.revision()?;
        self.etcdctl(&["compaction", "--physical", &revision.to_string()])?;
        Ok(revision)
    }

    /// The process, for fault injection.
    pub fn process(&mut self) -> &mut Proc {
        &mut self.proc
    }
}

fn etcdctl(url: &str, tls: Option<&StoreTls>, args: &[&str]) -> Result<String> {
    let mut command = Command::new(tools::etcdctl36_bin()?);
    command
        .arg(format!("--endpoints={url}"))
        .arg(format!("--command-timeout={ETCDCTL_TIMEOUT}"));
    if let Some(t) = tls {
        command
            .arg(format!("--cacert={}", t.ca.display()))
            .arg(format!("--cert={}", t.pair.cert.display()))
            .arg(format!("--key={}", t.pair.key.display()));
    }
    command.args(args);
    run_capture(command, None, &format!("etcdctl {}", args.join(" ")))
}
