//! What the leader observes, read back from a real kube-apiserver: `GuardedHost` status
//! (power, agent, etcd member, conditions) and `GuardedControlPlane` status (voters, leader,
//! quorum tolerance, disruption budget, conditions), written only when they change; a silent
//! agent's Node condition turned `MetalguardAgentReady=Unknown`; the leader's label on its
//! own Pod object, removed when another identity takes the Lease.

#![cfg(feature = "kubernetes")]
// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod kubelab;

use std::time::{Duration, SystemTime};

use kubelab::{KubeLab, LabOptions, check_spec};
use metalguard_api::protocol::Outcome;
use metalguard_e2e::kube::time::rfc3339_micros;
use serde_json::{Value, json};

const LEASE: &str =
    "/apis/coordination.k8s.io/v1/namespaces/metalguard-system/leases/metalguard-controller";

fn condition<'a>(conditions: &'a Value, type_: &str) -> &'a Value {
    conditions
        .as_array()
        .and_then(|cs| cs.iter().find(|c| c["type"] == type_))
        .unwrap_or(&Value::Null)
}

#[test]
fn statuses_show_power_agent_member_and_quorum_and_a_silent_agent_goes_unknown() {
    let mut check = check_spec(&json!(1), "Delete");
    check["agentHeartbeatTimeout"] = json!("10s");
    let mut lab = KubeLab::start(&LabOptions {
        control_plane: vec!["cp-1"],
        check,
        ..LabOptions::default()
    });
    lab.agents.report_etcd_voter("cp-1");
    kubelab::create_control_plane(lab.admin(), 1);
    lab.start_controller("controller-0");
    lab.wait_leading("w-1", Duration::from_secs(60));

    lab.wait("control plane status", Duration::from_secs(20), |lab| {
        lab.control_plane()["status"]["etcdVoters"] == 1
    });
    let status = lab.control_plane()["status"].clone();
    assert_eq!(status["replicas"], 1, "{status}");
    assert_eq!(status["etcdLearners"], 0, "{status}");
    assert_eq!(status["etcdLeader"], "cp-1", "{status}");
    assert_eq!(status["quorumTolerance"], 0, "{status}");
    assert_eq!(status["minAvailable"], 0, "{status}");
    assert_eq!(status["observedGeneration"], 1, "{status}");
    let quorum = condition(&status["conditions"], "QuorumSafe");
    assert_eq!(
        (&quorum["status"], &quorum["reason"]),
        (&json!("False"), &json!("QuorumAtRisk")),
        "one voter: any failure loses quorum: {status}"
    );
    assert_eq!(
        condition(&status["conditions"], "Scaling")["status"],
        "False"
    );

    lab.wait(
        "cp-1's member in its status",
        Duration::from_secs(20),
        |lab| lab.host("cp-1")["status"]["etcdMember"]["leader"] == true,
    );
    let cp = lab.host("cp-1")["status"].clone();
    assert_eq!(cp["etcdMember"]["learner"], false, "{cp}");
    assert_eq!(cp["etcdMember"]["healthy"], true, "{cp}");
    assert!(
        cp["etcdMember"]["id"]
            .as_str()
            .unwrap()
            .chars()
            .all(|c| c.is_ascii_hexdigit())
    );
    assert_eq!(cp["power"], "On", "its agent reports: {cp}");
    assert!(cp["powerObservedTime"].is_string(), "{cp}");
    assert!(!cp["agent"]["version"].as_str().unwrap().is_empty(), "{cp}");
    let w1 = lab.host("w-1")["status"].clone();
    assert_eq!(
        condition(&w1["conditions"], "Healthy")["status"],
        "True",
        "{w1}"
    );
    assert_eq!(
        condition(&w1["conditions"], "Fenceable")["status"],
        "True",
        "{w1}"
    );

    // Nothing changes for 3 s (several plan rounds): at most one write of w-1's status (its
    // heartbeat time is refreshed every half timeout, 5 s), none per round.
    let before = lab.controller_calls().len();
    std::thread::sleep(Duration::from_secs(3));
    let writes = lab.controller_calls()[before..]
        .iter()
        .filter(|e| e.verb == "patch" && e.resource == "guardedhosts" && e.name == "w-1")
        .count();
    assert!(
        writes <= 1,
        "{writes} writes of w-1's status in 3 quiet seconds"
    );

    // w-2's agent goes silent (its kubelet still posts Ready): after 10 s its Node's
    // MetalguardAgentReady is Unknown, and it is unhealthy.
    lab.agents.set_live("w-2", false);
    let silent = SystemTime::now();
    lab.wait(
        "MetalguardAgentReady=Unknown on w-2",
        Duration::from_secs(30),
        |lab| {
            lab.node("w-2").is_some_and(|n| {
                condition(&n["status"]["conditions"], "MetalguardAgentReady")["status"] == "Unknown"
            })
        },
    );
    assert!(silent.elapsed().unwrap() >= Duration::from_secs(9));
    let node = lab.node("w-2").unwrap();
    let ready = condition(&node["status"]["conditions"], "MetalguardAgentReady");
    assert_eq!(ready["reason"], "AgentSilent", "{ready}");
    assert!(
        ready["message"]
            .as_str()
            .unwrap()
            .contains("heartbeat timeout 10s"),
        "{ready}"
    );
    assert_eq!(
        condition(&node["status"]["conditions"], "Ready")["status"],
        "True"
    );

    // The silent host is remediated: once its power-off is verified, its status says Off.
    let off = "remediation/w-2/1/power-off";
    lab.agents.wait_offered(off, Duration::from_secs(30));
    let w2 = lab.host("w-2")["status"].clone();
    assert_eq!(
        condition(&w2["conditions"], "Healthy")["status"],
        "False",
        "{w2}"
    );
    assert_eq!(
        condition(&w2["conditions"], "Remediating")["status"],
        "True",
        "{w2}"
    );
    lab.kubelets["w-2"].stop();
    let verified = SystemTime::now();
    assert_eq!(lab.agents.finish(off, Outcome::Succeeded), 200);
    lab.wait("w-2's power Off", Duration::from_secs(20), |lab| {
        lab.host("w-2")["status"]["power"] == "Off"
    });
    let w2 = lab.host("w-2")["status"].clone();
    // The remediation's records are still there next to the observed fields (one manager).
    assert!(w2["remediation"]["phase"].is_string(), "{w2}");
    assert_eq!(w2["operations"][0]["id"], off, "{w2}");
    let observed: SystemTime = k8s_time(&w2["powerObservedTime"]);
    assert!(
        observed + Duration::from_secs(1) >= verified,
        "power Off observed before it was verified: {w2}"
    );
    lab.assert_nothing_forbidden();
}

fn k8s_time(v: &Value) -> SystemTime {
    let text = v.as_str().unwrap();
    let t: k8s_openapi::jiff::Timestamp = text.parse().unwrap();
    SystemTime::UNIX_EPOCH + Duration::from_secs(u64::try_from(t.as_second()).unwrap())
}

#[test]
fn the_leader_labels_its_pod_and_removes_the_label_when_it_loses_the_lease() {
    let mut lab = KubeLab::start(&LabOptions::default());
    lab.start_controller_in_pod("controller-0");
    lab.wait(
        "the leader label on pod controller-0",
        Duration::from_secs(60),
        |lab| {
            lab.pod_labels("controller-0")
                .get("metalguard.io/leader")
                .map(String::as_str)
                == Some("true")
        },
    );
    // The Deployment's own label is kept.
    assert_eq!(
        lab.pod_labels("controller-0")["app.kubernetes.io/name"],
        "metalguard-controller"
    );
    // Another identity holds the Lease: the label goes.
    let taken = SystemTime::now();
    lab.admin()
        .merge_patch(
            LEASE,
            &json!({"spec": {"holderIdentity": "controller-elsewhere",
                "acquireTime": rfc3339_micros(taken), "renewTime": rfc3339_micros(taken),
                "leaseDurationSeconds": 15}}),
        )
        .unwrap();
    lab.wait("the leader label removed", Duration::from_secs(10), |lab| {
        !lab.pod_labels("controller-0")
            .contains_key("metalguard.io/leader")
    });
    // When that Lease runs out, this controller leads again and labels its pod again.
    lab.wait("the leader label back", Duration::from_secs(60), |lab| {
        lab.pod_labels("controller-0")
            .get("metalguard.io/leader")
            .map(String::as_str)
            == Some("true")
    });
    lab.assert_nothing_forbidden();
}
