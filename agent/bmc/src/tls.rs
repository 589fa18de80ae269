//! TLS trust for Redfish BMCs: system roots (default), a per-BMC CA bundle, SHA-256 certificate
//! fingerprint pinning, or an explicit insecure opt-in.
//!
//! Pinning exists because BMCs commonly present a self-signed certificate with `CA:TRUE` as
//! their end-entity certificate, which webpki refuses (`CaUsedAsEndEntity`) even when that very
//! certificate is trusted as a root. The pinning verifier accepts exactly the certificate whose
//! SHA-256 digest matches, ignores chain, name and validity period (the pin *is* the identity),
//! and still verifies the handshake signature against the pinned certificate's key, so a peer
//! that merely replays the certificate without its private key is refused.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use sha2::{Digest, Sha256};

/// Where the system CA bundle is looked for, first match wins (Debian, RHEL, SUSE/Alpine).
pub const SYSTEM_CA_BUNDLES: [&str; 4] = [
    "/etc/ssl/certs/ca-certificates.crt",
    "/etc/pki/tls/certs/ca-bundle.crt",
    "/etc/ssl/ca-bundle.pem",
    "/etc/ssl/cert.pem",
];

static INSECURE_HANDSHAKES: AtomicU64 = AtomicU64::new(0);

/// How many TLS handshakes were accepted without verification (`--insecure`) in this process,
/// for the `metalguard_bmc_insecure_tls_handshakes_total` metric.
pub fn insecure_handshakes() -> u64 {
    INSECURE_HANDSHAKES.load(Ordering::Relaxed)
}

/// How the BMC's certificate is trusted.
#[derive(Clone, PartialEq, Eq)]
pub enum TlsTrust {
    /// Verify against the system CA bundle (the default).
    SystemRoots,
    /// Verify against the CA certificates in this PEM file only.
    CaBundle(PathBuf),
    /// Accept exactly the certificate with this SHA-256 digest (of its DER encoding).
    Fingerprint([u8; 32]),
    /// Accept any certificate. Explicit opt-in only; logged as a warning and counted.
    Insecure,
}

impl fmt::Debug for TlsTrust {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SystemRoots => f.write_str("SystemRoots"),
            Self::CaBundle(path) => f.debug_tuple("CaBundle").field(path).finish(),
            Self::Fingerprint(digest) => write!(f, "Fingerprint({})", hex(digest)),
            Self::Insecure => f.write_str("Insecure"),
        }
    }
}

/// Why a TLS configuration could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// The CA bundle could not be read.
    #[error("cannot read ca bundle {path}")]
    ReadBundle {
        /// The bundle path.
        path: PathBuf,
        /// The PEM/I/O error.
        #[source]
        source: rustls::pki_types::pem::Error,
    },
    /// The CA bundle holds no usable certificate.
    #[error("ca bundle {path} holds no usable certificate")]
    EmptyBundle {
        /// The bundle path.
        path: PathBuf,
    },
    /// No system CA bundle was found.
    #[error("no system ca bundle found (looked in {looked})")]
    NoSystemBundle {
        /// The paths tried.
        looked: String,
    },
    /// The fingerprint is not 32 bytes of hex.
    #[error(
        "certificate fingerprint {given} is not a sha-256 digest (64 hex digits, colons allowed)"
    )]
    Fingerprint {
        /// The text given.
        given: String,
    },
    /// rustls refused the configuration.
    #[error("tls configuration refused")]
    Rustls(#[source] rustls::Error),
    /// The certificate verifier could not be built.
    #[error("certificate verifier could not be built")]
    Verifier(#[source] rustls::client::VerifierBuilderError),
}

/// Parses a SHA-256 fingerprint: 64 hex digits, optionally colon-separated and optionally
/// prefixed `sha256:` or `SHA256 Fingerprint=` (as `openssl x509 -fingerprint` prints), with
/// the rules the controller checks its inventory with
/// ([`metalguard_api::bmc::parse_sha256_fingerprint`]).
pub fn parse_fingerprint(text: &str) -> Result<[u8; 32], TlsError> {
    metalguard_api::bmc::parse_sha256_fingerprint(text).ok_or_else(|| TlsError::Fingerprint {
        given: metalguard_api::text::excerpt(text, 100),
    })
}

/// The SHA-256 digest of a DER certificate, as pinned by [`TlsTrust::Fingerprint`].
pub fn certificate_fingerprint(der: &[u8]) -> [u8; 32] {
    Sha256::digest(der).into()
}

/// Lowercase hex with colons, the way fingerprints are shown.
pub fn hex(bytes: &[u8]) -> String {
    bytes
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// The crypto provider (ring) every BMC TLS connection uses.
fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Builds the rustls client configuration for one BMC.
pub fn client_config(trust: &TlsTrust) -> Result<rustls::ClientConfig, TlsError> {
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Rustls)?;
    let config = match trust {
        TlsTrust::SystemRoots => {
            let found = SYSTEM_CA_BUNDLES.iter().map(Path::new).find(|p| p.exists());
            let Some(bundle) = found else {
                return Err(TlsError::NoSystemBundle {
                    looked: SYSTEM_CA_BUNDLES.join(", "),
                });
            };
            let roots = load_roots(bundle)?;
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        TlsTrust::CaBundle(path) => {
            let roots = load_roots(path)?;
            builder.with_root_certificates(roots).with_no_client_auth()
        }
        TlsTrust::Fingerprint(digest) => builder
            .dangerous()
            .with_custom_certificate_verifier(Arc::new(PinnedCertificate {
                digest: *digest,
                algorithms: provider.signature_verification_algorithms,
            }))
            .with_no_client_auth(),
        TlsTrust::Insecure => {
            tracing::warn!("tls certificate verification disabled for this bmc by explicit opt-in");
            builder
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(AnyCertificate {
                    algorithms: provider.signature_verification_algorithms,
                }))
                .with_no_client_auth()
        }
    };
    Ok(config)
}

/// A configuration that trusts no certificate, for clients that speak plain HTTP only.
pub fn trust_nothing_config() -> Result<rustls::ClientConfig, TlsError> {
    Ok(rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .map_err(TlsError::Rustls)?
        .with_root_certificates(RootCertStore::empty())
        .with_no_client_auth())
}

fn load_roots(path: &Path) -> Result<RootCertStore, TlsError> {
    let read_error = |source| TlsError::ReadBundle {
        path: path.to_owned(),
        source,
    };
    let mut roots = RootCertStore::empty();
    for cert in CertificateDer::pem_file_iter(path).map_err(read_error)? {
        let cert = cert.map_err(read_error)?;
        // Certificates webpki cannot parse are skipped, as system bundles carry a few.
        let _ = roots.add(cert);
    }
    if roots.is_empty() {
        return Err(TlsError::EmptyBundle {
            path: path.to_owned(),
        });
    }
    Ok(roots)
}

/// Accepts exactly one certificate, by SHA-256 digest, and checks the handshake signature.
#[derive(Debug)]
struct PinnedCertificate {
    digest: [u8; 32],
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for PinnedCertificate {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let seen = certificate_fingerprint(end_entity);
        // Not secret data, but compare without early exit anyway.
        let differs = seen
            .iter()
            .zip(self.digest.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if differs == 0 {
            Ok(ServerCertVerified::assertion())
        } else {
            tracing::warn!(
                seen = %hex(&seen),
                pinned = %hex(&self.digest),
                "bmc certificate does not match the pinned fingerprint"
            );
            Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::ApplicationVerificationFailure,
            ))
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

/// Accepts any certificate (explicit insecure opt-in); still checks the handshake signature so
/// the session key belongs to whoever presented the certificate. Counts each handshake.
#[derive(Debug)]
struct AnyCertificate {
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for AnyCertificate {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        INSECURE_HANDSHAKES.fetch_add(1, Ordering::Relaxed);
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::{TlsError, TlsTrust, client_config, hex, parse_fingerprint};

    #[test]
    fn fingerprint_spellings() {
        let plain = "ab".repeat(32);
        let colons = vec!["AB"; 32].join(":");
        let expected = [0xab; 32];
        assert_eq!(parse_fingerprint(&plain).unwrap(), expected);
        assert_eq!(parse_fingerprint(&colons).unwrap(), expected);
        assert_eq!(
            parse_fingerprint(&format!("sha256 Fingerprint={colons}")).unwrap(),
            expected
        );
        assert_eq!(
            parse_fingerprint(&format!("sha256:{plain}")).unwrap(),
            expected
        );
        assert!(matches!(
            parse_fingerprint(&"ab".repeat(31)),
            Err(TlsError::Fingerprint { .. })
        ));
        assert!(parse_fingerprint(&"zz".repeat(32)).is_err());
        assert_eq!(hex(&[1, 0xff]), "01:ff");
    }

    #[test]
    fn system_roots_and_bad_bundles() {
        assert!(client_config(&TlsTrust::SystemRoots).is_ok());
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.pem");
        std::fs::write(&empty, "not a certificate\n").unwrap();
        assert!(matches!(
            client_config(&TlsTrust::CaBundle(empty)),
            Err(TlsError::EmptyBundle { .. })
        ));
        assert!(matches!(
            client_config(&TlsTrust::CaBundle(dir.path().join("absent.pem"))),
            Err(TlsError::ReadBundle { .. })
        ));
        assert!(client_config(&TlsTrust::Fingerprint([0; 32])).is_ok());
    }
}
