//! TLS client configurations that present a client certificate: to the controller (mutual TLS
//! of the agent API) and to etcd (`--client-cert-auth`, as kubeadm runs it). Errors name the
//! configuration key and the file, never a key's content.

use std::path::Path;
use std::sync::Arc;

use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// A client configuration trusting the CA bundle `ca` and presenting `identity` (certificate
/// chain and private key) when given; `section` (`controller`, `etcd`) prefixes the keys in
/// messages (`etcd.ca /path: …`).
pub fn config(
    section: &str,
    ca: &Path,
    identity: Option<(&Path, &Path)>,
) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    let ca_error = |e: &dyn std::fmt::Display| format!("{section}.ca {}: {e}", ca.display());
    for der in CertificateDer::pem_file_iter(ca).map_err(|e| ca_error(&e))? {
        let der = der.map_err(|e| ca_error(&e))?;
        roots.add(der).map_err(|e| ca_error(&e))?;
    }
    if roots.is_empty() {
        return Err(ca_error(&"holds no PEM certificate"));
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| e.to_string())?
    .with_root_certificates(roots);
    let Some((cert, key)) = identity else {
        return Ok(builder.with_no_client_auth());
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("{section}.cert {}: {e}", cert.display()))?
        .collect::<Result<_, _>>()
        .map_err(|e| format!("{section}.cert {}: {e}", cert.display()))?;
    if chain.is_empty() {
        return Err(format!(
            "{section}.cert {}: holds no PEM certificate",
            cert.display()
        ));
    }
    // The key's contents never appear in messages, only its path.
    let key_der = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("{section}.key {}: {e}", key.display()))?;
    builder.with_client_auth_cert(chain, key_der).map_err(|e| {
        format!(
            "{section}.key {}: does not go with {section}.cert ({e})",
            key.display()
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use rcgen::{BasicConstraints, CertificateParams, IsCa, Issuer, KeyPair};

    fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
        let path = dir.join(name);
        std::fs::write(&path, text).unwrap();
        path
    }

    #[test]
    fn each_file_is_named_when_it_cannot_be_used() {
        let dir = tempfile::tempdir().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_key = KeyPair::generate().unwrap();
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let issuer = Issuer::new(ca, ca_key);
        let leaf = |name: &str| {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(vec![name.to_owned()])
                .unwrap()
                .signed_by(&key, &issuer)
                .unwrap();
            (
                write(dir.path(), &format!("{name}.crt"), &cert.pem()),
                write(dir.path(), &format!("{name}.key"), &key.serialize_pem()),
            )
        };
        let ca = write(dir.path(), "ca.crt", &ca_pem);
        let (cert, key) = leaf("a");
        let (_, other_key) = leaf("b");
        config("etcd", &ca, Some((&cert, &key))).unwrap();
        config("etcd", &ca, None).unwrap();
        let err = config("etcd", &ca, Some((&cert, &other_key))).unwrap_err();
        assert!(
            err.starts_with("etcd.key ") && err.contains("does not go with etcd.cert"),
            "{err}"
        );
        let garbage = write(dir.path(), "garbage", "hello\n");
        let err = config("etcd", &garbage, None).unwrap_err();
        assert!(
            err.starts_with("etcd.ca ") && err.contains("no PEM certificate"),
            "{err}"
        );
        let err = config("etcd", &ca, Some((&garbage, &key))).unwrap_err();
        assert!(err.starts_with("etcd.cert "), "{err}");
        let err = config("etcd", &ca, Some((&cert, &garbage))).unwrap_err();
        assert!(
            err.starts_with("etcd.key ") && !err.contains("PRIVATE"),
            "{err}"
        );
    }
}
