//! `certs init|issue|show`: the cluster CA and the certificates signed by it.
//!
//! Layout of a certificate directory: `ca.pem` + `ca-key.pem` (the CA), `hmac.key` (the
//! controllers' record key, [`crate::pki::seal`]), and for every name issued `NAME.pem` +
//! `NAME-key.pem`. Agent certificates carry the host name as common name and DNS SAN with the
//! clientAuth usage (the controller takes the host from the common name); the controller's
//! server certificate (`--server`) carries `localhost`, `127.0.0.1` and any extra SANs with
//! the serverAuth usage. Every certificate has a random serial (what a deny list names,
//! [`crate::pki::revocation`]) and a bounded validity ([`Validity`]: one year by default, ten for
//! the CA, never past the CA's own end). Private keys are written with mode 0600 and never
//! overwritten, except by a renewal (`--renew`), which replaces a certificate and its key
//! through a rename each.

use std::fmt::Write as _;
use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType, SerialNumber,
};

use crate::pki::revocation::CertIdentity;
use crate::pki::seal::random_error;

/// File name of the CA certificate.
pub const CA_CERT: &str = "ca.pem";
/// File name of the CA private key.
pub const CA_KEY: &str = "ca-key.pem";
/// Default validity of an agent or controller certificate.
pub const DEFAULT_DAYS: u32 = 365;
/// Default validity of the CA.
pub const DEFAULT_CA_DAYS: u32 = 3650;
/// How far back `notBefore` is set, for clocks slightly behind the issuer's.
const BACKDATE: Duration = Duration::from_secs(300);
/// Bytes of a random serial number.
const SERIAL_BYTES: usize = 16;

/// Why a certificate could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CertsError {
    /// Reading or writing a file failed.
    #[error("certificate file {path} could not be {action}")]
    Io {
        /// The file.
        path: PathBuf,
        /// "read", "written", "created".
        action: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// rcgen refused to build or sign a certificate.
    #[error("certificate for {subject} could not be generated")]
    Generate {
        /// The subject.
        subject: String,
        /// The cause.
        #[source]
        source: rcgen::Error,
    },
    /// A name is not usable as a host name in a certificate or file name.
    #[error("certificate name {0:?} is not a valid host name")]
    BadName(String),
    /// A validity of zero days.
    #[error("a certificate must be valid for at least one day")]
    NoValidity,
    /// A renewal of a certificate that was never issued.
    #[error("certificate {0} does not exist: issue it first (a renewal replaces one)")]
    NothingToRenew(PathBuf),
    /// A certificate file does not hold a parsable certificate.
    #[error("certificate file {0} holds no certificate that names a host")]
    Unreadable(PathBuf),
    /// The operating system's random source failed.
    #[error("random bytes for a serial number could not be read")]
    Random(#[source] std::io::Error),
    /// The record key could not be created.
    #[error("the controllers' hmac key could not be created")]
    HmacKey(#[source] crate::pki::seal::KeyFileError),
}

/// How long a new certificate is valid, from now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Validity {
    /// Days (at least one).
    pub days: u32,
}

impl Default for Validity {
    fn default() -> Self {
        Self { days: DEFAULT_DAYS }
    }
}

/// The paths and identity of one issued certificate.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, 0600).
    pub key: PathBuf,
    /// Serial, SHA-256 fingerprint and named host (for a deny list).
    pub identity: Option<CertIdentity>,
    /// The end of its validity, seconds since the epoch.
    pub not_after: i64,
    /// The certificate it replaced, when it was a renewal.
    pub replaced: Option<CertIdentity>,
}

impl Issued {
    /// What `certs init|issue` print: the files, the identity to revoke it by, its end.
    pub fn describe(&self) -> String {
        let mut text = format!(
            "{}\n{}\nvalid until {}",
            self.cert.display(),
            self.key.display(),
            humantime::format_rfc3339_seconds(
                UNIX_EPOCH + Duration::from_secs(u64::try_from(self.not_after).unwrap_or(0))
            )
        );
        if let Some(id) = &self.identity {
            let _ = write!(text, "\nserial {}\nsha256 {}", id.serial, id.sha256);
        }
        if let Some(old) = &self.replaced {
            let _ = write!(
                text,
                "\nreplaces serial {} (revoke it once every copy is renewed: add `serial {}` to the inventory's revoked_certificates file)",
                old.serial, old.serial
            );
        }
        text
    }
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

fn random_serial() -> Result<SerialNumber, CertsError> {
    let mut bytes = [0u8; SERIAL_BYTES];
    getrandom::fill(&mut bytes).map_err(|e| CertsError::Random(random_error(e)))?;
    // A positive integer with no leading zero byte: DER keeps it as is.
    bytes[0] = (bytes[0] & 0x7f) | 0x40;
    Ok(SerialNumber::from_slice(&bytes))
}

/// Sets a random serial and the validity window: from a little before now for `days`, but
/// never past `cap` (the issuing CA's end, seconds since the epoch). Returns the end.
fn set_validity(
    params: &mut CertificateParams,
    validity: Validity,
    cap: Option<i64>,
) -> Result<i64, CertsError> {
    if validity.days == 0 {
        return Err(CertsError::NoValidity);
    }
    let now = unix_now();
    let epoch = rcgen::date_time_ymd(1970, 1, 1);
    let end = now + Duration::from_secs(u64::from(validity.days) * 86_400);
    let end = i64::try_from(end.as_secs()).unwrap_or(i64::MAX);
    let end = cap.map_or(end, |cap| end.min(cap));
    params.not_before = epoch + now.saturating_sub(BACKDATE);
    params.not_after = epoch + Duration::from_secs(u64::try_from(end).unwrap_or(0));
    params.serial_number = Some(random_serial()?);
    Ok(end)
}

/// Creates a new CA in `dir` (which is created if needed) and the controllers' hmac key file
/// next to it unless one exists. Refuses to overwrite a key.
pub fn init_ca(dir: &Path, validity: Validity) -> Result<Issued, CertsError> {
    fs::create_dir_all(dir).map_err(|source| CertsError::Io {
        path: dir.to_owned(),
        action: "created",
        source,
    })?;
    let subject = "metalguard cluster CA".to_owned();
    let generate = |source| CertsError::Generate {
        subject: subject.clone(),
        source,
    };
    let key = KeyPair::generate().map_err(generate)?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::CommonName, subject.clone());
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let not_after = set_validity(&mut params, validity, None)?;
    let cert = params.self_signed(&key).map_err(generate)?;
    let issued = Issued {
        cert: dir.join(CA_CERT),
        key: dir.join(CA_KEY),
        identity: None,
        not_after,
        replaced: None,
    };
    write_new(&issued.key, key.serialize_pem().as_bytes(), 0o600)?;
    write_new(&issued.cert, cert.pem().as_bytes(), 0o644)?;
    let hmac = dir.join(crate::pki::seal::KEY_FILE);
    if !hmac.exists() {
        crate::pki::seal::create_file(&hmac).map_err(CertsError::HmacKey)?;
    }
    Ok(issued)
}

/// What kind of certificate to issue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Usage {
    /// An agent's client certificate naming its host.
    Client,
    /// The controller's server certificate.
    Server,
}

/// Issues a certificate for `name` signed by the CA in `dir`, with extra SANs (names or IPs).
pub fn issue(
    dir: &Path,
    name: &str,
    usage: Usage,
    extra_sans: &[String],
    validity: Validity,
) -> Result<Issued, CertsError> {
    make(dir, name, usage, extra_sans, validity, false)
}

/// Replaces the certificate and key of `name` in `dir` with new ones (a new key pair, a new
/// serial, a new validity), each through a rename so a reader never sees half a file. The
/// old certificate stays valid until it expires or is revoked.
pub fn renew(
    dir: &Path,
    name: &str,
    usage: Usage,
    extra_sans: &[String],
    validity: Validity,
) -> Result<Issued, CertsError> {
    make(dir, name, usage, extra_sans, validity, true)
}

/// The end of validity (Unix seconds) of the first certificate in `path`, whatever it names
/// (a CA, a server, an etcd client).
pub fn not_after(path: &Path) -> Result<i64, CertsError> {
    let unreadable = || CertsError::Unreadable(path.to_owned());
    let cert = crate::pki::tls::read_certs(path)
        .map_err(|_| unreadable())?
        .into_iter()
        .next()
        .ok_or_else(unreadable)?;
    let (_, parsed) =
        x509_parser::parse_x509_certificate(cert.as_ref()).map_err(|_| unreadable())?;
    Ok(parsed.validity().not_after.timestamp())
}

/// The identity and end of validity of the certificate in `path`.
pub fn show(path: &Path) -> Result<(CertIdentity, i64), CertsError> {
    let unreadable = || CertsError::Unreadable(path.to_owned());
    let cert = crate::pki::tls::read_certs(path)
        .map_err(|_| unreadable())?
        .into_iter()
        .next()
        .ok_or_else(unreadable)?;
    let identity = CertIdentity::of(&cert).ok_or_else(unreadable)?;
    let (_, parsed) =
        x509_parser::parse_x509_certificate(cert.as_ref()).map_err(|_| unreadable())?;
    Ok((identity, parsed.validity().not_after.timestamp()))
}

fn make(
    dir: &Path,
    name: &str,
    usage: Usage,
    extra_sans: &[String],
    validity: Validity,
    replace: bool,
) -> Result<Issued, CertsError> {
    if name.is_empty()
        || name.starts_with('.')
        || !name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.' || c == '_')
    {
        return Err(CertsError::BadName(name.to_owned()));
    }
    let ca_pem = read(&dir.join(CA_CERT))?;
    let ca_key_pem = read(&dir.join(CA_KEY))?;
    let generate = |source| CertsError::Generate {
        subject: name.to_owned(),
        source,
    };
    let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(generate)?;
    let ca = Issuer::from_ca_cert_pem(&ca_pem, ca_key).map_err(generate)?;
    // A leaf never outlives its CA (it would fail then anyway, with a less clear error).
    let ca_end = show(&dir.join(CA_CERT)).ok().map(|(_, end)| end);
    let cert_path = dir.join(format!("{name}.pem"));
    let replaced = if replace {
        Some(
            show(&cert_path)
                .map_err(|_| CertsError::NothingToRenew(cert_path.clone()))?
                .0,
        )
    } else {
        None
    };

    let mut names: Vec<String> = vec![name.to_owned()];
    if usage == Usage::Server {
        names.push("localhost".to_owned());
        names.push("127.0.0.1".to_owned());
    }
    names.extend(extra_sans.iter().cloned());
    names.dedup();
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
    for san in &names {
        let entry = match san.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => SanType::DnsName(san.clone().try_into().map_err(generate)?),
        };
        params.subject_alt_names.push(entry);
    }
    params.distinguished_name.push(DnType::CommonName, name);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![match usage {
        Usage::Client => ExtendedKeyUsagePurpose::ClientAuth,
        Usage::Server => ExtendedKeyUsagePurpose::ServerAuth,
    }];
    params.use_authority_key_identifier_extension = true;
    let not_after = set_validity(&mut params, validity, ca_end)?;
    let key = KeyPair::generate().map_err(generate)?;
    let cert = params.signed_by(&key, &ca).map_err(generate)?;
    let issued = Issued {
        cert: cert_path,
        key: dir.join(format!("{name}-key.pem")),
        identity: CertIdentity::of(cert.der()),
        not_after,
        replaced,
    };
    if replace {
        // The key first: an agent that reads between the two renames finds the new key with
        // the old certificate, refuses the pair and keeps its previous identity.
        write_replacing(&issued.key, key.serialize_pem().as_bytes(), 0o600)?;
        write_replacing(&issued.cert, cert.pem().as_bytes(), 0o644)?;
    } else {
        write_new(&issued.key, key.serialize_pem().as_bytes(), 0o600)?;
        write_new(&issued.cert, cert.pem().as_bytes(), 0o644)?;
    }
    Ok(issued)
}

/// Replaces `path` with a new file of `mode` through a rename.
fn write_replacing(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CertsError> {
    let tmp = path.with_extension("pem.new");
    let _ = fs::remove_file(&tmp);
    write_new(&tmp, bytes, mode)?;
    fs::rename(&tmp, path).map_err(|source| CertsError::Io {
        path: path.to_owned(),
        action: "written",
        source,
    })
}

fn read(path: &Path) -> Result<String, CertsError> {
    fs::read_to_string(path).map_err(|source| CertsError::Io {
        path: path.to_owned(),
        action: "read",
        source,
    })
}

/// Writes a new file with `mode`; fails if it exists (keys are never silently replaced).
fn write_new(path: &Path, bytes: &[u8], mode: u32) -> Result<(), CertsError> {
    let io = |source| CertsError::Io {
        path: path.to_owned(),
        action: "written",
        source,
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(io)?;
    file.write_all(bytes).map_err(io)?;
    file.sync_all().map_err(io)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    const YEAR: u64 = 365 * 86_400;

    #[test]
    fn issued_keys_are_private_and_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let ca = init_ca(dir.path(), Validity::default()).unwrap();
        let mode = fs::metadata(&ca.key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let hmac = dir.path().join(crate::pki::seal::KEY_FILE);
        let mode = fs::metadata(&hmac).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the controllers' hmac key is made with the CA");
        let agent = issue(dir.path(), "cp-1", Usage::Client, &[], Validity::default()).unwrap();
        let mode = fs::metadata(&agent.key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = issue(dir.path(), "cp-1", Usage::Client, &[], Validity::default()).unwrap_err();
        assert!(again.to_string().contains("cp-1-key.pem"), "{again}");
        assert!(init_ca(dir.path(), Validity::default()).is_err());
    }

    #[test]
    fn names_that_could_escape_the_directory_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path(), Validity::default()).unwrap();
        for bad in ["", "../x", "a/b", ".hidden"] {
            assert!(matches!(
                issue(dir.path(), bad, Usage::Client, &[], Validity::default()),
                Err(CertsError::BadName(_))
            ));
        }
    }

    #[test]
    fn a_certificate_is_valid_for_a_year_by_default_and_never_past_its_ca() {
        let dir = tempfile::tempdir().unwrap();
        let ca = init_ca(dir.path(), Validity { days: 30 }).unwrap();
        let now = unix_now().as_secs();
        let ca_end = u64::try_from(ca.not_after).unwrap();
        assert!(ca_end.abs_diff(now + 30 * 86_400) < 60, "{ca_end}");
        let short = issue(dir.path(), "w-1", Usage::Client, &[], Validity { days: 2 }).unwrap();
        let (identity, end) = show(&short.cert).unwrap();
        assert_eq!(identity.host, "w-1");
        assert!(u64::try_from(end).unwrap().abs_diff(now + 2 * 86_400) < 60);
        let long = issue(dir.path(), "w-2", Usage::Client, &[], Validity::default()).unwrap();
        assert_eq!(long.not_after, ca.not_after, "capped at the CA's end");
        assert!(matches!(
            issue(dir.path(), "w-3", Usage::Client, &[], Validity { days: 0 }),
            Err(CertsError::NoValidity)
        ));
        let other = tempfile::tempdir().unwrap();
        init_ca(
            other.path(),
            Validity {
                days: DEFAULT_CA_DAYS,
            },
        )
        .unwrap();
        let year = issue(
            other.path(),
            "cp-1",
            Usage::Client,
            &[],
            Validity::default(),
        )
        .unwrap();
        let end = u64::try_from(year.not_after).unwrap();
        assert!(
            end.abs_diff(now + YEAR) < 60,
            "one year, not until 4096: {end}"
        );
        let (_, shown) = show(&year.cert).unwrap();
        assert_eq!(shown, year.not_after);
        assert_eq!(not_after(&year.cert).unwrap(), year.not_after);
        assert!(
            not_after(&dir.path().join("absent.pem")).is_err(),
            "a missing file is an error, not the epoch"
        );
    }

    #[test]
    fn a_renewal_replaces_the_pair_with_a_new_serial_and_names_the_old_one() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path(), Validity::default()).unwrap();
        assert!(matches!(
            renew(dir.path(), "cp-1", Usage::Client, &[], Validity::default()),
            Err(CertsError::NothingToRenew(_))
        ));
        let first = issue(dir.path(), "cp-1", Usage::Client, &[], Validity::default()).unwrap();
        let old_key = fs::read_to_string(&first.key).unwrap();
        let second = renew(dir.path(), "cp-1", Usage::Client, &[], Validity::default()).unwrap();
        let (old, new) = (first.identity.unwrap(), second.identity.clone().unwrap());
        assert_ne!(old.serial, new.serial);
        assert_eq!(second.replaced.as_ref().unwrap().serial, old.serial);
        assert_ne!(fs::read_to_string(&second.key).unwrap(), old_key);
        let mode = fs::metadata(&second.key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(show(&second.cert).unwrap().0, new);
        assert!(
            second
                .describe()
                .contains(&format!("replaces serial {}", old.serial))
        );
    }
}
