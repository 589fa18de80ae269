//! The lab's scenarios in Kubernetes mode (`LabBackend::Kubernetes`): the lab's three etcd
//! members are also the store of a real kube-apiserver (and kube-controller-manager marks
//! Nodes NotReady), each host has a Node whose fake kubelet follows the host's power and
//! freeze state, and the real `metalguard-controller run --backend=kubernetes` runs as its
//! ServiceAccount under the shipped RBAC on `GuardedHost`s, with the real agents. Each test
//! checks the same outcome as its standalone twin in `lab.rs`, plus what Kubernetes shows.
//!
//! A frozen etcd member stalls the API server's requests routed to it until its etcd
//! client's keepalive gives the connection up (`lab::kube::APISERVER_ETCD_STALL`): the bounds
//! here allow that on top of the standalone ones.
//!
//! Needs the Kubernetes binaries (`scripts/kube-build.sh`; `METALGUARD_KUBE_BIN_DIR`) and the
//! controller built with its default feature: without them the lab does not start and the
//! test fails saying so. One at a time with the other lab tests (nextest group `lab`).

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod labrun;

use std::time::Duration;

use metalguard_e2e::lab::kube::{APISERVER_ETCD_STALL, ZONE_LABEL};
use metalguard_e2e::lab::scenarios::{self, OVERHEAD};
use metalguard_e2e::lab::{KubeSide, Lab, LabBackend, LabOptions};

fn start() -> Lab {
    let mut options = LabOptions::new(3, metalguard_e2e::lab::test_bin_dir());
    options.backend = LabBackend::Kubernetes;
    labrun::start(options)
}

/// Every Node's labels, the lab's zone label among them.
fn assert_nodes_labelled(lab: &Lab) {
    let kube = lab.kube().expect("a Kubernetes lab");
    for h in lab.hosts() {
        let labels = kube.node_labels_now(&h.name).unwrap().unwrap_or_default();
        assert_eq!(
            labels.get(ZONE_LABEL),
            Some(&KubeSide::zone_label(&h.name)),
            "Node {} labels: {labels:?}\n{}",
            h.name,
            lab.timeline.render()
        );
    }
}

#[test]
fn hang_is_fenced_once_by_a_peer_its_node_deleted_and_back_with_its_labels() {
    let mut lab = start();
    // The API server's store is the lab's own etcd: its members, over TLS, with the client
    // certificate signed by the etcd CA.
    let pid = lab.kube().unwrap().cluster().apiserver().pid().unwrap();
    let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).unwrap();
    let flags: Vec<&str> = cmdline.split('\0').collect();
    let servers = format!("--etcd-servers={}", lab.etcd().endpoints().join(","));
    assert!(
        lab.etcd()
            .endpoints()
            .iter()
            .all(|e| e.starts_with("https://"))
            && flags.contains(&servers.as_str())
            && flags.iter().any(|f| f.starts_with("--etcd-certfile=")),
        "{flags:?}"
    );
    assert_nodes_labelled(&lab);
    let t = lab.options().timings.clone();
    let report = labrun::run(&mut lab, "hang");
    // ok already means: one power-off of the frozen host, executed by another host's agent,
    // no other host's power touched, no key lost, and its Node NotReady, deleted, and back
    // with the label only the backup had.
    assert!(
        report
            .seen
            .contains("Node NotReady: true, deleted: true, back with its labels: true"),
        "{}",
        report.seen
    );
    let detect = t.heartbeat_timeout.max(t.unhealthy_timeout);
    let off = labrun::timing(&report, "failure → verified off");
    let earliest = t
        .heartbeat_timeout
        .min(t.unhealthy_timeout)
        .saturating_sub(t.report_interval);
    let latest = detect + OVERHEAD + APISERVER_ETCD_STALL;
    assert!(
        off >= earliest && off <= latest,
        "fenced after {off:?}: expected between {earliest:?} and {latest:?}\n{}",
        lab.timeline.render()
    );
    assert_nodes_labelled(&lab);
}

#[test]
fn two_hung_hosts_of_three_take_the_api_server_down_and_nothing_is_fenced() {
    let mut lab = start();
    let report = labrun::run(&mut lab, "double-failure");
    assert!(report.seen.starts_with("0 power events"), "{}", report.seen);
    // Why: without etcd's quorum the API server is not ready (its etcd check fails), so no
    // Lease, no status and no decision.
    assert!(
        report.seen.contains("failing checks: etcd"),
        "{}",
        report.seen
    );
    assert_nodes_labelled(&lab);
}

#[test]
fn an_admin_fence_request_of_a_healthy_host_is_refused_unless_forced_and_then_recorded() {
    let mut lab = start();
    let report = labrun::run(&mut lab, "admin-fence");
    assert!(
        report.seen.contains("recorded as forced: true"),
        "{}",
        report.seen
    );
    // The fenced host's Node came back with its labels too.
    assert_nodes_labelled(&lab);
}

#[test]
fn a_bmc_password_changed_without_its_secret_ends_in_needs_a_person_and_touches_nothing() {
    let mut options = LabOptions::new(3, metalguard_e2e::lab::test_bin_dir());
    options.backend = LabBackend::Kubernetes;
    // The agents check the BMCs every 5 s: the scenario waits for the failed check.
    options.timings.bmc_check_period = std::time::Duration::from_secs(5);
    let mut lab = labrun::start(options);
    let report = labrun::run(&mut lab, "bad-bmc");
    assert!(
        report.seen.contains("rejected the credentials")
            && report.seen.ends_with("0 power events")
            && report
                .seen
                .contains("Node MetalguardFencingReady=False (CredentialsRefused): true"),
        "{}",
        report.seen
    );
}

/// `swapped-bmc` in Kubernetes mode: two `GuardedHost`s get each other's `spec.bmc` (valid
/// Secret, the other server): not ready by identity before the hang, refused at the fence.
#[test]
fn a_bmc_copied_from_another_guarded_host_is_refused_by_identity_and_touches_nothing() {
    let mut options = LabOptions::new(3, metalguard_e2e::lab::test_bin_dir());
    options.backend = LabBackend::Kubernetes;
    options.timings.bmc_check_period = std::time::Duration::from_secs(5);
    let mut lab = labrun::start(options);
    let report = labrun::run(&mut lab, "swapped-bmc");
    assert!(
        report.ok
            && report.seen.contains("answers for another machine")
            && report.seen.ends_with("0 power events"),
        "{}",
        report.seen
    );
}

/// `locked-account` in Kubernetes mode: `check-bmc --kubeconfig` writes
/// `spec.bmcCheckRequest` and reads the answer from `FencingReady`.
#[test]
fn a_locked_bmc_account_is_reported_by_check_bmc_through_the_api_server() {
    let mut lab = start();
    let report = labrun::run(&mut lab, "locked-account");
    assert!(report.ok, "{}", report.seen);
}

/// `drill` in Kubernetes mode: a `FenceRequest` with `action: Drill`.
#[test]
fn a_fence_request_drill_power_cycles_a_healthy_host_once_and_is_recorded() {
    let mut lab = start();
    let report = labrun::run(&mut lab, "drill");
    assert!(report.ok, "{}", report.seen);
}

/// `node-lease`: a host whose node lease Node Maintenance holds is not fenced until the lease
/// is free; metalguard then takes it, fences once, and releases it after the recovery.
#[test]
fn a_host_whose_node_lease_another_actor_holds_is_fenced_only_once_it_is_free() {
    let mut lab = start();
    let report = labrun::run(&mut lab, "node-lease");
    assert!(report.ok, "{}", report.seen);
}

/// `rotate-credentials` in Kubernetes mode: the BMC's Secret gets the new password first.
#[test]
fn a_rotated_password_in_a_bmc_secret_is_checked_before_a_fence_uses_it() {
    let mut options = LabOptions::new(3, metalguard_e2e::lab::test_bin_dir());
    options.backend = LabBackend::Kubernetes;
    options.timings.bmc_check_period = std::time::Duration::from_secs(5);
    let mut lab = labrun::start(options);
    let report = labrun::run(&mut lab, "rotate-credentials");
    assert!(report.ok, "{}", report.seen);
}

/// `replace` in Kubernetes mode: `retire cp-1 --kubeconfig` declares `spec.retirement` on its
/// `GuardedHost`, the spare's `GuardedHost` (and Secret, and Node) is added, its own agent
/// joins it as a learner, a voter's agent promotes it, `cp-1`'s member is removed and `cp-1`
/// powered off once through another host's agent; healthy voters never below quorum.
#[test]
fn a_spare_guarded_host_replaces_a_retired_one_without_losing_quorum_and_it_is_powered_off_once() {
    let mut options = LabOptions::new(3, metalguard_e2e::lab::test_bin_dir());
    options.backend = LabBackend::Kubernetes;
    options.spares = 1;
    let mut lab = labrun::start(options);
    let o = match scenarios::observe_replace(&mut lab) {
        Ok(o) => o,
        Err(e) => panic!(
            "scenario replace failed: {e}\n--- timeline\n{}\n--- logs\n{}",
            lab.timeline.render(),
            lab.logs()
        ),
    };
    let told = format!(
        "--- timeline\n{}\n--- logs\n{}",
        lab.timeline.render(),
        lab.logs()
    );
    let r = &o.report;
    assert!(
        r.ok,
        "replace did not match its outcome\nexpected: {}\nseen:     {}\n{told}",
        r.expected, r.seen
    );
    assert_eq!((o.retired.as_str(), o.spare.as_str()), ("cp-1", "cp-4"));
    let (Some(learner), Some(voter), Some(removed), Some(off)) =
        (o.learner_at, o.voter_at, o.removed_at, o.powered_off_at)
    else {
        panic!("a step was never seen: {:?}\n{told}", r.timings);
    };
    assert!(learner < voter && voter <= removed, "{told}");
    assert!(
        off >= removed.saturating_sub(Duration::from_secs(1)),
        "cp-1 powered off ({off:?}) before its member was removed ({removed:?})\n{told}"
    );
    assert!(
        o.min_voters == 3 && o.max_voters <= 4 && o.below_quorum.is_empty(),
        "voters {}..{}, below quorum {:?}\n{told}",
        o.min_voters,
        o.max_voters,
        o.below_quorum
    );
    assert_eq!(o.power_events.len(), 1, "{:?}\n{told}", o.power_events);
    assert_eq!(o.power_events[0].0, "cp-1", "{told}");
    assert!(
        o.executor.as_deref().is_some_and(|e| e != "cp-1"),
        "the power-off ran on {:?}\n{told}",
        o.executor
    );
    assert_eq!(o.final_voters, ["cp-2", "cp-3", "cp-4"], "{told}");
    assert_eq!(o.final_learners, 0, "{told}");
    assert!(o.missing.is_empty(), "{:?}\n{told}", o.missing);

    // Kubernetes shows the new control plane: cp-4's GuardedHost and Node, cp-1's gone.
    let kube = lab.kube().unwrap();
    let admin = kube.cluster().admin();
    let gh = |name: &str| {
        admin
            .get_opt(&format!(
                "/apis/metalguard.io/v1alpha1/namespaces/metalguard-system/guardedhosts/{name}"
            ))
            .unwrap()
    };
    assert!(gh("cp-1").is_none() && gh("cp-4").is_some(), "{told}");
    assert!(kube.node_labels_now("cp-4").unwrap().is_some(), "{told}");
    let apiserver = kube.cluster().apiserver().pid();
    assert!(lab.host_healthy(3), "{told}");

    // Dropping the lab stops every process it started: agents, etcd members (the spare's
    // supervised one too) and the API server.
    let mut pids: Vec<(String, u32)> = Vec::new();
    for h in lab.hosts() {
        pids.extend(h.agent_pid().map(|p| (format!("agent {}", h.name), p)));
        pids.extend(
            h.spare_etcd()
                .and_then(metalguard_e2e::lab::SpareEtcd::pid)
                .map(|p| (format!("etcd {}", h.name), p)),
        );
    }
    for i in 0..lab.etcd().len() {
        let m = lab.etcd().member(i);
        pids.extend(m.pid().map(|p| (format!("etcd {}", m.name()), p)));
    }
    pids.extend(apiserver.map(|p| ("kube-apiserver".to_owned(), p)));
    drop(lab);
    let left: Vec<&(String, u32)> = pids
        .iter()
        .filter(|(_, pid)| std::path::Path::new(&format!("/proc/{pid}")).exists())
        .collect();
    assert!(
        left.is_empty(),
        "left running after the lab stopped: {left:?}"
    );
}

/// `controller-crash` in Kubernetes mode: the controller is killed (SIGKILL) with the
/// power-off in flight and again once the BMC turned the host off; each new controller waits
/// out the dead one's Lease (15 s), takes over the same remediation from its `GuardedHost`
/// status and finishes it: one power-off, one power-on, one remediation.
#[test]
fn a_controller_killed_twice_mid_remediation_waits_out_its_lease_and_the_fence_happens_once() {
    let mut options = LabOptions::new(3, metalguard_e2e::lab::test_bin_dir());
    options.backend = LabBackend::Kubernetes;
    options.redfish_power_delay = true;
    let mut lab = labrun::start(options);
    let report = labrun::run(&mut lab, "controller-crash");
    assert!(
        report.seen.contains("0 off at the BMC")
            && report
                .seen
                .contains("1 power-off, 1 power-on, 0 other power events"),
        "{}",
        report.seen
    );
    assert_nodes_labelled(&lab);
}

/// `break-glass` in Kubernetes mode: a person fences cp-1 by hand from cp-2
/// (`metalguard-agent fence --direct`); the hold is recorded in cp-1's `GuardedHost`
/// `status.holds`, the leader leaves cp-1 off long past the heartbeat timeout and says why in a
/// `Refused` Event; `release --kubeconfig` names the hold in `spec.holdRelease`, and cp-1 is
/// powered on, its Node back with its labels, and cp-2's agent deletes its hold record.
#[test]
fn a_break_glass_fence_is_held_in_the_guarded_host_until_released_and_then_brought_back() {
    use metalguard_e2e::lab::scenarios::observe_break_glass;

    let mut lab = start();
    let heartbeat = lab.options().timings.heartbeat_timeout;
    let o = match observe_break_glass(&mut lab) {
        Ok(o) => o,
        Err(e) => panic!(
            "scenario break-glass failed: {e}\n--- timeline\n{}\n--- logs\n{}",
            lab.timeline.render(),
            lab.logs()
        ),
    };
    let unmet = o.unmet(heartbeat);
    assert!(
        unmet.is_empty(),
        "unmet: {unmet:#?}\n{o:#?}\n--- timeline\n{}\n--- logs\n{}",
        lab.timeline.render(),
        lab.logs()
    );
    // The release is recorded where the hold is, and the Node came back with its labels.
    let kube = lab.kube().unwrap();
    let host = kube
        .cluster()
        .admin()
        .get("/apis/metalguard.io/v1alpha1/namespaces/metalguard-system/guardedhosts/cp-1")
        .unwrap();
    let holds = host["status"]["holds"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(holds.len(), 1, "{host}");
    assert_eq!(holds[0]["reportedBy"], "cp-2", "{host}");
    assert!(
        holds[0]["released"]["by"]
            .as_str()
            .is_some_and(|by| by.ends_with("(cli)")),
        "{host}"
    );
    assert_eq!(
        host["spec"]["holdRelease"]["holds"][0], holds[0]["id"],
        "{host}"
    );
    assert_nodes_labelled(&lab);
}

/// A controller whose node-lease grant is missing (upgraded before its RBAC) disrupts
/// nothing: a hung host is not fenced while the controller cannot take its node lease, and
/// is fenced once the grant is back.
#[test]
fn without_its_node_lease_grant_the_controller_fences_nothing_until_the_grant_is_back() {
    let mut lab = start();
    let target = lab.in_service().last().copied().unwrap();
    let binding = "/apis/rbac.authorization.k8s.io/v1/namespaces/medik8s-leases/rolebindings/metalguard-controller";
    let admin = lab.kube().unwrap().cluster().admin();
    let saved = admin.get(binding).unwrap();
    admin.delete(binding).unwrap();
    let since = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    lab.freeze(target).unwrap();
    let t = lab.options().timings.clone();
    let detect = t.heartbeat_timeout.max(t.unhealthy_timeout) + APISERVER_ETCD_STALL;
    lab.idle(detect + Duration::from_secs(20)).unwrap();
    let offs_without = lab.power_offs_since(target, since).unwrap();
    let mut restored = saved.clone();
    restored["metadata"] = serde_json::json!({
        "name": "metalguard-controller",
        "namespace": "medik8s-leases",
        "labels": saved["metadata"]["labels"],
    });
    // The API server's requests routed to the frozen member stall until its etcd client gives
    // the connection up: a write may fail meanwhile (500), and is tried again.
    let deadline = std::time::Instant::now() + APISERVER_ETCD_STALL * 2;
    loop {
        let created = lab.kube().unwrap().cluster().admin().create(
            "/apis/rbac.authorization.k8s.io/v1/namespaces/medik8s-leases/rolebindings",
            &restored,
        );
        match created {
            Ok(_) => break,
            Err(e) if std::time::Instant::now() < deadline => {
                eprintln!("restoring the RoleBinding: {e}; trying again");
                std::thread::sleep(Duration::from_millis(500));
            }
            Err(e) => panic!("the RoleBinding could not be restored: {e}"),
        }
    }
    let fenced = lab.wait_for(
        "the hung host to be fenced once the grant is back",
        Duration::from_secs(90),
        |lab| Ok(lab.power_offs_since(target, since)? > 0),
    );
    lab.thaw(target).unwrap();
    assert!(
        offs_without == 0 && fenced.is_ok(),
        "power-offs without the grant: {offs_without}; fenced after: {fenced:?}\n{}",
        lab.timeline.render()
    );
}
