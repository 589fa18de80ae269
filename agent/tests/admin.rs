//! Break-glass fencing against the real Redfish emulator.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::process::Command;

use metalguard_e2e::redfish::{RedfishBmc, RedfishOptions};

const AGENT: &str = env!("CARGO_BIN_EXE_metalguard-agent");

fn fence(bmc: &RedfishBmc, extra: &[&str]) -> (Option<i32>, String, String) {
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
        .args(extra)
        .env("SUDO_USER", "alice")
        .env_remove("METALGUARD_AGENT_CONFIG")
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn direct_fence_records_a_hold_first_then_powers_off_logs_loudly_and_never_prints_the_password() {
    let bmc = RedfishBmc::start(RedfishOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    let config = dir.path().join("agent.toml");
    // A controller the fence cannot use (its files are missing): reported, not fatal.
    std::fs::write(
        &config,
        format!(
            "host = \"cp-2\"\n[state]\ndir = \"{}\"\n[controller]\nurl = \"https://127.0.0.1:9\"\n\
             ca = \"/nonexistent/ca.pem\"\ncert = \"/nonexistent/cp-2.pem\"\nkey = \"/nonexistent/cp-2-key.pem\"\n",
            state.display()
        ),
    )
    .unwrap();
    let (code, stdout, stderr) = fence(&bmc, &["--config", config.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{stdout}\n{stderr}");
    assert!(stderr.contains("BREAK-GLASS"), "{stderr}");
    assert!(
        stderr.contains("hung at 3am") && stderr.contains("alice"),
        "{stderr}"
    );
    assert!(stderr.contains("hold cp-2/"), "{stderr}");
    assert!(
        stderr.contains("not recorded by the controller") && stderr.contains("controller.ca"),
        "{stderr}"
    );
    assert!(
        stderr.contains("cp-1 is held: metalguard leaves its power alone until `metalguard-controller release cp-1"),
        "{stderr}"
    );
    assert_eq!(bmc.power_state(0).unwrap(), "Off");
    assert!(!stdout.contains(bmc.password()) && !stderr.contains(bmc.password()));
    let files: Vec<_> = std::fs::read_dir(state.join("holds"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    let hold: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&files[0]).unwrap()).unwrap();
    assert_eq!(hold["target"], "cp-1");
    assert_eq!(hold["by"], "alice on cp-2");
    assert_eq!(hold["action"], "off");
    assert_eq!(hold["reason"], "hung at 3am");
    assert!(hold["id"].as_str().unwrap().starts_with("cp-2/"), "{hold}");
}

#[test]
fn without_an_agent_configuration_the_fence_is_refused_unless_no_hold_is_given() {
    let bmc = RedfishBmc::start(RedfishOptions::default()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("agent.toml");
    let (code, _, stderr) = fence(&bmc, &["--config", missing.to_str().unwrap()]);
    assert_eq!(code, Some(6), "{stderr}");
    assert!(
        stderr.contains("no hold can be recorded") && stderr.contains("--no-hold"),
        "{stderr}"
    );
    assert_eq!(bmc.power_state(0).unwrap(), "On", "nothing was done");
    let (code, _, stderr) = fence(&bmc, &["--config", missing.to_str().unwrap(), "--no-hold"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("no hold recorded (--no-hold)"), "{stderr}");
    assert_eq!(bmc.power_state(0).unwrap(), "Off");
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

#[test]
fn a_reason_with_control_characters_is_refused_before_anything_is_done() {
    // A raw screen-clear sequence and a forged log line reached the terminal and the log
    // through the hold's reason (issue 28).
    let dir = tempfile::tempdir().unwrap();
    let creds = dir.path().join("bmc.conf");
    std::fs::write(&creds, "username=admin\npassword=x\n").unwrap();
    for reason in ["disk\u{1b}[2J", "x\n2026-11-27T03:00:00Z ERROR forged"] {
        let out = Command::new(AGENT)
            .args([
                "fence",
                "cp-1",
                "--direct",
                "--no-hold",
                "--reason",
                reason,
                "--bmc",
                "redfish+http://127.0.0.1:9",
                "--credentials",
            ])
            .arg(&creds)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(6), "{stderr}");
        assert!(
            stderr.contains("--reason contains a control character"),
            "{stderr}"
        );
        assert!(
            !stderr.contains('\u{1b}') && !stderr.contains("ERROR forged"),
            "{stderr}"
        );
    }
}
