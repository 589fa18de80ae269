//! The controller's records as they are kept in `GuardedHost` status, and back: a remediation
//! and its operations (intent first, result after). A round trip keeps everything the
//! planner reads; times are kept to the second (Kubernetes' `Time`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff;
use metalguard_api::duration::Timestamp;
use metalguard_api::k8s::host::{OperationResult, OperationStatus, RemediationStatus};
use metalguard_api::plan::OperationId;
use metalguard_api::protocol::{CommandResult, Outcome, PowerAction, PromotedBy};
use metalguard_api::remediation::{NodeBackup, Remediation, RemediationPhase};

use crate::backend::{OperationKind, StoredOperation};

/// A core timestamp as a Kubernetes time.
pub fn time(t: Timestamp) -> Time {
    let ms = i64::try_from(t.0).unwrap_or(i64::MAX);
    Time(jiff::Timestamp::from_millisecond(ms).unwrap_or(jiff::Timestamp::MAX))
}

/// A Kubernetes time as a core timestamp.
pub fn timestamp(t: &Time) -> Timestamp {
    Timestamp(u64::try_from(t.0.as_millisecond()).unwrap_or(0))
}

/// A remediation as `status.remediation`.
pub fn remediation_status(r: &Remediation) -> RemediationStatus {
    let message = match &r.phase {
        RemediationPhase::Failed { reason }
        | RemediationPhase::NeedsPerson { reason }
        | RemediationPhase::Cancelled { reason } => Some(reason.clone()),
        _ => None,
    };
    RemediationStatus {
        id: r.id.clone(),
        phase: (&r.phase).into(),
        attempt: r.attempt,
        executor: r.executor.clone(),
        cause: r.cause.clone(),
        start_time: time(r.started_at),
        phase_transition_time: time(r.phase_since),
        message,
        node_backup: r.backup.as_ref().map(Into::into),
        seq: r.seq,
        strategy: r.strategy.into(),
        node_action: r.node_handling.into(),
        control_plane: r.control_plane,
        forced: r.forced.clone(),
        cancel_requested: r.cancel_requested.clone(),
        power_on_time: r.powered_on_at.map(time),
        stay_off: r.stay_off,
        boot_before: r.boot_before.clone(),
    }
}

/// `status.remediation` of host `target` as the core's record.
pub fn remediation(target: &str, s: &RemediationStatus) -> Remediation {
    use metalguard_api::k8s::host::RemediationPhaseName as N;
    let reason = || s.message.clone().unwrap_or_default();
    let phase = match s.phase {
        N::Detected => RemediationPhase::Detected,
        N::Gated => RemediationPhase::Gated,
        N::PoweringOff => RemediationPhase::PoweringOff,
        N::VerifiedOff => RemediationPhase::VerifiedOff,
        N::BackedUp => RemediationPhase::BackedUp,
        N::NodeRemoved => RemediationPhase::NodeRemoved,
        N::PoweringOn => RemediationPhase::PoweringOn,
        N::WaitingForNode => RemediationPhase::WaitingForNode,
        N::Restored => RemediationPhase::Restored,
        N::Done => RemediationPhase::Done,
        N::Failed => RemediationPhase::Failed { reason: reason() },
        N::NeedsPerson => RemediationPhase::NeedsPerson { reason: reason() },
        N::Reprovisioning => RemediationPhase::Reprovisioning,
        N::Cancelled => RemediationPhase::Cancelled { reason: reason() },
    };
    Remediation {
        id: s.id.clone(),
        target: target.to_owned(),
        seq: s.seq,
        attempt: s.attempt,
        executor: s.executor.clone(),
        strategy: s.strategy.into(),
        node_handling: s.node_action.into(),
        phase,
        started_at: timestamp(&s.start_time),
        phase_since: timestamp(&s.phase_transition_time),
        control_plane: s.control_plane,
        cause: s.cause.clone(),
        forced: s.forced.clone(),
        cancel_requested: s.cancel_requested.clone(),
        backup: s.node_backup.as_ref().map(|b| NodeBackup {
            labels: b.labels.clone(),
            annotations: b.annotations.clone(),
        }),
        powered_on_at: s.power_on_time.as_ref().map(timestamp),
        stay_off: s.stay_off,
        boot_before: s.boot_before.clone(),
    }
}

/// The host whose `GuardedHost` keeps `op`: a fence's target, else the executing agent's host.
pub fn home_of(op: &StoredOperation) -> &str {
    match &op.kind {
        OperationKind::Fence { target, .. } => target,
        _ => &op.agent,
    }
}

fn name_of<T: serde::Serialize>(value: &T) -> String {
    match serde_json::to_value(value) {
        Ok(serde_json::Value::String(s)) => s,
        _ => String::new(),
    }
}

fn parse_name<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, String> {
    serde_json::from_value(serde_json::Value::String(text.to_owned()))
        .map_err(|_| format!("unknown value {text:?}"))
}

/// An operation as an entry of `status.operations`.
pub fn operation_status(op: &StoredOperation) -> OperationStatus {
    let (type_, target, power, member) = match &op.kind {
        OperationKind::Fence { target, action } => {
            ("fence", Some(target.clone()), Some(name_of(action)), None)
        }
        OperationKind::EtcdPromote { member_id } => ("etcd-promote", None, None, Some(*member_id)),
        OperationKind::EtcdRemove { member_id } => ("etcd-remove", None, None, Some(*member_id)),
        OperationKind::EtcdJoin {} => ("etcd-join", None, None, None),
        OperationKind::EtcdMoveLeader { to_member } => {
            ("etcd-move-leader", None, None, Some(*to_member))
        }
    };
    OperationStatus {
        id: op.id.to_string(),
        agent: op.agent.clone(),
        type_: type_.to_owned(),
        target,
        power,
        member_id: member.map(|m| format!("{m:x}")),
        remediation_id: op.remediation_id.clone(),
        step: op.step.clone(),
        create_time: time(op.created_at),
        result: op.result.as_ref().map(|r| OperationResult {
            outcome: name_of(&r.outcome),
            start_time: time(r.started_at),
            finish_time: time(r.finished_at),
            error: r.error.clone(),
            promoted_by: r.promoted_by.map(|by| by.name().to_owned()),
        }),
        term: (op.term != 0).then_some(op.term),
    }
}

/// An entry of `status.operations` as the core's record; a malformed entry (edited by hand)
/// is an error naming what is wrong.
pub fn operation(s: &OperationStatus) -> Result<StoredOperation, String> {
    let member = || -> Result<u64, String> {
        let hex = s.member_id.as_deref().ok_or("memberId is missing")?;
        u64::from_str_radix(hex, 16).map_err(|_| format!("memberId {hex:?} is not hex"))
    };
    let kind = match s.type_.as_str() {
        "fence" => OperationKind::Fence {
            target: s.target.clone().ok_or("target is missing")?,
            action: parse_name::<PowerAction>(s.power.as_deref().ok_or("power is missing")?)?,
        },
        "etcd-promote" => OperationKind::EtcdPromote {
            member_id: member()?,
        },
        "etcd-remove" => OperationKind::EtcdRemove {
            member_id: member()?,
        },
        "etcd-join" => OperationKind::EtcdJoin {},
        "etcd-move-leader" => OperationKind::EtcdMoveLeader {
            to_member: member()?,
        },
        other => return Err(format!("unknown operation type {other:?}")),
    };
    let result = match &s.result {
        None => None,
        Some(r) => Some(CommandResult {
            operation_id: OperationId(s.id.clone()),
            outcome: parse_name::<Outcome>(&r.outcome)?,
            started_at: timestamp(&r.start_time),
            finished_at: timestamp(&r.finish_time),
            timeline: Vec::new(),
            error: r.error.clone(),
            promoted_by: r
                .promoted_by
                .as_deref()
                .map(parse_name::<PromotedBy>)
                .transpose()?,
            term: 0,
        }),
    };
    Ok(StoredOperation {
        id: OperationId(s.id.clone()),
        agent: s.agent.clone(),
        kind,
        remediation_id: s.remediation_id.clone(),
        step: s.step.clone(),
        created_at: timestamp(&s.create_time),
        requested_by: None,
        executed_by: None,
        result,
        term: s.term.unwrap_or(0),
    })
}

#[cfg(test)]
mod tests {
    use metalguard_api::policy::{NodeHandling, Strategy};

    use super::*;

    #[test]
    fn a_remediation_and_its_operations_survive_the_round_trip_through_status() {
        let r = Remediation {
            id: "remediation/cp-2/3".into(),
            target: "cp-2".into(),
            seq: 3,
            attempt: 2,
            executor: "cp-1".into(),
            strategy: Strategy::ExternalBaremetal,
            node_handling: NodeHandling::OutOfServiceTaint,
            phase: RemediationPhase::NeedsPerson {
                reason: "bmc rejected the credentials".into(),
            },
            started_at: Timestamp(1_700_000_000_000),
            phase_since: Timestamp(1_700_000_060_000),
            control_plane: true,
            cause: "Ready=False for 5m".into(),
            forced: Some("admin".into()),
            cancel_requested: None,
            backup: Some(NodeBackup {
                labels: [("a".to_owned(), "b".to_owned())].into(),
                annotations: std::collections::BTreeMap::default(),
            }),
            powered_on_at: Some(Timestamp(1_700_000_050_000)),
            stay_off: true,
            boot_before: None,
        };
        assert_eq!(remediation("cp-2", &remediation_status(&r)), r);
        assert!(remediation_status(&r).stay_off);
        let op = StoredOperation {
            id: OperationId("remediation/cp-2/3/power-off".into()),
            agent: "cp-1".into(),
            kind: OperationKind::Fence {
                target: "cp-2".into(),
                action: PowerAction::Off,
            },
            remediation_id: Some(r.id.clone()),
            step: Some("power-off".into()),
            created_at: Timestamp(1_700_000_061_000),
            requested_by: None,
            executed_by: None,
            result: Some(CommandResult {
                operation_id: OperationId("remediation/cp-2/3/power-off".into()),
                outcome: Outcome::Succeeded,
                started_at: Timestamp(1_700_000_062_000),
                finished_at: Timestamp(1_700_000_063_000),
                timeline: Vec::new(),
                error: None,
                promoted_by: None,
                term: 0,
            }),
            term: 0,
        };
        assert_eq!(operation(&operation_status(&op)), Ok(op));
        let remove = StoredOperation {
            id: OperationId("etcd/remove/1".into()),
            agent: "cp-1".into(),
            kind: OperationKind::EtcdRemove {
                member_id: 0xdead_beef,
            },
            remediation_id: None,
            step: None,
            created_at: Timestamp(1_700_000_000_000),
            requested_by: None,
            executed_by: None,
            result: None,
            term: 0,
        };
        let status = operation_status(&remove);
        assert_eq!(status.member_id.as_deref(), Some("deadbeef"));
        assert_eq!(operation(&status), Ok(remove));
        // Who promoted a learner survives the record (kubeadm promoted it: "outside").
        let promote = StoredOperation {
            id: OperationId("quorum/promote/4".into()),
            agent: "cp-1".into(),
            kind: OperationKind::EtcdPromote { member_id: 4 },
            remediation_id: None,
            step: None,
            created_at: Timestamp(1_700_000_000_000),
            requested_by: None,
            executed_by: None,
            result: Some(CommandResult {
                operation_id: OperationId("quorum/promote/4".into()),
                outcome: Outcome::Succeeded,
                started_at: Timestamp(1_700_000_001_000),
                finished_at: Timestamp(1_700_000_002_000),
                timeline: Vec::new(),
                error: None,
                promoted_by: Some(PromotedBy::Outside),
                term: 0,
            }),
            term: 0,
        };
        let mut status = operation_status(&promote);
        let result = status.result.as_mut().unwrap();
        assert_eq!(result.promoted_by.as_deref(), Some("outside"));
        assert_eq!(operation(&status), Ok(promote));
        status.result.as_mut().unwrap().promoted_by = Some("a-person".into());
        assert_eq!(
            operation(&status).unwrap_err(),
            "unknown value \"a-person\""
        );
    }

    #[test]
    fn a_hand_edited_operation_is_an_error_not_a_guess() {
        let mut s = operation_status(&StoredOperation {
            id: OperationId("x".into()),
            agent: "cp-1".into(),
            kind: OperationKind::EtcdJoin {},
            remediation_id: None,
            step: None,
            created_at: Timestamp(0),
            requested_by: None,
            executed_by: None,
            result: None,
            term: 0,
        });
        s.type_ = "etcd-explode".into();
        assert_eq!(
            operation(&s).unwrap_err(),
            "unknown operation type \"etcd-explode\""
        );
    }
}
