//! The standalone inventory: one TOML file describing the controller, its etcd store, the
//! hosts with their BMCs, and the decision policy.
//!
//! Unknown keys are rejected everywhere; [`Inventory::load`] parses and then validates, and
//! every error names the file and the offending key or host. BMC passwords are never in the
//! inventory: each host names a credentials directory (`username` and `password` files, mode
//! 0600 or stricter) that is read only when a command is built.

use std::collections::BTreeSet;
use std::fs;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use metalguard_api::duration::go_duration;
use metalguard_api::policy::Policy;
use metalguard_api::protocol::{BmcCredentials, BmcTrust, Secret};
use metalguard_api::snapshot::{ControlPlaneSpec, Role};
use serde::Deserialize;

mod api_limits;
mod etcd_rules;
pub(crate) mod files;
pub use etcd_rules::validate as validate_etcd;
pub(crate) mod checks;

pub use api_limits::ApiLimits;

/// Default etcd key prefix.
pub const DEFAULT_PREFIX: &str = "/metalguard";
/// Default leader lease: a dead leader is replaced within this long.
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(5);
/// Default timeout of one etcd request.
pub const DEFAULT_ETCD_TIMEOUT: Duration = Duration::from_secs(2);
/// Default re-plan period when nothing is reported.
pub const DEFAULT_PLAN_INTERVAL: Duration = Duration::from_secs(1);

/// Why an inventory could not be used.
#[derive(Debug, thiserror::Error)]
pub enum InventoryError {
    /// The file could not be read.
    #[error("inventory {path} could not be read")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The TOML did not parse or named an unknown key (the message names the key and line).
    #[error("inventory {path} is invalid: {message}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// toml's description, which names the key and position.
        message: String,
    },
    /// A semantic rule failed.
    #[error("inventory {path}: {problem}")]
    Invalid {
        /// The file.
        path: PathBuf,
        /// What is wrong, naming the key or host.
        problem: String,
    },
    /// The Kubernetes backend could not read a host's credentials Secret.
    #[error("bmc credentials of host {host}: {problem}")]
    Secret {
        /// The host.
        host: String,
        /// What is wrong (names the Secret and key, never a value).
        problem: String,
    },
    /// A file that carries authority may be written by others, or is owned by a stranger.
    #[error("{what} is refused")]
    Unsafe {
        /// The file's role (`inventory /etc/metalguard/inventory.toml`, `bmc credentials of
        /// host cp-1`).
        what: String,
        /// What is wrong with it.
        #[source]
        source: metalguard_fs::FileError,
    },
    /// A credentials file is missing or unreadable.
    #[error("bmc credentials file {path} of host {host} {problem}")]
    Credentials {
        /// The host.
        host: String,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        problem: String,
    },
}

/// The whole inventory file.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Inventory {
    /// This controller's settings.
    #[serde(default)]
    pub controller: ControllerSettings,
    /// The etcd store (leader election and persisted intent).
    pub etcd: EtcdSettings,
    /// Desired replicas and failure domains.
    pub control_plane: ControlPlaneSpec,
    /// Every host.
    #[serde(default)]
    pub hosts: Vec<InventoryHost>,
    /// Health checks and remediation settings.
    #[serde(default)]
    pub policy: Policy,
    /// Where each host is in `hosts` ([`Inventory::host`]).
    #[serde(skip)]
    pub index: HostIndex,
}

/// Host name → its first position in [`Inventory::hosts`], built at the first lookup. Each hit
/// is checked against the host it points to, and a miss is looked for in the list, so a list
/// changed after the index was built is still searched right (only slower).
#[derive(Debug, Clone, Default)]
pub struct HostIndex(std::sync::OnceLock<std::collections::HashMap<String, usize>>);

/// Settings of the controller process.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerSettings {
    /// Address of the agent API (mTLS); default 127.0.0.1:8443.
    #[serde(default = "default_listen")]
    pub listen: SocketAddr,
    /// Address of the Prometheus `/metrics` endpoint (plain HTTP); unset disables it.
    #[serde(default)]
    pub metrics_listen: Option<SocketAddr>,
    /// Directory written by `certs init` / `certs issue --server`.
    pub tls_dir: Option<PathBuf>,
    /// Name of the server certificate in `tls_dir` (`NAME.pem`, `NAME-key.pem`).
    #[serde(default = "default_server_name")]
    pub server_cert_name: String,
    /// Re-plan at least this often.
    #[serde(default = "default_plan_interval", with = "go_duration")]
    pub plan_interval: Duration,
    /// The controllers' record key file (`crate::pki::seal`, mode 0600); default `hmac.key` in
    /// `tls_dir`. Every controller of a cluster has the same file.
    #[serde(default)]
    pub hmac_key: Option<PathBuf>,
    /// A deny list of agent certificates (`crate::pki::revocation`), re-read when it changes.
    #[serde(default)]
    pub revoked_certificates: Option<PathBuf>,
    /// What one agent may hold or send (`[controller.limits]`).
    #[serde(default)]
    pub limits: ApiLimits,
}

impl Default for ControllerSettings {
    fn default() -> Self {
        Self {
            listen: default_listen(),
            metrics_listen: None,
            tls_dir: None,
            server_cert_name: default_server_name(),
            plan_interval: DEFAULT_PLAN_INTERVAL,
            hmac_key: None,
            revoked_certificates: None,
            limits: ApiLimits::default(),
        }
    }
}

impl ControllerSettings {
    /// The record key file: `hmac_key`, else `hmac.key` in `tls_dir`; `None` when neither is
    /// set.
    pub fn hmac_key_path(&self) -> Option<PathBuf> {
        self.hmac_key.clone().or_else(|| {
            self.tls_dir
                .as_ref()
                .map(|dir| dir.join(crate::pki::seal::KEY_FILE))
        })
    }
}

fn default_listen() -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 8443))
}
fn default_server_name() -> String {
    "controller".to_owned()
}
fn default_plan_interval() -> Duration {
    DEFAULT_PLAN_INTERVAL
}
fn default_prefix() -> String {
    DEFAULT_PREFIX.to_owned()
}
fn default_lease_ttl() -> Duration {
    DEFAULT_LEASE_TTL
}
fn default_etcd_timeout() -> Duration {
    DEFAULT_ETCD_TIMEOUT
}

/// Where state and leadership live, and how the controller authenticates to etcd
/// (`crate::standalone::access` reads the files; never their content in messages).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdSettings {
    /// Client URLs of the guarded etcd cluster, all `https://` or all `http://`.
    pub endpoints: Vec<String>,
    /// CA bundle that signed the members' server certificates (kubeadm:
    /// `/etc/kubernetes/pki/etcd/ca.crt`); required with `https://` endpoints.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// Client certificate for etcd's `--client-cert-auth` (kubeadm:
    /// `/etc/kubernetes/pki/etcd/healthcheck-client.crt`, or one of metalguard's own).
    #[serde(default)]
    pub cert_file: Option<PathBuf>,
    /// Its private key; refused when group or others may read it.
    #[serde(default)]
    pub key_file: Option<PathBuf>,
    /// etcd user for RBAC with a password; unset, etcd takes the client certificate's common
    /// name as the user once its authentication is enabled.
    #[serde(default)]
    pub username: Option<String>,
    /// File holding `username`'s password; refused when group or others may read it.
    #[serde(default)]
    pub password_file: Option<PathBuf>,
    /// Every key metalguard writes starts with this prefix.
    #[serde(default = "default_prefix")]
    pub prefix: String,
    /// Leader lease time to live.
    #[serde(default = "default_lease_ttl", with = "go_duration")]
    pub lease_ttl: Duration,
    /// Timeout of one etcd request (and of connecting).
    #[serde(default = "default_etcd_timeout", with = "go_duration")]
    pub timeout: Duration,
}

/// One host of the inventory.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct InventoryHost {
    /// Unique host name; also the common name of its agent's certificate.
    pub name: String,
    /// Control plane or worker.
    pub role: Role,
    /// Failure domain, one of `control_plane.failure_domains`.
    #[serde(default)]
    pub failure_domain: Option<String>,
    /// Labels health-check selectors match on.
    #[serde(default)]
    pub labels: std::collections::BTreeMap<String, String>,
    /// Annotations, as a Machine's: Cluster API's `cluster.x-k8s.io/delete-machine` (any
    /// value) makes the host the first a scale-down removes (seed 004).
    #[serde(default)]
    pub annotations: std::collections::BTreeMap<String, String>,
    /// The host's BMC, if it has one.
    #[serde(default)]
    pub bmc: Option<BmcSettings>,
}

/// A host's BMC.
#[derive(Debug, Clone, PartialEq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BmcSettings {
    /// Address as `metalguard-bmc` parses it (`redfish+https://…`, `ipmi://…`).
    pub address: String,
    /// Directory holding `username` and `password` files (0600).
    pub credentials_dir: PathBuf,
    /// How the agent trusts the BMC's certificate.
    #[serde(default)]
    pub tls: TrustSetting,
    /// The Kubernetes backend's source: credentials read from the host's Secret and the CA
    /// bundle from its `GuardedHost` (never from a file). Not part of the inventory file.
    #[serde(skip)]
    pub from_cluster: Option<ClusterBmc>,
}

/// A BMC's credentials and CA bundle as the Kubernetes backend read them; a Secret that is
/// missing or incomplete is kept as the reason, reported when a command needs it.
#[derive(Debug, Clone, PartialEq)]
pub struct ClusterBmc {
    /// The credentials, or why they could not be read.
    pub credentials: Result<BmcCredentials, String>,
    /// The CA bundle (PEM) of the `GuardedHost`, if any.
    pub ca_pem: Option<String>,
}

/// TLS trust of a BMC as written in the inventory.
#[derive(Debug, Clone, Default, PartialEq, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct TrustSetting {
    /// A CA bundle file; its PEM text is sent to the agent.
    #[serde(default)]
    pub ca_file: Option<PathBuf>,
    /// A SHA-256 certificate fingerprint.
    #[serde(default)]
    pub fingerprint_sha256: Option<String>,
    /// Accept any certificate (counted as insecure).
    #[serde(default)]
    pub insecure: bool,
}

impl Inventory {
    /// Reads, parses and validates an inventory file.
    pub fn load(path: &Path) -> Result<Self, InventoryError> {
        if path.exists() {
            files::check_inventory(path)?;
        }
        let text = fs::read_to_string(path).map_err(|source| InventoryError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Parses and validates inventory text (`path` is used in messages only).
    pub fn parse(path: &Path, text: &str) -> Result<Self, InventoryError> {
        let inventory: Inventory = toml::from_str(text).map_err(|e| InventoryError::Parse {
            path: path.to_owned(),
            message: e.to_string().trim().replace('\n', " "),
        })?;
        inventory
            .validate()
            .map_err(|problem| InventoryError::Invalid {
                path: path.to_owned(),
                problem,
            })?;
        Ok(inventory)
    }

    /// The semantic rules: unique host names, known failure domains, odd replicas, a usable
    /// etcd section, at most one trust mode per BMC, and every value within bounds
    /// ([`checks`]: BMC addresses, fingerprints, etcd endpoints, durations).
    pub fn validate(&self) -> Result<(), String> {
        // Each value first (the endpoint's own error names its index), then how they go
        // together (schemes and TLS files).
        checks::check(self)?;
        validate_etcd(&self.etcd)?;
        if !self.etcd.prefix.starts_with('/') || self.etcd.prefix.ends_with('/') {
            return Err(format!(
                "etcd.prefix {:?} must start with / and not end with /",
                self.etcd.prefix
            ));
        }
        if self.etcd.lease_ttl < Duration::from_secs(2) {
            return Err("etcd.lease_ttl must be at least 2s".to_owned());
        }
        let replicas = self.control_plane.desired_replicas;
        if replicas == 0 || replicas.is_multiple_of(2) {
            return Err(format!(
                "control_plane.desired_replicas is {replicas}; it must be odd"
            ));
        }
        let domains: BTreeSet<&str> = self
            .control_plane
            .failure_domains
            .iter()
            .map(String::as_str)
            .collect();
        let mut names = BTreeSet::new();
        for host in &self.hosts {
            if host.name.is_empty() {
                return Err("a host has an empty name".to_owned());
            }
            if !names.insert(host.name.as_str()) {
                return Err(format!("host {} is listed twice", host.name));
            }
            if let Some(domain) = &host.failure_domain
                && !domains.contains(domain.as_str())
            {
                {
                    return Err(format!(
                        "host {} names failure_domain {domain:?}, which control_plane.failure_domains does not list",
                        host.name
                    ));
                }
            }
            if let Some(bmc) = &host.bmc {
                let modes = usize::from(bmc.tls.ca_file.is_some())
                    + usize::from(bmc.tls.fingerprint_sha256.is_some())
                    + usize::from(bmc.tls.insecure);
                if modes > 1 {
                    return Err(format!(
                        "host {} bmc.tls sets more than one of ca-file, fingerprint-sha256, insecure",
                        host.name
                    ));
                }
            }
        }
        Ok(())
    }

    /// Reads every file the inventory names (credentials, CA bundles) and returns every
    /// problem found, so `check-config` reports them all at once.
    pub fn check_files(&self) -> Vec<InventoryError> {
        let mut problems = Vec::new();
        for host in &self.hosts {
            if let Some(bmc) = &host.bmc {
                if let Err(e) = bmc.credentials(&host.name) {
                    problems.push(e);
                }
                if let Err(e) = bmc.trust(&host.name) {
                    problems.push(e);
                }
            }
        }
        problems
    }

    /// The host named `name`.
    /// The host named `name`: a lookup (a round asks for thousands; a scan each was the
    /// square of the hosts in comparisons).
    pub fn host(&self, name: &str) -> Option<&InventoryHost> {
        let index = self.index.0.get_or_init(|| {
            let mut index = std::collections::HashMap::with_capacity(self.hosts.len());
            for (i, h) in self.hosts.iter().enumerate() {
                index.entry(h.name.clone()).or_insert(i);
            }
            index
        });
        index
            .get(name)
            .and_then(|&i| self.hosts.get(i))
            .filter(|h| h.name == name)
            .or_else(|| self.hosts.iter().find(|h| h.name == name))
    }
}

impl BmcSettings {
    /// Reads the credentials of `host`'s BMC, refusing files others may read.
    pub fn credentials(&self, host: &str) -> Result<BmcCredentials, InventoryError> {
        if let Some(cluster) = &self.from_cluster {
            return cluster
                .credentials
                .clone()
                .map_err(|problem| InventoryError::Secret {
                    host: host.to_owned(),
                    problem,
                });
        }
        if self.credentials_dir.exists() {
            files::check_credentials_dir(host, &self.credentials_dir)?;
        }
        let username = files::read_secret_file(host, &self.credentials_dir.join("username"))?;
        let password = files::read_secret_file(host, &self.credentials_dir.join("password"))?;
        Ok(BmcCredentials {
            username,
            password: Secret::new(password),
        })
    }

    /// The trust to send to the agent (reads a CA file's PEM text).
    pub fn trust(&self, host: &str) -> Result<BmcTrust, InventoryError> {
        if self.tls.insecure {
            return Ok(BmcTrust::Insecure);
        }
        if let Some(sha256) = &self.tls.fingerprint_sha256 {
            return Ok(BmcTrust::Fingerprint {
                sha256: sha256.clone(),
            });
        }
        if let Some(pem) = self.from_cluster.as_ref().and_then(|c| c.ca_pem.clone()) {
            return Ok(BmcTrust::CaPem { pem });
        }
        if let Some(path) = &self.tls.ca_file {
            if path.exists() {
                files::check_ca_file(host, path)?;
            }
            let pem = fs::read_to_string(path).map_err(|e| InventoryError::Credentials {
                host: host.to_owned(),
                path: path.clone(),
                problem: format!("could not be read ({})", e.kind()),
            })?;
            return Ok(BmcTrust::CaPem { pem });
        }
        Ok(BmcTrust::SystemRoots)
    }
}

#[cfg(test)]
mod tests;
