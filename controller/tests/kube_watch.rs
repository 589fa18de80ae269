//! Watches after 410 Gone: the API server restarts (its watch cache starts from the current
//! revision) and etcd's history is compacted, so every resourceVersion the controller's
//! watches held has expired. The watches get 410, list again, and the controller acts on
//! what changed afterwards: a new `FenceRequest` is answered and the Node's new label is in
//! the backup it takes.

#![cfg(feature = "kubernetes")]
// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod kubelab;

use std::time::{Duration, Instant};

use kubelab::{KubeLab, LabOptions, MG, NS};
use metalguard_api::protocol::Outcome;
use serde_json::json;

#[test]
fn watches_that_get_410_gone_list_again_and_see_what_changed_meanwhile() {
    let mut lab = KubeLab::start(&LabOptions::default());
    lab.start_controller("controller-0");
    lab.wait_leading("w-1", Duration::from_secs(60));
    // Something the watches have not seen moves the revision on.
    lab.admin()
        .create(
            &format!("/api/v1/namespaces/{NS}/configmaps"),
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bump"}}),
        )
        .unwrap();
    let outage = Instant::now();
    lab.cluster.stop_apiserver();
    let compacted = lab.cluster.store().unwrap().compact().unwrap();
    lab.cluster.start_apiserver_again().unwrap();
    eprintln!(
        "[kubelab] API server down and back in {:?}; etcd compacted at revision {compacted}",
        outage.elapsed()
    );
    lab.admin()
        .merge_patch(
            "/api/v1/nodes/w-2",
            &json!({"metadata": {"labels": {"after-restart": "yes"}}}),
        )
        .unwrap();
    lab.admin()
        .create(
            &format!("{MG}/fencerequests"),
            &json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "FenceRequest",
                "metadata": {"name": "fence-w-2", "namespace": NS},
                "spec": {"target": "w-2", "reason": "after the outage", "force": true}}),
        )
        .unwrap();
    let off = "remediation/w-2/1/power-off";
    lab.agents.wait_offered(off, Duration::from_secs(60));
    let log = lab.controller_log("controller-0", 2000);
    assert!(
        log.contains("too old resource version"),
        "no 410 Gone in the controller's log:\n{log}"
    );
    eprintln!(
        "[kubelab] watches relisted after 410 Gone: {} warnings",
        log.matches("too old resource version").count()
    );
    lab.kubelets["w-2"].stop();
    lab.agents.set_live("w-2", false);
    assert_eq!(lab.agents.finish(off, Outcome::Succeeded), 200);
    lab.wait("the Node backup", Duration::from_secs(20), |lab| {
        !lab.host("w-2")["status"]["remediation"]["nodeBackup"].is_null()
    });
    let backup = &lab.host("w-2")["status"]["remediation"]["nodeBackup"];
    assert_eq!(backup["labels"]["after-restart"], "yes", "{backup}");
    lab.assert_nothing_forbidden();
}
