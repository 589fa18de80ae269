//! Table tests that walk the remediation state machine through the simulator, including every
//! failure branch.

use metalguard_api::plan::ActionKind;
use metalguard_api::policy::{NodeHandling, Strategy};
use metalguard_api::remediation::RemediationPhase as P;
use metalguard_api::snapshot::FenceRequest;

use crate::sim::World;
use crate::testkit::{NOW, cluster, policy};

/// A world of 3 control-plane hosts and `workers` workers where `broken` hosts crashed ten
/// minutes ago.
fn world(workers: usize, broken: &[&str], tweak: impl FnOnce(&mut World)) -> World {
    let mut w = World::new(cluster(3, workers), policy(), NOW);
    tweak(&mut w);
    for b in broken {
        w.broken.insert((*b).to_owned());
    }
    w.refresh();
    w.advance(600);
    w
}

fn run(w: &mut World, rounds: usize) {
    for _ in 0..rounds {
        w.step().unwrap();
        w.advance(10);
    }
}

fn steps(w: &World, rid: &str) -> Vec<String> {
    w.log
        .iter()
        .filter_map(|id| id.strip_prefix(&format!("{rid}/")).map(str::to_owned))
        .collect()
}

fn phase(w: &World, rid: &str) -> P {
    w.snap
        .remediations
        .iter()
        .find(|r| r.id == rid)
        .unwrap()
        .phase
        .clone()
}

#[test]
fn external_baremetal_flow_walks_every_phase_and_restores_metadata() {
    let mut w = world(2, &["w-0"], |w| {
        let n = w.host_mut("w-0").unwrap().node.as_mut().unwrap();
        n.labels.insert("zone".into(), "old".into());
        n.labels.insert("custom".into(), "1".into());
    });
    while phase_or_none(&w, "remediation/w-0/1") != Some(P::WaitingForNode) {
        w.step().unwrap();
        assert!(w.log.len() < 50, "{:?}", w.log);
    }
    // The re-registered node already carries a key: it wins over the backup.
    w.advance(10);
    w.host_mut("w-0")
        .unwrap()
        .node
        .as_mut()
        .unwrap()
        .labels
        .insert("zone".into(), "new".into());
    run(&mut w, 4);
    assert_eq!(
        steps(&w, "remediation/w-0/1"),
        [
            "start",
            "power-off",
            "verify-power-off",
            "backup-node-metadata",
            "delete-node",
            "power-on",
            "verify-power-on",
            "restore-node-metadata",
            "complete"
        ]
    );
    let labels = &w
        .snap
        .hosts
        .iter()
        .find(|h| h.name == "w-0")
        .unwrap()
        .node
        .as_ref()
        .unwrap()
        .labels;
    assert_eq!(labels.get("zone").map(String::as_str), Some("new"));
    assert_eq!(labels.get("custom").map(String::as_str), Some("1"));
}

fn phase_or_none(w: &World, rid: &str) -> Option<P> {
    w.snap
        .remediations
        .iter()
        .find(|r| r.id == rid)
        .map(|r| r.phase.clone())
}

#[test]
fn reboot_strategy_power_cycles_only() {
    let mut w = world(2, &["w-1"], |w| {
        w.policy.remediation.strategy = Strategy::Reboot;
    });
    run(&mut w, 8);
    assert_eq!(
        steps(&w, "remediation/w-1/1"),
        [
            "start",
            "power-off",
            "verify-power-off",
            "power-on",
            "verify-power-on",
            "complete"
        ]
    );
}

#[test]
fn out_of_service_taint_replaces_node_deletion_and_is_removed_on_restore() {
    let mut w = world(2, &["w-0"], |w| {
        w.policy.remediation.node_handling = NodeHandling::OutOfServiceTaint;
    });
    run(&mut w, 10);
    let s = steps(&w, "remediation/w-0/1");
    assert!(
        s.contains(&"taint-out-of-service".to_owned()) && !s.contains(&"delete-node".to_owned()),
        "{s:?}"
    );
    assert_eq!(phase(&w, "remediation/w-0/1"), P::Done);
    let node = w
        .snap
        .hosts
        .iter()
        .find(|h| h.name == "w-0")
        .unwrap()
        .node
        .as_ref()
        .unwrap();
    assert!(!node.out_of_service);
}

#[test]
fn control_plane_power_failures_retry_then_need_a_person() {
    let mut w = world(2, &["cp-0"], |w| {
        w.policy.remediation.max_retry = 1;
        w.bmc_broken.insert("cp-0".into());
    });
    run(&mut w, 3);
    assert!(
        matches!(phase(&w, "remediation/cp-0/1"), P::Failed { .. }),
        "{:?}",
        w.log
    );
    // retryPeriod (5 min) must pass before attempt 2.
    let p = w.step().unwrap();
    assert!(
        p.refusals
            .iter()
            .any(|r| r.reason.contains("waits for retryPeriod")),
        "{p}"
    );
    w.advance(301);
    run(&mut w, 3);
    let second = w
        .snap
        .remediations
        .iter()
        .find(|r| r.id == "remediation/cp-0/2")
        .unwrap();
    assert_eq!(second.attempt, 2);
    w.advance(301);
    run(&mut w, 2);
    match phase(&w, "remediation/cp-0/2") {
        P::NeedsPerson { reason } => assert!(
            reason.contains("control-plane host is never reprovisioned"),
            "{reason}"
        ),
        other => panic!("expected needs-a-person, got {other}: {:?}", w.log),
    }
    let p = w.step().unwrap();
    assert!(
        p.refusals
            .iter()
            .any(|r| r.subject == "cp-0" && r.reason.contains("needs a person")),
        "{p}"
    );
}

#[test]
fn worker_is_reprovisioned_when_allowed_but_never_an_externally_provisioned_one() {
    let mut w = world(3, &["w-0", "w-1"], |w| {
        w.policy.remediation.max_retry = 0;
        w.policy.remediation.allow_reprovision = true;
        w.policy.remediation.max_concurrent = 2;
        w.bmc_broken.insert("w-0".into());
        w.bmc_broken.insert("w-1".into());
        w.host_mut("w-1").unwrap().externally_provisioned = true;
    });
    run(&mut w, 4);
    assert_eq!(
        phase(&w, "remediation/w-0/1"),
        P::Reprovisioning,
        "{:?}",
        w.log
    );
    assert!(
        matches!(phase(&w, "remediation/w-1/1"), P::NeedsPerson { .. }),
        "{:?}",
        w.log
    );
}

#[test]
fn cancellation_before_power_off_is_clean() {
    let mut w = world(2, &["w-0"], |_| {});
    w.step().unwrap(); // start (gated)
    w.broken.remove("w-0");
    w.refresh();
    let p = w.step().unwrap();
    assert!(
        p.to_string().contains("target recovered before power-off"),
        "{p}"
    );
    assert!(matches!(
        phase(&w, "remediation/w-0/1"),
        P::Cancelled { .. }
    ));
    assert!(!steps(&w, "remediation/w-0/1").contains(&"power-off".to_owned()));
}

#[test]
fn cancellation_after_power_off_powers_the_host_back_on() {
    let mut w = world(2, &["w-0"], |_| {});
    while phase_or_none(&w, "remediation/w-0/1") != Some(P::VerifiedOff) {
        w.step().unwrap();
    }
    let r = w
        .snap
        .remediations
        .iter_mut()
        .find(|r| r.id == "remediation/w-0/1")
        .unwrap();
    r.cancel_requested = Some("operator changed their mind".into());
    run(&mut w, 5);
    assert!(
        matches!(phase(&w, "remediation/w-0/1"), P::Cancelled { .. }),
        "{:?}",
        w.log
    );
    assert!(steps(&w, "remediation/w-0/1").contains(&"power-on".to_owned()));
    assert!(w.up("w-0"));
}

#[test]
fn node_that_never_returns_fails_the_attempt_after_the_deadline() {
    let mut w = world(2, &["w-0"], |w| w.policy.remediation.max_retry = 0);
    while phase_or_none(&w, "remediation/w-0/1") != Some(P::WaitingForNode) {
        w.step().unwrap();
    }
    w.broken.insert("w-0".into()); // the OS never comes back
    w.refresh();
    w.step().unwrap();
    assert_eq!(phase(&w, "remediation/w-0/1"), P::WaitingForNode);
    w.advance(1201); // no nodeStartupTimeout configured: the 20 min default
    w.step().unwrap();
    match phase(&w, "remediation/w-0/1") {
        P::Failed { reason } => assert!(reason.contains("within 20m"), "{reason}"),
        other => panic!("{other}"),
    }
}

#[test]
fn executor_is_never_the_target_and_prefers_another_failure_domain() {
    let mut w = world(3, &["w-0"], |w| {
        for (name, d) in [("w-0", "a"), ("w-1", "a"), ("w-2", "b")] {
            w.host_mut(name).unwrap().failure_domain = Some(d.into());
        }
        for h in &mut w.snap.hosts {
            if h.name.starts_with("cp-") {
                h.agent = None; // only workers run agents here
            }
        }
    });
    let p = w.step().unwrap();
    let ex = p.actions.iter().find_map(|a| match &a.kind {
        ActionKind::StartRemediation { remediation } => Some(remediation.executor.clone()),
        _ => None,
    });
    assert_eq!(ex.as_deref(), Some("w-2"), "{p}");
}

fn started_executor(w: &mut World) -> Option<String> {
    let p = w.step().unwrap();
    p.actions.iter().find_map(|a| match &a.kind {
        ActionKind::StartRemediation { remediation } => Some(remediation.executor.clone()),
        _ => None,
    })
}

fn report_bmc(w: &mut World, agent: &str, target: &str, reachable: bool) {
    let a = w.host_mut(agent).unwrap().agent.as_mut().unwrap();
    a.bmc_reachable.insert(target.into(), reachable);
}

#[test]
fn an_agent_that_cannot_reach_the_targets_bmc_is_passed_over_while_another_might() {
    // Nothing reported: the first by name, as before reachability existed.
    let mut w = world(2, &["w-0"], |_| {});
    assert_eq!(started_executor(&mut w).as_deref(), Some("cp-0"));
    // cp-0 cannot reach w-0's BMC (it reaches w-1's, which does not matter): cp-1 drives it.
    let mut w = world(2, &["w-0"], |w| {
        report_bmc(w, "cp-0", "w-0", false);
        report_bmc(w, "cp-0", "w-1", true);
    });
    assert_eq!(started_executor(&mut w).as_deref(), Some("cp-1"));
}

/// Issue 15: a fence that no agent can carry out is not started (it would spend a retry and
/// hide the cause); the refusal names the cause.
#[test]
fn a_fence_no_agent_can_carry_out_is_not_started_and_the_refusal_says_why() {
    let mut w = world(2, &["w-0"], |w| {
        for agent in ["cp-0", "cp-1", "cp-2", "w-1"] {
            report_bmc(w, agent, "w-0", false);
        }
    });
    let p = w.step().unwrap();
    assert!(
        !p.actions
            .iter()
            .any(|a| matches!(a.kind, ActionKind::StartRemediation { .. })),
        "{p}"
    );
    let r = p.refusals.iter().find(|r| r.subject == "w-0").unwrap();
    assert_eq!(r.kind, metalguard_api::plan::ReasonKind::Executor, "{p}");
    assert!(r.reason.contains("cannot reach w-0's BMC"), "{}", r.reason);
}

#[test]
fn a_running_remediation_moves_off_an_executor_that_lost_the_targets_bmc() {
    let mut w = world(2, &["w-0"], |_| {});
    assert_eq!(started_executor(&mut w).as_deref(), Some("cp-0"));
    w.advance(10);
    report_bmc(&mut w, "cp-0", "w-0", false);
    report_bmc(&mut w, "cp-2", "w-0", true);
    let p = w.step().unwrap();
    let executors: Vec<&str> = p
        .actions
        .iter()
        .filter_map(|a| match &a.kind {
            ActionKind::Remediate { executor, .. } => Some(executor.as_str()),
            _ => None,
        })
        .collect();
    assert!(!executors.is_empty(), "{p}");
    assert!(executors.iter().all(|e| *e == "cp-1"), "{p}");
}

#[test]
fn quick_relapse_within_min_healthy_period_counts_as_a_retry() {
    let mut w = world(2, &["w-0"], |_| {});
    run(&mut w, 10);
    assert_eq!(phase(&w, "remediation/w-0/1"), P::Done);
    w.broken.insert("w-0".into());
    w.refresh();
    w.advance(600);
    w.step().unwrap();
    assert_eq!(
        w.snap
            .remediations
            .iter()
            .find(|r| r.seq == 2)
            .unwrap()
            .attempt,
        2
    );
}

#[test]
fn admin_fence_goes_through_the_gates_unless_forced_and_the_reason_is_recorded() {
    let mut w = world(3, &["w-1", "w-2"], |w| {
        w.policy.health_checks[1].max_unhealthy =
            Some(metalguard_api::policy::MaxUnhealthy::Count(1));
        w.host_mut("w-0").unwrap().fence_request = Some(FenceRequest {
            requested_at: w.now,
            requested_by: Some("alice".into()),
            force_reason: None,
            stay_off: false,
            nonce: None,
            drill: false,
        });
    });
    let p = w.step().unwrap();
    assert!(
        p.refusals
            .iter()
            .any(|r| r.subject == "w-0" && r.reason.contains("short-circuited")),
        "{p}"
    );
    w.host_mut("w-0")
        .unwrap()
        .fence_request
        .as_mut()
        .unwrap()
        .force_reason = Some("disk controller on fire".into());
    let p = w.step().unwrap();
    let r = w
        .snap
        .remediations
        .iter()
        .find(|r| r.target == "w-0")
        .unwrap();
    assert_eq!(r.forced.as_deref(), Some("disk controller on fire"));
    assert!(r.cause.contains("alice"));
    assert!(
        p.to_string()
            .contains("FORCED past policy gates: disk controller on fire"),
        "{p}"
    );
}

#[test]
fn forced_fence_of_a_control_plane_host_never_skips_the_quorum_guard() {
    let mut w = world(1, &[], |w| {
        w.hung.insert("cp-1".into());
        w.host_mut("cp-0").unwrap().fence_request = Some(FenceRequest {
            requested_at: w.now,
            requested_by: None,
            force_reason: Some("because".into()),
            stay_off: false,
            nonce: None,
            drill: false,
        });
    });
    let p = w.step().unwrap();
    assert!(w.snap.remediations.is_empty(), "{p}");
    assert!(
        p.refusals
            .iter()
            .any(|r| r.subject == "cp-0" && r.reason.contains("would leave 1 of 3")),
        "{p}"
    );
}

#[test]
fn control_plane_host_with_a_live_member_is_not_fenced_while_another_member_hangs() {
    let mut w = world(1, &[], |w| {
        w.kubelet_down.insert("cp-0".into());
        w.hung.insert("cp-1".into());
    });
    run(&mut w, 3);
    assert!(w.snap.remediations.is_empty(), "{:?}", w.log);
    let p = w.step().unwrap();
    assert!(
        p.refusals
            .iter()
            .any(|r| r.subject == "cp-0" && r.reason.contains("would leave 1 of 3")),
        "{p}"
    );
}

#[test]
fn a_stay_off_fence_powers_off_handles_the_node_and_leaves_the_host_off_for_a_person() {
    // w-0 is unhealthy by its check: the request adds only "leave it off".
    let mut w = world(2, &["w-0"], |w| {
        w.host_mut("w-0").unwrap().fence_request = Some(FenceRequest {
            requested_at: w.now,
            requested_by: Some("alice".into()),
            force_reason: None,
            stay_off: true,
            nonce: None,
            drill: false,
        });
    });
    let rid = "remediation/w-0/1";
    while !phase_or_none(&w, rid).is_some_and(|p| p.is_terminal()) {
        w.step().unwrap();
        w.advance(10);
        assert!(w.log.len() < 50, "{:?}", w.log);
    }
    let P::NeedsPerson { reason } = phase(&w, rid) else {
        panic!("{:?}", phase(&w, rid));
    };
    assert!(reason.contains("is left off"), "{reason}");
    let r = w.snap.remediations.iter().find(|r| r.id == rid).unwrap();
    assert!(r.stay_off);
    let done = steps(&w, rid);
    for step in ["power-off", "verify-power-off", "delete-node"] {
        assert!(done.iter().any(|s| s == step), "{step}: {done:?}");
    }
    assert!(!done.iter().any(|s| s.starts_with("power-on")), "{done:?}");
    assert!(w.power_off.contains("w-0"));
    // Rounds go by: nothing powers it on, no new remediation starts.
    run(&mut w, 10);
    assert!(w.power_off.contains("w-0"));
    assert_eq!(
        w.snap
            .remediations
            .iter()
            .filter(|r| r.target == "w-0")
            .count(),
        1
    );
    let p = w.step().unwrap();
    assert!(
        p.refusals
            .iter()
            .any(|r| r.subject == "w-0" && r.reason.contains("needs a person")),
        "{p}"
    );
}

#[test]
fn without_stay_off_the_same_fence_powers_the_host_back_on() {
    let mut w = world(2, &["w-0"], |w| {
        w.host_mut("w-0").unwrap().fence_request = Some(FenceRequest {
            requested_at: w.now,
            requested_by: Some("alice".into()),
            force_reason: None,
            stay_off: false,
            nonce: None,
            drill: false,
        });
    });
    let rid = "remediation/w-0/1";
    while phase_or_none(&w, rid) != Some(P::WaitingForNode) {
        w.step().unwrap();
        w.advance(10);
        assert!(w.log.len() < 50, "{:?}", w.log);
    }
    assert!(steps(&w, rid).iter().any(|s| s == "power-on"));
    assert!(!w.snap.remediations.iter().any(|r| r.stay_off));
}

#[test]
fn the_largest_max_retry_retries_without_overflowing() {
    // `max_retry = 4294967295` passed the checks and overflowed `max_retry + 1` at the second
    // attempt, panicking the leader's task (issue 28).
    let mut w = world(2, &["cp-0"], |w| {
        w.policy.remediation.max_retry = u32::MAX;
        w.bmc_broken.insert("cp-0".into());
    });
    run(&mut w, 3);
    assert!(matches!(phase(&w, "remediation/cp-0/1"), P::Failed { .. }));
    w.advance(301);
    run(&mut w, 3);
    let second = w
        .snap
        .remediations
        .iter()
        .find(|r| r.id == "remediation/cp-0/2")
        .unwrap();
    assert_eq!(second.attempt, 2);
}

/// w-0 (boot `w-0-boot-0`, its kubelet down) remediated through a BMC that says yes and does
/// nothing, up to the wait for its node after the "verified" power-on; no retries.
fn lying_bmc_waiting_for_node(rid: &str, tweak: impl FnOnce(&mut World)) -> World {
    let mut w = world(2, &[], |w| {
        tweak(w);
        w.policy.remediation.max_retry = 0;
        w.host_mut("w-0").unwrap().agent.as_mut().unwrap().boot_id = Some("w-0-boot-0".into());
        w.bmc_lying.insert("w-0".into());
        w.kubelet_down.insert("w-0".into());
    });
    while phase_or_none(&w, rid) != Some(P::WaitingForNode) {
        w.step().unwrap();
        w.advance(1);
        assert!(w.log.len() < 50, "{:?}", w.log);
    }
    w
}

/// Issue 24, item 3: a remediation is done only when the target reports a new boot ID after
/// its verified power-on. A BMC that says yes to off and on and does nothing (the kubelet
/// came back on its own) is caught: ready, but still the boot from before the fence. A report
/// of that boot received 30 s or more after the power-on was verified proves the host never
/// went down, and fails the attempt then, with the evidence in its reason, instead of at the
/// node deadline (20 minutes, during which no other control-plane host would be remediated).
#[test]
fn a_power_cycle_that_booted_nothing_is_not_taken_for_a_recovery() {
    let rid = "remediation/w-0/1";
    let mut w = lying_bmc_waiting_for_node(rid, |_| {});
    let started = w.snap.remediations.iter().find(|r| r.id == rid).unwrap();
    assert_eq!(started.boot_before.as_deref(), Some("w-0-boot-0"));
    // The kubelet comes back by itself: ready, same boot; too soon after the power-on to
    // tell a report sent before the power went off from one sent after.
    w.kubelet_down.remove("w-0");
    w.refresh();
    run(&mut w, 3);
    assert_eq!(phase(&w, rid), P::WaitingForNode, "{:?}", w.log);
    // Still within the heartbeat timeout (60 s here) of the power-on: not proof yet.
    w.advance(24);
    w.step().unwrap();
    assert_eq!(phase(&w, rid), P::WaitingForNode, "{:?}", w.log);
    w.advance(6);
    w.step().unwrap();
    match phase(&w, rid) {
        P::Failed { reason } => assert!(
            reason.contains("w-0 still ran boot w-0-boot-0")
                && reason.contains("after its power-on was verified")
                && reason.contains("did not take"),
            "{reason}"
        ),
        other => panic!("{other}"),
    }
}

/// With a heartbeat timeout under 30 s the proof still needs 30 s after the power-on: a report
/// sent just before the power went off may arrive just after it was verified off.
#[test]
fn a_report_of_the_old_boot_proves_nothing_within_30_s_of_the_power_on() {
    let rid = "remediation/w-0/1";
    let mut w = lying_bmc_waiting_for_node(rid, |w| {
        for check in &mut w.policy.health_checks {
            check.agent_heartbeat_timeout = Some(std::time::Duration::from_secs(5));
        }
    });
    let since = w
        .snap
        .remediations
        .iter()
        .find(|r| r.id == rid)
        .unwrap()
        .phase_since;
    w.kubelet_down.remove("w-0");
    let until = |w: &World, secs: u64| secs.saturating_sub(w.now.since(since).as_secs());
    let wait = until(&w, 29);
    w.advance(wait);
    w.step().unwrap();
    assert_eq!(phase(&w, rid), P::WaitingForNode, "{:?}", w.log);
    w.advance(2);
    w.step().unwrap();
    assert!(
        matches!(phase(&w, rid), P::Failed { reason } if reason.contains("did not take")),
        "{:?}",
        w.log
    );
}

/// Without a report of the old boot after the power-on (the agent silent, the host down or
/// hung), nothing is proven: the attempt waits for the node deadline, as before.
#[test]
fn a_silent_target_with_its_old_boot_waits_for_the_node_deadline() {
    let rid = "remediation/w-0/1";
    let mut w = lying_bmc_waiting_for_node(rid, |_| {});
    // The host dies now: its agent says nothing more after the power-on.
    w.broken.insert("w-0".into());
    w.refresh();
    w.advance(600);
    w.step().unwrap();
    assert_eq!(phase(&w, rid), P::WaitingForNode, "{:?}", w.log);
    w.advance(601);
    w.step().unwrap();
    assert!(matches!(phase(&w, rid), P::Failed { .. }), "{:?}", w.log);
}

/// The same with a BMC that works: the power-on boots the host (a new boot ID) and the
/// remediation completes.
#[test]
fn a_power_cycle_that_booted_the_host_completes() {
    let mut w = world(2, &[], |w| {
        w.host_mut("w-0").unwrap().agent.as_mut().unwrap().boot_id = Some("w-0-boot-0".into());
        w.kubelet_down.insert("w-0".into());
    });
    let rid = "remediation/w-0/1";
    run(&mut w, 20);
    let last = steps(&w, rid);
    assert_eq!(
        last.last().map(String::as_str),
        Some("complete"),
        "{:?}",
        w.log
    );
    assert_ne!(
        w.host_mut("w-0")
            .unwrap()
            .agent
            .as_ref()
            .unwrap()
            .boot_id
            .as_deref(),
        Some("w-0-boot-0")
    );
}

fn ask_for_a_drill(w: &mut World, host: &str) {
    w.host_mut(host).unwrap().fence_request = Some(FenceRequest {
        requested_at: w.now,
        requested_by: Some("alice".into()),
        force_reason: None,
        stay_off: false,
        nonce: None,
        drill: true,
    });
}

#[test]
fn a_drill_power_cycles_a_healthy_control_plane_host_and_is_recorded_as_one() {
    let mut w = world(1, &[], |_| {});
    ask_for_a_drill(&mut w, "cp-1");
    let p = w.step().unwrap();
    assert!(
        p.to_string().contains("a fence drill: a real power cycle"),
        "{p}"
    );
    run(&mut w, 12);
    let r = w
        .snap
        .remediations
        .iter()
        .find(|r| r.target == "cp-1")
        .unwrap()
        .clone();
    assert!(
        r.cause.starts_with(crate::remediation::DRILL_CAUSE) && r.cause.contains("alice"),
        "{r:?}"
    );
    assert!(r.forced.is_none(), "a drill skips no gate");
    assert_eq!(r.phase, P::Done, "{:?}", steps(&w, &r.id));
    let s = steps(&w, &r.id);
    assert!(
        s.contains(&"power-off".to_owned()) && s.contains(&"power-on".to_owned()),
        "a real power cycle, not cancelled as healthy: {s:?}"
    );
    assert_eq!(
        w.snap
            .remediations
            .iter()
            .filter(|r| r.target == "cp-1")
            .count(),
        1,
        "the request is served once"
    );
}

#[test]
fn a_drill_waits_while_any_host_is_unhealthy_or_being_remediated() {
    let mut w = world(2, &["w-1"], |_| {});
    ask_for_a_drill(&mut w, "w-0");
    let p = w.step().unwrap();
    assert!(
        !w.snap.remediations.iter().any(|r| r.target == "w-0"),
        "{p}"
    );
    assert!(
        p.refusals.iter().any(|r| r.subject == "w-0"
            && r.reason
                .contains("drill runs only while no host is unhealthy")
            && r.reason.contains("w-1")),
        "{p}"
    );
    // A control-plane drill while another control-plane host is down is refused before the
    // quorum guard would be asked.
    let mut w = world(0, &[], |w| {
        w.hung.insert("cp-2".into());
    });
    ask_for_a_drill(&mut w, "cp-0");
    let p = w.step().unwrap();
    assert!(
        !w.snap.remediations.iter().any(|r| r.target == "cp-0"),
        "{p}"
    );
    // A drill of a host a check finds unhealthy is that host's remediation.
    let mut w = world(2, &["w-1"], |_| {});
    ask_for_a_drill(&mut w, "w-1");
    w.step().unwrap();
    let r = w
        .snap
        .remediations
        .iter()
        .find(|r| r.target == "w-1")
        .unwrap();
    assert!(
        !r.cause.starts_with(crate::remediation::DRILL_CAUSE),
        "{r:?}"
    );
}

#[test]
fn a_host_whose_node_lease_another_actor_holds_is_not_remediated_even_when_forced() {
    let mut w = world(2, &["w-1"], |w| {
        w.host_mut("w-1").unwrap().lease_held_by = Some("node-maintenance".into());
    });
    let p = w.step().unwrap();
    assert!(
        !w.snap.remediations.iter().any(|r| r.target == "w-1"),
        "{p}"
    );
    assert!(
        p.refusals.iter().any(|r| r.subject == "w-1"
            && r.reason
                .contains("medik8s-leases/node-w-1 is held by node-maintenance")),
        "{p}"
    );
    w.host_mut("w-1").unwrap().fence_request = Some(FenceRequest {
        requested_at: w.now,
        requested_by: Some("alice".into()),
        force_reason: Some("now".into()),
        stay_off: false,
        nonce: None,
        drill: false,
    });
    w.step().unwrap();
    assert!(!w.snap.remediations.iter().any(|r| r.target == "w-1"));
    // Free again: the remediation starts.
    w.host_mut("w-1").unwrap().lease_held_by = None;
    w.step().unwrap();
    assert!(w.snap.remediations.iter().any(|r| r.target == "w-1"));
}
