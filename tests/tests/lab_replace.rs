//! End to end: the lab's `replace` scenario with the real binaries. A three-host lab with one
//! spare (`cp-4`: BMC, certificate and an agent with `[etcd.join]` on the env-file launcher,
//! the lab as its supervisor) retires `cp-1` and adds `cp-4` to the inventory; the real
//! controller has `cp-4`'s own agent join it as a learner, promotes it, removes `cp-1`'s
//! member and powers `cp-1` off through another host's agent. The test checks each step was
//! seen in order within its bound, that healthy voters never fell below quorum, the BMCs'
//! power logs and the data written before. Runs one at a time with the other lab tests
//! (`.config/nextest.toml`, test group `lab`); dropping the lab stops every process. The
//! second test runs the same with the spare's etcd as kubeadm's static Pod.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;

use metalguard_e2e::lab::scenarios::{ReplaceOutcome, observe_replace};
use metalguard_e2e::lab::{EtcdLayout, Lab, LabOptions, SpareEtcd, Standing};

/// The timeline and the processes' logs, for failure messages.
fn story(lab: &Lab) -> String {
    format!(
        "--- timeline\n{}\n--- logs\n{}",
        lab.timeline.render(),
        lab.logs()
    )
}

fn run_replace(lab: &mut Lab) -> ReplaceOutcome {
    match observe_replace(lab) {
        Ok(outcome) => outcome,
        Err(e) => panic!("scenario replace failed: {e}\n{}", story(lab)),
    }
}

#[test]
fn a_spare_replaces_a_retired_host_without_losing_quorum_and_the_old_host_is_powered_off_once() {
    let mut options = LabOptions::new(3, metalguard_e2e::lab::test_bin_dir());
    options.spares = 1;
    let mut lab = match Lab::start(options) {
        Ok(lab) => lab,
        Err(e) => panic!("the lab did not start: {e}"),
    };
    // The spare comes after the voters, outside the inventory, with no member of its own.
    let spare = &lab.hosts()[3];
    assert_eq!(spare.name, "cp-4");
    assert_eq!(spare.standing(), Standing::Standby);
    assert!(spare.spare_etcd().is_some_and(|s| !s.is_running()));
    assert!(
        !std::fs::read_to_string(lab.inventory())
            .unwrap()
            .contains("cp-4")
    );

    let o = run_replace(&mut lab);
    let r = &o.report;
    let told = story(&lab);
    assert!(
        r.ok,
        "replace did not match its outcome\nexpected: {}\nseen:     {}\n{told}",
        r.expected, r.seen
    );
    assert_eq!((o.retired.as_str(), o.spare.as_str()), ("cp-1", "cp-4"));

    // Each step was seen, in order, within its bound.
    let (Some(learner), Some(voter), Some(removed), Some(off)) =
        (o.learner_at, o.voter_at, o.removed_at, o.powered_off_at)
    else {
        panic!("a step was never seen: {:?}\n{told}", r.timings);
    };
    assert!(
        learner < voter,
        "cp-4 was seen as a learner ({learner:?}) before it voted ({voter:?})\n{told}"
    );
    assert!(voter <= removed, "cp-1 removed before cp-4 voted\n{told}");
    assert!(
        off >= removed.saturating_sub(std::time::Duration::from_secs(1)),
        "cp-1 powered off ({off:?}) before its member was removed ({removed:?})\n{told}"
    );
    let mut previous = std::time::Duration::ZERO;
    for (step, at) in [
        ("learner", learner),
        ("voter", voter),
        ("removed", removed),
        ("off", off),
    ] {
        assert!(
            at.saturating_sub(previous) <= o.step_budget,
            "step {step} took {:?}, more than {:?}\n{told}",
            at.saturating_sub(previous),
            o.step_budget
        );
        previous = at;
    }

    // Voters went 3 → 4 → 3 and never fewer than 3; healthy voters never fell below the
    // quorum of the moment. The 4-voter window can be shorter than one sample (promotion and
    // removal 30 ms apart were seen), so 4 is the most, not a must.
    assert!(
        o.samples >= 10,
        "only {} member-list samples\n{told}",
        o.samples
    );
    assert!(
        o.min_voters == 3 && o.max_voters <= 4,
        "voters seen: min {}, max {}\n{told}",
        o.min_voters,
        o.max_voters
    );
    assert!(
        o.below_quorum.is_empty(),
        "healthy voters below quorum: {:?}\n{told}",
        o.below_quorum
    );

    // One power change in the whole lab: cp-1 off, through another host's agent.
    assert_eq!(o.power_events.len(), 1, "{:?}\n{told}", o.power_events);
    assert_eq!(o.power_events[0].0, "cp-1", "{:?}\n{told}", o.power_events);
    assert!(
        o.executor.as_deref().is_some_and(|e| e != "cp-1"),
        "the power-off ran on {:?}\n{told}",
        o.executor
    );

    // The cluster without cp-1, every key written before the retirement intact.
    assert_eq!(o.final_voters, ["cp-2", "cp-3", "cp-4"], "{told}");
    assert_eq!(o.final_learners, 0, "{told}");
    assert!(
        o.missing.is_empty(),
        "{} of {} keys missing: {:?}\n{told}",
        o.missing.len(),
        o.keys,
        o.missing
    );

    // The lab itself goes on: cp-1 retired, off and out of the inventory; cp-4 in service.
    assert_eq!(lab.hosts()[0].standing(), Standing::Removed);
    assert!(!lab.hosts()[0].powered());
    assert_eq!(lab.hosts()[3].standing(), Standing::InService);
    assert!(lab.host_healthy(3), "{told}");
    let inventory = std::fs::read_to_string(lab.inventory()).unwrap();
    assert!(
        inventory.contains("name = \"cp-4\"") && !inventory.contains("name = \"cp-1\""),
        "{inventory}"
    );
    if let Err(e) = lab.wait_all_healthy(std::time::Duration::from_secs(30)) {
        panic!("the lab is not healthy after the replacement: {e}\n{told}");
    }
    eprintln!(
        "replace: {}\ntimings: {:?}\n{}",
        r.seen,
        r.timings,
        lab.timeline.render()
    );

    // Dropping the lab stops every process it started, the supervised etcd included (its
    // command line names no harness directory, so nothing else would find it).
    let mut pids: Vec<(String, u32)> = Vec::new();
    for h in lab.hosts() {
        pids.extend(h.agent_pid().map(|p| (format!("agent {}", h.name), p)));
        pids.extend(
            h.spare_etcd()
                .and_then(SpareEtcd::pid)
                .map(|p| (format!("etcd {}", h.name), p)),
        );
    }
    for i in 0..lab.etcd().len() {
        let m = lab.etcd().member(i);
        pids.extend(m.pid().map(|p| (format!("etcd {}", m.name()), p)));
    }
    assert!(
        pids.iter().any(|(name, _)| name == "etcd cp-4"),
        "cp-4's etcd runs: {pids:?}"
    );
    drop(lab);
    let left: Vec<&(String, u32)> = pids
        .iter()
        .filter(|(_, pid)| Path::new(&format!("/proc/{pid}")).exists())
        .collect();
    assert!(
        left.is_empty(),
        "left running after the lab stopped: {left:?}"
    );
}

/// The same replacement with the spare's etcd as kubeadm's static Pod: its agent's
/// `static-pod` launcher writes `manifests/etcd.yaml` (from a member's kubeadm manifest as the
/// template, kubeadm's certificate layout), and the lab, as the host's kubelet, runs etcd from
/// it, refusing what a real kubelet could not run.
#[test]
fn a_spare_with_etcd_as_a_static_pod_replaces_a_retired_host_without_losing_quorum() {
    let mut options = LabOptions::new(3, metalguard_e2e::lab::test_bin_dir());
    options.spares = 1;
    options.etcd_layout = EtcdLayout::StaticPod;
    let mut lab = match Lab::start(options) {
        Ok(lab) => lab,
        Err(e) => panic!("the lab did not start: {e}"),
    };
    let manifest = lab.hosts()[3].spare_etcd().unwrap().watched_file();
    assert!(manifest.ends_with("manifests/etcd.yaml"), "{manifest:?}");
    assert!(!manifest.exists(), "no manifest before the join");

    let o = run_replace(&mut lab);
    let r = &o.report;
    let told = story(&lab);
    assert!(
        r.ok,
        "replace did not match its outcome\nexpected: {}\nseen:     {}\n{told}",
        r.expected, r.seen
    );
    assert_eq!(o.final_voters, ["cp-2", "cp-3", "cp-4"], "{told}");
    assert_eq!(o.final_learners, 0, "{told}");
    assert!(o.below_quorum.is_empty(), "{:?}\n{told}", o.below_quorum);
    assert!(o.missing.is_empty(), "{:?}\n{told}", o.missing);

    // The kubelet ran cp-4's etcd from the agent's manifest, once, and refused nothing.
    let text = std::fs::read_to_string(&manifest).unwrap();
    assert!(
        text.contains("metalguard.io/written-by: metalguard-agent"),
        "{text}"
    );
    assert!(text.contains("--initial-cluster-state=existing"), "{text}");
    let timeline = lab.timeline.render();
    assert_eq!(
        timeline
            .matches("kubelet cp-4     etcd.yaml present: started etcd")
            .count(),
        1,
        "{told}"
    );
    assert!(!timeline.contains("not run as etcd"), "{told}");
    assert!(!timeline.contains("supervisor cp-4"), "{told}");
    assert!(lab.host_healthy(3), "{told}");
}
