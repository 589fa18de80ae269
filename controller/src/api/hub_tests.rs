//! Unit tests of [`super`] (hub.rs).

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::OperationId;
use metalguard_api::protocol::CommandKind;

use super::*;

/// `host`'s BMC as every agent is told of it (no credentials).
fn target(host: &str) -> BmcTarget {
    BmcTarget {
        host: host.into(),
        bmc_address: format!("ipmi://{host}-bmc"),
        tls: metalguard_api::protocol::BmcTrust::SystemRoots,
        credentials: None,
        expected_identity: None,
        credentials_id: None,
        credentials_new: false,
        check_request: None,
    }
}

fn command(id: &str) -> Command {
    Command {
        operation_id: OperationId(id.into()),
        issued_at: Timestamp(0),
        kind: CommandKind::EtcdPromote { member_id: 1 },
        term: 0,
    }
}

#[tokio::test]
async fn leadership_expires_by_itself() {
    let (hub, _rx) = Hub::new();
    hub.set_leader_until(Some(Instant::now() + Duration::from_millis(30)));
    assert!(hub.is_leader());
    tokio::time::sleep(Duration::from_millis(40)).await;
    assert!(!hub.is_leader());
}

#[tokio::test]
async fn a_waiting_poll_returns_as_soon_as_a_command_is_published() {
    let (hub, _rx) = Hub::new();
    let waiter = {
        let hub = hub.clone();
        tokio::spawn(async move { hub.poll("cp-1", Duration::from_secs(30)).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert_eq!(hub.agents_polling(), 1);
    let started = std::time::Instant::now();
    let pending = BTreeMap::from([("cp-1".to_owned(), vec![command("op-1")])]);
    hub.publish(&pending);
    let got = waiter.await.unwrap();
    assert_eq!(got, vec![command("op-1")]);
    assert!(started.elapsed() < Duration::from_millis(100));
    assert_eq!(hub.agents_polling(), 0);
}

#[test]
fn an_agent_is_told_every_bmc_but_its_own() {
    let (hub, _rx) = Hub::new();
    assert!(hub.bmc_targets_for("cp-1", true).is_empty());
    hub.set_bmc_targets(vec![target("cp-1"), target("cp-2"), target("cp-3")]);
    assert_eq!(
        hub.bmc_targets_for("cp-1", true),
        vec![target("cp-2"), target("cp-3")]
    );
    assert_eq!(hub.bmc_targets_for("w-9", false).len(), 3);
}

#[test]
fn only_the_would_be_executor_that_asks_gets_a_bmcs_credentials() {
    let (hub, _rx) = Hub::new();
    hub.set_bmc_targets(vec![target("cp-1"), target("cp-2"), target("cp-3")]);
    let credentials = metalguard_api::protocol::BmcCredentials {
        username: "admin".into(),
        password: metalguard_api::protocol::Secret::new("hunter2"),
    };
    hub.set_check_grants(BTreeMap::from([(
        "cp-3".to_owned(),
        CheckGrant {
            executor: "cp-1".into(),
            credentials: credentials.clone(),
            expected_identity: None,
            credentials_id: "c1".into(),
            credentials_new: true,
            check_request: Some("r1".into()),
        },
    )]));
    let credentialed = |host: &str, checks: bool| -> Vec<String> {
        hub.bmc_targets_for(host, checks)
            .into_iter()
            .filter(|t| t.credentials.is_some())
            .map(|t| t.host)
            .collect()
    };
    assert_eq!(credentialed("cp-1", true), vec!["cp-3".to_owned()]);
    assert!(credentialed("cp-1", false).is_empty(), "did not ask");
    assert!(credentialed("cp-2", true).is_empty(), "not the executor");
    let given = hub.bmc_targets_for("cp-1", true);
    assert_eq!(given[1].credentials, Some(credentials));
    assert_eq!(given[1].credentials_id.as_deref(), Some("c1"));
    assert!(given[1].credentials_new);
    assert_eq!(given[1].check_request.as_deref(), Some("r1"));
    let other = hub.bmc_targets_for("cp-2", true);
    assert!(
        other.iter().all(|t| t.check_request.is_none()),
        "a request goes with the credentials, only to the executor"
    );
}

#[test]
fn a_report_is_told_only_which_of_its_own_holds_were_released() {
    let (hub, _rx) = Hub::new();
    let hold = |id: &str| Hold {
        id: id.into(),
        target: "cp-1".into(),
        since: Timestamp(1),
        by: "alice on cp-2".into(),
        reason: "r".into(),
        action: "off".into(),
    };
    let report: AgentReport = serde_json::from_value(serde_json::json!({
        "host": "cp-2", "agent_version": "t", "sequence": 1, "sent_at": 1,
    }))
    .unwrap();
    let report = AgentReport {
        holds: vec![hold("cp-2/1"), hold("cp-2/2")],
        ..report
    };
    assert!(hub.released_among(&report).is_empty());
    hub.set_released_holds(["cp-2/2".to_owned(), "cp-3/9".to_owned()].into());
    assert_eq!(hub.released_among(&report), ["cp-2/2"]);
}

#[tokio::test]
async fn a_poll_for_another_host_sees_nothing_and_times_out() {
    let (hub, _rx) = Hub::new();
    hub.publish(&BTreeMap::from([(
        "cp-1".to_owned(),
        vec![command("op-1")],
    )]));
    assert!(hub.poll("cp-2", Duration::from_millis(50)).await.is_empty());
    assert_eq!(hub.poll("cp-1", Duration::from_millis(50)).await.len(), 1);
    hub.set_leader_until(Some(Instant::now() + Duration::from_secs(60)));
    assert!(hub.is_leader());
    hub.set_leader_until(None);
    assert!(!hub.is_leader());
    assert!(hub.poll("cp-1", Duration::from_millis(50)).await.is_empty());
}

fn identity(host: &str) -> CertIdentity {
    CertIdentity {
        host: host.into(),
        serial: "0a:0b".into(),
        sha256: "ff".repeat(32),
        not_after: 0,
    }
}

#[test]
fn only_inventory_hosts_that_are_not_retired_or_revoked_are_admitted() {
    let (hub, _rx) = Hub::new();
    assert!(
        hub.admits(&identity("cp-1")).is_err(),
        "nothing is admitted before the inventory"
    );
    hub.set_hosts(["cp-1".to_owned(), "cp-2".to_owned()]);
    assert_eq!(hub.admits(&identity("cp-1")), Ok(()));
    assert_eq!(
        hub.agent_certificates(),
        BTreeMap::from([("cp-1".to_owned(), 0)]),
        "the admitted certificate's end of validity is kept"
    );
    let stranger = hub.admits(&identity("mallory")).unwrap_err();
    assert!(
        stranger.contains("mallory is not in the inventory"),
        "{stranger}"
    );
    hub.set_retired(BTreeSet::from(["cp-2".to_owned()]));
    assert!(
        hub.admits(&identity("cp-2"))
            .unwrap_err()
            .contains("retired")
    );
    *hub.revoked().write().unwrap() =
        crate::pki::revocation::DenyList::parse(std::path::Path::new("r"), "serial 0a:0b\n")
            .unwrap();
    assert!(
        hub.admits(&identity("cp-1"))
            .unwrap_err()
            .contains("revoked")
    );
    // The inventory in force: a reload that drops a host drops its admission.
    *hub.revoked().write().unwrap() = crate::pki::revocation::DenyList::default();
    hub.set_hosts(["cp-2".to_owned()]);
    assert!(hub.admits(&identity("cp-1")).is_err());
}
