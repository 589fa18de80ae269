//! Unit tests of [`super`] (access.rs).

use super::*;
use crate::inventory::validate_etcd as validate;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
};
use std::os::unix::fs::PermissionsExt as _;

fn settings(endpoints: &[&str]) -> EtcdSettings {
    EtcdSettings {
        endpoints: endpoints.iter().map(|e| (*e).to_owned()).collect(),
        ca_file: None,
        cert_file: None,
        key_file: None,
        username: None,
        password_file: None,
        prefix: "/metalguard".to_owned(),
        lease_ttl: Duration::from_secs(5),
        timeout: Duration::from_secs(2),
    }
}

fn write(dir: &Path, name: &str, text: &str, mode: u32) -> PathBuf {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

/// A CA and a client certificate it signed, with `eku` and the given validity, written
/// to `dir` (`ca.crt`, `client.crt`, `client.key` 0600); returns the settings naming them.
fn pki(dir: &Path, eku: ExtendedKeyUsagePurpose, expired: bool) -> EtcdSettings {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.distinguished_name.push(DnType::CommonName, "etcd-ca");
    let ca_key = KeyPair::generate().unwrap();
    let ca_cert = ca.self_signed(&ca_key).unwrap();
    let issuer = Issuer::new(ca, ca_key);
    let mut leaf = CertificateParams::new(Vec::<String>::new()).unwrap();
    leaf.distinguished_name
        .push(DnType::CommonName, "metalguard");
    leaf.extended_key_usages = vec![eku];
    if expired {
        leaf.not_before = rcgen::date_time_ymd(2000, 1, 1);
        leaf.not_after = rcgen::date_time_ymd(2001, 1, 1);
    }
    let key = KeyPair::generate().unwrap();
    let cert = leaf.signed_by(&key, &issuer).unwrap();
    let mut s = settings(&["https://127.0.0.1:2379"]);
    s.ca_file = Some(write(dir, "ca.crt", &ca_cert.pem(), 0o644));
    s.cert_file = Some(write(dir, "client.crt", &cert.pem(), 0o644));
    s.key_file = Some(write(dir, "client.key", &key.serialize_pem(), 0o600));
    s
}

#[test]
fn the_section_must_be_consistent_with_its_endpoints() {
    let with = |f: &dyn Fn(&mut EtcdSettings)| {
        let mut s = settings(&["https://10.0.0.1:2379"]);
        s.ca_file = Some("/ca.crt".into());
        f(&mut s);
        validate(&s)
    };
    assert_eq!(with(&|_| {}), Ok(()));
    let err = with(&|s| s.ca_file = None).unwrap_err();
    assert!(
        err.contains("etcd.ca_file is not set") && err.contains("/etc/kubernetes/pki/etcd/ca.crt"),
        "{err}"
    );
    let err = with(&|s| s.endpoints.push("http://10.0.0.2:2379".into())).unwrap_err();
    assert!(err.contains("mixes"), "{err}");
    let err = with(&|s| s.endpoints = vec!["http://10.0.0.1:2379".into()]).unwrap_err();
    assert!(
        err.contains("etcd.ca_file set, but etcd.endpoints are http://"),
        "{err}"
    );
    let err = with(&|s| s.cert_file = Some("/c".into())).unwrap_err();
    assert!(err.contains("cert_file and etcd.key_file"), "{err}");
    let err = with(&|s| s.username = Some("metalguard".into())).unwrap_err();
    assert!(err.contains("username and etcd.password_file"), "{err}");
    let err = with(&|s| s.endpoints = vec!["10.0.0.1:2379".into()]).unwrap_err();
    assert!(err.contains("must start with https:// or http://"), "{err}");
    let mut plain = settings(&["http://10.0.0.1:2379"]);
    assert_eq!(validate(&plain), Ok(()));
    plain.username = Some("metalguard".into());
    plain.password_file = Some("/pw".into());
    let err = validate(&plain).unwrap_err();
    assert!(err.contains("in clear"), "{err}");
}

#[test]
fn good_files_load_and_pass_the_checks() {
    let dir = tempfile::tempdir().unwrap();
    let s = pki(dir.path(), ExtendedKeyUsagePurpose::ClientAuth, false);
    let access = EtcdAccess::load(&s).unwrap();
    assert_eq!(
        access.identity(),
        &EtcdIdentity::Certificate {
            common_name: "metalguard".into()
        }
    );
    assert!(access.probe_tls().is_some() && access.has_client_cert());
    let problems = check_files(&s, SystemTime::now());
    assert!(problems.is_empty(), "{problems:?}");
}

#[test]
fn each_bad_file_is_named_with_what_is_wrong() {
    let dir = tempfile::tempdir().unwrap();
    let s = pki(dir.path(), ExtendedKeyUsagePurpose::ServerAuth, true);
    let problems: Vec<String> = check_files(&s, SystemTime::now())
        .iter()
        .map(ToString::to_string)
        .collect();
    let text = problems.join("\n");
    assert!(
        text.contains("etcd.cert_file") && text.contains("expired on"),
        "{text}"
    );
    assert!(
        text.contains("not valid for client authentication"),
        "{text}"
    );

    // The CA file names a leaf, the key is world-readable: both named, the key's content never.
    let mut s = pki(dir.path(), ExtendedKeyUsagePurpose::ClientAuth, false);
    s.ca_file = s.cert_file.clone();
    let key = s.key_file.clone().unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let text: Vec<String> = check_files(&s, SystemTime::now())
        .iter()
        .map(ToString::to_string)
        .collect();
    let text = text.join("\n");
    assert!(
        text.contains("etcd.ca_file") && text.contains("is not a CA certificate"),
        "{text}"
    );
    assert!(
        text.contains("etcd.key_file") && text.contains("mode 0644"),
        "{text}"
    );
    assert!(!text.contains("PRIVATE KEY"), "{text}");
    let err = EtcdAccess::load(&s).unwrap_err().to_string();
    assert!(
        err.contains("etcd.key_file") && err.contains("chmod 600"),
        "{err}"
    );

    // A key of another certificate.
    let other = tempfile::tempdir().unwrap();
    let o = pki(other.path(), ExtendedKeyUsagePurpose::ClientAuth, false);
    let mut s = pki(dir.path(), ExtendedKeyUsagePurpose::ClientAuth, false);
    s.key_file = o.key_file;
    let err = EtcdAccess::load(&s).unwrap_err().to_string();
    assert!(err.contains("does not go with etcd.cert_file"), "{err}");

    // A client certificate of another CA.
    let mut s = pki(dir.path(), ExtendedKeyUsagePurpose::ClientAuth, false);
    s.ca_file = o.ca_file;
    let text: Vec<String> = check_files(&s, SystemTime::now())
        .iter()
        .map(ToString::to_string)
        .collect();
    assert!(
        text.join("\n")
            .contains("is not signed by a CA in etcd.ca_file"),
        "{text:?}"
    );

    // Not PEM at all.
    let mut s = pki(dir.path(), ExtendedKeyUsagePurpose::ClientAuth, false);
    s.ca_file = Some(write(
        dir.path(),
        "garbage.crt",
        "not a certificate\n",
        0o644,
    ));
    let err = EtcdAccess::load(&s).unwrap_err().to_string();
    assert!(
        err.starts_with("etcd.ca_file ") && err.contains("holds no PEM certificate"),
        "{err}"
    );
}

#[test]
fn the_password_file_is_a_secret_and_never_echoed() {
    let dir = tempfile::tempdir().unwrap();
    let mut s = pki(dir.path(), ExtendedKeyUsagePurpose::ClientAuth, false);
    s.username = Some("metalguard".into());
    s.password_file = Some(write(dir.path(), "password", "hunter2\n", 0o640));
    let err = EtcdAccess::load(&s).unwrap_err().to_string();
    assert!(
        err.contains("etcd.password_file") && err.contains("mode 0640"),
        "{err}"
    );
    assert!(!err.contains("hunter2"));
    std::fs::set_permissions(
        s.password_file.as_ref().unwrap(),
        std::fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let access = EtcdAccess::load(&s).unwrap();
    assert_eq!(
        access.identity(),
        &EtcdIdentity::User {
            name: "metalguard".into()
        }
    );
    assert!(!format!("{access:?}").contains("hunter2"));
    write(dir.path(), "password", "\n", 0o600);
    let problems = check_files(&s, SystemTime::now());
    assert!(
        problems.iter().any(|p| p.to_string().contains("is empty")),
        "{problems:?}"
    );
}
