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
    let unmet = o.unmet(heartbeat);
    assert!(
        unmet.is_empty(),
        "unmet: {unmet:#?}\n{o:#?}\n{}",
        story(&lab)
    );
}
