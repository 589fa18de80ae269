//! The Kubernetes lab with the controller as a cluster runs it (issue 26, item 4): the shipped
//! Deployment's two Pods (`kubectl apply -k packaging/kubernetes`, the image from
//! `METALGUARD_IMAGE_ARCHIVE`) on two real nodes attached to the lab's API server, whose store
//! is the lab's etcd; the agents reach the leader only through the NodePort Service. A hung
//! host is fenced and recovered as in `lab_kube.rs`, then the leading Pod's container is
//! killed with a power-off in flight and the other Pod finishes the remediation.
//!
//! Real nodes change host-wide state: one at a time with the other node tests (nextest group
//! `node`; the harness's host lock), and the bed checks it left nothing behind.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod labrun;

use metalguard_e2e::lab::kube::pods;
use metalguard_e2e::lab::{Lab, LabBackend, LabOptions};

fn start(redfish_power_delay: bool) -> Lab {
    let mut options = LabOptions::new(3, metalguard_e2e::lab::test_bin_dir());
    options.backend = LabBackend::Kubernetes;
    options.controller_image = Some(pods::image_archive_from_env().unwrap());
    options.redfish_power_delay = redfish_power_delay;
    let lab = labrun::start(options);
    assert!(lab.pods_run_controllers());
    let told = lab.timeline.render();
    assert!(
        told.contains("the controller runs as the shipped Deployment's 2 Pods"),
        "{told}"
    );
    lab
}

/// Every agent is configured with the NodePort Service only: no controller's own address.
fn assert_agents_use_the_service(lab: &Lab) {
    for h in lab.hosts() {
        let config = std::fs::read_to_string(h.agent_config_path()).unwrap();
        assert!(
            config.contains("url = \"https://127.0.0.1:30843\"") && config.contains("urls = []"),
            "{}: {config}",
            h.name
        );
    }
}

#[test]
fn with_the_controller_as_pods_a_hang_is_fenced_once_and_the_host_recovers() {
    let mut lab = start(false);
    assert_agents_use_the_service(&lab);
    let report = labrun::run(&mut lab, "hang");
    assert!(report.ok, "{}", report.seen);
}

#[test]
fn with_the_controller_as_pods_the_leading_pod_killed_mid_fence_is_replaced_and_fences_once() {
    let mut lab = start(true);
    let report = labrun::run(&mut lab, "controller-crash");
    assert!(report.ok, "{}", report.seen);
    let told = lab.timeline.render();
    assert!(told.contains("'s container (Pod "), "{told}");
}
