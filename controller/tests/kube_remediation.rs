//! The Kubernetes backend on a real kube-apiserver, as its ServiceAccount under the shipped
//! RBAC: a NotReady worker is powered off, its Node deleted only after the agent verified
//! the power-off, powered on, and its labels and annotations merged onto the new Node;
//! status is server-side applied and owned by the controller's field manager; Events tell
//! each step. Two unhealthy workers with `maxUnhealthy: 1` short-circuit: nothing is done.

#![cfg(feature = "kubernetes")]
// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod kubelab;

use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

use kubelab::{KubeLab, LabOptions, MG, check_spec};
use metalguard_api::protocol::{CommandKind, Outcome, PowerAction};
use metalguard_e2e::kube::kubelet::NodeTemplate;
use serde_json::{Value, json};

const OFF: &str = "remediation/w-3/1/power-off";
const ON: &str = "remediation/w-3/1/power-on";

fn string_map(v: &Value) -> BTreeMap<String, String> {
    serde_json::from_value(v.clone()).unwrap_or_default()
}

/// Whether `events` holds `wanted` in this order (other events may come between).
fn in_order(events: &[String], wanted: &[&str]) -> bool {
    let mut rest = events.iter();
    wanted.iter().all(|w| rest.any(|e| e == w))
}

#[test]
fn an_unhealthy_node_is_deleted_only_after_verified_off_and_its_metadata_restored() {
    let mut lab = KubeLab::start(&LabOptions {
        control_plane: vec!["cp-1"],
        ..LabOptions::default()
    });
    lab.agents.report_etcd_voter("cp-1");
    lab.start_controller("controller-0");
    lab.wait_leading("w-1", Duration::from_secs(60));

    // Agents' conditions are mirrored onto their Nodes (strategic merge on nodes/status).
    lab.wait(
        "agent conditions on Node w-1",
        Duration::from_secs(20),
        |lab| {
            lab.node("w-1").is_some_and(|n| {
                n["status"]["conditions"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|c| c["type"] == "MetalguardAgentReady" && c["status"] == "True")
            })
        },
    );
    // cp-1 hosts the etcd voter: the quorum hook is placed on its GuardedHost.
    lab.wait("the quorum hook on cp-1", Duration::from_secs(20), |lab| {
        !kubelab::quorum_hooks(&lab.host("cp-1")).is_empty()
    });

    // w-3's kubelet reports NotReady.
    lab.kubelets["w-3"].set_ready(false).unwrap();
    let off = lab.agents.wait_offered(OFF, Duration::from_secs(30));
    let CommandKind::Fence(fence) = &off.command.kind else {
        panic!("{off:?}")
    };
    assert_eq!(
        (fence.target.as_str(), fence.action),
        ("w-3", PowerAction::Off)
    );
    assert_eq!(fence.credentials.password.expose(), "hunter2");
    assert_ne!(off.agent, "w-3");
    // Intent first: the operation and PoweringOff are in status before the command was offered.
    let host = lab.host("w-3");
    assert_eq!(host["status"]["remediation"]["phase"], "PoweringOff");
    assert_eq!(host["status"]["operations"][0]["id"], OFF);
    let managers: Vec<(String, String, String)> = host["metadata"]["managedFields"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let s = |k: &str| m[k].as_str().unwrap_or("").to_owned();
            (s("manager"), s("operation"), s("subresource"))
        })
        .collect();
    assert!(
        managers.contains(&(
            "metalguard-controller".into(),
            "Apply".into(),
            "status".into()
        )),
        "{managers:?}"
    );
    // Another manager cannot take the controller's fields without forcing.
    let err = lab
        .admin()
        .apply(
            &format!("{MG}/guardedhosts/w-3/status"),
            "someone-else",
            &json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "GuardedHost",
                "metadata": {"name": "w-3"},
                "status": {"remediation": {"phase": "Done"}}}),
            false,
        )
        .unwrap_err();
    assert_eq!(err.api_status(), Some(409), "{err}");
    assert!(err.to_string().contains("metalguard-controller"), "{err}");

    // Unverified: three plan rounds later the Node is still there and untouched.
    std::thread::sleep(Duration::from_secs(3));
    assert!(lab.node("w-3").is_some());
    assert_eq!(lab.phase("w-3"), "PoweringOff");

    // The host is off (kubelet and agent silent); the agent reports the verified power-off.
    lab.kubelets["w-3"].stop();
    lab.agents.set_live("w-3", false);
    let verified_at = SystemTime::now();
    assert_eq!(lab.agents.finish(OFF, Outcome::Succeeded), 200);
    lab.wait("Node w-3 deleted", Duration::from_secs(20), |lab| {
        lab.node("w-3").is_none()
    });
    let on = lab.agents.wait_offered(ON, Duration::from_secs(20));
    assert_eq!(on.agent, off.agent);
    let deletes: Vec<_> = lab
        .controller_calls()
        .into_iter()
        .filter(|e| e.verb == "delete" && e.resource == "nodes")
        .collect();
    assert_eq!(deletes.len(), 1, "{deletes:?}");
    assert_eq!(deletes[0].name, "w-3");
    assert!(
        deletes[0].received.unwrap() > verified_at,
        "the Node was deleted before the power-off was verified"
    );
    // The backup is in status while the host is away.
    let backup = &lab.host("w-3")["status"]["remediation"]["nodeBackup"];
    assert_eq!(
        string_map(&backup["labels"]),
        BTreeMap::from([
            ("kubernetes.io/hostname".to_owned(), "w-3".to_owned()),
            ("team".to_owned(), "storage".to_owned())
        ])
    );
    assert_eq!(
        string_map(&backup["annotations"]),
        BTreeMap::from([("rack".to_owned(), "r7".to_owned())])
    );

    // Powered on: a new Node registers with its own annotation value and without `team`.
    assert_eq!(lab.agents.finish(ON, Outcome::Succeeded), 200);
    lab.wait("WaitingForNode", Duration::from_secs(20), |lab| {
        lab.phase("w-3") == "WaitingForNode"
    });
    lab.kubelets["w-3"]
        .register_again(&NodeTemplate::named("w-3").annotation("rack", "r9"))
        .unwrap();
    lab.agents.set_live("w-3", true);
    lab.wait("remediation of w-3 Done", Duration::from_secs(30), |lab| {
        lab.phase("w-3") == "Done"
    });
    let node = lab.node("w-3").unwrap();
    assert_eq!(node["metadata"]["labels"]["team"], "storage");
    assert_eq!(
        node["metadata"]["annotations"]["rack"], "r9",
        "the new Node's value wins"
    );
    assert!(
        lab.host("w-3")["status"]["remediation"]
            .get("nodeBackup")
            .is_none()
    );

    let reasons = lab.host_event_reasons("w-3");
    assert!(
        in_order(
            &reasons,
            &[
                "PowerOff",
                "VerifyPowerOff",
                "BackupNodeMetadata",
                "DeleteNode",
                "PowerOn",
                "VerifyPowerOn",
                "RestoreNodeMetadata",
                "Complete"
            ]
        ),
        "{reasons:?}"
    );
    let check = lab
        .admin()
        .get(&format!("{MG}/hosthealthchecks/workers"))
        .unwrap();
    assert_eq!(check["status"]["expectedHosts"], 3, "{check}");
    assert_eq!(
        check["status"]["conditions"][0]["status"], "True",
        "{check}"
    );
    lab.assert_nothing_forbidden();
}

#[test]
fn two_unhealthy_with_max_unhealthy_one_short_circuit_and_say_why() {
    let mut lab = KubeLab::start(&LabOptions {
        check: check_spec(&json!(1), "Delete"),
        ..LabOptions::default()
    });
    lab.kubelets["w-2"].set_ready(false).unwrap();
    lab.kubelets["w-3"].set_ready(false).unwrap();
    lab.start_controller("controller-0");
    lab.wait_leading("w-1", Duration::from_secs(60));
    lab.wait("RemediationAllowed=False", Duration::from_secs(30), |lab| {
        let check = lab
            .admin()
            .get(&format!("{MG}/hosthealthchecks/workers"))
            .unwrap();
        check["status"]["conditions"][0]["status"] == "False"
    });
    let check = lab
        .admin()
        .get(&format!("{MG}/hosthealthchecks/workers"))
        .unwrap();
    let condition = &check["status"]["conditions"][0];
    assert_eq!(condition["type"], "RemediationAllowed");
    assert_eq!(condition["reason"], "TooManyUnhealthy");
    assert_eq!(check["status"]["remediationsAllowed"], 0);
    lab.wait("the short-circuit events", Duration::from_secs(10), |lab| {
        lab.events().iter().any(|(kind, _, _, reason, _)| {
            kind == "HostHealthCheck" && reason == "RemediationShortCircuited"
        })
    });
    let events = lab.events();
    for host in ["w-2", "w-3"] {
        assert!(
            events
                .iter()
                .any(|(kind, name, type_, reason, note)| kind == "GuardedHost"
                    && name == host
                    && type_ == "Warning"
                    && reason == "Refused"
                    && note.contains("short-circuited")),
            "{events:?}"
        );
    }
    // Rounds go by: nothing is offered, recorded or done to a Node; each event was said once.
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        lab.agents.offered().is_empty(),
        "{:?}",
        lab.agents.offered()
    );
    for host in ["w-2", "w-3"] {
        assert!(lab.host(host)["status"].get("remediation").is_none());
        // (The API server's TaintNodesByCondition admission put `not-ready` there at
        // registration; no node-lifecycle controller runs here to lift it.)
        let taints = lab.taints(host);
        assert!(
            lab.node(host).is_some()
                && !taints
                    .iter()
                    .any(|t| t == "node.kubernetes.io/out-of-service"),
            "{taints:?}"
        );
    }
    let short_circuits = lab
        .events()
        .iter()
        .filter(|(_, _, _, reason, _)| reason == "RemediationShortCircuited")
        .count();
    assert_eq!(short_circuits, 1);
    assert!(
        !lab.controller_calls()
            .iter()
            .any(|e| e.resource == "nodes" && (e.verb == "delete" || e.verb == "patch"))
    );
    lab.assert_nothing_forbidden();
}
