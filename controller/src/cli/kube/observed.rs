//! What `status --kubeconfig` shows in place of the agents' reports, which live in the
//! leader's memory: what the leader last wrote of each host (its agent, power, etcd member
//! and judgement in `GuardedHost` status), the agents' conditions it mirrored onto the
//! Nodes, and the control plane's quorum from `GuardedControlPlane` status.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::ResourceExt as _;
use metalguard_api::duration::Timestamp;
use metalguard_api::k8s::{GuardedControlPlane, GuardedHost};
use serde_json::json;

use crate::kube::record;

/// The Node conditions an agent reported (mirrored by the leader): every type but the
/// kubelet's own.
fn agent_conditions(node: Option<&Node>) -> Vec<(String, String, String, String)> {
    node.and_then(|n| n.status.as_ref())
        .and_then(|s| s.conditions.as_ref())
        .map(|conditions| {
            conditions
                .iter()
                .filter(|c| !metalguard_api::protocol::is_reserved_condition(&c.type_))
                .map(|c| {
                    (
                        c.type_.clone(),
                        c.status.clone(),
                        c.reason.clone().unwrap_or_default(),
                        c.message.clone().unwrap_or_default(),
                    )
                })
                .collect()
        })
        .unwrap_or_default()
}

fn condition_line(c: &Condition) -> String {
    let mut line = format!("{}={} ({})", c.type_, c.status, c.reason);
    if !c.message.is_empty() {
        let _ = write!(line, ": {}", c.message);
    }
    line
}

/// The `agents:` and `judged by the leader:` sections and the control plane's line.
pub fn render(
    hosts: &[GuardedHost],
    nodes: &BTreeMap<String, Node>,
    control_plane: Option<&GuardedControlPlane>,
    now: Timestamp,
) -> String {
    let mut out = String::from(
        "agents (as the leader last wrote them: GuardedHost status, conditions mirrored on the Nodes):\n",
    );
    for h in hosts {
        let name = h.name_any();
        let status = h.status.clone().unwrap_or_default();
        match &status.agent {
            Some(agent) => {
                let heard = now.since(record::timestamp(&agent.last_heartbeat_time));
                let _ = writeln!(
                    out,
                    "  {name}: agent {} heard {:.0}s ago (refreshed every half heartbeat timeout), {}",
                    agent.version,
                    heard.as_secs_f64(),
                    if agent.can_fence {
                        "reaches every BMC it probes"
                    } else {
                        "some BMC it probes does not answer"
                    }
                );
            }
            None => {
                let _ = writeln!(out, "  {name}: no report from its agent");
            }
        }
        for (type_, status, reason, message) in agent_conditions(nodes.get(&h.spec.node_name)) {
            let _ = write!(out, "    {type_} = {status} ({reason})");
            if status != "True" && !message.is_empty() {
                let _ = write!(out, ": {message}");
            }
            let _ = writeln!(out);
        }
    }
    out.push_str("judged by the leader:\n");
    for h in hosts {
        let status = h.status.clone().unwrap_or_default();
        let mut parts: Vec<String> = Vec::new();
        if let Some(power) = status.power {
            parts.push(format!("power {power:?}"));
        }
        if let Some(m) = &status.etcd_member {
            parts.push(format!(
                "etcd member {} {}{}{}",
                m.id,
                if m.learner { "learner" } else { "voter" },
                if m.healthy {
                    ", healthy"
                } else {
                    ", UNHEALTHY"
                },
                if m.leader { ", raft leader" } else { "" }
            ));
        }
        parts.extend(status.conditions.iter().map(condition_line));
        let _ = writeln!(
            out,
            "  {}: {}",
            h.name_any(),
            if parts.is_empty() {
                "nothing written yet".to_owned()
            } else {
                parts.join("; ")
            }
        );
    }
    if let Some(s) = control_plane.and_then(|c| c.status.as_ref()) {
        let mut line = format!(
            "control plane: {} voters, {} learners, raft leader {}, tolerates {} failure(s), at least {} must stay available",
            s.etcd_voters,
            s.etcd_learners,
            s.etcd_leader.as_deref().unwrap_or("unknown"),
            s.quorum_tolerance
                .map_or_else(|| "?".to_owned(), |t| t.to_string()),
            s.min_available
                .map_or_else(|| "?".to_owned(), |m| m.to_string()),
        );
        for c in &s.conditions {
            let _ = write!(line, "; {}", condition_line(c));
        }
        let _ = writeln!(out, "{line}");
    }
    out
}

/// The same for `status --json`: per host its status as the leader wrote it and the agent's
/// Node conditions; the control plane's status.
pub fn to_json(
    hosts: &[GuardedHost],
    nodes: &BTreeMap<String, Node>,
    control_plane: Option<&GuardedControlPlane>,
) -> serde_json::Value {
    let hosts: Vec<serde_json::Value> = hosts
        .iter()
        .map(|h| {
            let conditions: Vec<serde_json::Value> = agent_conditions(nodes.get(&h.spec.node_name))
                .into_iter()
                .map(|(type_, status, reason, message)| {
                    json!({"type": type_, "status": status, "reason": reason, "message": message})
                })
                .collect();
            json!({
                "name": h.name_any(),
                "status": h.status,
                "agent_conditions": conditions,
            })
        })
        .collect();
    json!({
        "hosts": hosts,
        "control_plane": control_plane.and_then(|c| c.status.as_ref()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_host_shows_its_agent_its_mirrored_conditions_and_the_leaders_judgement() {
        let host: GuardedHost = serde_json::from_value(json!({
            "apiVersion": "metalguard.io/v1alpha1", "kind": "GuardedHost",
            "metadata": {"name": "cp-1"},
            "spec": {"role": "ControlPlane", "nodeName": "node-1"},
            "status": {
                "power": "On",
                "agent": {"lastHeartbeatTime": "2026-11-25T10:00:00Z", "version": "0.1.0", "canFence": true},
                "etcdMember": {"id": "a1", "name": "cp-1", "learner": false, "healthy": true, "leader": true},
                "conditions": [{"type": "Healthy", "status": "True", "reason": "Healthy", "message": "",
                                "lastTransitionTime": "2026-11-25T09:00:00Z"}],
            },
        }))
        .unwrap();
        let silent: GuardedHost = serde_json::from_value(json!({
            "apiVersion": "metalguard.io/v1alpha1", "kind": "GuardedHost",
            "metadata": {"name": "cp-2"},
            "spec": {"role": "ControlPlane", "nodeName": "node-2"},
        }))
        .unwrap();
        let node: Node = serde_json::from_value(json!({
            "metadata": {"name": "node-1"},
            "status": {"conditions": [
                {"type": "Ready", "status": "True", "reason": "KubeletReady"},
                {"type": "EtcdMemberHealthy", "status": "False", "reason": "Slow", "message": "fsync 2s"},
            ]},
        }))
        .unwrap();
        let nodes = BTreeMap::from([("node-1".to_owned(), node)]);
        let heard = host.status.as_ref().unwrap().agent.as_ref().unwrap();
        let now = Timestamp(record::timestamp(&heard.last_heartbeat_time).0 + 12_000);
        let text = render(&[host.clone(), silent.clone()], &nodes, None, now);
        assert!(text.contains("cp-1: agent 0.1.0 heard 12s ago"), "{text}");
        assert!(
            text.contains("    EtcdMemberHealthy = False (Slow): fsync 2s"),
            "{text}"
        );
        assert!(!text.contains("Ready = True"), "the kubelet's own: {text}");
        assert!(text.contains("cp-2: no report from its agent"), "{text}");
        assert!(
            text.contains(
                "cp-1: power On; etcd member a1 voter, healthy, raft leader; Healthy=True (Healthy)"
            ),
            "{text}"
        );
        assert!(text.contains("cp-2: nothing written yet"), "{text}");
        let document = to_json(&[host, silent], &nodes, None);
        assert_eq!(
            document["hosts"][0]["agent_conditions"][0]["type"],
            "EtcdMemberHealthy"
        );
        assert_eq!(document["hosts"][0]["status"]["power"], "On");
    }
}
