//! Unit tests of [`super`] (executor.rs).

use metalguard_api::plan::OperationId;

use super::*;
use crate::control::credentials::CredentialBook;

fn remediation(phase: RemediationPhase) -> Remediation {
    crate::testkit::remediation("w-2", "w-1", phase)
}

fn action(step: RemediationStep) -> Action {
    Action {
        id: OperationId(format!("remediation/w-2/1/{}", step.name())),
        kind: ActionKind::Remediate {
            remediation_id: "remediation/w-2/1".into(),
            target: "w-2".into(),
            executor: "w-1".into(),
            step,
        },
        reason: "test".into(),
    }
}

fn state_with(r: Remediation) -> State {
    let mut state = State::default();
    state.remediations.insert(r.id.clone(), r);
    state
}

/// Applies writes to an in-memory state the way the store would.
fn apply(state: &mut State, writes: Vec<Write>) {
    for w in writes {
        match w {
            Write::CreateOperation(op) | Write::PutOperation(op) => {
                state.operations.insert(op.id.clone(), op);
            }
            Write::PutRemediation(r) => {
                state.remediations.insert(r.id.clone(), r);
            }
            Write::DeleteFenceRequest(h) => {
                state.fence_requests.remove(&h);
            }
            Write::PutHooks(h, hooks) => {
                state.hooks.insert(h, hooks);
            }
            Write::PutNotes(notes) => state.notes = Some(notes),
            Write::CreateHold(record) => {
                state.hold_records.insert(record.hold.id.clone(), record);
            }
            Write::DeleteHold(id) => {
                state.hold_records.remove(&id);
            }
            Write::ConsumeFenceRequest(consumed) => {
                state
                    .consumed_fence_requests
                    .insert(consumed.nonce.clone(), consumed);
            }
            Write::Node(_) | Write::Reseal(_) => {}
        }
    }
}

fn result(id: &OperationId, outcome: Outcome) -> CommandResult {
    CommandResult {
        operation_id: id.clone(),
        outcome,
        started_at: Timestamp(10),
        finished_at: Timestamp(20),
        timeline: Vec::new(),
        error: (outcome != Outcome::Succeeded).then(|| "bmc said no".to_owned()),
        promoted_by: None,
        term: 0,
    }
}

#[test]
fn a_power_off_persists_its_intent_with_the_phase_change_and_only_once() {
    let mut state = state_with(remediation(RemediationPhase::Gated));
    let off = action(RemediationStep::PowerOff);
    let writes = writes_for(&off, &state, Timestamp(5)).unwrap();
    assert!(
        matches!(&writes[0], Write::CreateOperation(op) if op.id == off.id && op.agent == "w-1")
    );
    assert!(
        matches!(&writes[1], Write::PutRemediation(r) if r.phase == RemediationPhase::PoweringOff)
    );
    apply(&mut state, writes);
    // Re-planning the same step (as after a restart) creates nothing new...
    assert!(writes_for(&off, &state, Timestamp(6)).is_none());
    // ...and neither does a differently named action for the same remediation step.
    let mut renamed = off.clone();
    renamed.id = OperationId("other-id".into());
    assert!(writes_for(&renamed, &state, Timestamp(6)).is_none());
    // The persisted operation is what agents are offered.
    assert_eq!(state.operations.len(), 1);
}

#[test]
fn verification_waits_for_the_result_and_follows_its_outcome() {
    for (outcome, expect_failed) in [(Outcome::Succeeded, false), (Outcome::Failed, true)] {
        let mut state = state_with(remediation(RemediationPhase::Gated));
        let off = action(RemediationStep::PowerOff);
        let writes = writes_for(&off, &state, Timestamp(5)).unwrap();
        apply(&mut state, writes);
        let verify = action(RemediationStep::VerifyPowerOff);
        assert!(
            writes_for(&verify, &state, Timestamp(6)).is_none(),
            "no result yet"
        );
        let (write, ack) = record_result(
            &state,
            "w-1",
            "w-1 (certificate serial 01)",
            result(&off.id, outcome),
            7,
        )
        .unwrap();
        assert!(ack.first);
        apply(&mut state, vec![write.unwrap()]);
        let writes = writes_for(&verify, &state, Timestamp(7)).unwrap();
        let Write::PutRemediation(r) = &writes[0] else {
            panic!("{writes:?}")
        };
        assert_eq!(
            matches!(r.phase, RemediationPhase::Failed { .. }),
            expect_failed,
            "{:?}",
            r.phase
        );
        if !expect_failed {
            assert_eq!(r.phase, RemediationPhase::VerifiedOff);
        }
    }
}

#[test]
fn results_are_accepted_once_and_only_from_the_executing_agent() {
    let mut state = state_with(remediation(RemediationPhase::Gated));
    let off = action(RemediationStep::PowerOff);
    let writes = writes_for(&off, &state, Timestamp(5)).unwrap();
    apply(&mut state, writes);
    let err = record_result(
        &state,
        "w-2",
        "w-2 (certificate serial 02)",
        result(&off.id, Outcome::Succeeded),
        7,
    )
    .unwrap_err();
    assert!(err.contains("w-1") && err.contains("w-2"), "{err}");
    let unknown = OperationId("nope".into());
    assert!(
        record_result(
            &state,
            "w-1",
            "w-1 (certificate serial 01)",
            result(&unknown, Outcome::Succeeded),
            7,
        )
        .is_err()
    );
    let (write, _) = record_result(
        &state,
        "w-1",
        "w-1 (certificate serial 01)",
        result(&off.id, Outcome::Succeeded),
        7,
    )
    .unwrap();
    apply(&mut state, vec![write.unwrap()]);
    let (again, ack) = record_result(
        &state,
        "w-1",
        "w-1 (certificate serial 01)",
        result(&off.id, Outcome::Failed),
        7,
    )
    .unwrap();
    assert!(again.is_none() && !ack.first);
    assert_eq!(
        state.operations[&off.id].result.as_ref().unwrap().outcome,
        Outcome::Succeeded,
        "a retried post never overwrites the first result"
    );
}

/// Two workers, `w-2` with a BMC whose credentials are in the returned directory.
fn inventory_with_a_bmc_for_w2() -> (tempfile::TempDir, Inventory) {
    use std::os::unix::fs::PermissionsExt as _;
    let credentials = tempfile::tempdir().unwrap();
    for (name, value) in [("username", "admin"), ("password", "pw")] {
        let path = credentials.path().join(name);
        std::fs::write(&path, value).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let text = format!(
        "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n\
         [control_plane]\ndesired_replicas = 1\n\
         [[hosts]]\nname = \"w-1\"\nrole = \"worker\"\n\
         [[hosts]]\nname = \"w-2\"\nrole = \"worker\"\n\
         bmc = {{ address = \"ipmi://127.0.0.1:1623\", credentials_dir = \"{}\" }}\n",
        credentials.path().display()
    );
    let inventory = Inventory::parse(std::path::Path::new("i.toml"), &text).unwrap();
    (credentials, inventory)
}

#[test]
fn a_fence_of_a_held_host_is_not_offered_until_it_is_released() {
    let (_credentials, inventory) = inventory_with_a_bmc_for_w2();
    let mut state = state_with(remediation(RemediationPhase::Gated));
    let off = action(RemediationStep::PowerOff);
    let writes = writes_for(&off, &state, Timestamp(5)).unwrap();
    apply(&mut state, writes);
    let offered = |state: &State| -> Vec<OperationId> {
        pending_commands(&inventory, state, 7, &CredentialBook::default())
            .get("w-1")
            .map(|cs| cs.iter().map(|c| c.operation_id.clone()).collect())
            .unwrap_or_default()
    };
    assert_eq!(
        offered(&state),
        std::slice::from_ref(&off.id),
        "not held: offered"
    );
    // The hold arrives after the intent was persisted.
    let hold = metalguard_api::snapshot::Hold {
        id: "w-1/7".into(),
        target: "w-2".into(),
        since: Timestamp(7),
        by: "alice on w-1".into(),
        reason: "smoke".into(),
        action: "off".into(),
    };
    apply(
        &mut state,
        vec![Write::CreateHold(crate::backend::StoredHold {
            hold,
            reported_by: "w-1".into(),
            recorded_at: Timestamp(8),
            released: None,
        })],
    );
    state.refresh_holds();
    assert!(offered(&state).is_empty(), "held: not offered");
    // w-1's agent carries the hold in its report (it made it).
    let mut stored = crate::testkit::stored_report("w-1", 8, None);
    stored.report.holds = vec![state.hold_records["w-1/7"].hold.clone()];
    state.reports.insert("w-1".into(), stored);
    state.hold_records.get_mut("w-1/7").unwrap().released = Some(crate::backend::HoldRelease {
        at: Timestamp(9),
        by: "bob".into(),
        reason: "fixed".into(),
    });
    state.refresh_holds();
    assert!(state.holds.is_empty());
    assert!(
        offered(&state).is_empty(),
        "released, but w-1's agent still holds it locally (it would refuse): not yet"
    );
    let op = &state.operations[&off.id];
    assert!(
        withheld(&inventory, &state, op)
            .unwrap()
            .contains("still carries a released hold of w-2"),
        "{:?}",
        withheld(&inventory, &state, op)
    );
    state.reports.get_mut("w-1").unwrap().report.holds.clear();
    assert_eq!(
        offered(&state),
        [off.id],
        "released: the same operation is offered again"
    );
}

#[test]
fn an_illegal_transition_is_not_persisted() {
    let state = state_with(remediation(RemediationPhase::Detected));
    // Detected → PoweringOff skips the gates: refused, and no operation is created.
    assert!(writes_for(&action(RemediationStep::PowerOff), &state, Timestamp(5)).is_none());
}

#[test]
fn a_retired_hosts_power_off_is_one_fence_operation_created_once() {
    let mut state = State::default();
    let off = Action {
        id: metalguard_core::retire::decommission_id("cp-1", Timestamp(5)),
        kind: ActionKind::DecommissionHost {
            host: "cp-1".into(),
            executor: "cp-2".into(),
        },
        reason: "retired".into(),
    };
    let writes = writes_for(&off, &state, Timestamp(9)).unwrap();
    let [Write::CreateOperation(op)] = &writes[..] else {
        panic!("{writes:?}")
    };
    assert_eq!(
        (op.id.0.as_str(), op.agent.as_str()),
        ("retire/cp-1/5/power-off", "cp-2")
    );
    assert_eq!(
        op.kind,
        OperationKind::Fence {
            target: "cp-1".into(),
            action: PowerAction::Off
        }
    );
    apply(&mut state, writes);
    // Re-planned with another executor (cp-2 went silent): still the one operation.
    let mut again = off.clone();
    again.kind = ActionKind::DecommissionHost {
        host: "cp-1".into(),
        executor: "cp-3".into(),
    };
    assert!(writes_for(&again, &state, Timestamp(10)).is_none());
    let (write, _) = record_result(
        &state,
        "cp-2",
        "cp-2 (certificate serial 03)",
        result(&off.id, Outcome::Failed),
        7,
    )
    .unwrap();
    apply(&mut state, vec![write.unwrap()]);
    assert!(
        writes_for(&off, &state, Timestamp(11)).is_none(),
        "a failed power-off is not repeated by itself"
    );
}

const INVENTORY: &str = r#"
[etcd]
endpoints = ["http://127.0.0.1:2379"]

[control_plane]
desired_replicas = 1

[[hosts]]
name = "w-1"
role = "worker"

[[hosts]]
name = "w-2"
role = "worker"
bmc = { address = "ipmi://10.0.0.2", credentials_dir = "CREDS" }
"#;

fn fence(id: &str, agent: &str, target: &str) -> StoredOperation {
    StoredOperation {
        id: OperationId(id.into()),
        agent: agent.into(),
        kind: OperationKind::Fence {
            target: target.into(),
            action: PowerAction::Off,
        },
        remediation_id: None,
        step: None,
        created_at: Timestamp(1),
        requested_by: None,
        executed_by: None,
        result: None,
        term: 0,
    }
}

#[test]
fn an_operation_for_an_agent_or_a_target_outside_the_inventory_is_never_offered() {
    use std::os::unix::fs::PermissionsExt as _;
    let creds = tempfile::tempdir().unwrap();
    for (file, value) in [("username", "admin"), ("password", "hunter2")] {
        let path = creds.path().join(file);
        std::fs::write(&path, value).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    }
    let text = INVENTORY.replace("CREDS", creds.path().to_str().unwrap());
    let inventory = Inventory::parse(std::path::Path::new("i.toml"), &text).unwrap();
    let mut state = State::default();
    for op in [
        fence("good", "w-1", "w-2"),
        fence("stranger-agent", "mallory", "w-2"),
        fence("stranger-target", "w-1", "mallory"),
    ] {
        state.operations.insert(op.id.clone(), op);
    }
    let pending = pending_commands(&inventory, &state, 7, &CredentialBook::default());
    let offered: Vec<(&str, &str)> = pending
        .iter()
        .flat_map(|(host, commands)| {
            commands
                .iter()
                .map(move |c| (host.as_str(), c.operation_id.0.as_str()))
        })
        .collect();
    assert_eq!(offered, [("w-1", "good")]);
    let why = |id: &str| {
        withheld(
            &inventory,
            &state,
            &state.operations[&OperationId(id.into())],
        )
    };
    assert_eq!(why("good"), None);
    assert!(why("stranger-agent").unwrap().contains("agent mallory"));
    assert!(why("stranger-target").unwrap().contains("target mallory"));
}

#[test]
fn who_asked_is_kept_with_the_operation_and_who_executed_it_with_its_result() {
    let mut r = remediation(RemediationPhase::Gated);
    r.cause = "fence requested by alice@ctl-1 (cli): disk noise".into();
    let mut state = state_with(r);
    let off = action(RemediationStep::PowerOff);
    let writes = writes_for(&off, &state, Timestamp(5)).unwrap();
    apply(&mut state, writes);
    let op = &state.operations[&off.id];
    assert_eq!(
        op.requested_by.as_deref(),
        Some("fence requested by alice@ctl-1 (cli): disk noise")
    );
    let (write, _) = record_result(
        &state,
        "w-1",
        "w-1 (certificate serial 0a)",
        result(&off.id, Outcome::Succeeded),
        7,
    )
    .unwrap();
    apply(&mut state, vec![write.unwrap()]);
    assert_eq!(
        state.operations[&off.id].executed_by.as_deref(),
        Some("w-1 (certificate serial 0a)")
    );
}

#[test]
fn an_agents_refusal_of_an_older_terms_offer_is_not_recorded_but_any_other_result_is() {
    let mut state = state_with(remediation(RemediationPhase::Gated));
    let off = action(RemediationStep::PowerOff);
    let writes = writes_for(&off, &state, Timestamp(5)).unwrap();
    apply(&mut state, writes);
    let refusal = CommandResult {
        term: 6,
        ..result(&off.id, Outcome::Rejected)
    };
    // Offered by term 6, refused by the agent; this leader leads in term 7: nothing was done,
    // and the current offer of the same operation stands.
    let (write, ack) = record_result(&state, "w-1", "w-1 (serial 01)", refusal.clone(), 7).unwrap();
    assert!(write.is_none() && !ack.first, "{ack:?}");
    // Every command carries the leader's term.
    let (_credentials, inventory) = inventory_with_a_bmc_for_w2();
    let offered = pending_commands(&inventory, &state, 7, &CredentialBook::default());
    assert!(
        !offered.is_empty() && offered.values().flatten().all(|c| c.term == 7),
        "{offered:?}"
    );
    // A refusal in the current term is a result like any other.
    let (write, _) = record_result(&state, "w-1", "w-1 (serial 01)", refusal, 6).unwrap();
    assert!(write.is_some());
    // A fact from an older term (the power went off) is recorded.
    let done = CommandResult {
        term: 6,
        ..result(&off.id, Outcome::Succeeded)
    };
    let (write, _) = record_result(&state, "w-1", "w-1 (serial 01)", done, 7).unwrap();
    assert!(write.is_some());
}

#[test]
fn a_fence_during_a_credential_rotation_carries_the_credentials_in_use() {
    let (credentials, inventory) = inventory_with_a_bmc_for_w2();
    let mut state = state_with(remediation(RemediationPhase::Gated));
    let off = action(RemediationStep::PowerOff);
    let writes = writes_for(&off, &state, Timestamp(5)).unwrap();
    apply(&mut state, writes);
    let password = |book: &CredentialBook| -> String {
        let offered = pending_commands(&inventory, &state, 7, book);
        match &offered["w-1"][0].kind {
            CommandKind::Fence(fence) => fence.credentials.password.expose().to_owned(),
            other => panic!("not a fence: {other:?}"),
        }
    };
    let mut book = CredentialBook::default();
    assert_eq!(password(&book), "pw", "a host the book has not read");
    book.read(
        "w-2",
        "ipmi://127.0.0.1:1623",
        metalguard_api::protocol::BmcCredentials {
            username: "admin".into(),
            password: metalguard_api::protocol::Secret::new("pw"),
        },
    );
    // The file now says "rotated"; the book took it as a rotation not yet checked.
    std::fs::write(credentials.path().join("password"), "rotated").unwrap();
    book.read(
        "w-2",
        "ipmi://127.0.0.1:1623",
        metalguard_api::protocol::BmcCredentials {
            username: "admin".into(),
            password: metalguard_api::protocol::Secret::new("rotated"),
        },
    );
    assert!(book.rotating("w-2"));
    assert_eq!(password(&book), "pw", "the new password is unproven");
    // An unreadable source still stops the fence.
    std::fs::remove_file(credentials.path().join("password")).unwrap();
    assert!(pending_commands(&inventory, &state, 7, &book).is_empty());
}
