//! Revoked agent certificates: a deny list of serial numbers and SHA-256 fingerprints in a
//! file the inventory names (`[controller] revoked_certificates`), re-read when it changes.
//!
//! The list is honoured twice: at the handshake ([`DenyingVerifier`] refuses a revoked
//! certificate before any HTTP) and on every request (a connection opened before the
//! certificate was revoked is answered 403 from then on).
//!
//! File format, one certificate per line, `#` starts a comment:
//!
//! ```text
//! serial 5f:0a:93:…      # as `metalguard-controller certs issue` and `certs show` print it
//! sha256 3b9c…           # the DER certificate's SHA-256 fingerprint
//! ```

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};

use rustls::client::danger::HandshakeSignatureValid;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls_pki_types::{CertificateDer, UnixTime};
use sha2::{Digest as _, Sha256};

use crate::pki::seal::{hex, unhex};

/// Why a deny list could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DenyListError {
    /// The file could not be read.
    #[error("revoked certificates file {path} could not be read")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Others than its owner may write the file, or a stranger owns it: whoever may write it
    /// decides which certificates are cut off (the rule is `metalguard_fs`'s).
    #[error("revoked certificates file {path} is refused")]
    Unsafe {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: metalguard_fs::FileError,
    },
    /// A line is neither `serial HEX` nor `sha256 HEX`.
    #[error(
        "revoked certificates file {path} line {line}: expected `serial HEX` or `sha256 HEX`, found {found:?}"
    )]
    BadLine {
        /// The file.
        path: PathBuf,
        /// One-based line number.
        line: usize,
        /// The line.
        found: String,
    },
}

/// The identity of a client certificate: the host it names, its serial and fingerprint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertIdentity {
    /// The host: the common name, or failing that the first DNS SAN.
    pub host: String,
    /// The serial number, lowercase hex with colons.
    pub serial: String,
    /// SHA-256 of the DER certificate, lowercase hex.
    pub sha256: String,
    /// End of validity, Unix seconds.
    pub not_after: i64,
}

impl CertIdentity {
    /// The identity of a DER certificate; `None` when it names no host or does not parse.
    pub fn of(cert: &CertificateDer<'_>) -> Option<Self> {
        let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref()).ok()?;
        Some(Self {
            host: crate::pki::tls::peer_host(cert)?,
            serial: colons(&hex(parsed.raw_serial())),
            sha256: hex(&Sha256::digest(cert.as_ref())),
            not_after: parsed.validity().not_after.timestamp(),
        })
    }

    /// `cp-2 (serial 5f:0a:…)`, for records and logs.
    pub fn describe(&self) -> String {
        format!("{} (certificate serial {})", self.host, self.serial)
    }
}

/// `ab:cd:ef` from `abcdef`.
fn colons(hex: &str) -> String {
    hex.as_bytes()
        .chunks(2)
        .map(|pair| String::from_utf8_lossy(pair).into_owned())
        .collect::<Vec<_>>()
        .join(":")
}

/// The revoked serials and fingerprints (lowercase hex without colons).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DenyList {
    serials: BTreeSet<String>,
    fingerprints: BTreeSet<String>,
}

impl DenyList {
    /// Parses a deny list (`path` is used in messages only).
    pub fn parse(path: &Path, text: &str) -> Result<Self, DenyListError> {
        let mut list = Self::default();
        for (index, raw) in text.lines().enumerate() {
            let line = raw.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let bad = || DenyListError::BadLine {
                path: path.to_owned(),
                line: index + 1,
                found: line.to_owned(),
            };
            let mut words = line.split_whitespace();
            let (Some(kind), Some(value), None) = (words.next(), words.next(), words.next()) else {
                return Err(bad());
            };
            let bytes = unhex(&value.to_ascii_lowercase()).ok_or_else(bad)?;
            // Serials are positive integers: a leading zero byte is DER's sign padding.
            let normal = hex(&bytes);
            match kind {
                "serial" => {
                    list.serials
                        .insert(normal.trim_start_matches("00").to_owned());
                }
                "sha256" if bytes.len() == 32 => {
                    list.fingerprints.insert(normal);
                }
                _ => return Err(bad()),
            }
        }
        Ok(list)
    }

    /// Reads and parses `path`, refused when others than root or the service user may
    /// write it (at start and at every reload).
    pub fn load(path: &Path) -> Result<Self, DenyListError> {
        use metalguard_fs::{Access, FileError, Owners};
        match metalguard_fs::check_path(path, Access::Authority, &Owners::service()) {
            Ok(_) | Err(FileError::Examine { .. }) => {}
            Err(source) => {
                return Err(DenyListError::Unsafe {
                    path: path.to_owned(),
                    source,
                });
            }
        }
        let text = std::fs::read_to_string(path).map_err(|source| DenyListError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::parse(path, &text)
    }

    /// Why `cert` is refused, if it is on the list.
    pub fn refuses(&self, cert: &CertIdentity) -> Option<String> {
        let serial = cert.serial.replace(':', "");
        if self.serials.contains(serial.trim_start_matches("00")) {
            return Some(format!("certificate serial {} is revoked", cert.serial));
        }
        self.fingerprints
            .contains(&cert.sha256)
            .then(|| format!("certificate sha256 {} is revoked", cert.sha256))
    }

    /// How many certificates the list names.
    pub fn len(&self) -> usize {
        self.serials.len() + self.fingerprints.len()
    }
}

/// The deny list in force, shared by the handshake verifier, the routes and the loop that
/// reloads it.
pub type Revoked = Arc<RwLock<DenyList>>;

/// Why a certificate is refused by the list in force, if it is.
pub fn refused(revoked: &Revoked, cert: &CertIdentity) -> Option<String> {
    revoked
        .read()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .refuses(cert)
}

/// A deny list file, re-read when its modification time, length, mode or owner changes.
#[derive(Debug)]
pub struct DenyListFile {
    path: PathBuf,
    /// The file as seen at the last check.
    seen: Seen,
}

/// What the last check of a file saw.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Seen {
    /// Not checked yet.
    Never,
    /// Missing or unreadable metadata.
    Missing,
    /// Its modification time, length, mode and owner.
    At(std::time::SystemTime, u64, u32, u32),
}

/// What a check of the deny list file found.
#[derive(Debug)]
pub enum DenyListReload {
    /// Unchanged since the last check.
    Unchanged,
    /// Changed and read: this many certificates are revoked now.
    Loaded(usize),
    /// Changed and unreadable: the previous list stays in force.
    Rejected(DenyListError),
}

impl DenyListFile {
    /// The file at `path`, not read yet.
    pub fn new(path: &Path) -> Self {
        Self {
            path: path.to_owned(),
            seen: Seen::Never,
        }
    }

    /// Re-reads the file into `revoked` when it changed.
    pub fn check(&mut self, revoked: &Revoked) -> DenyListReload {
        use std::os::unix::fs::MetadataExt as _;
        let seen = std::fs::metadata(&self.path)
            .ok()
            .and_then(|m| Some(Seen::At(m.modified().ok()?, m.len(), m.mode(), m.uid())))
            .unwrap_or(Seen::Missing);
        if self.seen == seen {
            return DenyListReload::Unchanged;
        }
        self.seen = seen;
        match DenyList::load(&self.path) {
            Ok(list) => {
                let count = list.len();
                *revoked
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = list;
                DenyListReload::Loaded(count)
            }
            Err(error) => DenyListReload::Rejected(error),
        }
    }
}

/// The cluster CA's client verifier, refusing revoked certificates at the handshake.
#[derive(Debug)]
pub struct DenyingVerifier {
    inner: Arc<dyn ClientCertVerifier>,
    revoked: Revoked,
}

impl DenyingVerifier {
    /// Wraps `inner` (the CA's verifier).
    pub fn new(inner: Arc<dyn ClientCertVerifier>, revoked: Revoked) -> Self {
        Self { inner, revoked }
    }
}

impl ClientCertVerifier for DenyingVerifier {
    fn offer_client_auth(&self) -> bool {
        self.inner.offer_client_auth()
    }

    fn client_auth_mandatory(&self) -> bool {
        self.inner.client_auth_mandatory()
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.inner.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        let verified = self
            .inner
            .verify_client_cert(end_entity, intermediates, now)?;
        if let Some(identity) = CertIdentity::of(end_entity)
            && let Some(why) = refused(&self.revoked, &identity)
        {
            tracing::warn!(host = %identity.host, serial = %identity.serial, reason = %why, "revoked client certificate refused at the handshake");
            return Err(rustls::Error::InvalidCertificate(
                rustls::CertificateError::Revoked,
            ));
        }
        Ok(verified)
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pki::certs::{Usage, init_ca, issue};

    fn identity(dir: &Path, name: &str) -> CertIdentity {
        let issued = issue(
            dir,
            name,
            Usage::Client,
            &[],
            crate::pki::certs::Validity::default(),
        )
        .unwrap();
        let cert = crate::pki::tls::read_certs(&issued.cert).unwrap().remove(0);
        CertIdentity::of(&cert).unwrap()
    }

    #[test]
    fn a_certificate_is_refused_by_its_serial_or_its_fingerprint_and_no_other() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path(), crate::pki::certs::Validity::default()).unwrap();
        let (a, b, c) = (
            identity(dir.path(), "cp-1"),
            identity(dir.path(), "cp-2"),
            identity(dir.path(), "cp-3"),
        );
        assert_ne!(a.serial, b.serial, "serials are random");
        let text = format!(
            "# revoked\nserial {}   # cp-1's old certificate\nsha256 {}\n",
            a.serial.to_uppercase(),
            b.sha256
        );
        let list = DenyList::parse(Path::new("revoked.txt"), &text).unwrap();
        assert!(list.refuses(&a).unwrap().contains(&a.serial));
        assert!(list.refuses(&b).unwrap().contains("sha256"));
        assert_eq!(list.refuses(&c), None);
        assert_eq!(list.len(), 2);
    }

    #[test]
    fn a_bad_line_is_named_and_the_list_in_force_stays() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("revoked.txt");
        std::fs::write(&path, "serial 0a:0b\n").unwrap();
        let revoked = Revoked::default();
        let mut file = DenyListFile::new(&path);
        assert!(matches!(file.check(&revoked), DenyListReload::Loaded(1)));
        assert!(matches!(file.check(&revoked), DenyListReload::Unchanged));
        std::fs::write(&path, "serial 0a:0b\nfingerprint ab\n").unwrap();
        let DenyListReload::Rejected(error) = file.check(&revoked) else {
            panic!("a bad line was accepted")
        };
        assert!(error.to_string().contains("line 2"), "{error}");
        assert_eq!(revoked.read().unwrap().len(), 1, "the previous list stays");
    }

    #[test]
    fn a_deny_list_others_may_write_is_refused_at_start_and_at_reload() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("revoked.txt");
        std::fs::write(&path, "serial 0a:0b\n").unwrap();
        let revoked = Revoked::default();
        let mut file = DenyListFile::new(&path);
        assert!(matches!(file.check(&revoked), DenyListReload::Loaded(1)));
        // A local user who may write it cuts off a healthy host's certificate.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();
        std::fs::write(&path, "serial 0a:0b\nserial 0c:0d\n").unwrap();
        let DenyListReload::Rejected(error) = file.check(&revoked) else {
            panic!("a list others may write was applied")
        };
        let text = crate::error::chain(&error);
        assert!(text.contains("revoked.txt has mode 0666"), "{text}");
        assert_eq!(revoked.read().unwrap().len(), 1, "the previous list stays");
        assert!(DenyList::load(&path).is_err(), "refused at start too");
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(file.check(&revoked), DenyListReload::Loaded(2)));
    }
}
