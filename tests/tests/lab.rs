//! End-to-end tests of the lab's scenarios: real etcd members, real agents, real BMC
//! emulators (sushy-tools and `ipmi_sim`) with power coupled to the hosts' processes, and the
//! real standalone controller. Each test starts its own three-host lab and checks the
//! scenario's outcome, its timings against the configured timeouts, the emulators' power logs
//! and the data written before the failure. These binaries run one at a time
//! (`.config/nextest.toml`, test group `lab`).

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod labrun;

use metalguard_e2e::etcd::EtcdSecurity;
use metalguard_e2e::lab::scenarios::OVERHEAD;
use metalguard_e2e::lab::{Lab, LabOptions};

fn start() -> Lab {
    labrun::start(LabOptions::new(3, metalguard_e2e::lab::test_bin_dir()))
}

/// A lab whose agents check the BMCs every 5 s (the BMC scenarios wait for a failed check).
fn checking_bmcs_often() -> Lab {
    let mut options = LabOptions::new(3, metalguard_e2e::lab::test_bin_dir());
    options.timings.bmc_check_period = std::time::Duration::from_secs(5);
    labrun::start(options)
}

#[test]
fn hang_is_fenced_once_by_a_peer_and_comes_back_without_losing_data() {
    let mut lab = start();
    // As every lab test but one: etcd with TLS and client certificates, as kubeadm runs it.
    assert!(
        lab.etcd()
            .endpoints()
            .iter()
            .all(|e| e.starts_with("https://"))
    );
    let inventory = std::fs::read_to_string(lab.inventory()).unwrap();
    assert!(
        inventory.contains("ca_file = ") && inventory.contains("cert_file = "),
        "{inventory}"
    );
    let t = lab.options().timings.clone();
    let report = labrun::run(&mut lab, "hang");
    // ok already means: one power-off of the frozen host, executed by another host's agent,
    // no other host's power touched, every key written before the hang present after.
    let detect = t.heartbeat_timeout.max(t.unhealthy_timeout);
    let off = labrun::timing(&report, "failure → verified off");
    // The earliest: the host's last report left up to one report interval before the
    // freeze, and the silence is timed from it.
    let earliest = t
        .heartbeat_timeout
        .min(t.unhealthy_timeout)
        .saturating_sub(t.report_interval);
    assert!(
        off >= earliest && off <= detect + OVERHEAD,
        "fenced after {off:?}: expected between {earliest:?} and {:?}\n{}",
        detect + OVERHEAD,
        lab.timeline.render()
    );
    let healthy = labrun::timing(&report, "failure → healthy");
    assert!(
        healthy <= detect + OVERHEAD * 2,
        "healthy again after {healthy:?}, more than {:?}\n{}",
        detect + OVERHEAD * 2,
        lab.timeline.render()
    );
}

/// The one lab test on plain-HTTP etcd (no TLS, no client certificates): metalguard still works
/// where etcd is run that way.
#[test]
fn hang_is_fenced_on_a_plain_http_etcd_too() {
    let mut options = LabOptions::new(3, metalguard_e2e::lab::test_bin_dir());
    options.etcd_security = EtcdSecurity::PlainHttp;
    let mut lab = labrun::start(options);
    assert!(
        lab.etcd()
            .endpoints()
            .iter()
            .all(|e| e.starts_with("http://"))
    );
    labrun::run(&mut lab, "hang");
}

#[test]
fn two_hung_hosts_of_three_are_not_fenced_and_status_says_why() {
    let mut lab = start();
    let report = labrun::run(&mut lab, "double-failure");
    assert!(report.seen.starts_with("0 power events"), "{}", report.seen);
}

#[test]
fn an_admin_fence_of_a_healthy_host_is_refused_unless_forced_and_then_recorded() {
    let mut lab = start();
    let report = labrun::run(&mut lab, "admin-fence");
    assert!(
        report.seen.contains("recorded as forced: true"),
        "{}",
        report.seen
    );
}

#[test]
fn a_wrong_bmc_password_ends_in_needs_a_person_and_touches_nothing() {
    let mut lab = checking_bmcs_often();
    let report = labrun::run(&mut lab, "bad-bmc");
    assert!(
        report.seen.contains("rejected the credentials") && report.seen.ends_with("0 power events"),
        "{}",
        report.seen
    );
}

/// `locked-account`: `check-bmc` on demand names a locked BMC account within one check
/// period, before the host fails; unlocked, it passes again.
#[test]
fn a_locked_bmc_account_is_reported_by_an_on_demand_check_before_the_host_fails() {
    let mut lab = start();
    let report = labrun::run(&mut lab, "locked-account");
    assert!(report.ok, "{}", report.seen);
}

#[test]
fn a_fence_drill_power_cycles_a_healthy_host_once_and_is_recorded_as_a_drill() {
    let mut lab = start();
    let report = labrun::run(&mut lab, "drill");
    assert!(report.ok, "{}", report.seen);
}

#[test]
fn a_rotated_bmc_password_is_checked_before_a_fence_uses_it_and_the_old_one_serves_meanwhile() {
    let mut lab = checking_bmcs_often();
    let report = labrun::run(&mut lab, "rotate-credentials");
    assert!(report.ok, "{}", report.seen);
}

#[test]
fn a_bmc_line_copied_from_another_host_is_refused_by_identity_and_touches_nothing() {
    let mut lab = checking_bmcs_often();
    let report = labrun::run(&mut lab, "swapped-bmc");
    assert!(
        report.ok
            && report.seen.contains("answers for another machine")
            && report.seen.ends_with("0 power events"),
        "{}",
        report.seen
    );
}

#[test]
fn a_controller_killed_twice_mid_remediation_is_replaced_and_the_fence_happens_once() {
    let mut options = LabOptions::new(3, metalguard_e2e::lab::test_bin_dir());
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
}
