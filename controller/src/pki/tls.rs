//! Mutual TLS for the agent API: the server configuration (a client certificate signed by the
//! cluster CA and not revoked is required at the handshake), the host identity taken from that
//! certificate, and the rule on the controller's private keys (nobody but their owner may read
//! them).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use metalguard_fs::{Access, Owners, check_path};
use rustls::ServerConfig;
use rustls::server::WebPkiClientVerifier;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};

/// Why the TLS configuration could not be built or a peer could not be identified.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A PEM file could not be read or parsed.
    #[error("tls file {0} could not be read as PEM")]
    Pem(PathBuf, #[source] rustls_pki_types::pem::Error),
    /// A PEM file held no certificate.
    #[error("tls file {0} holds no certificate")]
    NoCertificate(PathBuf),
    /// The CA certificate was rejected as a trust anchor.
    #[error("ca certificate {0} is not a usable trust anchor")]
    Anchor(PathBuf, #[source] rustls::Error),
    /// The client verifier could not be built.
    #[error("client certificate verifier could not be built")]
    Verifier(#[source] rustls::server::VerifierBuilderError),
    /// rustls refused the certificate, key or protocol versions.
    #[error("tls server configuration was refused")]
    Config(#[source] rustls::Error),
    /// A TLS file or directory others than its owner may write (a key: read), owned by a
    /// stranger, or that cannot be inspected (the rule is `metalguard_fs`'s).
    #[error("tls file {0} is refused")]
    Unsafe(PathBuf, #[source] metalguard_fs::FileError),
}

/// Who besides the owner may read the controller's private keys.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyModes {
    /// Nobody (mode 0600 or 0400): the standalone controller on its hosts.
    OwnerOnly,
    /// The owner and the group (mode 0440 at most): a Kubernetes Secret volume is owned by
    /// root and read by a non-root pod through its fsGroup, so group read is the tightest
    /// mode it can use. Others: never.
    // Only the Kubernetes backend reads its keys from a Secret volume.
    #[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
    OwnerAndGroup,
}

/// The files of the controller's TLS identity.
#[derive(Debug, Clone)]
pub struct TlsFiles {
    /// The cluster CA (trust anchor for client certificates).
    pub ca: PathBuf,
    /// The controller's server certificate chain.
    pub cert: PathBuf,
    /// The controller's private key.
    pub key: PathBuf,
    /// Where the CA's private key would be if it were kept in the same directory (it should
    /// not be: it belongs on an offline machine, docs/threat-model.md).
    pub ca_key: PathBuf,
}

impl TlsFiles {
    /// The files of `name` in a directory written by `certs init` / `certs issue --server`.
    pub fn in_dir(dir: &Path, name: &str) -> Self {
        Self {
            ca: dir.join(crate::pki::certs::CA_CERT),
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}-key.pem")),
            ca_key: dir.join(crate::pki::certs::CA_KEY),
        }
    }

    /// Every private key present that breaks `rule`: the controller's key (which must exist)
    /// and the CA's key when it is in the directory.
    pub fn check_key_modes(&self, rule: KeyModes) -> Vec<TlsError> {
        let access = match rule {
            KeyModes::OwnerOnly => Access::Secret,
            KeyModes::OwnerAndGroup => Access::GroupReadableSecret,
        };
        let mut problems = Vec::new();
        for (path, required) in [(&self.key, true), (&self.ca_key, false)] {
            if !required && !path.exists() {
                continue;
            }
            if let Err(e) = check_path(path, access, &Owners::service()) {
                problems.push(TlsError::Unsafe(path.clone(), e));
            }
        }
        problems
    }

    /// Every problem with the files that decide whom the agent API trusts, on the controller's
    /// own hosts: `dir` (whoever may write it may swap any file) and the CA and server
    /// certificates, each not writable by group or others and owned by root or the service
    /// user. (Not for a Kubernetes Secret volume, whose directory the kubelet lays out.)
    pub fn check_authority(&self, dir: &Path) -> Vec<TlsError> {
        [dir, self.ca.as_path(), self.cert.as_path()]
            .into_iter()
            .filter_map(|path| {
                check_path(path, Access::Authority, &Owners::service())
                    .err()
                    .map(|e| TlsError::Unsafe(path.to_owned(), e))
            })
            .collect()
    }
}

/// Reads every certificate of a PEM file.
pub fn read_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let certs = CertificateDer::pem_file_iter(path)
        .and_then(Iterator::collect::<Result<Vec<_>, _>>)
        .map_err(|e| TlsError::Pem(path.to_owned(), e))?;
    if certs.is_empty() {
        return Err(TlsError::NoCertificate(path.to_owned()));
    }
    Ok(certs)
}

/// Builds the server configuration: our certificate, and a required client certificate that
/// chains to the cluster CA and is not on the deny list in force (`revoked`, read at every
/// handshake).
pub fn server_config(
    files: &TlsFiles,
    revoked: crate::pki::revocation::Revoked,
) -> Result<ServerConfig, TlsError> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut roots = rustls::RootCertStore::empty();
    for ca in read_certs(&files.ca)? {
        roots
            .add(ca)
            .map_err(|e| TlsError::Anchor(files.ca.clone(), e))?;
    }
    let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .map_err(TlsError::Verifier)?;
    let verifier = Arc::new(crate::pki::revocation::DenyingVerifier::new(
        verifier, revoked,
    ));
    let chain = read_certs(&files.cert)?;
    let key = PrivateKeyDer::from_pem_file(&files.key)
        .map_err(|e| TlsError::Pem(files.key.clone(), e))?;
    let mut config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Config)?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key)
        .map_err(TlsError::Config)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

/// The host a verified client certificate names: its common name, or failing that its first
/// DNS SAN. `None` when the certificate names no usable host.
pub fn peer_host(cert: &CertificateDer<'_>) -> Option<String> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
    let cn = parsed
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .map(str::to_owned);
    let host = cn.or_else(|| {
        let sans = parsed.subject_alternative_name().ok()??;
        sans.value.general_names.iter().find_map(|name| match name {
            x509_parser::extensions::GeneralName::DNSName(dns) => Some((*dns).to_owned()),
            _ => None,
        })
    })?;
    (!host.is_empty()).then_some(host)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::certs::{Usage, init_ca, issue};
    use std::os::unix::fs::PermissionsExt as _;

    use crate::pki::certs::Validity;

    #[test]
    fn the_host_comes_from_the_client_certificate() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path(), Validity::default()).unwrap();
        let issued = issue(dir.path(), "cp-2", Usage::Client, &[], Validity::default()).unwrap();
        let cert = read_certs(&issued.cert).unwrap().remove(0);
        assert_eq!(peer_host(&cert).as_deref(), Some("cp-2"));
    }

    #[test]
    fn the_server_configuration_requires_client_certificates() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path(), Validity::default()).unwrap();
        issue(
            dir.path(),
            "controller",
            Usage::Server,
            &[],
            Validity::default(),
        )
        .unwrap();
        server_config(&TlsFiles::in_dir(dir.path(), "controller"), Arc::default()).unwrap();
        let missing =
            server_config(&TlsFiles::in_dir(dir.path(), "nope"), Arc::default()).unwrap_err();
        assert!(missing.to_string().contains("nope.pem"), "{missing}");
    }

    #[test]
    fn keys_others_may_read_are_refused_and_group_read_only_where_a_secret_needs_it() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path(), Validity::default()).unwrap();
        issue(
            dir.path(),
            "controller",
            Usage::Server,
            &[],
            Validity::default(),
        )
        .unwrap();
        let files = TlsFiles::in_dir(dir.path(), "controller");
        let chmod = |path: &Path, mode| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        assert!(files.check_key_modes(KeyModes::OwnerOnly).is_empty());
        chmod(&files.key, 0o644);
        chmod(&files.ca_key, 0o640);
        let problems = files.check_key_modes(KeyModes::OwnerOnly);
        let text: Vec<String> = problems.iter().map(|e| crate::error::chain(e)).collect();
        assert_eq!(text.len(), 2, "{text:?}");
        assert!(
            text[0].contains("controller-key.pem") && text[0].contains("644"),
            "{text:?}"
        );
        assert!(
            text[1].contains("ca-key.pem") && text[1].contains("640"),
            "{text:?}"
        );
        assert_eq!(
            files.check_key_modes(KeyModes::OwnerAndGroup).len(),
            1,
            "o+r never"
        );
        chmod(&files.key, 0o440);
        assert!(files.check_key_modes(KeyModes::OwnerAndGroup).is_empty());
        std::fs::remove_file(&files.ca_key).unwrap();
        chmod(&files.key, 0o600);
        assert!(
            files.check_key_modes(KeyModes::OwnerOnly).is_empty(),
            "no CA key here: fine"
        );
    }

    #[test]
    fn a_tls_dir_or_certificate_others_may_write_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path(), Validity::default()).unwrap();
        issue(
            dir.path(),
            "controller",
            Usage::Server,
            &[],
            Validity::default(),
        )
        .unwrap();
        let files = TlsFiles::in_dir(dir.path(), "controller");
        let chmod = |path: &Path, mode| {
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        chmod(dir.path(), 0o755);
        assert!(files.check_authority(dir.path()).is_empty());
        chmod(dir.path(), 0o777);
        chmod(&files.ca, 0o664);
        let text: Vec<String> = files
            .check_authority(dir.path())
            .iter()
            .map(|e| crate::error::chain(e))
            .collect();
        assert_eq!(text.len(), 2, "{text:?}");
        assert!(text[0].contains("has mode 0777"), "{text:?}");
        assert!(text[1].contains("ca.pem has mode 0664"), "{text:?}");
    }
}
