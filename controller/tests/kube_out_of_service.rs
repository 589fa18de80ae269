//! With kube-controller-manager running (node lifecycle, taint eviction, pod GC): a host
//! hangs, its Node goes `Unknown`, its pod is evicted and stays `Terminating` (no kubelet
//! confirms it), through a whole pod-GC period, until metalguard has verified the power-off
//! and tainted the Node `node.kubernetes.io/out-of-service`: then pod GC force-deletes it.
//! One healthy Node stays, or node lifecycle would enter master disruption mode.

#![cfg(feature = "kubernetes")]
// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod kubelab;

use std::time::{Duration, Instant};

use kubelab::{KubeLab, LabOptions, check_spec, node_template};
use metalguard_api::protocol::Outcome;
use serde_json::{Value, json};

const OOS: &str = "node.kubernetes.io/out-of-service";
/// kube-controller-manager's pod GC runs every 20 s (`gcCheckPeriod`, not a flag).
const POD_GC_PERIOD: Duration = Duration::from_secs(20);

fn pod(name: &str, node: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"nodeName": node, "containers": [{"name": "app", "image": "registry.invalid/app:1"}]}})
}

fn pod_path(name: &str) -> String {
    format!("/api/v1/namespaces/default/pods/{name}")
}

#[test]
fn the_out_of_service_taint_after_a_verified_power_off_frees_the_nodes_pods() {
    let mut lab = KubeLab::start(&LabOptions {
        check: check_spec(&json!(1), "OutOfServiceTaint"),
        controller_manager: true,
        ..LabOptions::default()
    });
    lab.start_controller("controller-0");
    lab.wait_leading("w-1", Duration::from_secs(60));
    let admin = lab.admin().clone();
    admin
        .create("/api/v1/namespaces/default/pods", &pod("app-w-2", "w-2"))
        .unwrap();
    admin
        .create("/api/v1/namespaces/default/pods", &pod("app-w-1", "w-1"))
        .unwrap();

    // w-2 hangs: its kubelet and agent fall silent.
    lab.kubelets["w-2"].stop();
    lab.agents.set_live("w-2", false);
    let off = "remediation/w-2/1/power-off";
    lab.agents.wait_offered(off, Duration::from_secs(60));
    lab.wait(
        "app-w-2 evicted (Terminating)",
        Duration::from_secs(60),
        |lab| {
            lab.admin()
                .get_opt(&pod_path("app-w-2"))
                .unwrap()
                .is_some_and(|p| !p["metadata"]["deletionTimestamp"].is_null())
        },
    );
    // Stuck: no kubelet confirms the deletion; pod GC passes it by on a Node without the taint.
    let terminating = Instant::now();
    while terminating.elapsed() < POD_GC_PERIOD + Duration::from_secs(2) {
        assert!(
            admin.get_opt(&pod_path("app-w-2")).unwrap().is_some(),
            "the pod went away before the out-of-service taint"
        );
        assert!(!lab.taints("w-2").iter().any(|t| t == OOS));
        std::thread::sleep(Duration::from_millis(500));
    }
    lab.cluster.controller_manager_running().unwrap();

    // The power-off is verified: metalguard taints the Node, pod GC force-deletes the pod.
    assert_eq!(lab.agents.finish(off, Outcome::Succeeded), 200);
    lab.wait("the out-of-service taint", Duration::from_secs(20), |lab| {
        lab.taints("w-2").iter().any(|t| t == OOS)
    });
    let tainted = Instant::now();
    lab.wait(
        "app-w-2 deleted by pod GC",
        POD_GC_PERIOD + Duration::from_secs(15),
        |lab| lab.admin().get_opt(&pod_path("app-w-2")).unwrap().is_none(),
    );
    eprintln!(
        "[kubelab] terminating pod freed {:?} after the out-of-service taint",
        tainted.elapsed()
    );
    let healthy = admin.get(&pod_path("app-w-1")).unwrap();
    assert!(healthy["metadata"]["deletionTimestamp"].is_null());
    // The taint joined the list node lifecycle keeps changing (unreachable, not-ready); the
    // Node's own taints stay.
    let taints = lab.taints("w-2");
    assert!(taints.iter().any(|t| t == "dedicated"), "{taints:?}");

    // Back on: the kubelet finds its Node, node lifecycle lifts its taints, metalguard its own.
    let on = "remediation/w-2/1/power-on";
    lab.agents.wait_offered(on, Duration::from_secs(20));
    assert_eq!(lab.agents.finish(on, Outcome::Succeeded), 200);
    lab.kubelets["w-2"]
        .register_again(&node_template("w-2"))
        .unwrap();
    lab.agents.set_live("w-2", true);
    lab.wait("remediation Done", Duration::from_secs(40), |lab| {
        lab.phase("w-2") == "Done"
    });
    let taints = lab.taints("w-2");
    assert!(!taints.iter().any(|t| t == OOS), "{taints:?}");
    lab.assert_nothing_forbidden();
}
