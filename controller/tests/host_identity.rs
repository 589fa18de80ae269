//! The host-identity handshake with the real binary on real etcd, the test playing the
//! agents: a controller that takes `host_identity` says so only to an agent that asks, takes
//! reports carrying it, and refuses one beyond the protocol's bounds naming the field (the
//! agent then resends without it; `agent/src/daemon/link.rs`, `IdentityOffer`).

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::*;
use metalguard_api::identity::SystemIdentity;
use metalguard_api::protocol::*;
use metalguard_e2e::ports::reserve_port;

/// Posts `report` to `path` as its host: the status and the raw answer.
async fn post(lab: &Lab, port: u16, path: &str, report: &AgentReport) -> (u16, String) {
    let response = client(&lab.tls(), Some(&report.host))
        .post(url(port, path))
        .json(report)
        .send()
        .await
        .unwrap();
    let status = response.status().as_u16();
    (status, response.text().await.unwrap())
}

fn identity(uuid_absent: &str) -> SystemIdentity {
    let mut identity = SystemIdentity::default();
    identity.set_uuid(Err(uuid_absent.to_owned()));
    identity.set_serial_number(Ok("SN-CP-1"));
    identity
}

#[tokio::test(flavor = "multi_thread")]
async fn the_controller_takes_the_identity_only_from_agents_that_ask() {
    let lab = Lab::start();
    let port = reserve_port().unwrap();
    let controller = lab.controller("ctl-a", &port);
    let w1 = client(&lab.tls(), Some("w-1"));
    wait_leader(&w1, port.port(), Duration::from_secs(15)).await;
    let port = port.port();

    // An agent that predates the field does not ask and gets no word of it (it would refuse
    // an answer with an unknown field).
    let (status, answer) = post(&lab, port, &report_path("cp-1"), &report("cp-1", 1)).await;
    assert_eq!(status, 200, "{answer}");
    assert!(!answer.contains("host_identity"), "{answer}");

    // Today's agent asks, and is told.
    let asking = report_path_with_bmc_targets("cp-1");
    let (status, answer) = post(&lab, port, &asking, &report("cp-1", 2)).await;
    assert_eq!(status, 200, "{answer}");
    let ack: ReportAck = serde_json::from_str(&answer).unwrap();
    assert!(ack.host_identity, "{answer}");

    // Its next reports carry the identity, and are taken.
    let mut with = report("cp-1", 3);
    with.host_identity = Some(identity(
        "/sys/class/dmi/id/product_uuid: permission denied",
    ));
    let (status, answer) = post(&lab, port, &asking, &with).await;
    assert_eq!(status, 200, "{answer}\n{}", controller.log_tail(40));

    // Beyond the bounds: refused with 422 naming the field, never the value.
    let long = "x".repeat(metalguard_api::limits::MAX_TEXT + 1);
    let mut beyond = report("cp-1", 4);
    beyond.host_identity = Some(identity(&long));
    let (status, answer) = post(&lab, port, &asking, &beyond).await;
    assert_eq!(status, 422, "{answer}");
    assert!(answer.contains("host_identity.uuid_absent"), "{answer}");
    assert!(!answer.contains(&long), "{answer}");
}
