//! Observation of an etcd that serves its clients over TLS, trusting a CA file.
#![allow(clippy::unwrap_used)]

mod common;

use metalguard_e2e::ports::reserve_port;
use metalguard_e2e::process::Proc;
use metalguard_e2e::tls::ServerCert;
use metalguard_etcd::observe::observe;
use metalguard_etcd::{ClientSettings, EtcdError, TlsFiles};
use std::process::Command;
use std::time::{Duration, Instant};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_endpoint_is_observed_with_the_ca_file_and_refused_without_it() {
    let dir = tempfile::tempdir().unwrap();
    let files = ServerCert::ca_signed()
        .unwrap()
        .write_to(dir.path())
        .unwrap();
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
        .arg(&files.cert)
        .arg("--key-file")
        .arg(&files.key);
    let _leases = (client, peer);
    let _etcd = Proc::spawn("etcd tls0", command, &dir.path().join("etcd.log")).unwrap();

    let mut settings = ClientSettings::new(vec![client_url.clone()]);
    settings.probe_timeout = common::PROBE;
    settings.tls = Some(TlsFiles {
        ca: Some(files.ca.clone()),
        cert: None,
        key: None,
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

    // Without the CA the certificate is not trusted: no endpoint answers.
    settings.tls = None;
    assert!(matches!(
        observe(&settings).await,
        Err(EtcdError::NoEndpointAnswered { .. })
    ));
}
