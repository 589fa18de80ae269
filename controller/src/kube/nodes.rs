//! The leader's writes to Nodes: deletion or the out-of-service taint of a fenced host's Node,
//! its labels and taints kept to put back when the host returns, and the agents' conditions
//! mirrored onto their Node.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use metalguard_api::remediation::RemediationPhase;
use serde_json::json;

use super::world::OUT_OF_SERVICE_TAINT;
use super::{AGENT_READY, KubeBackend, evidence, record, status_name, world};
use crate::backend::{BackendError, NodeWrite, State, StoredReport};

impl KubeBackend {
    pub(super) async fn node_write(&mut self, write: NodeWrite) -> Result<(), BackendError> {
        let api: Api<Node> = Api::all(self.client.clone());
        match write {
            NodeWrite::Delete { host } => {
                let Some(node) = self.node_name(&host) else {
                    return Ok(());
                };
                match api.delete(&node, &DeleteParams::default()).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(status)) if status.code == 404 => Ok(()),
                    Err(e) => Err(Self::unavailable(format!("delete Node {node}"), e)),
                }
            }
            NodeWrite::TaintOutOfService { host } => {
                let Some(node) = self.world.node_of(&host) else {
                    // No Node: nothing is scheduled there to move.
                    return Ok(());
                };
                let mut taints = node
                    .spec
                    .as_ref()
                    .and_then(|s| s.taints.clone())
                    .unwrap_or_default();
                if taints.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT) {
                    return Ok(());
                }
                taints.push(k8s_openapi::api::core::v1::Taint {
                    key: OUT_OF_SERVICE_TAINT.to_owned(),
                    value: Some("nodeshutdown".to_owned()),
                    effect: "NoExecute".to_owned(),
                    time_added: None,
                });
                self.patch_node(&node, json!({ "spec": { "taints": taints } }))
                    .await
            }
            NodeWrite::Restore { host, backup } => {
                let Some(node) = self.world.node_of(&host) else {
                    return Err(BackendError::Unavailable {
                        what: format!("restore of host {host}'s Node metadata"),
                        source: "the Node is not in the watch cache yet".into(),
                    });
                };
                let missing = |saved: &BTreeMap<String, String>, now: &BTreeMap<String, String>| {
                    saved
                        .iter()
                        .filter(|(k, _)| !now.contains_key(*k))
                        .map(|(k, v)| (k.clone(), v.clone()))
                        .collect::<BTreeMap<_, _>>()
                };
                let labels = missing(&backup.labels, node.labels());
                let annotations = missing(&backup.annotations, node.annotations());
                let taints = node.spec.as_ref().and_then(|s| s.taints.clone());
                let tainted = taints
                    .as_ref()
                    .is_some_and(|t| t.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT));
                if labels.is_empty() && annotations.is_empty() && !tainted {
                    return Ok(());
                }
                let mut patch = json!({ "metadata": {} });
                if !labels.is_empty() {
                    patch["metadata"]["labels"] = json!(labels);
                }
                if !annotations.is_empty() {
                    patch["metadata"]["annotations"] = json!(annotations);
                }
                if tainted {
                    let kept: Vec<_> = taints
                        .unwrap_or_default()
                        .into_iter()
                        .filter(|t| t.key != OUT_OF_SERVICE_TAINT)
                        .collect();
                    patch["spec"] = json!({ "taints": kept });
                }
                self.patch_node(&node, patch).await
            }
        }
    }

    /// A JSON merge patch of a Node, conditional on the version it was computed from (taints
    /// are a list the API server replaces whole: a concurrent change fails with 409 and the
    /// next round recomputes).
    pub(super) async fn patch_node(
        &self,
        node: &Node,
        mut patch: serde_json::Value,
    ) -> Result<(), BackendError> {
        let name = node.name_any();
        patch["metadata"]["resourceVersion"] = json!(node.resource_version());
        let api: Api<Node> = Api::all(self.client.clone());
        api.patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map(|_| ())
            .map_err(|e| Self::unavailable(format!("patch of Node {name}"), e))
    }

    /// The Nodes of the hosts whose next step is the backup of their labels and annotations
    /// (`VerifiedOff`), read now instead of from the watch: the backup is what the new Node
    /// gets back, and a watch can lag (a real API server restarted: the Nodes watch was still
    /// in its retry backoff when the backup was taken and missed a label set meanwhile).
    pub(super) async fn refresh_nodes_to_back_up(
        &self,
        state: &mut State,
    ) -> Result<(), BackendError> {
        let hosts: Vec<String> = state
            .remediations
            .values()
            .filter(|r| r.phase == RemediationPhase::VerifiedOff)
            .map(|r| r.target.clone())
            .collect();
        if hosts.is_empty() {
            return Ok(());
        }
        let api: Api<Node> = Api::all(self.client.clone());
        let mut fresh: BTreeMap<String, std::sync::Arc<Node>> = BTreeMap::new();
        for host in hosts {
            let Some(name) = self.node_name(&host) else {
                continue;
            };
            let node = api
                .get_opt(&name)
                .await
                .map_err(|e| Self::unavailable(format!("Node {name} (for its backup)"), e))?;
            let Some(nodes) = state.nodes.as_mut() else {
                return Ok(());
            };
            match node {
                Some(node) => {
                    nodes.insert(host.clone(), world::node_status(&node));
                    fresh.insert(host, std::sync::Arc::new(node));
                }
                None => {
                    nodes.remove(&host);
                }
            }
        }
        evidence::discount_stale_ready(state, |host| {
            fresh
                .get(host)
                .cloned()
                .or_else(|| self.world.node_of(host))
        });
        Ok(())
    }

    pub(super) fn node_name(&self, host: &str) -> Option<String> {
        self.host(host).map(|h| h.spec.node_name)
    }

    /// Mirrors an agent's conditions onto its Node (strategic merge on `status.conditions`,
    /// keyed by type: the kubelet's conditions are untouched) when a status or reason changed.
    pub(super) async fn mirror(&mut self, stored: &StoredReport) -> Result<(), BackendError> {
        let host = &stored.report.host;
        let Some(node) = self.world.node_of(host) else {
            return Ok(());
        };
        // A reserved type (`Ready`, the kubelet's) is the kubelet's own: never overwritten.
        let mut wanted: BTreeMap<String, (String, String, String)> = stored
            .report
            .conditions
            .iter()
            .filter(|c| !metalguard_api::protocol::is_reserved_condition(&c.type_))
            .map(|c| {
                (
                    c.type_.clone(),
                    (
                        status_name(c.status).to_owned(),
                        c.reason.clone(),
                        c.message.clone(),
                    ),
                )
            })
            .collect();
        if let Some(fencing) = self.fencing_ready.get(host) {
            wanted.insert(super::FENCING_READY.to_owned(), fencing.clone());
        }
        wanted.insert(
            AGENT_READY.to_owned(),
            (
                "True".to_owned(),
                "AgentReporting".to_owned(),
                format!("metalguard agent {} reports", stored.report.agent_version),
            ),
        );
        let key: BTreeMap<String, (String, String)> = wanted
            .iter()
            .map(|(t, (s, r, _))| (t.clone(), (s.clone(), r.clone())))
            .collect();
        if self.mirrored.get(host) == Some(&key) {
            return Ok(());
        }
        let on_node: BTreeMap<String, (String, String)> = node
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_ref())
            .map(|cs| {
                cs.iter()
                    .map(|c| {
                        (
                            c.type_.clone(),
                            (c.status.clone(), c.reason.clone().unwrap_or_default()),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default();
        let now = record::time(stored.received_at);
        let changed: Vec<serde_json::Value> = wanted
            .iter()
            .filter(|(t, (s, r, _))| on_node.get(*t) != Some(&(s.clone(), r.clone())))
            .map(|(t, (s, r, m))| {
                let since = stored
                    .report
                    .conditions
                    .iter()
                    .find(|c| c.type_ == *t)
                    .map_or(stored.received_at, |c| c.last_transition);
                json!({
                    "type": t, "status": s, "reason": r, "message": m,
                    "lastHeartbeatTime": now, "lastTransitionTime": record::time(since),
                })
            })
            .collect();
        if !changed.is_empty() {
            let api: Api<Node> = Api::all(self.client.clone());
            let name = node.name_any();
            api.patch_status(
                &name,
                &PatchParams::default(),
                &Patch::Strategic(json!({ "status": { "conditions": changed } })),
            )
            .await
            .map_err(|e| Self::unavailable(format!("conditions of Node {name}"), e))?;
        }
        self.mirrored.insert(host.clone(), key);
        Ok(())
    }
}
