//! Mutual TLS for the agent API: the server configuration (a client certificate signed by the
//! cluster CA is required at the handshake) and the host identity taken from that certificate.

use std::path::{Path, PathBuf};
use std::sync::Arc;

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
}

impl TlsFiles {
    /// The files of `name` in a directory written by `certs init` / `certs issue --server`.
    pub fn in_dir(dir: &Path, name: &str) -> Self {
        Self {
            ca: dir.join(crate::certs::CA_CERT),
            cert: dir.join(format!("{name}.pem")),
            key: dir.join(format!("{name}-key.pem")),
        }
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
/// chains to the cluster CA.
pub fn server_config(files: &TlsFiles) -> Result<ServerConfig, TlsError> {
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
    use crate::certs::{Usage, init_ca, issue};

    #[test]
    fn the_host_comes_from_the_client_certificate() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path()).unwrap();
        let issued = issue(dir.path(), "cp-2", Usage::Client, &[]).unwrap();
        let cert = read_certs(&issued.cert).unwrap().remove(0);
        assert_eq!(peer_host(&cert).as_deref(), Some("cp-2"));
    }

    #[test]
    fn the_server_configuration_requires_client_certificates() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path()).unwrap();
        issue(dir.path(), "controller", Usage::Server, &[]).unwrap();
        server_config(&TlsFiles::in_dir(dir.path(), "controller")).unwrap();
        let missing = server_config(&TlsFiles::in_dir(dir.path(), "nope")).unwrap_err();
        assert!(missing.to_string().contains("nope.pem"), "{missing}");
    }
}
