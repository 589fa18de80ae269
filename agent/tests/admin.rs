//! Break-glass fencing against the real Redfish emulator.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

use metalguard_e2e::redfish::{RedfishBmc, RedfishOptions};

const AGENT: &str = env!("CARGO_BIN_EXE_metalguard-agent");

#[test]
fn direct_fence_powers_off_logs_loudly_and_never_prints_the_password() {
    let bmc = RedfishBmc::start(RedfishOptions::default()).unwrap();
    let url = format!(
        "redfish+http://127.0.0.1:{}{}",
        bmc.port(),
        bmc.system_path(0)
    );
    let out = Command::new(AGENT)
        .args([
            "fence",
            "cp-1",
            "--direct",
            "--reason",
            "hung at 3am",
            "--bmc",
            &url,
            "--credentials",
        ])
        .arg(bmc.credentials_dir())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stdout}\n{stderr}");
    assert!(stderr.contains("BREAK-GLASS"), "{stderr}");
    assert!(stderr.contains("hung at 3am"), "{stderr}");
    assert_eq!(bmc.power_state(0).unwrap(), "Off");
    assert!(!stdout.contains(bmc.password()) && !stderr.contains(bmc.password()));
}

#[test]
fn fence_without_direct_is_refused_before_touching_the_bmc() {
    let bmc = RedfishBmc::start(RedfishOptions::default()).unwrap();
    let url = format!(
        "redfish+http://127.0.0.1:{}{}",
        bmc.port(),
        bmc.system_path(0)
    );
    let out = Command::new(AGENT)
        .args([
            "fence",
            "cp-1",
            "--reason",
            "x",
            "--bmc",
            &url,
            "--credentials",
        ])
        .arg(bmc.credentials_dir())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--direct"));
    assert_eq!(bmc.power_state(0).unwrap(), "On");
}
