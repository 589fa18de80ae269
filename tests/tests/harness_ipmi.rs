//! Self-tests of the IPMI harness: ipmitool (an independent client) switches the simulators'
//! power and the recorded state and log follow.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use metalguard_e2e::ipmi::{IpmiOptions, IpmiSim, Privilege, PyghmiBmc};

/// Runs `ipmitool -I lanplus -C 3` with the password from a file (never an argument).
fn ipmitool(port: u16, creds: &Path, privilege: &str, args: &[&str]) -> std::process::Output {
    let user = std::fs::read_to_string(creds.join("username")).unwrap();
    Command::new("ipmitool")
        .args([
            "-I",
            "lanplus",
            "-C",
            "3",
            "-H",
            "127.0.0.1",
            "-N",
            "1",
            "-R",
            "2",
        ])
        .args([
            "-p",
            &port.to_string(),
            "-U",
            user.trim(),
            "-L",
            privilege,
            "-f",
        ])
        .arg(creds.join("password"))
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn ipmi_sim_power_is_switched_by_ipmitool_and_recorded() {
    let sim = IpmiSim::start(IpmiOptions::default()).unwrap();
    assert!(sim.power_on().unwrap());
    let admin = sim.credentials_dir(Privilege::Admin);
    let out = ipmitool(
        sim.port(),
        &admin,
        "ADMINISTRATOR",
        &["chassis", "power", "off"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!sim.power_on().unwrap());
    let out = ipmitool(
        sim.port(),
        &admin,
        "ADMINISTRATOR",
        &["chassis", "power", "status"],
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("off"));
    let out = ipmitool(
        sim.port(),
        &admin,
        "ADMINISTRATOR",
        &["chassis", "power", "on"],
    );
    assert!(out.status.success());
    assert!(sim.power_on().unwrap());
    let log = sim.power_log().unwrap();
    assert_eq!(log.iter().filter(|e| e.is_off()).count(), 1, "{log:?}");
    assert_eq!(log.len(), 2, "{log:?}");
    assert!(log[0].at_ms <= log[1].at_ms);
}

#[test]
fn ipmi_sim_enforces_privilege_levels() {
    let sim = IpmiSim::start(IpmiOptions::default()).unwrap();
    let viewer = sim.credentials_dir(Privilege::User);
    let out = ipmitool(sim.port(), &viewer, "USER", &["chassis", "power", "status"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = ipmitool(sim.port(), &viewer, "USER", &["chassis", "power", "off"]);
    assert!(
        !out.status.success(),
        "a USER-level account must not switch power"
    );
    assert!(sim.power_on().unwrap());
    assert!(sim.power_log().unwrap().is_empty());
}

#[test]
fn ipmi_sim_refuses_a_wrong_password() {
    let sim = IpmiSim::start(IpmiOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    metalguard_e2e::redfish::write_credentials(dir.path(), "admin", "not-the-password").unwrap();
    let out = ipmitool(
        sim.port(),
        dir.path(),
        "ADMINISTRATOR",
        &["chassis", "power", "off"],
    );
    assert!(!out.status.success());
    assert!(sim.power_on().unwrap());
}

#[test]
fn pyghmi_bmc_power_is_switched_and_replies_can_be_delayed() {
    let bmc = PyghmiBmc::start(IpmiOptions::default()).unwrap();
    let creds = bmc.credentials_dir();
    let out = ipmitool(
        bmc.port(),
        &creds,
        "ADMINISTRATOR",
        &["chassis", "power", "off"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(!bmc.power_on().unwrap());
    assert_eq!(bmc.power_log().unwrap().len(), 1);

    bmc.set_behaviour(Duration::from_millis(700), 0).unwrap();
    let started = Instant::now();
    let out = ipmitool(
        bmc.port(),
        &creds,
        "ADMINISTRATOR",
        &["chassis", "power", "status"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        started.elapsed() >= Duration::from_millis(700),
        "the delay was not applied"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("off"));

    // A dropped reply is recovered by the client's retransmission.
    bmc.set_behaviour(Duration::ZERO, 1).unwrap();
    let out = ipmitool(
        bmc.port(),
        &creds,
        "ADMINISTRATOR",
        &["chassis", "power", "on"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(bmc.power_on().unwrap());
}

/// DSP0134 §7.2.1's example UUID and its SMBIOS-order bytes.
const SPEC_UUID: &str = "00112233-4455-6677-8899-aabbccddeeff";
const SPEC_WIRE: &str = "33 22 11 00 55 44 77 66 88 99 aa bb cc dd ee ff";

/// The bytes `ipmitool raw 0x06 0x37` (Get System GUID, an independent client) prints.
fn raw_system_guid(port: u16, creds: &Path) -> String {
    let out = ipmitool(port, creds, "ADMINISTRATOR", &["raw", "0x06", "0x37"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
}

#[test]
fn both_simulators_send_the_configured_system_uuid_in_smbios_order() {
    assert_eq!(
        metalguard_e2e::ipmi::smbios_guid_hex(SPEC_UUID).unwrap(),
        SPEC_WIRE.replace(' ', "")
    );
    let options = || IpmiOptions {
        system_uuid: Some(SPEC_UUID.to_owned()),
        ..IpmiOptions::default()
    };
    let sim = IpmiSim::start(options()).unwrap();
    assert_eq!(
        raw_system_guid(sim.port(), &sim.credentials_dir(Privilege::Admin)),
        SPEC_WIRE
    );
    let bmc = PyghmiBmc::start(options()).unwrap();
    assert_eq!(
        raw_system_guid(bmc.port(), &bmc.credentials_dir()),
        SPEC_WIRE
    );
    // Reading the identity changed no power.
    assert!(sim.power_log().unwrap().is_empty());
    assert!(bmc.power_log().unwrap().is_empty());
}

#[test]
fn pyghmi_without_a_system_uuid_refuses_get_system_guid() {
    let bmc = PyghmiBmc::start(IpmiOptions {
        system_uuid: None,
        ..IpmiOptions::default()
    })
    .unwrap();
    let out = ipmitool(
        bmc.port(),
        &bmc.credentials_dir(),
        "ADMINISTRATOR",
        &["raw", "0x06", "0x37"],
    );
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("rsp=0xc1"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        IpmiSim::start(IpmiOptions {
            system_uuid: None,
            ..IpmiOptions::default()
        })
        .is_err(),
        "ipmi_sim offers RMCP+ only with a GUID"
    );
}
