//! Unit tests of [`super`] (revalidate.rs): an inherited power cut is offered on this
//! leadership's own judgement only, and withdrawn when its target reports healthy to it.

use metalguard_api::plan::OperationId;
use metalguard_api::policy::{NodeHandling, Strategy};
use metalguard_api::protocol::{CommandKind, Condition};
use metalguard_api::remediation::Remediation;
use metalguard_api::snapshot::ConditionStatus;

use super::*;
use crate::api::hearing::Hearing;
use crate::backend::StoredReport;
use crate::inventory::Inventory;

/// Three control-plane hosts and one health check: Ready=False for 5 s, or silent for 10 s.
fn inventory() -> Inventory {
    crate::testkit::inventory(
        &[
            ("cp-1", "control-plane", false),
            ("cp-2", "control-plane", false),
            ("cp-3", "control-plane", false),
        ],
        r#"
[[policy.health_checks]]
name = "control-plane"
selector = { role = "control-plane" }
unhealthy_conditions = [{ type = "Ready", status = "False", timeout = "5s" }]
agent_heartbeat_timeout = "10s"
"#,
    )
}

/// This leadership's term and when it began.
const TERM: u64 = 7;
const SINCE: Timestamp = Timestamp(100_000);

fn at(seconds_after_since: i64) -> Timestamp {
    Timestamp(SINCE.0.saturating_add_signed(seconds_after_since * 1000))
}

fn remediation(cause: &str, forced: Option<&str>) -> Remediation {
    Remediation {
        id: "remediation/cp-3/1".into(),
        target: "cp-3".into(),
        seq: 1,
        attempt: 1,
        executor: "cp-1".into(),
        strategy: Strategy::default(),
        node_handling: NodeHandling::default(),
        phase: RemediationPhase::PoweringOff,
        started_at: at(-20),
        phase_since: at(-20),
        control_plane: true,
        cause: cause.into(),
        forced: forced.map(str::to_owned),
        cancel_requested: None,
        backup: None,
        powered_on_at: None,
        stay_off: false,
        boot_before: None,
    }
}

fn cut(term: u64, action: PowerAction) -> StoredOperation {
    StoredOperation {
        id: OperationId("remediation/cp-3/1/power-off".into()),
        agent: "cp-1".into(),
        kind: OperationKind::Fence {
            target: "cp-3".into(),
            action,
        },
        remediation_id: Some("remediation/cp-3/1".into()),
        step: Some("power-off".into()),
        created_at: at(-20),
        requested_by: None,
        executed_by: None,
        result: None,
        term,
    }
}

/// cp-3's agent reported at `received` that its member is (`healthy`) or is not healthy,
/// since long before this leadership; cp-1 and cp-2 report healthy now.
fn state(op: StoredOperation, r: Remediation, received: Timestamp, healthy: bool) -> State {
    let mut state = State::default();
    for (host, when, ok) in [
        ("cp-1", at(0), true),
        ("cp-2", at(0), true),
        ("cp-3", received, healthy),
    ] {
        let mut stored: StoredReport = crate::testkit::stored_report(host, 0, None);
        stored.received_at = when;
        stored.report.seen_term = TERM;
        stored.report.conditions = vec![Condition {
            type_: "EtcdMemberHealthy".into(),
            status: if ok {
                ConditionStatus::True
            } else {
                ConditionStatus::False
            },
            reason: "r".into(),
            message: String::new(),
            last_transition: Timestamp(1_000),
        }];
        state.reports.insert(host.into(), stored);
    }
    state.remediations.insert(r.id.clone(), r);
    state.operations.insert(op.id.clone(), op);
    state
}

fn judged(state: &State, now: Timestamp) -> Revalidation {
    let inventory = inventory();
    let snapshot = crate::control::snapshot::build_for_round(
        &inventory,
        state,
        (SINCE, &Hearing::default()),
        now,
    );
    revalidate(state, (&snapshot, &inventory.policy), (TERM, SINCE), now)
}

fn health_cause() -> Remediation {
    remediation("cp-3 is unhealthy (Ready=False for at least 5s)", None)
}

#[test]
fn an_inherited_cut_waits_until_this_leadership_judges_the_target_unhealthy_itself() {
    // cp-3 said "unhealthy" before this leadership began: that counts from when it began.
    let s = state(cut(3, PowerAction::Off), health_cause(), at(-2), false);
    let early = judged(&s, at(1));
    assert!(early.writes.is_empty(), "{early:?}");
    let why = early.held_back.values().next().expect("held back");
    assert!(
        why.contains("decided by leadership 3") && why.contains("leadership 7 judges cp-3"),
        "{why}"
    );
    // Five seconds into this leadership, Ready=False has held long enough by its own count.
    let late = judged(&s, at(6));
    assert!(late.offers_all(), "{late:?}");
}

#[test]
fn a_silent_target_is_judged_by_its_silence_from_when_this_leadership_began() {
    let s = state(cut(3, PowerAction::Reboot), health_cause(), at(-50), true);
    assert_eq!(judged(&s, at(5)).held_back.len(), 1, "silent 5 s of ours");
    assert!(
        judged(&s, at(11)).offers_all(),
        "silent past the heartbeat timeout: offered"
    );
}

#[test]
fn a_target_reporting_healthy_to_this_leadership_has_its_cut_withdrawn_and_remediation_cancelled() {
    // Healthy, but heard before this leadership: held back, not yet withdrawn.
    let before = state(cut(3, PowerAction::Off), health_cause(), at(-1), true);
    let held = judged(&before, at(1));
    assert!(
        held.writes.is_empty() && held.held_back.len() == 1,
        "{held:?}"
    );
    // Heard healthy by this leadership: withdrawn.
    let s = state(cut(3, PowerAction::Off), health_cause(), at(1), true);
    let out = judged(&s, at(2));
    assert!(out.held_back.is_empty(), "{out:?}");
    let [Write::PutOperation(op), Write::PutRemediation(r)] = out.writes.as_slice() else {
        panic!("{:?}", out.writes);
    };
    let result = op.result.as_ref().expect("recorded");
    assert_eq!((result.outcome, result.term), (Outcome::Rejected, TERM));
    let error = result.error.as_deref().unwrap_or_default();
    assert!(
        error.contains("withdrawn by leadership 7") && error.contains("reported healthy"),
        "{error}"
    );
    assert!(
        matches!(&r.phase, RemediationPhase::Cancelled { reason } if reason == error),
        "{:?}",
        r.phase
    );
    assert_eq!(r.phase_since, at(2));
}

#[test]
fn a_cut_its_executor_may_have_carried_out_is_not_withdrawn() {
    let held = |s: &State| {
        let out = judged(s, at(2));
        out.writes.is_empty() && out.held_back.len() == 1
    };
    // cp-1 executed it while nobody led: the result waits in its journal.
    let mut s = state(cut(3, PowerAction::Off), health_cause(), at(1), true);
    let op = s.operations.keys().next().unwrap().clone();
    s.reports
        .get_mut("cp-1")
        .unwrap()
        .report
        .unacknowledged_results = vec![op];
    assert!(held(&s), "its result is on its way");
    // cp-1 has not seen this leadership's term: it might still take the older offer.
    let mut s = state(cut(3, PowerAction::Off), health_cause(), at(1), true);
    s.reports.get_mut("cp-1").unwrap().report.seen_term = 3;
    assert!(held(&s), "the executor has not seen the term");
    // cp-1 has not reported to this leadership at all.
    let mut s = state(cut(3, PowerAction::Off), health_cause(), at(1), true);
    s.reports.get_mut("cp-1").unwrap().received_at = at(-1);
    assert!(held(&s), "the executor is not heard from");
}

#[test]
fn only_unanswered_health_cuts_of_older_leaderships_are_judged_again() {
    let untouched = |op: StoredOperation, r: Remediation| {
        // cp-3 reported healthy to this leadership: any judged cut would be withdrawn.
        let s = state(op, r, at(1), true);
        judged(&s, at(2)).offers_all()
    };
    assert!(untouched(cut(TERM, PowerAction::Off), health_cause()));
    assert!(untouched(cut(3, PowerAction::On), health_cause()));
    assert!(untouched(
        cut(3, PowerAction::Off),
        remediation(
            "cp-3 is unhealthy",
            Some("the BMC console shows a kernel panic")
        ),
    ));
    assert!(untouched(
        cut(3, PowerAction::Off),
        remediation(
            &format!(
                "{} alice: disk failing",
                metalguard_core::remediation::ADMIN_CAUSE
            ),
            None
        ),
    ));
    let mut answered = cut(3, PowerAction::Off);
    answered.result = judged(
        &state(cut(3, PowerAction::Off), health_cause(), at(1), true),
        at(2),
    )
    .writes
    .into_iter()
    .find_map(|w| match w {
        Write::PutOperation(op) => op.result,
        _ => None,
    });
    assert!(untouched(answered, health_cause()));
    // One persisted before terms existed (term 0) is older than any leadership.
    assert!(!untouched(cut(0, PowerAction::Off), health_cause()));
}

#[test]
fn held_back_commands_are_not_offered_and_empty_agents_are_dropped() {
    let command = |id: &str| Command {
        operation_id: OperationId(id.into()),
        issued_at: Timestamp(1),
        kind: CommandKind::EtcdJoinGoAhead {},
        term: TERM,
    };
    let mut pending = BTreeMap::from([
        ("cp-1".to_owned(), vec![command("a"), command("b")]),
        ("cp-2".to_owned(), vec![command("c")]),
    ]);
    hold_back(
        &mut pending,
        &BTreeSet::from([OperationId("a".into()), OperationId("c".into())]),
    );
    assert_eq!(pending.len(), 1);
    assert_eq!(pending["cp-1"].len(), 1);
    assert_eq!(pending["cp-1"][0].operation_id.0, "b");
}
