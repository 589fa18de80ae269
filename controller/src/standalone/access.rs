//! How the controller reaches etcd: the inventory's `[etcd]` TLS files and credentials,
//! checked and turned into the client's connect options.
//!
//! ```text
//! [etcd] ca_file, cert_file, key_file, username, password_file
//!     ── inventory::validate_etcd (structure, at load) ──► EtcdAccess::load (read + parse) ──► ConnectOptions
//!                                                                  │                          (failover.rs, report.rs)
//!                                                                  └► rustls config for the TLS probe (diagnosis.rs)
//!     ── check_files (check-config: also expiry, CA, client auth, issuer) ──► every problem
//! ```
//!
//! The private key and the password file are secrets: refused when group or others may read
//! them, never logged, and never part of a message (only their paths are). There is no
//! fallback to the system's trust store: etcd's CA is always a private one (kubeadm generates
//! `/etc/kubernetes/pki/etcd/ca.crt`), so an `https://` endpoint without `ca_file` is a
//! configuration error rather than a certificate error at run time.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use etcd_client::{Certificate, ConnectOptions, Identity, TlsOptions};
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

use crate::inventory::EtcdSettings;

/// A file of the `[etcd]` section that cannot be used. Names the key and the file, never a
/// secret's content.
#[derive(Debug, thiserror::Error)]
#[error("etcd.{key} {path}: {problem}")]
pub struct AccessError {
    /// The inventory key (`ca_file`, `cert_file`, `key_file`, `password_file`).
    pub key: &'static str,
    /// The file.
    pub path: PathBuf,
    /// What is wrong with it.
    pub problem: String,
}

/// Who the controller is to etcd, for messages (never a secret).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdIdentity {
    /// No client certificate, no user.
    Anonymous,
    /// A client certificate; etcd takes its common name as the user once auth is enabled.
    Certificate {
        /// The certificate's common name.
        common_name: String,
    },
    /// A user with a password (possibly with a client certificate for the handshake).
    User {
        /// The user name.
        name: String,
    },
}

impl fmt::Display for EtcdIdentity {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Anonymous => f.write_str("no client certificate and no user"),
            Self::Certificate { common_name } => {
                write!(f, "the client certificate's user {common_name:?}")
            }
            Self::User { name } => write!(f, "user {name:?}"),
        }
    }
}

/// Everything needed to open a client to one etcd endpoint.
#[derive(Clone)]
pub struct EtcdAccess {
    options: ConnectOptions,
    probe_tls: Option<Arc<rustls::ClientConfig>>,
    identity: EtcdIdentity,
    has_client_cert: bool,
    prefix: String,
    timeout: Duration,
}

impl fmt::Debug for EtcdAccess {
    // `ConnectOptions` holds the password in clear: never print it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdAccess")
            .field("tls", &self.probe_tls.is_some())
            .field("identity", &self.identity)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

impl EtcdAccess {
    /// Reads and parses the files `settings` names; every request and connection gets
    /// `settings.timeout`.
    pub fn load(settings: &EtcdSettings) -> Result<Self, AccessError> {
        let mut options = ConnectOptions::new()
            .with_timeout(settings.timeout)
            .with_connect_timeout(settings.timeout);
        let mut identity = EtcdIdentity::Anonymous;
        let mut probe_tls = None;
        let has_client_cert = settings.cert_file.is_some();
        if let Some(ca_path) = &settings.ca_file {
            let ca_pem = read_file("ca_file", ca_path)?;
            let roots = parse_certificates("ca_file", ca_path, &ca_pem)?;
            let mut tls = TlsOptions::new().ca_certificate(Certificate::from_pem(&ca_pem));
            let mut client_auth = None;
            if let (Some(cert_path), Some(key_path)) = (&settings.cert_file, &settings.key_file) {
                let cert_pem = read_file("cert_file", cert_path)?;
                let chain = parse_certificates("cert_file", cert_path, &cert_pem)?;
                let key_pem = read_secret("key_file", key_path)?;
                let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| AccessError {
                    key: "key_file",
                    path: key_path.clone(),
                    problem: format!("holds no usable PEM private key ({e})"),
                })?;
                identity = EtcdIdentity::Certificate {
                    common_name: common_name(&chain[0]).unwrap_or_default(),
                };
                tls = tls.identity(Identity::from_pem(&cert_pem, &key_pem));
                client_auth = Some((chain, key));
            }
            probe_tls = Some(Arc::new(probe_config(settings, roots, client_auth)?));
            options = options.with_tls(tls);
        }
        if let (Some(name), Some(path)) = (&settings.username, &settings.password_file) {
            let password = read_password(path)?;
            options = options
                .with_user(name.clone(), password)
                .with_auto_token_refresh(true);
            identity = EtcdIdentity::User { name: name.clone() };
        }
        Ok(Self {
            options,
            probe_tls,
            identity,
            has_client_cert,
            prefix: settings.prefix.clone(),
            timeout: settings.timeout,
        })
    }

    /// The connect options (timeouts, TLS, user) of a client to one endpoint.
    pub fn options(&self) -> ConnectOptions {
        self.options.clone()
    }

    /// The rustls configuration the TLS probe uses (`None` without TLS).
    pub fn probe_tls(&self) -> Option<Arc<rustls::ClientConfig>> {
        self.probe_tls.clone()
    }

    /// Who the controller is to etcd.
    pub fn identity(&self) -> &EtcdIdentity {
        &self.identity
    }

    /// Whether a client certificate is configured.
    pub fn has_client_cert(&self) -> bool {
        self.has_client_cert
    }

    /// The key prefix the controller needs to read and write.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// Timeout of one request and of one connection.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }
}

fn probe_config(
    settings: &EtcdSettings,
    roots: Vec<CertificateDer<'static>>,
    client_auth: Option<(Vec<CertificateDer<'static>>, PrivateKeyDer<'static>)>,
) -> Result<rustls::ClientConfig, AccessError> {
    let ca_path = settings.ca_file.clone().unwrap_or_default();
    let mut store = rustls::RootCertStore::empty();
    for root in roots {
        store.add(root).map_err(|e| AccessError {
            key: "ca_file",
            path: ca_path.clone(),
            problem: format!("holds a certificate that is no usable trust anchor ({e})"),
        })?;
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| AccessError {
        key: "ca_file",
        path: ca_path.clone(),
        problem: format!("no TLS configuration could be built ({e})"),
    })?
    .with_root_certificates(store);
    let mut config = match client_auth {
        Some((chain, key)) => {
            builder
                .with_client_auth_cert(chain, key)
                .map_err(|e| AccessError {
                    key: "key_file",
                    path: settings.key_file.clone().unwrap_or_default(),
                    problem: format!("does not go with etcd.cert_file ({e})"),
                })?
        }
        None => builder.with_no_client_auth(),
    };
    // etcd's gRPC port negotiates HTTP/2 by ALPN.
    config.alpn_protocols = vec![b"h2".to_vec()];
    Ok(config)
}

/// Every problem with the files of `settings`, as `check-config` reports them: what
/// [`EtcdAccess::load`] refuses, plus certificates expired or not yet valid at `now`, a CA
/// file holding no CA certificate, a client certificate not valid for client authentication
/// or not issued by a CA of `ca_file`.
pub fn check_files(settings: &EtcdSettings, now: SystemTime) -> Vec<AccessError> {
    let mut problems = Vec::new();
    let mut cas = Vec::new();
    if let Some(path) = &settings.ca_file {
        match read_file("ca_file", path).and_then(|pem| parse_certificates("ca_file", path, &pem)) {
            Ok(certs) => {
                for (i, der) in certs.iter().enumerate() {
                    check_certificate(
                        "ca_file",
                        path,
                        i,
                        der,
                        now,
                        Purpose::Ca,
                        &[],
                        &mut problems,
                    );
                }
                cas = certs;
            }
            Err(e) => problems.push(e),
        }
    }
    if let Some(path) = &settings.cert_file {
        match read_file("cert_file", path)
            .and_then(|pem| parse_certificates("cert_file", path, &pem))
        {
            Ok(certs) => check_certificate(
                "cert_file",
                path,
                0,
                &certs[0],
                now,
                Purpose::Client,
                &cas,
                &mut problems,
            ),
            Err(e) => problems.push(e),
        }
    }
    if let Some(path) = &settings.key_file {
        match read_secret("key_file", path) {
            Ok(pem) => {
                if let Err(e) = PrivateKeyDer::from_pem_slice(&pem) {
                    problems.push(AccessError {
                        key: "key_file",
                        path: path.clone(),
                        problem: format!("holds no usable PEM private key ({e})"),
                    });
                }
            }
            Err(e) => problems.push(e),
        }
    }
    if let Some(path) = &settings.password_file
        && let Err(e) = read_password(path)
    {
        problems.push(e);
    }
    if problems.is_empty()
        && let Err(e) = EtcdAccess::load(settings)
    {
        // What only building the client finds: a key that does not match its certificate.
        problems.push(e);
    }
    problems
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Purpose {
    Ca,
    Client,
}

#[allow(clippy::too_many_arguments)] // one certificate's context, checked in one place
fn check_certificate(
    key: &'static str,
    path: &Path,
    index: usize,
    der: &CertificateDer<'_>,
    now: SystemTime,
    purpose: Purpose,
    cas: &[CertificateDer<'static>],
    problems: &mut Vec<AccessError>,
) {
    let mut problem = |problem: String| {
        problems.push(AccessError {
            key,
            path: path.to_owned(),
            problem,
        });
    };
    let which = if index == 0 {
        "the certificate".to_owned()
    } else {
        format!("certificate {}", index + 1)
    };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(der.as_ref()) else {
        problem(format!("{which} is not a valid X.509 certificate"));
        return;
    };
    let secs = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX));
    if let Ok(at) = x509_parser::time::ASN1Time::from_timestamp(secs) {
        let validity = cert.validity();
        if at < validity.not_before {
            problem(format!(
                "{which} is not valid before {}",
                validity.not_before
            ));
        } else if at > validity.not_after {
            problem(format!("{which} expired on {}", validity.not_after));
        }
    }
    match purpose {
        Purpose::Ca => {
            if !cert.is_ca() {
                problem(format!(
                    "{which} ({}) is not a CA certificate: name the CA that signed etcd's server certificates",
                    cert.subject()
                ));
            }
        }
        Purpose::Client => {
            if let Ok(Some(eku)) = cert.extended_key_usage()
                && !eku.value.client_auth
                && !eku.value.any
            {
                problem(format!(
                    "{which} ({}) is not valid for client authentication (its extended key usage lacks clientAuth): etcd refuses it",
                    cert.subject()
                ));
            }
            let issued_by_ca = cas.iter().any(|ca| {
                x509_parser::parse_x509_certificate(ca.as_ref()).is_ok_and(|(_, ca)| {
                    ca.subject() == cert.issuer()
                        && cert.verify_signature(Some(ca.public_key())).is_ok()
                })
            });
            if !cas.is_empty() && !issued_by_ca {
                problem(format!(
                    "{which} is not signed by a CA in etcd.ca_file (its issuer: {}): etcd verifies \
                     client certificates with its --trusted-ca-file (kubeadm: the same etcd CA); \
                     if that is another CA, append it to ca_file",
                    cert.issuer()
                ));
            }
        }
    }
}

fn common_name(der: &CertificateDer<'_>) -> Option<String> {
    let (_, cert) = x509_parser::parse_x509_certificate(der.as_ref()).ok()?;
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?;
    Some(cn.to_owned())
}

fn read_file(key: &'static str, path: &Path) -> Result<Vec<u8>, AccessError> {
    checked_read(key, path, metalguard_fs::Access::Authority)
}

/// Reads a secret, refusing a file that group or others may read.
fn read_secret(key: &'static str, path: &Path) -> Result<Vec<u8>, AccessError> {
    checked_read(key, path, metalguard_fs::Access::Secret)
}

/// Reads `path` once `metalguard_fs`'s rule for `access` allows it: not writable (a secret:
/// not accessible) by group or others, owned by root or the service user.
fn checked_read(
    key: &'static str,
    path: &Path,
    access: metalguard_fs::Access,
) -> Result<Vec<u8>, AccessError> {
    use metalguard_fs::{FileError, Owners};
    let problem = |problem: String| AccessError {
        key,
        path: path.to_owned(),
        problem,
    };
    match metalguard_fs::check_path(path, access, &Owners::service()) {
        Ok(_) => {}
        Err(FileError::Examine { source, .. }) => {
            return Err(problem(format!("could not be read ({})", source.kind())));
        }
        Err(FileError::Mode { mode, rule, .. }) => {
            return Err(problem(format!("has mode {mode:04o}: {rule}")));
        }
        Err(other) => return Err(problem(crate::error::chain(&other))),
    }
    std::fs::read(path).map_err(|e| problem(format!("could not be read ({})", e.kind())))
}

fn read_password(path: &Path) -> Result<String, AccessError> {
    let bytes = read_secret("password_file", path)?;
    let problem = |problem: &str| AccessError {
        key: "password_file",
        path: path.to_owned(),
        problem: problem.to_owned(),
    };
    let text = String::from_utf8(bytes).map_err(|_| problem("is not UTF-8 text"))?;
    let password = text.trim_end_matches(['\n', '\r']);
    if password.is_empty() {
        return Err(problem("is empty"));
    }
    Ok(password.to_owned())
}

fn parse_certificates(
    key: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<Vec<CertificateDer<'static>>, AccessError> {
    let problem = |problem: String| AccessError {
        key,
        path: path.to_owned(),
        problem,
    };
    let certs = CertificateDer::pem_slice_iter(pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| problem(format!("is not PEM ({e})")))?;
    if certs.is_empty() {
        return Err(problem("holds no PEM certificate".to_owned()));
    }
    for (i, der) in certs.iter().enumerate() {
        if x509_parser::parse_x509_certificate(der.as_ref()).is_err() {
            return Err(problem(format!(
                "certificate {} is not a valid X.509 certificate",
                i + 1
            )));
        }
    }
    Ok(certs)
}

#[cfg(test)]
#[path = "access_tests.rs"]
mod tests;
