//! Certificates for an etcd cluster in kubeadm's layout, generated per run.
//!
//! kubeadm keeps, on every control-plane host, `/etc/kubernetes/pki/etcd/`: `ca.crt` (and
//! `ca.key`), `server.crt`/`.key` and `peer.crt`/`.key` (CN = the host, SANs = the host name,
//! `localhost`, the host's address, 127.0.0.1 and ::1, usable for server and client auth) and
//! `healthcheck-client.crt`/`.key` (CN `kube-etcd-healthcheck-client`, client auth only).
//! Here every member's directory `<pki>/<member>/etcd/` holds the same files, so a test can
//! point a component at a member's directory exactly as it would at a kubeadm host's. Client
//! certificates with any common name (etcd maps the CN to a user once auth is enabled) come
//! from [`EtcdPki::issue_client`].

use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

use crate::tls::write_file;
use crate::{HarnessError, Result};

/// Common name of kubeadm's health-check client certificate.
pub const HEALTHCHECK_CLIENT_CN: &str = "kube-etcd-healthcheck-client";
/// Common name of the harness's own administrative client (`etcdctl`): `root`, so that it
/// stays etcd's root user after a test enables authentication.
pub const ROOT_CLIENT_CN: &str = "root";

/// A certificate and its private key on disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CertFiles {
    /// PEM certificate.
    pub cert: PathBuf,
    /// PEM private key (mode 0600).
    pub key: PathBuf,
}

/// One member's directory in kubeadm's layout (`…/etcd/`).
#[derive(Debug, Clone)]
pub struct MemberPki {
    /// The directory (`<pki>/<member>/etcd`).
    pub dir: PathBuf,
    /// `ca.crt`.
    pub ca: PathBuf,
    /// `server.crt`/`server.key`.
    pub server: CertFiles,
    /// `peer.crt`/`peer.key`.
    pub peer: CertFiles,
    /// `healthcheck-client.crt`/`healthcheck-client.key`.
    pub healthcheck_client: CertFiles,
}

impl MemberPki {
    /// The `ETCD_*` variables that make a member serve its clients and peers over TLS with
    /// client-certificate authentication, as kubeadm's static pod flags do.
    pub fn etcd_env(&self) -> Vec<(String, String)> {
        let path = |p: &Path| p.display().to_string();
        [
            ("ETCD_CERT_FILE", path(&self.server.cert)),
            ("ETCD_KEY_FILE", path(&self.server.key)),
            ("ETCD_TRUSTED_CA_FILE", path(&self.ca)),
            ("ETCD_CLIENT_CERT_AUTH", "true".to_owned()),
            ("ETCD_PEER_CERT_FILE", path(&self.peer.cert)),
            ("ETCD_PEER_KEY_FILE", path(&self.peer.key)),
            ("ETCD_PEER_TRUSTED_CA_FILE", path(&self.ca)),
            ("ETCD_PEER_CLIENT_CERT_AUTH", "true".to_owned()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect()
    }

    /// The same settings as etcd's command-line flags.
    pub fn etcd_flags(&self) -> Vec<String> {
        self.etcd_env()
            .into_iter()
            .map(|(key, value)| {
                let flag = key
                    .trim_start_matches("ETCD_")
                    .to_ascii_lowercase()
                    .replace('_', "-");
                format!("--{flag}={value}")
            })
            .collect()
    }
}

/// An etcd CA in a directory, issuing member and client certificates.
#[derive(Debug)]
pub struct EtcdPki {
    dir: PathBuf,
    ca_params: CertificateParams,
    ca_key_pem: String,
    ca_cert: PathBuf,
}

fn rcgen_err(what: &str) -> impl FnOnce(rcgen::Error) -> HarnessError + '_ {
    move |e| HarnessError::Other(format!("generating {what}: {e}"))
}

fn create_dir(dir: &Path) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(HarnessError::io(format!("creating {}", dir.display())))
}

impl EtcdPki {
    /// A new CA (CN `etcd-ca`, as kubeadm names it) written to `dir/ca.crt` and `dir/ca.key`.
    pub fn create(dir: &Path) -> Result<Self> {
        create_dir(dir)?;
        let mut params =
            CertificateParams::new(Vec::<String>::new()).map_err(rcgen_err("etcd CA"))?;
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(DnType::CommonName, "etcd-ca");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let key = KeyPair::generate().map_err(rcgen_err("etcd CA key"))?;
        let cert = params.self_signed(&key).map_err(rcgen_err("etcd CA"))?;
        let ca_cert = dir.join("ca.crt");
        write_file(&ca_cert, cert.pem().as_bytes(), 0o644)?;
        write_file(&dir.join("ca.key"), key.serialize_pem().as_bytes(), 0o600)?;
        Ok(Self {
            dir: dir.to_owned(),
            ca_params: params,
            ca_key_pem: key.serialize_pem(),
            ca_cert,
        })
    }

    /// The CA certificate (`ca.crt`).
    pub fn ca(&self) -> &Path {
        &self.ca_cert
    }

    fn issuer(&self) -> Result<Issuer<'static, KeyPair>> {
        let key = KeyPair::from_pem(&self.ca_key_pem).map_err(rcgen_err("etcd CA key"))?;
        Ok(Issuer::new(self.ca_params.clone(), key))
    }

    fn issue(
        &self,
        cn: &str,
        sans: Vec<String>,
        usages: Vec<ExtendedKeyUsagePurpose>,
        files: &CertFiles,
    ) -> Result<()> {
        // rcgen reads each name as an IP address when it parses as one, else as a DNS name.
        let mut params =
            CertificateParams::new(sans).map_err(rcgen_err("certificate parameters"))?;
        params.distinguished_name.push(DnType::CommonName, cn);
        params.is_ca = IsCa::ExplicitNoCa;
        params.extended_key_usages = usages;
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        let key = KeyPair::generate().map_err(rcgen_err("certificate key"))?;
        let cert = params
            .signed_by(&key, &self.issuer()?)
            .map_err(rcgen_err(cn))?;
        write_file(&files.cert, cert.pem().as_bytes(), 0o644)?;
        write_file(&files.key, key.serialize_pem().as_bytes(), 0o600)
    }

    /// The directory of member `name` at `address` in kubeadm's layout: `ca.crt`, server and
    /// peer certificates for `name`, `localhost`, `address`, 127.0.0.1 and ::1, and the
    /// health-check client certificate.
    pub fn issue_member(&self, name: &str, address: Ipv4Addr) -> Result<MemberPki> {
        let dir = self.dir.join(name).join("etcd");
        create_dir(&dir)?;
        let ca = dir.join("ca.crt");
        std::fs::copy(&self.ca_cert, &ca).map_err(HarnessError::io(format!(
            "copying the CA to {}",
            ca.display()
        )))?;
        let pair = |stem: &str| CertFiles {
            cert: dir.join(format!("{stem}.crt")),
            key: dir.join(format!("{stem}.key")),
        };
        let member = MemberPki {
            server: pair("server"),
            peer: pair("peer"),
            healthcheck_client: pair("healthcheck-client"),
            ca,
            dir: dir.clone(),
        };
        let sans = || {
            let mut sans = vec![name.to_owned(), "localhost".to_owned(), address.to_string()];
            if address != Ipv4Addr::LOCALHOST {
                sans.push(Ipv4Addr::LOCALHOST.to_string());
            }
            sans.push(Ipv6Addr::LOCALHOST.to_string());
            sans
        };
        let both = || {
            vec![
                ExtendedKeyUsagePurpose::ServerAuth,
                ExtendedKeyUsagePurpose::ClientAuth,
            ]
        };
        self.issue(name, sans(), both(), &member.server)?;
        self.issue(name, sans(), both(), &member.peer)?;
        self.issue(
            HEALTHCHECK_CLIENT_CN,
            Vec::new(),
            vec![ExtendedKeyUsagePurpose::ClientAuth],
            &member.healthcheck_client,
        )?;
        Ok(member)
    }

    /// A client certificate with common name `cn` (etcd's user name for it once auth is
    /// enabled), written to `<pki>/clients/<cn>.crt` and `.key`.
    pub fn issue_client(&self, cn: &str) -> Result<CertFiles> {
        let dir = self.dir.join("clients");
        create_dir(&dir)?;
        let files = CertFiles {
            cert: dir.join(format!("{cn}.crt")),
            key: dir.join(format!("{cn}.key")),
        };
        self.issue(
            cn,
            Vec::new(),
            vec![ExtendedKeyUsagePurpose::ClientAuth],
            &files,
        )?;
        Ok(files)
    }
}
