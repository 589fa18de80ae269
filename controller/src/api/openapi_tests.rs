//! Tests of the OpenAPI document: every protocol type against its schema, and the committed
//! `docs/openapi.json` against [`super::document`].

use std::path::PathBuf;

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::OperationId;
use metalguard_api::protocol::*;
use metalguard_api::snapshot::ConditionStatus;
use serde::Serialize;

use super::*;

/// A small validator for the subset of JSON Schema the document uses.
fn validate(schema: &Value, value: &Value, root: &Value, at: &str) -> Result<(), String> {
    if let Some(r) = schema.get("$ref").and_then(Value::as_str) {
        let name = r.trim_start_matches("#/components/schemas/");
        return validate(&root["components"]["schemas"][name], value, root, at);
    }
    if let Some(options) = schema.get("oneOf").and_then(Value::as_array) {
        let matching = options
            .iter()
            .filter(|o| validate(o, value, root, at).is_ok())
            .count();
        return if matching == 1 {
            Ok(())
        } else {
            Err(format!("{at}: {matching} oneOf alternatives match {value}"))
        };
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        return Err(format!("{at}: {value} not in {allowed:?}"));
    }
    match schema.get("type").and_then(Value::as_str) {
        Some("object") => {
            let map = value.as_object().ok_or(format!("{at}: not an object"))?;
            let props = schema["properties"].as_object().ok_or("bad schema")?;
            for (k, v) in map {
                let p = props
                    .get(k)
                    .ok_or(format!("{at}: property {k} is not in the schema"))?;
                validate(p, v, root, &format!("{at}.{k}"))?;
            }
            for r in schema["required"].as_array().into_iter().flatten() {
                let r = r.as_str().unwrap_or_default();
                if !map.contains_key(r) {
                    return Err(format!("{at}: required {r} missing"));
                }
            }
            Ok(())
        }
        Some("array") => {
            let items = value.as_array().ok_or(format!("{at}: not an array"))?;
            for (i, v) in items.iter().enumerate() {
                validate(&schema["items"], v, root, &format!("{at}[{i}]"))?;
            }
            Ok(())
        }
        Some("string") if !value.is_string() => Err(format!("{at}: not a string")),
        Some("integer") if !value.is_u64() => Err(format!("{at}: not an integer")),
        Some("boolean") if !value.is_boolean() => Err(format!("{at}: not a boolean")),
        Some("null") if !value.is_null() => Err(format!("{at}: not null")),
        _ => Ok(()),
    }
}

fn check<T: Serialize>(name: &str, sample: &T) {
    let doc = document();
    let value = serde_json::to_value(sample).unwrap();
    validate(&doc["components"]["schemas"][name], &value, &doc, name)
        .unwrap_or_else(|e| panic!("schema {name} is stale: {e}"));
}

fn hold() -> metalguard_api::snapshot::Hold {
    metalguard_api::snapshot::Hold {
        id: "cp-1/5".into(),
        target: "cp-2".into(),
        since: Timestamp(5),
        by: "alice on cp-1".into(),
        reason: "r".into(),
        action: "off".into(),
    }
}

fn command(kind: CommandKind) -> Command {
    Command {
        operation_id: OperationId("op".into()),
        issued_at: Timestamp(1),
        kind,
        term: 0,
    }
}

#[test]
fn every_protocol_type_matches_its_schema() {
    let report = AgentReport {
        host: "cp-1".into(),
        agent_version: "0.1.0".into(),
        sequence: 3,
        boot_id: "b".into(),
        sent_at: Timestamp(5),
        conditions: vec![Condition {
            type_: "EtcdHealthy".into(),
            status: ConditionStatus::False,
            reason: "Timeout".into(),
            message: "m".into(),
            last_transition: Timestamp(4),
        }],
        etcd: Some(EtcdView {
            local_member_id: Some(1),
            leader_id: None,
            members: vec![EtcdMemberView {
                id: 1,
                name: "cp-1".into(),
                peer_urls: vec!["http://a".into()],
                client_urls: vec![],
                learner: true,
                healthy: false,
                alarms: vec!["NOSPACE".into()],
                raft_applied_index: Some(9),
                error: Some("e".into()),
            }],
        }),
        bmc_reachability: vec![BmcReachability {
            host: "cp-2".into(),
            reachable: false,
            checked_at: Timestamp(2),
            error: None,
            check: Some(metalguard_api::protocol::BmcCheck {
                failure: Some(metalguard_api::bmc::CheckFailure::IdentityMismatch),
                power_state: Some("on".into()),
                identity: Some(metalguard_api::identity::SystemIdentity::default()),
                detail: "d".into(),
                credentials_id: Some("0123456789abcdef".into()),
                request: None,
            }),
        }],
        unacknowledged_results: vec![OperationId("x".into())],
        holds: vec![hold()],
        seen_term: 0,
        host_identity: Some(metalguard_api::identity::SystemIdentity {
            uuid: Some("674523a1-ab89-efcd-a123-456789abcdef".parse().unwrap()),
            uuid_absent: None,
            serial_number: None,
            serial_number_absent: Some("permission denied".into()),
        }),
    };
    check("AgentReport", &report);
    check(
        "SystemIdentity",
        &metalguard_api::identity::SystemIdentity {
            uuid: None,
            uuid_absent: Some("no such file".into()),
            serial_number: Some("SN-1".into()),
            serial_number_absent: None,
        },
    );
    check("Hold", &hold());
    check(
        "HoldAck",
        &HoldAck {
            id: "cp-1/5".into(),
            first: false,
        },
    );
    check(
        "ReportAck",
        &ReportAck {
            sequence: 1,
            received_at: Timestamp(1),
            bmc_targets: vec![BmcTarget {
                host: "cp-2".into(),
                bmc_address: "redfish+https://10.0.0.5".into(),
                tls: BmcTrust::Fingerprint { sha256: "f".into() },
                credentials: Some(BmcCredentials {
                    username: "u".into(),
                    password: Secret::new("p"),
                }),
                expected_identity: Some(Box::default()),
                credentials_id: Some("0123456789abcdef".into()),
                credentials_new: true,
                check_request: None,
            }],
            released_holds: vec!["cp-1/5".into()],
            term: 0,
            host_identity: true,
        },
    );
    let trusts = [
        BmcTrust::SystemRoots,
        BmcTrust::CaPem { pem: "p".into() },
        BmcTrust::Fingerprint { sha256: "f".into() },
        BmcTrust::Insecure,
    ];
    let mut commands: Vec<Command> = trusts
        .into_iter()
        .map(|tls| {
            command(CommandKind::Fence(FenceCommand {
                target: "cp-2".into(),
                action: PowerAction::Reboot,
                bmc_address: "ipmi://a".into(),
                tls,
                credentials: BmcCredentials {
                    username: "u".into(),
                    password: Secret::new("p"),
                },
                etcd_member: None,
                forced: None,
                expected_identity: None,
            }))
        })
        .collect();
    commands.push(command(CommandKind::EtcdJoinGoAhead {}));
    commands.push(command(CommandKind::EtcdMoveLeader { to_member: 2 }));
    commands.push(command(CommandKind::EtcdPromote { member_id: 1 }));
    commands.push(command(CommandKind::EtcdRemove { member_id: 1 }));
    check("CommandBatch", &CommandBatch { commands });
    check(
        "CommandResult",
        &CommandResult {
            operation_id: OperationId("op".into()),
            outcome: Outcome::Rejected,
            started_at: Timestamp(1),
            finished_at: Timestamp(2),
            timeline: vec![TimelineEntry {
                elapsed_ms: 3,
                direction: TimelineDirection::Seen,
                what: "w".into(),
            }],
            error: Some("e".into()),
            promoted_by: None,
            term: 0,
        },
    );
    check(
        "CommandResult",
        &CommandResult {
            operation_id: OperationId("quorum/promote/1".into()),
            outcome: Outcome::Succeeded,
            started_at: Timestamp(1),
            finished_at: Timestamp(2),
            timeline: Vec::new(),
            error: None,
            promoted_by: Some(PromotedBy::Outside),
            term: 0,
        },
    );
    check(
        "ResultAck",
        &ResultAck {
            operation_id: OperationId("op".into()),
            first: true,
        },
    );
    check("ErrorBody", &ErrorBody { error: "e".into() });
}

#[test]
fn a_misnamed_field_fails_validation() {
    let doc = document();
    let bad = json!({ "sequence": 1, "received_at": 2, "extra": 3 });
    assert!(validate(&doc["components"]["schemas"]["ReportAck"], &bad, &doc, "x").is_err());
}

#[test]
fn the_committed_document_is_current() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/openapi.json");
    let current = render();
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &current).unwrap();
    }
    let committed = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        committed == current,
        "docs/openapi.json is stale: run UPDATE_OPENAPI=1 cargo nextest run -p metalguard-controller openapi"
    );
}
