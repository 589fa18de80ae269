//! The certificates and keys of a test cluster: one CA that signs the serving certificates
//! (kube-apiserver, etcd) and every client certificate; client certificates for any user and
//! groups (`CN=user`, one `O=` per group, as Kubernetes reads them); the service-account
//! signing key pair (EC P-256); and static bearer tokens.
//!
//! Client certificates are made with `openssl`: one subject may carry several `O` attributes,
//! which rcgen's `DistinguishedName` (one value per attribute type) cannot express.

use std::net::{IpAddr, Ipv4Addr};
use std::os::unix::fs::PermissionsExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};

use crate::process::run_capture;
use crate::tls::write_file;
use crate::{HarnessError, Result, tools};

/// A certificate and its key on disk.
#[derive(Debug, Clone)]
pub struct CertFiles {
    /// The certificate (PEM).
    pub cert: PathBuf,
    /// Its private key (PEM, mode 0600).
    pub key: PathBuf,
}

/// The cluster's CA and everything it issued, in one directory.
pub struct Pki {
    dir: PathBuf,
    ca: CertifiedIssuer<'static, KeyPair>,
    ca_cert: PathBuf,
    ca_key: PathBuf,
}

impl std::fmt::Debug for Pki {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pki")
            .field("dir", &self.dir)
            .field("ca_cert", &self.ca_cert)
            .finish_non_exhaustive()
    }
}

fn rcgen_err(what: &str) -> impl FnOnce(rcgen::Error) -> HarnessError + '_ {
    move |e| HarnessError::Other(format!("generating {what}: {e}"))
}

/// A file name for `name` (users look like `system:serviceaccount:ns:name`).
fn file_stem(name: &str) -> String {
    name.chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' {
                c
            } else {
                '_'
            }
        })
        .collect()
}

/// Escapes a value for `openssl req -subj` (`/` `+` `=` `,` and `\` are special).
fn subject_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        if matches!(c, '/' | '+' | '=' | ',' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

impl Pki {
    /// A new CA in `dir` (`ca.crt`, `ca.key`).
    pub fn create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir)
            .map_err(HarnessError::io(format!("creating {}", dir.display())))?;
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(rcgen_err("CA parameters"))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "metalguard test kubernetes CA");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().map_err(rcgen_err("CA key"))?;
        let key_pem = key.serialize_pem();
        let ca = CertifiedIssuer::self_signed(params, key).map_err(rcgen_err("CA"))?;
        let ca_cert = dir.join("ca.crt");
        let ca_key = dir.join("ca.key");
        write_file(&ca_cert, ca.pem().as_bytes(), 0o644)?;
        write_file(&ca_key, key_pem.as_bytes(), 0o600)?;
        Ok(Self {
            dir: dir.to_path_buf(),
            ca,
            ca_cert,
            ca_key,
        })
    }

    /// The CA certificate every component trusts.
    pub fn ca_file(&self) -> &Path {
        &self.ca_cert
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> String {
        self.ca.pem()
    }

    /// A serving certificate for `localhost` and `127.0.0.1` (also valid as a client
    /// certificate: etcd's peers and clients use one pair).
    pub fn serving(&self, name: &str) -> Result<CertFiles> {
        self.serving_with(name, &[], &[])
    }

    /// [`Pki::serving`] also valid for the names `dns` and the addresses `ips`.
    pub fn serving_with(&self, name: &str, dns: &[&str], ips: &[Ipv4Addr]) -> Result<CertFiles> {
        let mut names = vec!["localhost".to_owned()];
        names.extend(dns.iter().map(|d| (*d).to_owned()));
        let mut params = CertificateParams::new(names).map_err(rcgen_err("serving parameters"))?;
        for ip in std::iter::once(&Ipv4Addr::LOCALHOST).chain(ips) {
            params
                .subject_alt_names
                .push(SanType::IpAddress(IpAddr::V4(*ip)));
        }
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::ExplicitNoCa;
        params.extended_key_usages = vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ];
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let key = KeyPair::generate().map_err(rcgen_err("serving key"))?;
        let cert = params
            .signed_by(&key, &self.ca)
            .map_err(rcgen_err("serving certificate"))?;
        let files = CertFiles {
            cert: self.dir.join(format!("{}.crt", file_stem(name))),
            key: self.dir.join(format!("{}.key", file_stem(name))),
        };
        write_file(&files.cert, cert.pem().as_bytes(), 0o644)?;
        write_file(&files.key, key.serialize_pem().as_bytes(), 0o600)?;
        Ok(files)
    }

    /// A client certificate for `user` in `groups` (`CN=user`, `O=group` each), valid two days.
    pub fn client(&self, user: &str, groups: &[&str]) -> Result<CertFiles> {
        let openssl = tools::program("openssl")?;
        let stem = format!("user-{}", file_stem(user));
        let files = CertFiles {
            cert: self.dir.join(format!("{stem}.crt")),
            key: self.dir.join(format!("{stem}.key")),
        };
        let csr = self.dir.join(format!("{stem}.csr"));
        let ext = self.dir.join(format!("{stem}.ext"));
        write_file(
            &ext,
            b"basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n",
            0o644,
        )?;
        let mut subject = String::new();
        for group in groups {
            subject.push_str("/O=");
            subject.push_str(&subject_value(group));
        }
        subject.push_str("/CN=");
        subject.push_str(&subject_value(user));
        let mut genkey = Command::new(&openssl);
        genkey
            .args([
                "genpkey",
                "-algorithm",
                "EC",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
                "-out",
            ])
            .arg(&files.key);
        run_capture(genkey, None, "openssl genpkey")?;
        let mut req = Command::new(&openssl);
        req.args(["req", "-new", "-key"])
            .arg(&files.key)
            .args(["-subj", &subject, "-out"])
            .arg(&csr);
        run_capture(req, None, "openssl req")?;
        let serial = format!("0x{}", tools::random_token(16));
        let mut sign = Command::new(&openssl);
        sign.args(["x509", "-req", "-in"])
            .arg(&csr)
            .arg("-CA")
            .arg(&self.ca_cert)
            .arg("-CAkey")
            .arg(&self.ca_key)
            .args(["-set_serial", &serial, "-days", "2", "-extfile"])
            .arg(&ext)
            .arg("-out")
            .arg(&files.cert);
        run_capture(sign, None, "openssl x509 -req")?;
        let _ = std::fs::remove_file(&csr);
        let _ = std::fs::remove_file(&ext);
        std::fs::set_permissions(&files.key, std::fs::Permissions::from_mode(0o600)).map_err(
            HarnessError::io(format!("setting mode of {}", files.key.display())),
        )?;
        Ok(files)
    }

    /// The service-account token signing key pair: (`sa.key` private, `sa.pub` public).
    pub fn service_account_keys(&self) -> Result<(PathBuf, PathBuf)> {
        let key = KeyPair::generate().map_err(rcgen_err("service-account key"))?;
        let private = self.dir.join("sa.key");
        let public = self.dir.join("sa.pub");
        write_file(&private, key.serialize_pem().as_bytes(), 0o600)?;
        write_file(&public, key.public_key_pem().as_bytes(), 0o644)?;
        Ok((private, public))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn subjects_escape_what_openssl_would_split() {
        assert_eq!(
            subject_value("system:serviceaccount:ns:a/b=c"),
            "system:serviceaccount:ns:a\\/b\\=c"
        );
        assert_eq!(
            file_stem("system:serviceaccount:ns:n"),
            "system_serviceaccount_ns_n"
        );
    }
}
