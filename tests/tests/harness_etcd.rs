//! Self-tests of the etcd harness against real etcd processes.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::Duration;

use metalguard_e2e::etcd::{EtcdCluster, EtcdSecurity, MemberState, etcdctl_with};

#[test]
fn three_member_cluster_takes_writes_and_survives_injected_faults() {
    let mut cluster = EtcdCluster::start(3).expect("start 3 members");
    assert_eq!(cluster.security(), EtcdSecurity::ClientCertTls);
    assert_eq!(cluster.endpoints().len(), 3);
    assert!(
        cluster
            .endpoints()
            .iter()
            .all(|e| e.starts_with("https://127.0.0.1:"))
    );
    // kubeadm's layout on every member, and a client without a certificate is refused.
    let pki = cluster.member(0).pki().unwrap();
    for file in [
        "ca.crt",
        "server.crt",
        "server.key",
        "peer.crt",
        "peer.key",
        "healthcheck-client.crt",
        "healthcheck-client.key",
    ] {
        assert!(
            pki.dir.join(file).exists(),
            "{file} missing in {}",
            pki.dir.display()
        );
    }
    let mut anonymous = cluster.client_tls().unwrap();
    anonymous.client = pki.healthcheck_client.clone();
    etcdctl_with(
        &cluster.endpoints(),
        Some(&anonymous),
        Duration::from_secs(5),
        &["endpoint", "health"],
    )
    .expect("the health-check client certificate is accepted");
    let refused = etcdctl_with(
        &cluster.endpoints(),
        None,
        Duration::from_secs(2),
        &["get", "/mg/x"],
    );
    assert!(
        refused.is_err(),
        "a client without TLS got an answer: {refused:?}"
    );
    cluster.put("/mg/hello", "world").unwrap();
    assert_eq!(cluster.get("/mg/hello").unwrap().as_deref(), Some("world"));

    // A hung member keeps its process but stops answering.
    cluster.hang(0).unwrap();
    assert_eq!(cluster.member(0).state(), MemberState::Hung);
    assert!(cluster.member(0).pid().is_some());
    assert!(
        !cluster.is_healthy(0),
        "a SIGSTOPped member must not answer /health"
    );
    // If it was the leader, the others elect a new one within a few election timeouts.
    cluster.wait_writable(Duration::from_secs(10)).unwrap();
    cluster.put("/mg/during-hang", "1").unwrap();
    cluster.resume(0).unwrap();

    // A killed member: the other two keep quorum and serve writes.
    cluster.kill(1);
    assert!(cluster.member(1).pid().is_none());
    cluster.wait_writable(Duration::from_secs(10)).unwrap();
    cluster.put("/mg/during-kill", "2").unwrap();

    // Restart keeps the data dir: the member rejoins and catches up.
    cluster.restart(1).unwrap();
    cluster.wait_healthy(Duration::from_secs(20)).unwrap();
    assert!(cluster.is_healthy(0) && cluster.is_healthy(1) && cluster.is_healthy(2));
    assert_eq!(
        cluster.get("/mg/during-kill").unwrap().as_deref(),
        Some("2")
    );
    assert_eq!(
        cluster.get("/mg/during-hang").unwrap().as_deref(),
        Some("1")
    );
}

#[test]
fn learner_is_added_started_and_listed_as_learner() {
    let mut cluster = EtcdCluster::start(3).expect("start 3 members");
    let index = cluster.add_learner().expect("add learner");
    assert_eq!(index, 3);
    let members = cluster.member_list().unwrap();
    assert_eq!(members.len(), 4);
    let learner = members
        .iter()
        .find(|m| m.is_learner)
        .expect("a learner is listed");
    assert_eq!(
        learner.peer_urls,
        vec![cluster.member(3).peer_url().to_owned()]
    );
    assert_eq!(members.iter().filter(|m| m.is_learner).count(), 1);
    // The learner catches up and can be promoted by an independent client.
    let mut promoted = false;
    for _ in 0..50 {
        if cluster
            .etcdctl(&["member", "promote", &learner.id_hex()])
            .is_ok()
        {
            promoted = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(promoted, "the harness learner never became promotable");
    assert!(cluster.member_list().unwrap().iter().all(|m| !m.is_learner));
}

/// The harness's plain-HTTP exception (`EtcdCluster::start_plain_http`): no TLS anywhere.
#[test]
fn a_plain_http_cluster_is_only_made_when_asked_for() {
    let cluster = EtcdCluster::start_plain_http(1).expect("start 1 member");
    assert_eq!(cluster.security(), EtcdSecurity::PlainHttp);
    assert!(cluster.endpoints()[0].starts_with("http://127.0.0.1:"));
    assert!(cluster.client_tls().is_none() && cluster.member(0).pki().is_none());
    cluster.put("/mg/plain", "1").unwrap();
    assert_eq!(cluster.get("/mg/plain").unwrap().as_deref(), Some("1"));
}

#[test]
fn dropping_the_cluster_kills_every_member_and_removes_its_directory() {
    let cluster = EtcdCluster::start(1).expect("start 1 member");
    let pid = cluster.member(0).pid().unwrap();
    let dir = cluster.dir().to_path_buf();
    drop(cluster);
    assert!(
        !std::path::Path::new(&format!("/proc/{pid}")).exists(),
        "etcd {pid} survived"
    );
    assert!(!dir.exists(), "{} was not removed", dir.display());
}
