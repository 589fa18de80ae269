//! A real Kubernetes control plane for tests, in the style of controller-runtime's envtest:
//! etcd 3.6 ([`store`]) and kube-apiserver ([`apiserver`]) of the release pinned in
//! `tests/kube/k8s/go.mod` (built by `scripts/kube-build.sh`), optionally
//! kube-controller-manager with short grace periods, and fake kubelets ([`kubelet`]).
//!
//! Data flow: [`KubeCluster::start`] makes a CA and keys ([`pki`]), starts etcd (plain or TLS;
//! or uses an etcd the caller runs, [`KubeOptions::external_etcd`], as the lab does) and the
//! API server (RBAC, client certificates, static tokens, service-account keys, an
//! audit log of the users the test names), waits for `/readyz` and the system namespaces,
//! then writes an admin kubeconfig. Tests talk to the server as any identity through
//! [`client::ApiClient`] or `kubectl` with the kubeconfigs made here:
//! - the admin, in `system:masters` ([`KubeCluster::admin`]);
//! - any user in any groups, by a client certificate `CN=user, O=group…`
//!   ([`KubeCluster::user_kubeconfig`], [`KubeCluster::client_as`]);
//! - a ServiceAccount ([`KubeCluster::service_account_kubeconfig`]), by a static token whose user is
//!   `system:serviceaccount:NS:NAME` in the groups `system:serviceaccounts` and
//!   `system:serviceaccounts:NS`, which is how RBAC matches a ServiceAccount subject.
//!
//! Every process is killed when the cluster drops; paths carry `mg-harness-kube-` so a
//! leftover is visible to `scripts/test.sh`.

pub mod apiserver;
pub mod audit;
pub mod client;
pub mod kubelet;
pub mod pki;
pub mod store;
pub mod time;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::json;

use self::apiserver::ApiServer;
use self::client::{ApiClient, Credentials};
use self::kubelet::{FakeKubelet, NodeTemplate};
use self::pki::Pki;
use self::store::Store;
use crate::ports::reserve_port;
use crate::process::{Proc, run_capture, wait_until};
use crate::tls::write_file;
use crate::{HarnessError, Result, tools};

/// The admin's user name (in `system:masters`).
pub const ADMIN: &str = "metalguard-test-admin";
/// How long kube-controller-manager may take to start its controllers.
const CONTROLLER_MANAGER_TIMEOUT: Duration = Duration::from_secs(90);

/// What to start.
#[derive(Debug, Clone, Default)]
pub struct KubeOptions {
    /// etcd serves TLS with client certificates (else plain HTTP on loopback).
    pub etcd_tls: bool,
    /// Start kube-controller-manager (node lifecycle, taint eviction, pod GC, garbage
    /// collector, namespace and service-account controllers) with short grace periods.
    pub controller_manager: bool,
    /// ServiceAccount identities `(namespace, name)` that get a static token.
    pub service_accounts: Vec<(String, String)>,
    /// Users whose requests the audit log records (none: no audit log).
    pub audited_users: Vec<String>,
    /// More kube-apiserver flags.
    pub apiserver_args: Vec<String>,
    /// The API server's store is this etcd instead of one started here (kubeadm's external
    /// etcd, or its stacked members: the cluster's own etcd is the API server's too).
    pub external_etcd: Option<ExternalEtcd>,
    /// Real kubelets run Pods on this cluster ([`crate::node::NodeBed`]): the Node authorizer
    /// before RBAC, the ServiceAccount admission plugin (projected tokens), a client
    /// certificate for the API server's calls to kubelets, a serving certificate valid for
    /// the `kubernetes` Service (10.0.0.1 and its names) and for [`WORKLOAD_API_ADDRESS`], and
    /// kube-controller-manager's workload controllers (Deployments, ReplicaSets,
    /// EndpointSlices, disruption budgets, the root CA ConfigMap).
    pub workloads: bool,
    /// kube-controller-manager's `--node-monitor-grace-period` (default
    /// [`NODE_MONITOR_GRACE_PERIOD`]): how long a Node's kubelet may be silent before the
    /// node-lifecycle controller marks it `Ready=Unknown`.
    pub node_monitor_grace_period: Option<Duration>,
}

/// The address in-cluster clients reach the API server at with [`KubeOptions::workloads`]
/// (the first node's bridge gateway, forwarded to the loopback API server).
pub const WORKLOAD_API_ADDRESS: std::net::Ipv4Addr = std::net::Ipv4Addr::new(10, 244, 0, 1);

/// The default `--node-monitor-grace-period` of the harness's kube-controller-manager (40 s
/// in a real cluster).
pub const NODE_MONITOR_GRACE_PERIOD: Duration = Duration::from_secs(10);

/// An etcd the API server uses as its store without the harness starting it.
#[derive(Debug, Clone)]
pub struct ExternalEtcd {
    /// Client URLs (`--etcd-servers`), one per member.
    pub servers: Vec<String>,
    /// `--etcd-cafile`, and the client certificate the API server presents (kubeadm's
    /// `apiserver-etcd-client`, signed by the etcd CA); `None` for plain-HTTP members.
    pub tls: Option<ExternalEtcdTls>,
}

/// TLS files of an [`ExternalEtcd`].
#[derive(Debug, Clone)]
pub struct ExternalEtcdTls {
    /// The CA that signed the members' serving certificates.
    pub ca: PathBuf,
    /// The API server's client certificate.
    pub cert: PathBuf,
    /// Its key.
    pub key: PathBuf,
}

/// The user name RBAC gives ServiceAccount `namespace/name`.
pub fn service_account_user(namespace: &str, name: &str) -> String {
    format!("system:serviceaccount:{namespace}:{name}")
}

/// A running control plane. Dropping it kills kube-controller-manager, kube-apiserver and
/// etcd, in that order, then removes its directory.
#[derive(Debug)]
pub struct KubeCluster {
    // Field order is drop order: processes first, the directory last.
    controller_manager: Option<Proc>,
    apiserver: ApiServer,
    // `None` with an external etcd.
    store: Option<Store>,
    pki: Pki,
    admin: ApiClient,
    admin_kubeconfig: PathBuf,
    tokens: BTreeMap<(String, String), String>,
    audit_log: Option<PathBuf>,
    started_in: Duration,
    dir: tempfile::TempDir,
}

impl KubeCluster {
    /// Starts etcd, kube-apiserver and, if asked, kube-controller-manager; returns once the
    /// API server is ready and its system namespaces exist.
    pub fn start(options: &KubeOptions) -> Result<Self> {
        let started = Instant::now();
        let dir = tools::temp_dir("kube")?;
        let root = dir.path().to_path_buf();
        let pki = Pki::create(&root.join("pki"))?;
        let serving = if options.workloads {
            pki.serving_with(
                "kube-apiserver",
                &[
                    "kubernetes",
                    "kubernetes.default",
                    "kubernetes.default.svc",
                    "kubernetes.default.svc.cluster.local",
                ],
                &[std::net::Ipv4Addr::new(10, 0, 0, 1), WORKLOAD_API_ADDRESS],
            )?
        } else {
            pki.serving("kube-apiserver")?
        };
        let (sa_key, sa_pub) = pki.service_account_keys()?;
        let admin_cert = pki.client(ADMIN, &["system:masters"])?;

        let mut tokens = BTreeMap::new();
        let mut token_lines = String::new();
        for (ns, name) in &options.service_accounts {
            let token = tools::random_token(32);
            let user = service_account_user(ns, name);
            let _ = writeln!(
                token_lines,
                "{token},{user},{},\"system:serviceaccounts,system:serviceaccounts:{ns}\"",
                tools::random_uuid()
            );
            tokens.insert((ns.clone(), name.clone()), token);
        }
        let token_file = root.join("tokens.csv");
        write_file(&token_file, token_lines.as_bytes(), 0o600)?;

        let (store, etcd_servers) = if let Some(external) = &options.external_etcd {
            (None, external.servers.join(","))
        } else {
            let store = Store::start(&root, &pki, options.etcd_tls)?;
            let url = store.url();
            (Some(store), url)
        };
        let port = reserve_port()?;
        let url = format!("https://127.0.0.1:{}", port.port());
        let admin = ApiClient::new(
            &url,
            pki.ca_file(),
            &Credentials::Certificate {
                cert: admin_cert.cert.clone(),
                key: admin_cert.key.clone(),
            },
        )?;
        let flag = |name: &str, p: &Path| {
            let mut s = OsString::from(format!("--{name}="));
            s.push(p.as_os_str());
            s
        };
        let mut args: Vec<OsString> = vec![
            format!("--etcd-servers={etcd_servers}").into(),
            flag("cert-dir", &root.join("apiserver-certs")),
            flag("tls-cert-file", &serving.cert),
            flag("tls-private-key-file", &serving.key),
            flag("client-ca-file", pki.ca_file()),
            flag("token-auth-file", &token_file),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            flag("service-account-key-file", &sa_pub),
            flag("service-account-signing-key-file", &sa_key),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--allow-privileged=true".into(),
            "--endpoint-reconciler-type=none".into(),
            // Pods leave a NotReady/unreachable Node within seconds (DefaultTolerationSeconds).
            "--default-not-ready-toleration-seconds=2".into(),
            "--default-unreachable-toleration-seconds=2".into(),
            "--profiling=false".into(),
        ];
        if options.workloads {
            let kubelet_client =
                pki.client("kube-apiserver-kubelet-client", &["system:masters"])?;
            args.push("--authorization-mode=Node,RBAC".into());
            args.push(flag("kubelet-client-certificate", &kubelet_client.cert));
            args.push(flag("kubelet-client-key", &kubelet_client.key));
        } else {
            args.push("--authorization-mode=RBAC".into());
            // No token controller runs unless kube-controller-manager does.
            args.push("--disable-admission-plugins=ServiceAccount".into());
        }
        if let Some(t) = store.as_ref().and_then(Store::tls) {
            args.push(flag("etcd-cafile", &t.ca));
            args.push(flag("etcd-certfile", &t.pair.cert));
            args.push(flag("etcd-keyfile", &t.pair.key));
        }
        if let Some(t) = options.external_etcd.as_ref().and_then(|e| e.tls.as_ref()) {
            args.push(flag("etcd-cafile", &t.ca));
            args.push(flag("etcd-certfile", &t.cert));
            args.push(flag("etcd-keyfile", &t.key));
        }
        let audit_log = if options.audited_users.is_empty() {
            None
        } else {
            let policy = root.join("audit-policy.json");
            audit::write_policy(&policy, &options.audited_users)?;
            let log = root.join("audit.log");
            args.push(flag("audit-policy-file", &policy));
            args.push(flag("audit-log-path", &log));
            args.push("--audit-log-format=json".into());
            args.push("--audit-log-mode=blocking".into());
            Some(log)
        };
        args.extend(options.apiserver_args.iter().map(OsString::from));
        let apiserver = ApiServer::start(&root, port, args, &admin)?;

        let admin_kubeconfig = root.join("admin.kubeconfig");
        write_kubeconfig(
            &admin_kubeconfig,
            &url,
            pki.ca_file(),
            ADMIN,
            &Credentials::Certificate {
                cert: admin_cert.cert,
                key: admin_cert.key,
            },
        )?;
        let mut cluster = Self {
            controller_manager: None,
            apiserver,
            store,
            pki,
            admin,
            admin_kubeconfig,
            tokens,
            audit_log,
            started_in: Duration::ZERO,
            dir,
        };
        cluster.wait_for_system_namespaces()?;
        if options.controller_manager {
            let grace = options
                .node_monitor_grace_period
                .unwrap_or(NODE_MONITOR_GRACE_PERIOD);
            cluster.start_controller_manager(&sa_key, grace, options.workloads)?;
        }
        cluster.started_in = started.elapsed();
        Ok(cluster)
    }

    fn wait_for_system_namespaces(&self) -> Result<()> {
        wait_until(
            "the API server's system namespaces",
            apiserver::READY_TIMEOUT,
            || {
                for ns in ["default", "kube-system", "kube-node-lease"] {
                    if self
                        .admin
                        .get_opt(&format!("/api/v1/namespaces/{ns}"))?
                        .is_none()
                    {
                        return Ok(false);
                    }
                }
                Ok(true)
            },
        )
    }

    fn start_controller_manager(
        &mut self,
        sa_key: &Path,
        grace: Duration,
        workloads: bool,
    ) -> Result<()> {
        let root = self.dir.path();
        // The controllers act as one identity in system:masters (no per-controller
        // service-account credentials: envtest's shortcut; what is tested is their effect).
        let cert = self
            .pki
            .client("system:kube-controller-manager", &["system:masters"])?;
        let kubeconfig = root.join("controller-manager.kubeconfig");
        write_kubeconfig(
            &kubeconfig,
            &self.apiserver.url(),
            self.pki.ca_file(),
            "system:kube-controller-manager",
            &Credentials::Certificate {
                cert: cert.cert,
                key: cert.key,
            },
        )?;
        let mut controllers = String::from(
            "node-lifecycle-controller,taint-eviction-controller,\
             pod-garbage-collector-controller,garbage-collector-controller,\
             namespace-controller,serviceaccount-controller,serviceaccount-token-controller",
        );
        if workloads {
            controllers.push_str(
                ",deployment-controller,replicaset-controller,endpointslice-controller,\
                 disruption-controller,root-ca-certificate-publisher-controller",
            );
        }
        let mut command = Command::new(tools::kube_bin("kube-controller-manager")?);
        command
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .arg(format!("--controllers={controllers}"))
            .arg(format!(
                "--service-account-private-key-file={}",
                sa_key.display()
            ))
            .arg(format!("--root-ca-file={}", self.pki.ca_file().display()))
            .arg("--node-monitor-period=1s")
            .arg(format!(
                "--node-monitor-grace-period={}ms",
                grace.as_millis()
            ))
            .arg("--leader-elect=false")
            .arg("--secure-port=0");
        let mut proc = Proc::spawn(
            "kube-controller-manager",
            command,
            &root.join("kube-controller-manager.log"),
        )?;
        // The service-account controller creates `default` in every namespace: its
        // controllers are running.
        let admin = &self.admin;
        let waited = wait_until(
            "kube-controller-manager to start its controllers",
            CONTROLLER_MANAGER_TIMEOUT,
            || {
                proc.ensure_running()?;
                Ok(admin
                    .get_opt("/api/v1/namespaces/default/serviceaccounts/default")?
                    .is_some())
            },
        );
        if let Err(e) = waited {
            return Err(HarnessError::Other(format!(
                "{e}; log tail:\n{}",
                proc.log_tail(30)
            )));
        }
        self.controller_manager = Some(proc);
        Ok(())
    }

    /// The API server's URL.
    pub fn url(&self) -> String {
        self.apiserver.url()
    }

    /// The cluster CA (PEM file).
    pub fn ca_file(&self) -> &Path {
        self.pki.ca_file()
    }

    /// The cluster directory (logs, kubeconfigs, certificates).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// How long [`KubeCluster::start`] took.
    pub fn started_in(&self) -> Duration {
        self.started_in
    }

    /// The API server process (start time, pid, restart).
    pub fn apiserver(&self) -> &ApiServer {
        &self.apiserver
    }

    /// The API server's etcd, when the harness started it (not with
    /// [`KubeOptions::external_etcd`]).
    pub fn store(&self) -> Result<&Store> {
        self.store.as_ref().ok_or_else(|| {
            HarnessError::Other("the API server uses an external etcd, not the harness's".into())
        })
    }

    /// A client in `system:masters`.
    pub fn admin(&self) -> &ApiClient {
        &self.admin
    }

    /// The admin kubeconfig.
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// A client certificate for `user` in `groups` (made on demand).
    fn user_certificate(&self, user: &str, groups: &[&str]) -> Result<Credentials> {
        let cert = self.pki.client(user, groups)?;
        Ok(Credentials::Certificate {
            cert: cert.cert,
            key: cert.key,
        })
    }

    /// A client authenticated as `user` in `groups` (client certificate).
    pub fn client_as(&self, user: &str, groups: &[&str]) -> Result<ApiClient> {
        ApiClient::new(
            &self.url(),
            self.ca_file(),
            &self.user_certificate(user, groups)?,
        )
    }

    /// [`KubeCluster::client_as`] whose requests give up after `timeout`.
    pub fn client_as_within(
        &self,
        user: &str,
        groups: &[&str],
        timeout: Duration,
    ) -> Result<ApiClient> {
        ApiClient::with_timeout(
            &self.url(),
            self.ca_file(),
            &self.user_certificate(user, groups)?,
            timeout,
        )
    }

    /// A kubeconfig for `user` in `groups` (client certificate).
    pub fn user_kubeconfig(&self, user: &str, groups: &[&str]) -> Result<PathBuf> {
        let credentials = self.user_certificate(user, groups)?;
        let path = self
            .dir
            .path()
            .join(format!("user-{}.kubeconfig", tools::random_token(8)));
        write_kubeconfig(&path, &self.url(), self.ca_file(), user, &credentials)?;
        Ok(path)
    }

    /// The static token of ServiceAccount `namespace/name` (declared in
    /// [`KubeOptions::service_accounts`]).
    pub fn service_account_token(&self, namespace: &str, name: &str) -> Result<&str> {
        self.tokens
            .get(&(namespace.to_owned(), name.to_owned()))
            .map(String::as_str)
            .ok_or_else(|| {
                HarnessError::Other(format!(
                    "ServiceAccount {namespace}/{name} was not declared in KubeOptions::service_accounts"
                ))
            })
    }

    /// A client authenticated as ServiceAccount `namespace/name`.
    pub fn service_account_client(&self, namespace: &str, name: &str) -> Result<ApiClient> {
        let token = self.service_account_token(namespace, name)?.to_owned();
        ApiClient::new(&self.url(), self.ca_file(), &Credentials::Token(token))
    }

    /// A kubeconfig authenticated as ServiceAccount `namespace/name`.
    pub fn service_account_kubeconfig(&self, namespace: &str, name: &str) -> Result<PathBuf> {
        let token = self.service_account_token(namespace, name)?.to_owned();
        let path = self
            .dir
            .path()
            .join(format!("sa-{namespace}-{name}.kubeconfig"));
        write_kubeconfig(
            &path,
            &self.url(),
            self.ca_file(),
            &service_account_user(namespace, name),
            &Credentials::Token(token),
        )?;
        Ok(path)
    }

    /// Runs the pinned `kubectl` with `kubeconfig` and `args`; returns stdout, fails with
    /// stderr.
    pub fn kubectl(
        &self,
        kubeconfig: &Path,
        args: &[&str],
        stdin: Option<&[u8]>,
    ) -> Result<String> {
        let mut command = Command::new(tools::kube_bin("kubectl")?);
        command
            .arg(format!("--kubeconfig={}", kubeconfig.display()))
            .args(args)
            .current_dir(tools::repo_root());
        run_capture(command, stdin, &format!("kubectl {}", args.join(" ")))
    }

    /// Runs `kubectl` as the admin and returns whether it succeeded and its stdout (for
    /// commands whose exit status is the answer, like `auth can-i`).
    pub fn kubectl_answer(&self, args: &[&str]) -> Result<(bool, String)> {
        let output = Command::new(tools::kube_bin("kubectl")?)
            .arg(format!("--kubeconfig={}", self.admin_kubeconfig.display()))
            .args(args)
            .current_dir(tools::repo_root())
            .output()
            .map_err(HarnessError::io(format!(
                "running kubectl {}",
                args.join(" ")
            )))?;
        Ok((
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).trim().to_owned(),
        ))
    }

    /// `kubectl` as the admin.
    pub fn kubectl_admin(&self, args: &[&str]) -> Result<String> {
        self.kubectl(&self.admin_kubeconfig, args, None)
    }

    /// Starts a fake kubelet registering `node`.
    pub fn kubelet(&self, node: &NodeTemplate) -> Result<FakeKubelet> {
        FakeKubelet::start(&self.admin, node)
    }

    /// Kills the API server and starts it again on the same port (its clients' watches
    /// break; it rebuilds its watch cache from etcd).
    pub fn restart_apiserver(&mut self) -> Result<()> {
        let admin = self.admin.clone();
        self.apiserver.restart(&admin)
    }

    /// Kills the API server (see [`KubeCluster::start_apiserver_again`]).
    pub fn stop_apiserver(&mut self) {
        self.apiserver.kill();
    }

    /// Starts the killed API server again.
    pub fn start_apiserver_again(&mut self) -> Result<()> {
        self.restart_apiserver()
    }

    /// Every audited request so far (users of [`KubeOptions::audited_users`]).
    pub fn audit(&self) -> Result<Vec<audit::AuditEvent>> {
        match &self.audit_log {
            Some(path) => audit::read(path),
            None => Err(HarnessError::Other(
                "no audit log: KubeOptions::audited_users is empty".into(),
            )),
        }
    }

    /// Whether kube-controller-manager is still running (with its log tail when not).
    pub fn controller_manager_running(&mut self) -> Result<()> {
        match &mut self.controller_manager {
            Some(proc) => proc.ensure_running(),
            None => Err(HarnessError::Other(
                "kube-controller-manager was not started".into(),
            )),
        }
    }

    /// Resident memory of the API server process, in KiB (from `/proc`).
    pub fn apiserver_rss_kib(&self) -> Option<u64> {
        let pid = self.apiserver.pid()?;
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
    }
}

/// Writes a kubeconfig (JSON, which every YAML reader takes) for one cluster and user.
pub fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    user: &str,
    credentials: &Credentials,
) -> Result<()> {
    let user_entry = match credentials {
        Credentials::Certificate { cert, key } => json!({
            "client-certificate": cert, "client-key": key,
        }),
        Credentials::Token(token) => json!({ "token": token }),
    };
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": ca}}],
        "users": [{"name": user, "user": user_entry}],
        "contexts": [{"name": "test", "context": {"cluster": "test", "user": user}}],
        "current-context": "test",
    });
    write_file(path, config.to_string().as_bytes(), 0o600)
}
