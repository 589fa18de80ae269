//! Mixed versions in the lab (issue 26, item 5): the previous release (built by
//! `scripts/previous-release.sh` from the commit `packaging/releases.tsv` records) against this
//! tree's, in both directions, with a hang fenced while the versions are mixed. Real etcd,
//! real BMC emulators, real agents and controllers of both releases.
//!
//! `METALGUARD_PREVIOUS_BIN_DIR` names the previous release's binaries (scripts/test.sh sets
//! it); without it these tests fail, saying how to build them.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod labrun;

use std::path::PathBuf;
use std::time::Duration;

use metalguard_e2e::lab::{Lab, LabOptions, test_bin_dir};
use metalguard_e2e::soak::recorder::unix_ms;

/// The previous release's binaries.
fn previous_bin_dir() -> PathBuf {
    let dir = std::env::var_os("METALGUARD_PREVIOUS_BIN_DIR").map(PathBuf::from);
    match dir {
        Some(dir) if dir.join("metalguard-agent").exists() => dir,
        _ => panic!(
            "METALGUARD_PREVIOUS_BIN_DIR does not name the previous release's binaries: run \
             `export METALGUARD_PREVIOUS_BIN_DIR=$(scripts/previous-release.sh)` (scripts/test.sh does)"
        ),
    }
}

/// The release a binary says it is (`--version`: "metalguard-agent 0.1.0").
fn release_of(bin: &std::path::Path) -> String {
    let out = std::process::Command::new(bin)
        .arg("--version")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    text.split_whitespace()
        .last()
        .unwrap_or_default()
        .to_owned()
}

/// The release each host's agent last reported with, from the controller's status.
fn reported_releases(lab: &Lab) -> Vec<String> {
    let status = lab.last_status().cloned().unwrap_or_default();
    lab.hosts()
        .iter()
        .map(|h| {
            status["agents"][h.name.as_str()]["report"]["agent_version"]
                .as_str()
                .unwrap_or("none")
                .to_owned()
        })
        .collect()
}

/// Waits until host `i` reports with `release` and every host is healthy.
fn wait_on_release(lab: &mut Lab, i: usize, release: &str) {
    let name = lab.hosts()[i].name.clone();
    let waited = lab.wait_for(
        &format!("{name} reporting with release {release}"),
        Duration::from_secs(30),
        |lab| Ok(reported_releases(lab)[i] == release),
    );
    if let Err(e) = waited {
        panic!(
            "{e}: releases {:?}\n--- timeline\n{}\n--- logs\n{}",
            reported_releases(lab),
            lab.timeline.render(),
            lab.logs()
        );
    }
    if let Err(e) = lab.wait_all_healthy(Duration::from_secs(60)) {
        panic!(
            "{e}\n--- timeline\n{}\n--- logs\n{}",
            lab.timeline.render(),
            lab.logs()
        );
    }
}

#[test]
fn a_rolling_agent_upgrade_from_the_previous_release_fences_a_hang_in_the_middle_once() {
    let previous = previous_bin_dir();
    let (old, new) = (
        release_of(&previous.join("metalguard-agent")),
        release_of(&test_bin_dir().join("metalguard-agent")),
    );
    assert_ne!(
        old, new,
        "the previous release must differ from this tree's"
    );
    let mut options = LabOptions::new(3, test_bin_dir());
    options.agent_bin_dir = Some(previous);
    let mut lab = labrun::start(options);
    lab.wait_for("every agent reporting", Duration::from_secs(30), |lab| {
        Ok(reported_releases(lab).iter().all(|r| *r == old))
    })
    .unwrap();

    // Host by host, as packages are upgraded: cp-1 first.
    lab.upgrade_agent(0, None).unwrap();
    wait_on_release(&mut lab, 0, &new);
    assert_eq!(
        reported_releases(&lab),
        [new.clone(), old.clone(), old.clone()]
    );

    // In the middle of it, cp-1 (this release) hangs: this tree's controller has it fenced
    // by an agent of the previous release (cp-2 or cp-3), once, and it comes back (on this
    // release: its package was upgraded). `run` fails on any other outcome.
    let report = labrun::run(&mut lab, "hang");
    let executor = report
        .seen
        .split_whitespace()
        .nth(3)
        .unwrap_or_default()
        .to_owned();
    assert!(
        executor == "cp-2" || executor == "cp-3",
        "fenced by {executor}: expected an agent of the previous release\n{}",
        report.seen
    );
    let after_hang = unix_ms();

    // The rest of the hosts, one at a time: nothing is fenced.
    for i in 1..3 {
        lab.upgrade_agent(i, None).unwrap();
        wait_on_release(&mut lab, i, &new);
    }
    assert_eq!(reported_releases(&lab), [new.clone(), new.clone(), new]);
    // The controller told each release it heard, the previous one as older within the policy.
    let log = std::fs::read_to_string(lab.controller_log()).unwrap();
    assert!(
        log.lines().any(|l| l.contains("agent release")
            && l.contains(&format!("\"{old}\""))
            && l.contains("PeerOlder")),
        "{}",
        log.lines()
            .filter(|l| l.contains("agent release"))
            .collect::<Vec<_>>()
            .join("\n")
    );
    let events = lab.power_events_since(after_hang).unwrap();
    assert!(
        events.is_empty(),
        "power changed while agents were upgraded: {events:?}\n{}",
        lab.timeline.render()
    );
}

#[test]
fn the_previous_releases_controller_has_a_hang_fenced_by_this_releases_agents() {
    let previous = previous_bin_dir();
    let mut options = LabOptions::new(3, test_bin_dir());
    options.controller_bin_dir = Some(previous);
    let mut lab = labrun::start(options);
    let new = release_of(&test_bin_dir().join("metalguard-agent"));
    lab.wait_for("every agent reporting", Duration::from_secs(30), |lab| {
        Ok(reported_releases(lab).iter().all(|r| *r == new))
    })
    .unwrap();
    // The previous controller sends no version; this release's agents take it for 0.1.0,
    // within their policy, and one of them executes its fence of the hung host.
    labrun::run(&mut lab, "hang");
}
