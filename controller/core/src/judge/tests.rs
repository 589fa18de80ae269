//! The judgement on hand-made plans: each rule rejects what breaks it, whoever planned it.

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::{Action, ActionKind, OperationId, RemediationStep};
use metalguard_api::remediation::{Remediation, RemediationPhase as P};
use metalguard_api::snapshot::{QUORUM_HOOK, Retirement, Snapshot};

use super::{Rule, judge_plan};
use crate::testkit::{NOW, break_host, cluster, find, hold, member, policy, remediation};

fn action(id: &str, kind: ActionKind) -> Action {
    Action {
        id: OperationId(id.to_owned()),
        kind,
        reason: "test".to_owned(),
    }
}

fn step(r: &Remediation, executor: &str, step: RemediationStep) -> Action {
    action(
        &format!("{}/{}", r.id, step.name()),
        ActionKind::Remediate {
            remediation_id: r.id.clone(),
            target: r.target.clone(),
            executor: executor.to_owned(),
            step,
        },
    )
}

/// Forced past the policy gates, so that only the safety rules speak.
fn forced(mut r: Remediation) -> Remediation {
    r.forced = Some("test".into());
    r
}

fn start(r: Remediation) -> Action {
    action(
        &format!("{}/start", r.id),
        ActionKind::StartRemediation { remediation: r },
    )
}

fn rules(s: &Snapshot, actions: &[Action]) -> Vec<Rule> {
    judge_plan(s, &policy(), NOW, actions)
        .into_iter()
        .map(|v| v.rule)
        .collect()
}

#[test]
fn two_control_plane_power_offs_in_one_plan_are_one_too_many() {
    let mut s = cluster(3, 1);
    let a = forced(remediation("cp-0", 1, P::Gated, "w-0", true));
    let b = forced(remediation("cp-1", 1, P::Gated, "w-0", true));
    s.remediations = vec![a.clone(), b.clone()];
    let plan = [
        step(&a, "w-0", RemediationStep::PowerOff),
        step(&b, "w-0", RemediationStep::PowerOff),
    ];
    assert_eq!(rules(&s, &plan), [Rule::OneControlPlaneRemediation]);
    // On five voters quorum would survive two, but seed 004 still wants one at a time.
    let mut s5 = cluster(5, 1);
    s5.remediations = s.remediations.clone();
    assert_eq!(rules(&s5, &plan), [Rule::OneControlPlaneRemediation]);
}

#[test]
fn a_power_off_counts_what_is_in_flight() {
    // cp-0 is being powered off (its member still reports healthy); fencing cp-1 too would
    // leave 1 of 3 voters.
    let mut s = cluster(3, 1);
    let off = remediation("cp-0", 1, P::PoweringOff, "w-0", true);
    let next = forced(remediation("cp-1", 1, P::Gated, "w-0", true));
    s.remediations = vec![off, next.clone()];
    let v = judge_plan(
        &s,
        &policy(),
        NOW,
        &[step(&next, "w-0", RemediationStep::PowerOff)],
    );
    assert_eq!(v.len(), 1);
    assert_eq!(v[0].rule, Rule::OneControlPlaneRemediation, "{}", v[0]);
    // A held control-plane host is off as far as quorum goes: starting on another voter
    // would leave 1 of 3.
    let mut s = cluster(3, 1);
    find(&mut s, "cp-2").hold = Some(hold("cp-2", "dave"));
    let r = remediation("cp-0", 1, P::Gated, "w-0", true);
    assert_eq!(rules(&s, &[start(r)]), [Rule::QuorumAfterPlan]);
}

#[test]
fn a_failed_control_plane_remediation_blocks_another_start() {
    let mut s = cluster(5, 1);
    s.remediations = vec![remediation(
        "cp-0",
        1,
        P::Failed { reason: "x".into() },
        "w-0",
        true,
    )];
    // Its host came back by itself (healthy, ready, member healthy): nothing is held back.
    let other = remediation("cp-1", 1, P::Gated, "w-0", true);
    assert_eq!(rules(&s, &[start(other.clone())]), []);
    // Not back: it blocks every other control-plane start, not its own retry.
    break_host(find(&mut s, "cp-0"), Timestamp(0));
    assert_eq!(
        rules(&s, &[start(other)]),
        [Rule::OneControlPlaneRemediation]
    );
    let retry = remediation("cp-0", 2, P::Gated, "w-0", true);
    assert_eq!(rules(&s, &[start(retry)]), []);
}

#[test]
fn short_circuit_stops_starts_and_power_offs_unless_forced() {
    let mut s = cluster(3, 1);
    for h in ["cp-0", "cp-1"] {
        break_host(find(&mut s, h), Timestamp(NOW.0 - 600_000));
        find(&mut s, h).etcd.as_mut().unwrap().healthy = true;
    }
    let gated = remediation("cp-0", 1, P::Gated, "w-0", true);
    s.remediations = vec![gated.clone()];
    let off = step(&gated, "w-0", RemediationStep::PowerOff);
    assert_eq!(rules(&s, std::slice::from_ref(&off)), [Rule::ShortCircuit]);
    s.remediations[0].forced = Some("person".into());
    assert_eq!(rules(&s, &[off]), []);
}

#[test]
fn executors_must_be_other_live_hosts_that_reach_the_bmc() {
    let mut s = cluster(3, 2);
    let mut r = remediation("w-0", 1, P::Gated, "w-0", false);
    assert_eq!(rules(&s, &[start(r.clone())]), [Rule::Executor]);
    r.executor = "nope".into();
    assert_eq!(rules(&s, &[start(r.clone())]), [Rule::Executor]);
    r.executor = "cp-0".into();
    find(&mut s, "cp-0")
        .agent
        .as_mut()
        .unwrap()
        .bmc_reachable
        .insert("w-0".into(), false);
    assert_eq!(rules(&s, &[start(r.clone())]), [Rule::Executor]);
    r.executor = "cp-1".into();
    find(&mut s, "cp-1").agent.as_mut().unwrap().last_heartbeat = Timestamp(0);
    assert_eq!(rules(&s, &[start(r.clone())]), [Rule::Executor]);
    r.executor = "cp-2".into();
    find(&mut s, "cp-2").hold = Some(hold("cp-2", "erin"));
    assert_eq!(rules(&s, &[start(r.clone())]), [Rule::Executor]);
    r.executor = "w-1".into();
    assert_eq!(rules(&s, &[start(r)]), []);
}

#[test]
fn a_held_host_gets_no_start_and_no_power_step() {
    let mut s = cluster(3, 2);
    find(&mut s, "w-0").hold = Some(hold("w-0", "frank"));
    let r = remediation("w-0", 1, P::Gated, "cp-0", false);
    assert_eq!(rules(&s, &[start(r.clone())]), [Rule::Hold]);
    let on = remediation("w-0", 1, P::NodeRemoved, "cp-0", false);
    s.remediations = vec![on.clone()];
    assert_eq!(
        rules(&s, &[step(&on, "cp-0", RemediationStep::PowerOn)]),
        [Rule::Hold]
    );
}

#[test]
fn one_remediation_per_target_and_worker_concurrency() {
    let mut s = cluster(3, 3);
    s.remediations = vec![remediation("w-0", 1, P::PoweringOn, "cp-0", false)];
    let again = remediation("w-0", 2, P::Gated, "cp-0", false);
    assert_eq!(rules(&s, &[start(again)]), [Rule::OneRemediationPerTarget]);
    let other = remediation("w-1", 1, P::Gated, "cp-0", false);
    assert_eq!(rules(&s, &[start(other)]), [Rule::WorkerConcurrency]);
}

#[test]
fn membership_changes_follow_the_quorum_guards_rules() {
    let mut s = cluster(3, 1);
    // A healthy voter of a staying host, or at the desired count, is not removed.
    let remove = |id: u64| {
        action(
            &format!("quorum/remove-member/{id:x}"),
            ActionKind::RemoveMember {
                host: None,
                member_id: id,
            },
        )
    };
    assert_eq!(rules(&s, &[remove(1)]), [Rule::VoterRemoval]);
    find(&mut s, "cp-0").deletion_requested_at = Some(NOW);
    assert_eq!(rules(&s, &[remove(1)]), [Rule::VoterRemoval]);
    // With its replacement voting, it may go, but not while it leads.
    let mut spare = crate::testkit::cp_host("cp-3", None, 9);
    spare.etcd = Some(member(4, false, true));
    s.hosts.push(spare);
    assert_eq!(rules(&s, &[remove(1)]), []);
    find(&mut s, "cp-0").etcd.as_mut().unwrap().leader = true;
    assert_eq!(rules(&s, &[remove(1)]), [Rule::VoterRemoval]);
    // Two membership changes in one plan: the second is rejected.
    find(&mut s, "cp-0").etcd.as_mut().unwrap().leader = false;
    let promote = action(
        "quorum/promote/4",
        ActionKind::PromoteLearner {
            host: "cp-3".into(),
            member_id: 4,
        },
    );
    assert_eq!(
        rules(&s, &[remove(1), promote]),
        [Rule::OneMembershipChange]
    );
}

#[test]
fn a_learner_is_added_only_with_every_voter_up_and_promoted_only_when_ready() {
    let mut s = cluster(3, 0);
    let mut spare = crate::testkit::cp_host("cp-3", None, 9);
    spare.pre_drain_hooks.insert(QUORUM_HOOK.into());
    s.hosts.push(spare);
    let add = action(
        "quorum/add-learner/cp-3",
        ActionKind::AddLearner {
            host: "cp-3".into(),
        },
    );
    assert_eq!(rules(&s, std::slice::from_ref(&add)), []);
    find(&mut s, "cp-1").etcd.as_mut().unwrap().healthy = false;
    assert_eq!(rules(&s, &[add]), [Rule::LearnerAdd]);
    find(&mut s, "cp-1").etcd.as_mut().unwrap().healthy = true;
    let mut learner = member(4, true, true);
    learner.progress_permille = 500;
    find(&mut s, "cp-3").etcd = Some(learner);
    let promote = action(
        "quorum/promote/4",
        ActionKind::PromoteLearner {
            host: "cp-3".into(),
            member_id: 4,
        },
    );
    assert_eq!(rules(&s, std::slice::from_ref(&promote)), [Rule::Promotion]);
    find(&mut s, "cp-3")
        .etcd
        .as_mut()
        .unwrap()
        .progress_permille = 950;
    assert_eq!(rules(&s, std::slice::from_ref(&promote)), []);
    find(&mut s, "cp-3").pre_drain_hooks.clear();
    assert_eq!(rules(&s, &[promote]), [Rule::Promotion]);
}

#[test]
fn hooks_retirement_reprovisioning_and_scaling() {
    let mut s = cluster(3, 1);
    find(&mut s, "cp-0").deletion_requested_at = Some(NOW);
    let add_hook = action(
        "quorum/add-hook/cp-0",
        ActionKind::AddQuorumHook {
            host: "cp-0".into(),
        },
    );
    let remove_hook = action(
        "quorum/remove-hook/cp-0",
        ActionKind::RemoveQuorumHook {
            host: "cp-0".into(),
        },
    );
    assert_eq!(
        rules(&s, &[add_hook, remove_hook]),
        [Rule::QuorumHook, Rule::QuorumHook]
    );

    let mut s = cluster(3, 1);
    find(&mut s, "cp-0").retirement = Some(Retirement {
        requested_at: NOW,
        requested_by: None,
        reason: String::new(),
    });
    let off = action(
        "retire/cp-0/1/power-off",
        ActionKind::DecommissionHost {
            host: "cp-0".into(),
            executor: "cp-1".into(),
        },
    );
    assert_eq!(rules(&s, std::slice::from_ref(&off)), [Rule::Retirement]);
    let h = find(&mut s, "cp-0");
    h.etcd = None;
    h.pre_drain_hooks.clear();
    assert_eq!(rules(&s, &[off]), []);

    let mut s = cluster(3, 1);
    let failed = remediation("cp-1", 1, P::Failed { reason: "x".into() }, "w-0", true);
    s.remediations = vec![failed.clone()];
    assert_eq!(
        rules(&s, &[step(&failed, "w-0", RemediationStep::Reprovision)]),
        [Rule::Reprovision]
    );

    let mut s = cluster(3, 1);
    find(&mut s, "w-0").etcd = Some(member(9, false, true));
    let grow = action(
        "control-plane/request-host/4",
        ActionKind::RequestHost {
            failure_domain: None,
        },
    );
    assert_eq!(rules(&s, &[grow]), [Rule::ScalingWhileDisagreeing]);
}

/// Seed 004: scale-up and scale-down are "blocked based on Etcd and control plane preflight
/// checks" — "an equal number of control plane Machines and members" (a scale-down too) and,
/// with seed 002's step 6, "all etcd members are healthy" (in flight and held counted).
#[test]
fn seed_004_scaling_is_blocked_unless_machines_equal_members_and_every_member_is_up() {
    let shrink = action(
        "control-plane/delete-host/cp-0",
        ActionKind::RequestHostDeletion {
            host: "cp-0".into(),
        },
    );
    let grow = action(
        "control-plane/request-host/4",
        ActionKind::RequestHost {
            failure_domain: None,
        },
    );
    let mut s = cluster(3, 1);
    s.hosts
        .push(crate::testkit::cp_host("cp-3", None, NOW.0 - 60_000));
    assert_eq!(
        rules(&s, std::slice::from_ref(&shrink)),
        [Rule::ScalingWhileDisagreeing]
    );
    find(&mut s, "cp-3").etcd = Some(member(4, false, true));
    assert_eq!(rules(&s, std::slice::from_ref(&shrink)), []);

    let mut s = cluster(3, 1);
    find(&mut s, "cp-0").retirement = Some(Retirement {
        requested_at: NOW,
        requested_by: None,
        reason: String::new(),
    });
    assert_eq!(rules(&s, std::slice::from_ref(&grow)), []);
    find(&mut s, "cp-1").etcd.as_mut().unwrap().healthy = false;
    assert_eq!(
        rules(&s, std::slice::from_ref(&grow)),
        [Rule::ScalingWithMemberDown]
    );
    // A member whose host a remediation may have powered off counts as down.
    find(&mut s, "cp-1").etcd.as_mut().unwrap().healthy = true;
    s.remediations = vec![remediation("cp-2", 1, P::PoweringOff, "w-0", true)];
    assert_eq!(rules(&s, &[grow]), [Rule::ScalingWithMemberDown]);
}

#[test]
fn unknown_remediations_and_illegal_steps_are_rejected() {
    let mut s = cluster(3, 1);
    let r = remediation("w-0", 1, P::Gated, "cp-0", false);
    assert_eq!(
        rules(&s, &[step(&r, "cp-0", RemediationStep::PowerOn)]),
        [Rule::StateMachine]
    );
    s.remediations = vec![r.clone()];
    assert_eq!(
        rules(&s, &[step(&r, "cp-0", RemediationStep::Complete)]),
        [Rule::StateMachine]
    );
}

#[test]
fn degraded_means_no_membership_scaling_or_control_plane_fence() {
    let mut s = cluster(3, 1);
    for h in ["cp-0", "cp-1"] {
        find(&mut s, h).etcd.as_mut().unwrap().healthy = false;
    }
    let r = remediation("cp-0", 1, P::Gated, "w-0", true);
    assert_eq!(rules(&s, &[start(r)]), [Rule::Degraded]);
    let w = remediation("w-0", 1, P::Gated, "cp-2", false);
    assert_eq!(rules(&s, &[start(w)]), [], "workers cannot cost quorum");
}
