//! End to end: the lab's `break-glass` scenario with the real binaries. While the standalone
//! controller runs, a person fences `cp-1` by hand from `cp-2` (`metalguard-agent fence cp-1
//! --direct` with cp-2's agent configuration). The fence records a hold before it touches the
//! BMC; the controller leaves cp-1 off for far longer than the heartbeat timeout (without the
//! hold it powers a silent host back on within seconds: the `hang` scenario), and `status`
//! says who holds it. After `metalguard-controller release cp-1` the controller remediates the
//! silent host: powered on, healthy again, and cp-2's agent deletes its hold record. The BMC
//! emulators' power logs are the evidence. Runs one at a time with the other lab tests
//! (`.config/nextest.toml`, test group `lab`).

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use metalguard_e2e::lab::scenarios::{BreakGlassOutcome, observe_break_glass};
use metalguard_e2e::lab::{Lab, LabOptions};

fn story(lab: &Lab) -> String {
    format!(
        "--- timeline\n{}\n--- logs\n{}",
        lab.timeline.render(),
        lab.logs()
    )
}

#[test]
fn a_break_glass_fence_is_held_off_until_released_and_then_brought_back() {
    let options = LabOptions::new(3, metalguard_e2e::lab::test_bin_dir());
    let heartbeat = options.timings.heartbeat_timeout;
    let mut lab = match Lab::start(options) {
        Ok(lab) => lab,
        Err(e) => panic!("the lab did not start: {e}"),
    };
    let o: BreakGlassOutcome = match observe_break_glass(&mut lab) {
        Ok(o) => o,
        Err(e) => panic!("scenario break-glass failed: {e}\n{}", story(&lab)),
    };
    let told = format!("{o:#?}\n{}", story(&lab));
    assert_eq!((o.target.as_str(), o.executor.as_str()), ("cp-1", "cp-2"));

    // The fence recorded the hold on cp-2 and in the controller before the BMC powered off.
    assert!(o.fence_ok, "{told}");
    assert!(
        o.fence_stderr.contains("hold cp-2/")
            && o.fence_stderr.contains("recorded by the controller"),
        "{told}"
    );
    // Held: one power-off (the person's), nothing else, for well beyond the heartbeat timeout.
    assert!(o.watched >= heartbeat * 3, "{told}");
    assert_eq!(o.while_held, ["off"], "{told}");
    // status says it is held, by whom, through which agent, and how to release it.
    let line = o
        .status_lines
        .iter()
        .find(|l| l.starts_with("cp-1: HELD"))
        .unwrap_or_else(|| panic!("status shows no hold of cp-1\n{told}"));
    assert!(
        line.contains("by lab-operator on cp-2")
            && line.contains("via agent cp-2")
            && line.contains("metalguard-controller release cp-1"),
        "{line}"
    );
    assert_eq!(o.status_hold["by"], "lab-operator on cp-2", "{told}");
    assert_eq!(o.status_hold["reported_by"], "cp-2", "{told}");
    assert_eq!(o.status_hold["recorded"], true, "{told}");
    assert_eq!(o.status_hold["action"], "off", "{told}");
    // The planner itself left cp-1 alone (not only the executor and the agent behind it).
    let refusal = o
        .refusal_while_held
        .as_deref()
        .unwrap_or_else(|| panic!("no refusal of kind hold while held\n{told}"));
    assert!(
        refusal.contains("metalguard-controller release cp-1"),
        "{refusal}"
    );
    assert!(o.started_while_held.is_empty(), "{told}");

    // Released: the controller remediates the silent host and it comes back.
    assert!(o.release_output.contains("released hold cp-2/"), "{told}");
    assert!(o.back_after.is_some(), "never healthy again\n{told}");
    assert!(o.after_release.iter().any(|e| e == "on"), "{told}");
    assert!(
        !o.remediations.is_empty() && o.remediations.iter().all(|(_, phase)| phase == "done"),
        "{told}"
    );
    assert!(o.record_deleted, "cp-2 kept its hold record\n{told}");
    assert!(o.others.is_empty(), "{told}");
    assert!(o.report.ok, "{}\n{told}", o.report.seen);
}
