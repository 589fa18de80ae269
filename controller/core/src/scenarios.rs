//! Table tests named after the scenarios the seeds spell out.

use std::time::Duration;

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::{ActionKind, Plan, RemediationStep};
use metalguard_api::policy::MaxUnhealthy;
use metalguard_api::remediation::RemediationPhase as P;

use crate::sim::World;
use crate::testkit::{NOW, break_host, cluster, find, policy};

pub(crate) fn kinds(p: &Plan) -> Vec<&ActionKind> {
    p.actions.iter().map(|a| &a.kind).collect()
}

pub(crate) fn starts(p: &Plan) -> Vec<String> {
    p.actions
        .iter()
        .filter_map(|a| match &a.kind {
            ActionKind::StartRemediation { remediation } => Some(remediation.target.clone()),
            _ => None,
        })
        .collect()
}

pub(crate) fn refused(p: &Plan, subject: &str, needle: &str) -> bool {
    p.refusals
        .iter()
        .any(|r| r.subject == subject && r.reason.contains(needle))
}

pub(crate) fn ten_minutes_ago() -> Timestamp {
    Timestamp(NOW.0 - 600_000)
}

// ---- seed 004 (KCP) remediation scenarios -------------------------------------------------

#[test]
fn seed_004_scenario_1_three_replicas_one_machine_marked_for_remediation() {
    let mut s = cluster(3, 1);
    break_host(find(&mut s, "cp-0"), ten_minutes_ago());
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(starts(&p), ["cp-0"], "{p}");
    // Also when its etcd member still answers: the other two keep quorum.
    find(&mut s, "cp-0").etcd.as_mut().unwrap().healthy = true;
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(starts(&p), ["cp-0"], "{p}");
}

/// Seed 004 scenario 2, "Three replicas, two machines marked for remediation": "As long as
/// we continue to only have at most one unhealthy etcd member, we will scale down an
/// unhealthy machine, wait for it to provision and join the cluster, and then scale down the
/// other machine. However, if more than one etcd member is unhealthy, remediation would not
/// happen". The administrator's `maxUnhealthy: 2` is honoured (seed 002's "1 for cluster with
/// 3 members" is the default, not a ceiling); the per-host quorum guard picks the machine
/// whose member is the unhealthy one and refuses the other until the first is back.
#[test]
fn seed_004_scenario_2_three_replicas_two_marked_one_remediated_while_at_most_one_member_is_unhealthy()
 {
    let mut pol = policy();
    pol.health_checks[0].max_unhealthy = Some(MaxUnhealthy::Count(2));
    let mut s = cluster(3, 1);
    // cp-1 is NotReady with its etcd member still healthy, and has been for longer; cp-0 is
    // down with its member.
    break_host(find(&mut s, "cp-1"), Timestamp(NOW.0 - 900_000));
    find(&mut s, "cp-1").etcd.as_mut().unwrap().healthy = true;
    break_host(find(&mut s, "cp-0"), ten_minutes_ago());
    let p = crate::plan(&s, &pol, NOW);
    assert_eq!(p.health[0].max_unhealthy, Some(2), "{p}");
    assert_eq!(p.health[0].short_circuit, None, "{p}");
    assert_eq!(starts(&p), ["cp-0"], "{p}");
    let text = p.to_string();
    assert!(
        text.contains("its etcd member is already lost, so fencing it costs no quorum (2 of 3 voters stay healthy, quorum 2; seed 004 scenario 2: \"As long as we continue to only have at most one unhealthy etcd member"),
        "the start says why, quoting the seed: {text}"
    );
    assert!(
        refused(
            &p,
            "cp-1",
            "fencing cp-1 would leave 1 of 3 voters healthy, quorum needs 2 (seed 004: \"Remediation MUST preserve etcd quorum\")"
        ),
        "{p}"
    );

    // Carried out: cp-0 is power-cycled and rejoins, then cp-1 goes, never both at once.
    let mut w = World::new(s, pol.clone(), NOW);
    w.broken.insert("cp-0".into());
    w.kubelet_down.insert("cp-1".into());
    let mut started = Vec::new();
    for _ in 0..60 {
        let p = w.step().unwrap();
        started.extend(starts(&p));
        if started.len() == 2 {
            break;
        }
        w.advance(30);
    }
    assert_eq!(started, ["cp-0", "cp-1"], "{:?}", w.log);
    let first = &w.snap.remediations[0];
    assert!(
        first.target == "cp-0" && first.phase == P::Done,
        "cp-0's remediation ended before cp-1's began: {:?}",
        w.snap.remediations
    );

    // More than one unhealthy etcd member: no remediation, a person must act.
    let mut s = cluster(3, 1);
    break_host(find(&mut s, "cp-0"), ten_minutes_ago());
    break_host(find(&mut s, "cp-1"), ten_minutes_ago());
    let p = crate::plan(&s, &pol, NOW);
    assert!(starts(&p).is_empty(), "{p}");
    assert!(
        p.degraded.as_deref().unwrap().contains("quorum lost"),
        "{p}"
    );
}

/// Seed 004 ("Remediation MUST preserve etcd quorum"; scenario 2: remediate "as long as" it
/// costs no quorum) with five voters: two members are lost and a third host is NotReady with
/// a healthy member. With `maxUnhealthy: 3` written by the administrator, one of the two lost
/// ones is remediated (its fence costs nothing: 3 of 5 stay healthy); the third is refused
/// (fencing it would leave 2 of 5). Unset, seed 002's default for five members (2) applies and
/// the check short-circuits, saying where its value comes from.
#[test]
fn seed_004_five_voters_two_members_lost_a_third_notready_one_of_the_lost_is_remediated() {
    let mut s = cluster(5, 1);
    // cp-2 has been NotReady the longest, so it is considered first; its member answers.
    break_host(find(&mut s, "cp-2"), Timestamp(NOW.0 - 900_000));
    find(&mut s, "cp-2").etcd.as_mut().unwrap().healthy = true;
    break_host(find(&mut s, "cp-0"), Timestamp(NOW.0 - 800_000));
    break_host(find(&mut s, "cp-1"), ten_minutes_ago());
    let mut pol = policy();
    pol.health_checks[0].max_unhealthy = Some(MaxUnhealthy::Count(3));
    let p = crate::plan(&s, &pol, NOW);
    assert_eq!(starts(&p), ["cp-0"], "{p}");
    assert!(
        refused(
            &p,
            "cp-2",
            "fencing cp-2 would leave 2 of 5 voters healthy, quorum needs 3 (seed 004: \"Remediation MUST preserve etcd quorum\")"
        ),
        "{p}"
    );
    assert!(
        refused(&p, "cp-1", "one control-plane remediation at a time"),
        "{p}"
    );
    let text = p.to_string();
    assert!(
        text.contains("(3 of 5 voters stay healthy, quorum 3; seed 004 scenario 2:"),
        "{text}"
    );
    // "100%" is honoured the same way.
    pol.health_checks[0].max_unhealthy = Some(MaxUnhealthy::Text("100%".into()));
    assert_eq!(starts(&crate::plan(&s, &pol, NOW)), ["cp-0"]);

    let p = crate::plan(&s, &policy(), NOW);
    assert!(starts(&p).is_empty(), "{p}");
    assert!(
        refused(
            &p,
            "cp-0",
            "3 unhealthy > maxUnhealthy 2 (cp-0, cp-1, cp-2); maxUnhealthy is unset: 2 is the control-plane default for 5 etcd voters (seed 002: the controller sets maxUnhealthy \"1 for cluster with 3 members or 2 for a cluster with 5 members\")"
        ),
        "{p}"
    );
}

#[test]
fn seed_004_scenario_3_unresponsive_member_elsewhere_blocks_remediation() {
    let mut s = cluster(3, 1);
    break_host(find(&mut s, "cp-0"), ten_minutes_ago());
    find(&mut s, "cp-0").etcd.as_mut().unwrap().healthy = true;
    find(&mut s, "cp-2").etcd.as_mut().unwrap().healthy = false; // hung, node still Ready
    let p = crate::plan(&s, &policy(), NOW);
    assert!(starts(&p).is_empty(), "{p}");
    assert!(
        refused(&p, "cp-0", "would leave 1 of 3 voters healthy"),
        "{p}"
    );
}

#[test]
fn seed_004_scenario_4_unhealthy_machines_combined_with_rollout() {
    let mut s = cluster(3, 1);
    find(&mut s, "cp-1").up_to_date = false;
    let mut w = World::new(s, policy(), ten_minutes_ago());
    w.broken.insert("cp-0".into());
    w.refresh();
    w.advance(600);
    let p = w.step().unwrap();
    assert_eq!(starts(&p), ["cp-0"], "{p}");
    assert!(
        !kinds(&p)
            .iter()
            .any(|k| matches!(k, ActionKind::RequestHost { .. })),
        "{p}"
    );
    // Run until the remediation is done, then the rollout replaces the outdated host.
    let mut rolled = false;
    for _ in 0..40 {
        w.advance(30);
        let p = w.step().unwrap();
        if kinds(&p)
            .iter()
            .any(|k| matches!(k, ActionKind::RequestHost { .. }))
        {
            assert!(
                w.snap.remediations.iter().all(|r| !r.phase.is_active()),
                "{p}"
            );
            rolled = true;
            break;
        }
    }
    assert!(rolled, "rollout never started: {:?}", w.log);
    for _ in 0..40 {
        w.advance(30);
        w.step().unwrap();
    }
    assert!(
        w.snap.hosts.iter().all(|h| h.name != "cp-1"),
        "outdated cp-1 not replaced: {:?}",
        w.log
    );
    assert_eq!(EtcdVoters::of(&w), 3);
}

struct EtcdVoters;
impl EtcdVoters {
    fn of(w: &World) -> usize {
        crate::quorum::EtcdView::from_snapshot(&w.snap).voter_count()
    }
}

// ---- seed 000 and seed 003 maxUnhealthy ------------------------------------------------------

#[test]
fn seed_000_control_plane_max_unhealthy_1_takes_no_action_with_two_unhealthy() {
    let mut s = cluster(3, 0);
    break_host(find(&mut s, "cp-0"), ten_minutes_ago());
    break_host(find(&mut s, "cp-1"), ten_minutes_ago());
    for h in &mut s.hosts[..2] {
        h.etcd.as_mut().unwrap().healthy = true;
    }
    let p = crate::plan(&s, &policy(), NOW);
    assert!(starts(&p).is_empty(), "{p}");
    let text = p.to_string();
    assert!(
        text.contains("not remediating cp-0: check control-plane short-circuited: 2 unhealthy > maxUnhealthy 1 (cp-0, cp-1)"),
        "{text}"
    );
}

fn workers_with_unhealthy(total: usize, unhealthy: usize) -> Plan {
    let mut s = cluster(3, total);
    for i in 0..unhealthy {
        break_host(find(&mut s, &format!("w-{i}")), ten_minutes_ago());
    }
    let mut pol = policy();
    pol.health_checks[1].max_unhealthy = Some(MaxUnhealthy::Text("40%".into()));
    crate::plan(&s, &pol, NOW)
}

#[test]
fn seed_003_40_percent_of_25_remediates_10_unhealthy_not_11() {
    let p = workers_with_unhealthy(25, 10);
    assert_eq!(starts(&p).len(), 1, "{p}"); // one at a time (maxConcurrent 1)
    let p = workers_with_unhealthy(25, 11);
    assert!(starts(&p).is_empty(), "{p}");
    assert!(
        p.health[1]
            .short_circuit
            .as_deref()
            .unwrap()
            .starts_with("11 unhealthy > maxUnhealthy 10")
    );
}

#[test]
fn seed_003_40_percent_of_6_remediates_2_unhealthy_not_3() {
    assert_eq!(starts(&workers_with_unhealthy(6, 2)).len(), 1);
    assert!(starts(&workers_with_unhealthy(6, 3)).is_empty());
}

#[test]
fn seed_003_invalid_max_unhealthy_blocks_remediation() {
    let mut s = cluster(3, 4);
    break_host(find(&mut s, "w-0"), ten_minutes_ago());
    let mut pol = policy();
    pol.health_checks[1].max_unhealthy = Some(MaxUnhealthy::Text("lots".into()));
    let p = crate::plan(&s, &pol, NOW);
    assert!(starts(&p).is_empty(), "{p}");
    assert!(
        refused(&p, "w-0", "neither an integer nor a percentage"),
        "{p}"
    );
}

#[test]
fn seed_003_requeue_at_earliest_timeout() {
    let mut s = cluster(3, 2);
    break_host(find(&mut s, "w-0"), Timestamp(NOW.0 - 100_000)); // 100 s of a 300 s timeout
    let p = crate::plan(&s, &policy(), NOW);
    assert!(starts(&p).is_empty());
    assert_eq!(p.requeue_at, Some(Timestamp(NOW.0 + 200_000)));
}

#[test]
fn seed_003_node_startup_timeout_and_zero_disables() {
    let mut s = cluster(3, 2);
    let w0 = find(&mut s, "w-0");
    w0.node = None;
    w0.node_seen = false;
    w0.created_at = Timestamp(NOW.0 - Duration::from_secs(601).as_millis() as u64);
    let p = crate::plan(&s, &policy(), NOW);
    assert_eq!(starts(&p), ["w-0"], "{p}");
    let mut pol = policy();
    pol.health_checks[1].node_startup_timeout = Some(Duration::ZERO);
    assert!(starts(&crate::plan(&s, &pol, NOW)).is_empty());
    // A node that existed and vanished is unhealthy at once.
    find(&mut s, "w-0").node_seen = true;
    assert_eq!(starts(&crate::plan(&s, &pol, NOW)), ["w-0"]);
}

#[test]
fn step_names_are_stable_operation_ids() {
    let mut s = cluster(3, 2);
    break_host(find(&mut s, "w-1"), ten_minutes_ago());
    let p1 = crate::plan(&s, &policy(), NOW);
    let p2 = crate::plan(&s, &policy(), Timestamp(NOW.0 + 1_000));
    let ids = |p: &Plan| p.actions.iter().map(|a| a.id.0.clone()).collect::<Vec<_>>();
    assert_eq!(ids(&p1), ["remediation/w-1/1/start"]);
    assert_eq!(ids(&p1), ids(&p2));
    let _ = RemediationStep::PowerOff;
}

#[test]
fn plan_renders_actions_refusals_and_reasons_as_text() {
    let mut s = cluster(3, 3);
    break_host(find(&mut s, "w-0"), ten_minutes_ago());
    break_host(find(&mut s, "w-1"), ten_minutes_ago());
    s.hosts[0].pre_drain_hooks.clear();
    let text = crate::plan(&s, &policy(), NOW).to_string();
    let expected = "\
plan at t=100000000ms
check control-plane: 0 of 3 unhealthy (maxUnhealthy 1)
check workers: 2 of 3 unhealthy (maxUnhealthy 3) [w-0, w-1]
disruption budget: 2 control-plane machines must stay available
1. [quorum/add-hook/cp-0] cp-0 hosts etcd voter 1: protect it with the preDrain hook before it votes
2. [remediation/w-0/1/start] w-0: Ready=False for at least 5m (check workers); attempt 1; executor cp-0
not remediating w-1: 1 worker remediations running, maxConcurrent 1
";
    assert_eq!(text, expected);
}
