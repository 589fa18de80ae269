//! `certs init|issue`: the cluster CA and the certificates signed by it.
//!
//! Layout of a certificate directory: `ca.pem` + `ca-key.pem` (the CA), and for every name
//! issued `NAME.pem` + `NAME-key.pem`. Agent certificates carry the host name as common name
//! and DNS SAN with the clientAuth usage (the controller takes the host from the common
//! name); the controller's server certificate (`--server`) carries `localhost`, `127.0.0.1`
//! and any extra SANs with the serverAuth usage. Private keys are written with mode 0600 and
//! never overwritten.

use std::fs::{self, OpenOptions};
use std::io::Write as _;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};

/// File name of the CA certificate.
pub const CA_CERT: &str = "ca.pem";
/// File name of the CA private key.
pub const CA_KEY: &str = "ca-key.pem";

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
}

/// The paths of one issued certificate.
#[derive(Debug, Clone)]
pub struct Issued {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, 0600).
    pub key: PathBuf,
}

/// Creates a new CA in `dir` (which is created if needed). Refuses to overwrite a key.
pub fn init_ca(dir: &Path) -> Result<Issued, CertsError> {
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
    let cert = params.self_signed(&key).map_err(generate)?;
    let issued = Issued {
        cert: dir.join(CA_CERT),
        key: dir.join(CA_KEY),
    };
    write_new(&issued.key, key.serialize_pem().as_bytes(), 0o600)?;
    write_new(&issued.cert, cert.pem().as_bytes(), 0o644)?;
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
    let key = KeyPair::generate().map_err(generate)?;
    let cert = params.signed_by(&key, &ca).map_err(generate)?;
    let issued = Issued {
        cert: dir.join(format!("{name}.pem")),
        key: dir.join(format!("{name}-key.pem")),
    };
    write_new(&issued.key, key.serialize_pem().as_bytes(), 0o600)?;
    write_new(&issued.cert, cert.pem().as_bytes(), 0o644)?;
    Ok(issued)
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

    #[test]
    fn issued_keys_are_private_and_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let ca = init_ca(dir.path()).unwrap();
        let mode = fs::metadata(&ca.key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let agent = issue(dir.path(), "cp-1", Usage::Client, &[]).unwrap();
        let mode = fs::metadata(&agent.key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = issue(dir.path(), "cp-1", Usage::Client, &[]).unwrap_err();
        assert!(again.to_string().contains("cp-1-key.pem"), "{again}");
        assert!(init_ca(dir.path()).is_err());
    }

    #[test]
    fn names_that_could_escape_the_directory_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path()).unwrap();
        for bad in ["", "../x", "a/b", ".hidden"] {
            assert!(matches!(
                issue(dir.path(), bad, Usage::Client, &[]),
                Err(CertsError::BadName(_))
            ));
        }
    }
}
