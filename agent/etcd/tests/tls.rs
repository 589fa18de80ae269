//! Observation of an etcd that serves its clients over TLS and requires client certificates.
#![allow(clippy::unwrap_used)]

mod common;

use metalguard_e2e::ports::reserve_port;
use metalguard_e2e::process::Proc;
use metalguard_etcd::observe::observe;
use metalguard_etcd::{ClientSettings, EtcdError, TlsFiles};
use rcgen::{
    BasicConstraints, CertificateParams, CertifiedIssuer, DnType, ExtendedKeyUsagePurpose, IsCa,
    KeyPair, KeyUsagePurpose, SanType,
};
use std::net::{IpAddr, Ipv4Addr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

struct Pki {
    ca: PathBuf,
    server: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
}

/// A CA, a server certificate for 127.0.0.1 and a client certificate, written to `dir`.
fn make_pki(dir: &Path) -> Pki {
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "etcd test CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = CertifiedIssuer::self_signed(ca_params, KeyPair::generate().unwrap()).unwrap();
    let leaf = |name: &str, usage: ExtendedKeyUsagePurpose| {
        let mut params = CertificateParams::new(vec!["localhost".to_owned()]).unwrap();
        params
            .subject_alt_names
            .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::LOCALHOST)));
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::ExplicitNoCa;
        params.extended_key_usages = vec![usage];
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &ca).unwrap();
        let (cert_path, key_path) = (
            dir.join(format!("{name}.crt")),
            dir.join(format!("{name}.key")),
        );
        std::fs::write(&cert_path, cert.pem()).unwrap();
        std::fs::write(&key_path, key.serialize_pem()).unwrap();
        (cert_path, key_path)
    };
    let ca_path = dir.join("ca.crt");
    std::fs::write(&ca_path, ca.pem()).unwrap();
    Pki {
        ca: ca_path,
        server: leaf("server", ExtendedKeyUsagePurpose::ServerAuth),
        client: leaf("client", ExtendedKeyUsagePurpose::ClientAuth),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_etcd_with_client_cert_auth_is_observed_only_with_ca_and_client_cert() {
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let (client, peer) = (reserve_port().unwrap(), reserve_port().unwrap());
    let client_url = format!("https://127.0.0.1:{}", client.port());
    let peer_url = format!("http://127.0.0.1:{}", peer.port());
    let mut command = Command::new(metalguard_e2e::tools::etcd_bin().unwrap());
    command
        .args(["--name", "tls0", "--listen-client-urls", &client_url])
        .args(["--advertise-client-urls", &client_url])
        .args([
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
        ])
        .args(["--initial-cluster", &format!("tls0={peer_url}")])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--cert-file")
        .arg(&pki.server.0)
        .arg("--key-file")
        .arg(&pki.server.1)
        .arg("--client-cert-auth")
        .arg("--trusted-ca-file")
        .arg(&pki.ca);
    let _leases = (client, peer);
    let _etcd = Proc::spawn("etcd tls0", command, &dir.path().join("etcd.log")).unwrap();

    let mut settings = ClientSettings::new(vec![client_url.clone()]);
    settings.probe_timeout = common::PROBE;
    settings.tls = Some(TlsFiles {
        ca: Some(pki.ca.clone()),
        cert: Some(pki.client.0.clone()),
        key: Some(pki.client.1.clone()),
    });
    let started = Instant::now();
    let view = loop {
        match observe(&settings).await {
            Ok(view) if view.summary.leader.is_some() => break view,
            _ if started.elapsed() < Duration::from_secs(10) => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            other => panic!("tls etcd never answered: {other:?}"),
        }
    };
    assert_eq!(view.summary.healthy_voters, 1);
    assert_eq!(view.members[0].client_urls, vec![client_url.clone()]);

    // Without the client certificate etcd refuses us; without the CA we refuse etcd.
    for tls in [
        Some(TlsFiles {
            ca: Some(pki.ca.clone()),
            cert: None,
            key: None,
        }),
        Some(TlsFiles {
            ca: None,
            cert: Some(pki.client.0.clone()),
            key: Some(pki.client.1.clone()),
        }),
        None,
    ] {
        settings.tls = tls.clone();
        assert!(
            matches!(
                observe(&settings).await,
                Err(EtcdError::NoEndpointAnswered { .. })
            ),
            "{tls:?}"
        );
    }
}
