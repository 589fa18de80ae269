//! BMC reachability with the real binary on real etcd, the test playing the agents: each
//! report's answer lists the other hosts' BMCs without credentials; the reachability the
//! agents report is shown by `status` per BMC and steers the fence to an agent that reaches
//! the target's BMC.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::time::Duration;

use common::*;
use metalguard_api::duration::Timestamp;
use metalguard_api::protocol::*;
use metalguard_e2e::ports::reserve_port;

const UNREACHABLE: &str = "bmc 127.0.0.1:2623 did not answer get channel authentication \
                           capabilities after 4 attempts over 3.75s";

fn probe(host: &str, error: Option<&str>) -> BmcReachability {
    BmcReachability {
        host: host.to_owned(),
        reachable: error.is_none(),
        checked_at: Timestamp(1),
        error: error.map(str::to_owned),
        check: None,
    }
}

/// Posts `report` as its host, asking for the BMC targets as today's agents do, and returns
/// the raw answer.
async fn post(lab: &Lab, port: u16, report: &AgentReport) -> String {
    let response = client(&lab.tls(), Some(&report.host))
        .post(url(port, &report_path_with_bmc_targets(&report.host)))
        .json(report)
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 200, "report of {}", report.host);
    response.text().await.unwrap()
}

#[tokio::test(flavor = "multi_thread")]
async fn reports_carry_the_bmc_targets_and_the_fence_goes_to_an_agent_that_reaches_the_bmc() {
    let lab = Lab::start();
    let port = reserve_port().unwrap();
    let controller = lab.controller("ctl-a", &port);
    let w1 = client(&lab.tls(), Some("w-1"));
    wait_leader(&w1, port.port(), Duration::from_secs(15)).await;

    // cp-1 is told the BMCs of w-1 and w-2 (cp-1 has none), with no credentials.
    let mut cp1 = report("cp-1", 1);
    cp1.etcd = Some(single_voter_view());
    let answer = post(&lab, port.port(), &cp1).await;
    assert!(
        !answer.contains("hunter2") && !answer.contains("password"),
        "{answer}"
    );
    let ack: ReportAck = serde_json::from_str(&answer).unwrap();
    let targets: Vec<(&str, &str)> = ack
        .bmc_targets
        .iter()
        .map(|t| (t.host.as_str(), t.bmc_address.as_str()))
        .collect();
    assert_eq!(
        targets,
        [
            ("w-1", "ipmi://127.0.0.1:1623"),
            ("w-2", "ipmi://127.0.0.1:2623")
        ]
    );
    // An agent that predates the targets does not ask for them and gets an answer without
    // the field, which it can read (it refuses unknown fields).
    let old_agent = client(&lab.tls(), Some("cp-1"))
        .post(url(port.port(), &report_path("cp-1")))
        .json(&report("cp-1", 2))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(!old_agent.contains("bmc_targets"), "{old_agent}");
    // w-1 is not told its own BMC.
    let answer = post(&lab, port.port(), &report("w-1", 2)).await;
    let ack: ReportAck = serde_json::from_str(&answer).unwrap();
    assert_eq!(
        ack.bmc_targets
            .iter()
            .map(|t| t.host.as_str())
            .collect::<Vec<_>>(),
        ["w-2"]
    );

    // cp-1 (first by name, the executor so far) cannot reach w-2's BMC; w-1 can.
    cp1.sequence = 3;
    cp1.bmc_reachability = vec![probe("w-1", None), probe("w-2", Some(UNREACHABLE))];
    post(&lab, port.port(), &cp1).await;
    let mut w1_report = report("w-1", 3);
    w1_report.bmc_reachability = vec![probe("w-2", None)];
    post(&lab, port.port(), &w1_report).await;

    let inventory = lab.inventory("ctl-a", port.port());
    // A changed report is stored within a second of the host's previous write.
    let want = format!(
        "  w-2 (ipmi://127.0.0.1:2623): reached by w-1\n    NOT reached by cp-1: {UNREACHABLE}\n"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    let status = loop {
        let status = run(&["status", "--inventory", inventory.to_str().unwrap()]);
        if status.contains(&want) || std::time::Instant::now() > deadline {
            break status;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert!(status.contains(&want), "{status}");
    assert!(
        status.contains("  w-1 (ipmi://127.0.0.1:1623): reached by cp-1\n"),
        "{status}"
    );

    run(&[
        "fence",
        "w-2",
        "--reason",
        "test",
        "--force",
        "--inventory",
        inventory.to_str().unwrap(),
    ]);
    let batch = poll(&w1, port.port(), "w-1", Duration::from_secs(10)).await;
    assert!(
        matches!(&batch.commands[..], [c] if matches!(&c.kind, CommandKind::Fence(f) if f.target == "w-2" && f.action == PowerAction::Off)),
        "{batch:?}\n{}",
        controller.log_tail(80)
    );
    let cp1_client = client(&lab.tls(), Some("cp-1"));
    let nothing = poll(&cp1_client, port.port(), "cp-1", Duration::ZERO).await;
    assert!(nothing.commands.is_empty(), "{nothing:?}");
}
