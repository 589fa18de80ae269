//! The API server's audit log, restricted to chosen users: what a component really asked for
//! and what RBAC answered, read back as [`AuditEvent`]s.

use std::path::Path;

use serde_json::{Value, json};

use crate::tls::write_file;
use crate::{HarnessError, Result};

/// Writes an audit policy that records the requests of `users` at `Metadata` level (who,
/// verb, resource, answer, authorization decision; no bodies) and nothing else.
pub fn write_policy(path: &Path, users: &[String]) -> Result<()> {
    let policy = json!({
        "apiVersion": "audit.k8s.io/v1",
        "kind": "Policy",
        "omitStages": ["RequestReceived"],
        "rules": [
            {"level": "Metadata", "users": users},
            {"level": "None"},
        ],
    });
    write_file(path, policy.to_string().as_bytes(), 0o644)
}

/// One audited request.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct AuditEvent {
    /// The authenticated user.
    pub user: String,
    /// The Kubernetes verb (`get`, `list`, `watch`, `create`, `patch`, `delete`, ...).
    pub verb: String,
    /// API group (`""` for the core group); empty for non-resource requests.
    pub api_group: String,
    /// Resource, with `/subresource` when there is one; the URL path for non-resource
    /// requests.
    pub resource: String,
    /// Namespace (`""` for cluster-scoped requests).
    pub namespace: String,
    /// Object name, when the request names one.
    pub name: String,
    /// The HTTP status answered.
    pub code: u16,
    /// The authorizer's decision (`allow` / `forbid`).
    pub decision: String,
    /// The stage (`ResponseStarted` for a watch that began, `ResponseComplete`, `Panic`).
    pub stage: String,
    /// The request URI.
    pub uri: String,
    /// When the API server received the request (`requestReceivedTimestamp`).
    pub received: Option<std::time::SystemTime>,
}

impl AuditEvent {
    fn from_json(v: &Value) -> Self {
        let text = |pointer: &str| {
            v.pointer(pointer)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        };
        let object = v.get("objectRef");
        let resource = match object {
            Some(o) => {
                let r = o["resource"].as_str().unwrap_or("");
                match o["subresource"].as_str() {
                    Some(sub) => format!("{r}/{sub}"),
                    None => r.to_owned(),
                }
            }
            None => text("/requestURI"),
        };
        Self {
            user: text("/user/username"),
            verb: text("/verb"),
            api_group: text("/objectRef/apiGroup"),
            resource,
            namespace: text("/objectRef/namespace"),
            name: text("/objectRef/name"),
            code: v
                .pointer("/responseStatus/code")
                .and_then(Value::as_u64)
                .and_then(|c| u16::try_from(c).ok())
                .unwrap_or(0),
            decision: text("/annotations/authorization.k8s.io~1decision"),
            stage: text("/stage"),
            uri: text("/requestURI"),
            received: super::time::parse_rfc3339(&text("/requestReceivedTimestamp")),
        }
    }
}

/// Reads every event in the audit log at `path` (JSON lines); a missing file is no events.
pub fn read(path: &Path) -> Result<Vec<AuditEvent>> {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(HarnessError::Io {
                context: format!("reading audit log {}", path.display()),
                source: e,
            });
        }
    };
    // The last line may be half written while the server runs: skip what does not parse.
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .map(|v| AuditEvent::from_json(&v))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_names_its_subresource_and_decision() {
        let line = json!({
            "stage": "ResponseComplete", "verb": "patch", "requestURI": "/api/v1/nodes/w-1/status",
            "user": {"username": "system:serviceaccount:ns:sa"},
            "objectRef": {"resource": "nodes", "name": "w-1", "apiVersion": "v1", "subresource": "status"},
            "responseStatus": {"code": 403},
            "annotations": {"authorization.k8s.io/decision": "forbid"},
        });
        let event = AuditEvent::from_json(&line);
        assert_eq!(
            (
                event.resource.as_str(),
                event.api_group.as_str(),
                event.code,
                event.decision.as_str()
            ),
            ("nodes/status", "", 403, "forbid")
        );
    }
}
