//! The OpenAPI 3.1 document of the agent API, built from the protocol's path constants.
//!
//! Schemas are written here by hand rather than derived (the `metalguard-api` crate stays
//! free of schema-derive dependencies because the agent builds it too); a test validates
//! serialized samples of every protocol type against them, so a field added, renamed or
//! removed in `metalguard_api::protocol` fails the build until the schema follows. Another
//! test fails when the committed `docs/openapi.json` differs from [`document`]
//! (`UPDATE_OPENAPI=1 cargo nextest run -p metalguard-controller openapi` rewrites it).

use metalguard_api::protocol::{
    API_VERSION, BMC_CHECKS_PARAM, BMC_TARGETS_PARAM, COMMANDS_PATH, HOLDS_PATH,
    HOST_IDENTITY_PARAM, MAX_WAIT, REPORT_PATH, RESULTS_PATH, TERMS_PARAM, WAIT_PARAM,
};
use serde_json::{Map, Value, json};

fn reference(name: &str) -> Value {
    json!({ "$ref": format!("#/components/schemas/{name}") })
}

fn object(properties: &[(&str, Value)], required: &[&str]) -> Value {
    let props: Map<String, Value> = properties
        .iter()
        .map(|(k, v)| ((*k).to_owned(), v.clone()))
        .collect();
    json!({
        "type": "object",
        "additionalProperties": false,
        "properties": props,
        "required": required,
    })
}

fn string() -> Value {
    json!({ "type": "string" })
}
fn integer() -> Value {
    json!({ "type": "integer", "minimum": 0 })
}
fn boolean() -> Value {
    json!({ "type": "boolean" })
}
fn array(items: &Value) -> Value {
    json!({ "type": "array", "items": items })
}
fn nullable(schema: &Value) -> Value {
    json!({ "oneOf": [schema, { "type": "null" }] })
}
fn one_of_strings(values: &[&str]) -> Value {
    json!({ "type": "string", "enum": values })
}
fn tagged(tag: &str, value: &str, properties: &[(&str, Value)], required: &[&str]) -> Value {
    let mut props = vec![(tag, one_of_strings(&[value]))];
    props.extend(properties.iter().cloned());
    let mut req = vec![tag];
    req.extend(required);
    object(&props, &req)
}

fn timestamp() -> Value {
    json!({ "type": "integer", "minimum": 0, "description": "milliseconds since the Unix epoch" })
}

fn schemas() -> Value {
    let fence_fields = [
        ("target", string()),
        ("action", reference("PowerAction")),
        ("bmc_address", string()),
        ("tls", reference("BmcTrust")),
        ("credentials", reference("BmcCredentials")),
        ("etcd_member", nullable(&integer())),
        ("forced", nullable(&reference("ForcedBy"))),
        ("expected_identity", nullable(&reference("SystemIdentity"))),
    ];
    json!({
        "AgentReport": object(&[
            ("host", string()),
            ("agent_version", string()),
            ("sequence", integer()),
            ("boot_id", string()),
            ("sent_at", timestamp()),
            ("conditions", array(&reference("Condition"))),
            ("etcd", nullable(&reference("EtcdView"))),
            ("bmc_reachability", array(&reference("BmcReachability"))),
            ("unacknowledged_results", array(&string())),
            ("holds", array(&reference("Hold"))),
            ("seen_term", integer()),
            ("host_identity", reference("SystemIdentity")),
        ], &["host", "agent_version", "sequence", "sent_at"]),
        "SystemIdentity": object(&[
            ("uuid", json!({
                "type": "string",
                "format": "uuid",
                "description": "canonical lowercase 8-4-4-4-12 text",
            })),
            ("uuid_absent", string()),
            ("serial_number", string()),
            ("serial_number_absent", string()),
        ], &[]),
        "Hold": object(&[
            ("id", string()),
            ("target", string()),
            ("since", timestamp()),
            ("by", string()),
            ("reason", string()),
            ("action", string()),
        ], &["id", "target", "since", "by", "reason", "action"]),
        "HoldAck": object(&[
            ("id", string()),
            ("first", boolean()),
        ], &["id", "first"]),
        "Condition": object(&[
            ("type", string()),
            ("status", one_of_strings(&["True", "False", "Unknown"])),
            ("reason", string()),
            ("message", string()),
            ("last_transition", timestamp()),
        ], &["type", "status", "reason", "last_transition"]),
        "EtcdView": object(&[
            ("local_member_id", nullable(&integer())),
            ("leader_id", nullable(&integer())),
            ("members", array(&reference("EtcdMemberView"))),
        ], &[]),
        "EtcdMemberView": object(&[
            ("id", integer()),
            ("name", string()),
            ("peer_urls", array(&string())),
            ("client_urls", array(&string())),
            ("learner", boolean()),
            ("healthy", boolean()),
            ("alarms", array(&string())),
            ("raft_applied_index", nullable(&integer())),
            ("error", nullable(&string())),
        ], &["id", "healthy"]),
        "BmcReachability": object(&[
            ("host", string()),
            ("reachable", boolean()),
            ("checked_at", timestamp()),
            ("error", nullable(&string())),
            ("check", reference("BmcCheck")),
        ], &["host", "reachable", "checked_at"]),
        "BmcCheck": object(&[
            ("failure", one_of_strings(
                &metalguard_api::bmc::CheckFailure::ALL.map(metalguard_api::bmc::CheckFailure::name),
            )),
            ("power_state", string()),
            ("identity", reference("SystemIdentity")),
            ("detail", string()),
            ("credentials_id", string()),
            ("request", string()),
        ], &["detail"]),
        "ReportAck": object(&[
            ("sequence", integer()),
            ("received_at", timestamp()),
            ("bmc_targets", array(&reference("BmcTarget"))),
            ("released_holds", array(&string())),
            ("term", integer()),
            ("host_identity", boolean()),
        ], &["sequence", "received_at"]),
        "BmcTarget": object(&[
            ("host", string()),
            ("bmc_address", string()),
            ("tls", reference("BmcTrust")),
            ("credentials", reference("BmcCredentials")),
            ("expected_identity", reference("SystemIdentity")),
            ("credentials_id", string()),
            ("credentials_new", boolean()),
            ("check_request", string()),
        ], &["host", "bmc_address"]),
        "CommandBatch": object(&[
            ("commands", array(&reference("Command"))),
        ], &["commands"]),
        "Command": object(&[
            ("operation_id", string()),
            ("issued_at", timestamp()),
            ("kind", reference("CommandKind")),
            ("term", integer()),
        ], &["operation_id", "issued_at", "kind"]),
        "ForcedBy": object(&[
            ("by", string()),
            ("reason", string()),
        ], &["by", "reason"]),
        "CommandKind": { "oneOf": [
            tagged("type", "fence", &fence_fields,
                &["target", "action", "bmc_address", "credentials"]),
            tagged("type", "etcd-join-go-ahead", &[], &[]),
            tagged("type", "etcd-promote", &[("member_id", integer())], &["member_id"]),
            tagged("type", "etcd-remove", &[("member_id", integer())], &["member_id"]),
            tagged("type", "etcd-move-leader", &[("to_member", integer())], &["to_member"]),
        ]},
        "PowerAction": one_of_strings(&["off", "on", "reboot"]),
        "BmcTrust": { "oneOf": [
            tagged("mode", "system-roots", &[], &[]),
            tagged("mode", "ca-pem", &[("pem", string())], &["pem"]),
            tagged("mode", "fingerprint", &[("sha256", string())], &["sha256"]),
            tagged("mode", "insecure", &[], &[]),
        ]},
        "BmcCredentials": object(&[
            ("username", string()),
            ("password", json!({ "type": "string", "format": "password", "writeOnly": true })),
        ], &["username", "password"]),
        "CommandResult": object(&[
            ("operation_id", string()),
            ("outcome", one_of_strings(&["succeeded", "failed", "rejected"])),
            ("started_at", timestamp()),
            ("finished_at", timestamp()),
            ("timeline", array(&reference("TimelineEntry"))),
            ("error", nullable(&string())),
            ("promoted_by", one_of_strings(&["metalguard", "outside"])),
            ("term", integer()),
        ], &["operation_id", "outcome", "started_at", "finished_at"]),
        "TimelineEntry": object(&[
            ("elapsed_ms", integer()),
            ("direction", one_of_strings(&["sent", "seen", "note"])),
            ("what", string()),
        ], &["elapsed_ms", "direction", "what"]),
        "ResultAck": object(&[
            ("operation_id", string()),
            ("first", boolean()),
        ], &["operation_id", "first"]),
        "ErrorBody": object(&[("error", string())], &["error"]),
    })
}

fn errors() -> Value {
    let body = json!({ "content": { "application/json": { "schema": reference("ErrorBody") } } });
    let with = |text: &str| {
        let mut b = body.clone();
        b["description"] = json!(text);
        b
    };
    let mut throttled = with(
        "the host posts faster than its token bucket allows (reports, results and holds), or holds as many long-polls as allowed; retry after Retry-After seconds",
    );
    throttled["headers"] = json!({ "Retry-After": {
        "description": "whole seconds to wait before the next request",
        "schema": { "type": "integer", "minimum": 1 },
    }});
    json!({
        "400": with("the query, the body or the metalguard-version header is not well-formed"),
        "403": with("the path names a host other than the client certificate's, or the certificate may not speak: its host is not in the inventory, is retired and powered off, or it is revoked"),
        "429": throttled,
        "503": with("this controller is not the leader, or is stopping"),
    })
}

/// The refusals of a posted body: time, size, media type and the protocol's limits
/// (`metalguard_api::limits`).
fn body_errors(responses: &mut Value, max_bytes: usize, unprocessable: &str) {
    let with = |text: String| {
        json!({
            "description": text,
            "content": { "application/json": { "schema": reference("ErrorBody") } },
        })
    };
    responses["408"] = with("the body did not arrive within the body read timeout".to_owned());
    responses["413"] = with(format!("the body is over {max_bytes} bytes"));
    responses["415"] = with("the body is not declared application/json".to_owned());
    responses["422"] = with(unprocessable.to_owned());
}

fn json_body(name: &str) -> Value {
    json!({ "required": true, "content": { "application/json": { "schema": reference(name) } } })
}

fn ok(name: &str, description: &str) -> Value {
    json!({ "description": description, "content": { "application/json": { "schema": reference(name) } } })
}

/// The whole document.
pub fn document() -> Value {
    let host = json!({
        "name": "host", "in": "path", "required": true,
        "description": "the host named by the client certificate",
        "schema": { "type": "string" },
    });
    let release = json!({
        "name": metalguard_api::skew::VERSION_HEADER, "in": "header", "required": false,
        "description": "the agent's release (MAJOR.MINOR.PATCH); absent: 0.1.0. Every answer carries the controller's in the same header. Agents and controllers at most one minor version apart work together; a newer agent's unknown fields are left out, the same or an older release's refused (422)",
        "schema": { "type": "string" },
    });
    let with_errors = |mut responses: Value| {
        if let (Some(map), Some(errs)) = (responses.as_object_mut(), errors().as_object()) {
            for (k, v) in errs {
                map.insert(k.clone(), v.clone());
            }
        }
        responses
    };
    let mut result_responses =
        with_errors(json!({ "200": ok("ResultAck", "the result is persisted") }));
    result_responses["409"] = json!({
        "description": "unknown operation id, or an operation sent to another host",
        "content": { "application/json": { "schema": reference("ErrorBody") } },
    });
    let error_response = |description: &str| {
        json!({
            "description": description,
            "content": { "application/json": { "schema": reference("ErrorBody") } },
        })
    };
    body_errors(
        &mut result_responses,
        metalguard_api::limits::MAX_RESULT_BYTES,
        "a field is missing or unknown, or a list or string is beyond the protocol's limits (the message names the field)",
    );
    let mut report_responses =
        with_errors(json!({ "200": ok("ReportAck", "the report was received") }));
    body_errors(
        &mut report_responses,
        metalguard_api::limits::MAX_REPORT_BYTES,
        "a field is missing or unknown, or a list or string is beyond the protocol's limits (the message names the field)",
    );
    let mut hold_responses =
        with_errors(json!({ "200": ok("HoldAck", "the hold is persisted (or was already)") }));
    body_errors(
        &mut hold_responses,
        metalguard_api::limits::MAX_HOLD_BYTES,
        "the hold's id is not <host>/<milliseconds>, its target is not an inventory host, a field is missing or unknown, or a string is beyond the protocol's limits",
    );
    hold_responses["409"] = error_response("a person released this hold; it is not honoured again");
    json!({
        "openapi": "3.1.0",
        "info": {
            "title": "metalguard agent API",
            "version": API_VERSION,
            "description": "Agent to controller protocol. HTTPS with mutual TLS: a client certificate signed by the cluster CA is required, and its common name is the only host a client may speak for.",
        },
        "paths": {
            REPORT_PATH: { "post": {
                "operationId": "report",
                "summary": "An agent's report about its own host",
                "parameters": [host, release, {
                    "name": BMC_TARGETS_PARAM, "in": "query", "required": false,
                    "description": "true: answer with bmc_targets (agents that predate it refuse unknown fields)",
                    "schema": { "type": "boolean" },
                }, {
                    "name": BMC_CHECKS_PARAM, "in": "query", "required": false,
                    "description": "true: the agent runs credentialed read-only BMC checks (the targets whose fence it would execute carry credentials and the expected identity; its reports carry check for them)",
                    "schema": { "type": "boolean" },
                }, {
                    "name": TERMS_PARAM, "in": "query", "required": false,
                    "description": "true: the agent knows leadership terms (the answer carries the leader's term; commands carry theirs)",
                    "schema": { "type": "boolean" },
                }, {
                    "name": HOST_IDENTITY_PARAM, "in": "query", "required": false,
                    "description": "true: the agent can send host_identity (the answer says host_identity: true when this controller takes it; agents send it only then)",
                    "schema": { "type": "boolean" },
                }],
                "requestBody": json_body("AgentReport"),
                "responses": report_responses,
            }},
            COMMANDS_PATH: { "get": {
                "operationId": "commands",
                "summary": "Long-poll for the host's pending commands",
                "parameters": [host, release, {
                    "name": WAIT_PARAM, "in": "query", "required": false,
                    "description": format!("seconds to wait for a command (at most {})", MAX_WAIT.as_secs()),
                    "schema": { "type": "integer", "minimum": 0 },
                }, {
                    "name": TERMS_PARAM, "in": "query", "required": false,
                    "description": "true: the agent knows leadership terms (the answer carries the leader's term; commands carry theirs)",
                    "schema": { "type": "boolean" },
                }, {
                    "name": HOST_IDENTITY_PARAM, "in": "query", "required": false,
                    "description": "true: the agent checks a fence target's identity (fences carry expected_identity; agents that predate it refuse the field)",
                    "schema": { "type": "boolean" },
                }],
                "responses": with_errors(json!({
                    "200": ok("CommandBatch", "pending commands; empty when the wait ran out"),
                    "426": {
                        "description": "the agent's release is outside the skew policy: it is given no command (its reports, results and holds are still read)",
                        "content": { "application/json": { "schema": reference("ErrorBody") } },
                    },
                })),
            }},
            RESULTS_PATH: { "post": {
                "operationId": "results",
                "summary": "The result of one command",
                "parameters": [host, release],
                "requestBody": json_body("CommandResult"),
                "responses": result_responses,
            }},
            HOLDS_PATH: { "post": {
                "operationId": "holds",
                "summary": "A break-glass hold recorded on this host (metalguard-agent fence --direct)",
                "parameters": [host, release],
                "requestBody": json_body("Hold"),
                "responses": hold_responses,
            }},
        },
        "components": { "schemas": schemas() },
    })
}

/// The document as committed: pretty JSON with a trailing newline.
pub fn render() -> String {
    let mut text = serde_json::to_string_pretty(&document()).unwrap_or_default();
    text.push('\n');
    text
}

#[cfg(test)]
#[path = "openapi_tests.rs"]
mod tests;
