//! A `FenceRequest` on a real kube-apiserver: answered once with its timeline (status
//! server-side applied), the target's Node tainted `node.kubernetes.io/out-of-service` only
//! after the power-off is verified (its other taints kept, the Node never deleted), the taint
//! lifted when the host is back, and the request `Succeeded`.

#![cfg(feature = "kubernetes")]
// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod kubelab;

use std::time::Duration;

use kubelab::{KubeLab, LabOptions, MG, NS, check_spec, node_template};
use metalguard_api::protocol::Outcome;
use serde_json::{Value, json};

const OOS: &str = "node.kubernetes.io/out-of-service";

fn fence(lab: &KubeLab) -> Value {
    lab.admin()
        .get(&format!("{MG}/fencerequests/fence-w-2"))
        .unwrap()
}

#[test]
fn a_fence_request_is_answered_once_and_taints_the_node_out_of_service_after_verified_off() {
    let mut lab = KubeLab::start(&LabOptions {
        check: check_spec(&json!("100%"), "OutOfServiceTaint"),
        ..LabOptions::default()
    });
    lab.start_controller("controller-0");
    lab.wait_leading("w-1", Duration::from_secs(60));
    lab.admin()
        .create(
            &format!("{MG}/fencerequests"),
            &json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "FenceRequest",
                "metadata": {"name": "fence-w-2", "namespace": NS},
                "spec": {"target": "w-2", "reason": "kernel hung, console frozen", "force": true}}),
        )
        .unwrap();
    lab.wait("the request is answered", Duration::from_secs(20), |lab| {
        fence(lab)["status"]["phase"] == "InProgress"
    });
    let status = &fence(&lab)["status"];
    assert_eq!(status["remediationId"], "remediation/w-2/1");
    let first = &status["timeline"][0];
    assert!(
        first["message"]
            .as_str()
            .unwrap()
            .starts_with("accepted by controller-0"),
        "{first}"
    );
    assert_eq!(
        lab.host("w-2")["status"]["remediation"]["forced"],
        "kernel hung, console frozen"
    );

    let off = "remediation/w-2/1/power-off";
    lab.agents.wait_offered(off, Duration::from_secs(20));
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        !lab.taints("w-2").iter().any(|t| t == OOS),
        "tainted before the power-off was verified"
    );
    lab.kubelets["w-2"].stop();
    lab.agents.set_live("w-2", false);
    assert_eq!(lab.agents.finish(off, Outcome::Succeeded), 200);
    lab.wait("the out-of-service taint", Duration::from_secs(20), |lab| {
        lab.taints("w-2").iter().any(|t| t == OOS)
    });
    let node = lab.node("w-2").unwrap();
    let taints = node["spec"]["taints"].as_array().unwrap();
    let oos = taints.iter().find(|t| t["key"] == OOS).unwrap();
    assert_eq!(
        (oos["value"].as_str(), oos["effect"].as_str()),
        (Some("nodeshutdown"), Some("NoExecute"))
    );
    assert!(taints.iter().any(|t| t["key"] == "dedicated"), "{taints:?}");

    let on = "remediation/w-2/1/power-on";
    lab.agents.wait_offered(on, Duration::from_secs(20));
    assert_eq!(lab.agents.finish(on, Outcome::Succeeded), 200);
    lab.wait("WaitingForNode", Duration::from_secs(20), |lab| {
        lab.phase("w-2") == "WaitingForNode"
    });
    // Powered on but not booted: the Node's last `Ready=True` was posted before the power-off
    // (no node-lifecycle controller runs here to mark it Unknown), which proves nothing.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(lab.phase("w-2"), "WaitingForNode");
    assert!(lab.taints("w-2").iter().any(|t| t == OOS));
    // The host booted: its kubelet finds its Node (never deleted) and reports Ready.
    lab.kubelets["w-2"]
        .register_again(&node_template("w-2"))
        .unwrap();
    lab.agents.set_live("w-2", true);
    lab.wait("the request Succeeded", Duration::from_secs(30), |lab| {
        fence(lab)["status"]["phase"] == "Succeeded"
    });
    let timeline: Vec<String> = fence(&lab)["status"]["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["remediationPhase"].as_str().unwrap().to_owned())
        .collect();
    assert_eq!(timeline.first().map(String::as_str), Some("Gated"));
    assert_eq!(timeline.last().map(String::as_str), Some("Done"));
    for phase in [
        "PoweringOff",
        "VerifiedOff",
        "PoweringOn",
        "WaitingForNode",
        "Restored",
    ] {
        assert!(timeline.iter().any(|p| p == phase), "{phase}: {timeline:?}");
    }
    let taints = lab.taints("w-2");
    assert!(!taints.iter().any(|t| t == OOS), "{taints:?}");
    assert!(taints.iter().any(|t| t == "dedicated"), "{taints:?}");

    // Answered once: rounds go by, no second remediation, no other command.
    std::thread::sleep(Duration::from_secs(3));
    assert_eq!(
        lab.agents.offered().keys().cloned().collect::<Vec<_>>(),
        [off, on]
    );
    assert_eq!(
        lab.host("w-2")["status"]["remediation"]["id"],
        "remediation/w-2/1"
    );
    assert!(
        !lab.controller_calls()
            .iter()
            .any(|e| e.verb == "delete" && e.resource == "nodes")
    );
    lab.assert_nothing_forbidden();
}
