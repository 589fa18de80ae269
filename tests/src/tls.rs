//! Test certificates: a CA with a leaf for 127.0.0.1 (and another address on request), and a
//! self-signed certificate with CA:TRUE used as the server's own certificate (as many BMCs
//! ship).

use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use sha2::{Digest, Sha256};

use crate::{HarnessError, Result};

/// A server certificate with its key and, when CA-signed, the CA.
#[derive(Debug, Clone)]
pub struct ServerCert {
    /// Server certificate, PEM.
    pub cert_pem: String,
    /// Server certificate, DER.
    pub cert_der: Vec<u8>,
    /// Server private key, PEM.
    pub key_pem: String,
    /// The issuing CA certificate, PEM (`None` for a self-signed certificate).
    pub ca_pem: Option<String>,
}

/// Paths of a [`ServerCert`] written to disk.
#[derive(Debug, Clone)]
pub struct ServerCertFiles {
    /// Server certificate.
    pub cert: PathBuf,
    /// Server key (mode 0600).
    pub key: PathBuf,
    /// CA bundle to trust: the CA for a CA-signed certificate, else the certificate itself.
    pub ca: PathBuf,
}

fn rcgen_err(what: &str) -> impl FnOnce(rcgen::Error) -> HarnessError + '_ {
    move |e| HarnessError::Other(format!("generating {what}: {e}"))
}

fn server_params(address: Ipv4Addr) -> Result<CertificateParams> {
    let mut params = CertificateParams::new(vec!["localhost".to_owned()])
        .map_err(rcgen_err("server parameters"))?;
    params
        .subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
    if address != Ipv4Addr::LOCALHOST {
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(address)));
    }
    params
        .distinguished_name
        .push(DnType::CommonName, "127.0.0.1");
    Ok(params)
}

impl ServerCert {
    /// A test CA and a leaf certificate it signed for `localhost` and `127.0.0.1`.
    pub fn ca_signed() -> Result<Self> {
        Self::ca_signed_for(Ipv4Addr::LOCALHOST)
    }

    /// A test CA and a leaf certificate it signed for `localhost`, `127.0.0.1` and `address`.
    pub fn ca_signed_for(address: Ipv4Addr) -> Result<Self> {
        let mut ca_params =
            CertificateParams::new(Vec::<String>::new()).map_err(rcgen_err("CA parameters"))?;
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(DnType::CommonName, "metalguard test CA");
        ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let ca_key = KeyPair::generate().map_err(rcgen_err("CA key"))?;
        let ca = CertifiedIssuer::self_signed(ca_params, ca_key).map_err(rcgen_err("CA"))?;

        let mut params = server_params(address)?;
        params.is_ca = IsCa::ExplicitNoCa;
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().map_err(rcgen_err("server key"))?;
        let cert = params
            .signed_by(&key, &ca)
            .map_err(rcgen_err("server certificate"))?;
        Ok(Self {
            cert_pem: cert.pem(),
            cert_der: cert.der().to_vec(),
            key_pem: key.serialize_pem(),
            ca_pem: Some(ca.pem()),
        })
    }

    /// A self-signed certificate with CA:TRUE, used directly by the server. rustls refuses it
    /// as an end-entity (`CaUsedAsEndEntity`) even when trusted, hence fingerprint pinning.
    pub fn self_signed_ca() -> Result<Self> {
        Self::self_signed_ca_for(Ipv4Addr::LOCALHOST)
    }

    /// [`ServerCert::self_signed_ca`] for `localhost`, `127.0.0.1` and `address`.
    pub fn self_signed_ca_for(address: Ipv4Addr) -> Result<Self> {
        let mut params = server_params(address)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let key = KeyPair::generate().map_err(rcgen_err("self-signed key"))?;
        let cert = params
            .self_signed(&key)
            .map_err(rcgen_err("self-signed certificate"))?;
        Ok(Self {
            cert_pem: cert.pem(),
            cert_der: cert.der().to_vec(),
            key_pem: key.serialize_pem(),
            ca_pem: None,
        })
    }

    /// SHA-256 fingerprint of the server certificate, as `AB:CD:...` (the form `openssl x509
    /// -fingerprint -sha256` prints).
    pub fn fingerprint_sha256(&self) -> String {
        fingerprint_sha256(&self.cert_der)
    }

    /// Writes `server.crt`, `server.key` (0600) and `ca.crt` into `dir`.
    pub fn write_to(&self, dir: &Path) -> Result<ServerCertFiles> {
        let files = ServerCertFiles {
            cert: dir.join("server.crt"),
            key: dir.join("server.key"),
            ca: dir.join("ca.crt"),
        };
        write_file(&files.cert, self.cert_pem.as_bytes(), 0o644)?;
        write_file(&files.key, self.key_pem.as_bytes(), 0o600)?;
        let ca = self.ca_pem.as_deref().unwrap_or(&self.cert_pem);
        write_file(&files.ca, ca.as_bytes(), 0o644)?;
        Ok(files)
    }
}

/// SHA-256 of `der` as upper-case hex pairs joined by colons.
pub fn fingerprint_sha256(der: &[u8]) -> String {
    Sha256::digest(der)
        .iter()
        .map(|b| format!("{b:02X}"))
        .collect::<Vec<_>>()
        .join(":")
}

/// Writes `bytes` to `path` with `mode`.
pub fn write_file(path: &Path, bytes: &[u8], mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::write(path, bytes).map_err(HarnessError::io(format!("writing {}", path.display())))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(HarnessError::io(
        format!("setting mode of {}", path.display()),
    ))
}
