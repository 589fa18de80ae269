//! The leader's writes of what it observed ([`super::status`]): `GuardedHost` and
//! `GuardedControlPlane` status by server-side apply under [`FIELD_MANAGER`], each only when
//! it differs from what the object carries; `MetalguardAgentReady=Unknown` on the Node of a
//! silent agent; and the leader label on the controller's own pod.

use std::collections::BTreeSet;

use k8s_openapi::api::core::v1::{Node, Pod};
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use metalguard_api::k8s::GuardedControlPlane;
use metalguard_api::k8s::host::GuardedHostStatus;
use serde_json::json;

use super::{AGENT_READY, FIELD_MANAGER, KubeBackend, budget, status};
use crate::backend::Judged;

/// The label the leader puts on its own pod; the Service selects it.
pub const LEADER_LABEL: &str = "metalguard.io/leader";
/// Why a Node's `MetalguardAgentReady` is `Unknown`.
pub const AGENT_SILENT: &str = "AgentSilent";

/// `status` as the body of a `GuardedHost` status apply: every field this manager owns, so
/// nothing it wrote before is dropped by the apply.
pub fn host_status_apply(status: &GuardedHostStatus) -> serde_json::Value {
    json!({
        "apiVersion": "metalguard.io/v1alpha1",
        "kind": "GuardedHost",
        "status": status,
    })
}

impl KubeBackend {
    /// Writes each host's observed status that changed since the object's, as many as
    /// `deadline` allows ([`budget`]); the rest are observed and written at the next rounds.
    pub(super) async fn write_host_observations(
        &mut self,
        judged: &Judged<'_>,
        deadline: tokio::time::Instant,
    ) {
        let now = judged.snapshot.observed_at;
        let scope = self.observe_scope.hosts(judged);
        let index = status::RoundIndex::of(judged, now, scope.as_ref());
        let hosts: Vec<&metalguard_api::snapshot::Host> = match &scope {
            None => judged.snapshot.hosts.iter().collect(),
            Some(names) => names
                .iter()
                .filter_map(|name| super::observe_scope::find(&judged.snapshot.hosts, name))
                .collect(),
        };
        self.observed_hosts = 0;
        let mut writes: Vec<(String, GuardedHostStatus)> = Vec::new();
        for host in hosts {
            let Some(object) = self.host_shared(&host.name) else {
                continue;
            };
            self.observed_hosts += 1;
            let previous = object.status.clone().unwrap_or_default();
            let mut observed = status::observe_host(
                &index,
                judged,
                &previous,
                object.metadata.generation,
                host,
                now,
            );
            // A release a person named in the spec is recorded in status, where it stays.
            super::holds::apply_release(&mut observed.holds, object.spec.hold_release.as_ref());
            // Mirrored onto the host's Node with its agent's conditions (`nodes.rs`).
            match observed
                .conditions
                .iter()
                .find(|c| c.type_ == "FencingReady")
            {
                Some(c) => {
                    self.fencing_ready.insert(
                        host.name.clone(),
                        (c.status.clone(), c.reason.clone(), c.message.clone()),
                    );
                }
                None => {
                    self.fencing_ready.remove(&host.name);
                }
            }
            if observed != previous {
                writes.push((host.name.clone(), observed));
            }
        }
        let writes = budget::oldest_first(writes, &self.waiting_observations, |(name, _)| name);
        let api = self.hosts_api();
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let (done, left) =
            budget::within(writes, budget::CONCURRENCY, deadline, |(name, observed)| {
                let (api, params) = (api.clone(), params.clone());
                async move {
                    let written = api
                        .patch_status(&name, &params, &Patch::Apply(&host_status_apply(&observed)))
                        .await;
                    (name, written)
                }
            })
            .await;
        let mut waiting: BTreeSet<String> = left.into_iter().map(|(name, _)| name).collect();
        let (started, deferred) = (done.len(), waiting.len());
        for (name, written) in done {
            match written {
                Ok(written) => self.written_hosts.insert(name, written),
                Err(error) => {
                    tracing::warn!(host = %name, %error, "observed host status not written");
                    waiting.insert(name);
                }
            }
        }
        if deferred > 0 {
            tracing::info!(
                written = started,
                deferred,
                "observed host statuses left for the next rounds: this round's write budget is spent"
            );
        }
        for name in &waiting {
            self.observe_scope.retry(name);
        }
        self.waiting_observations = waiting;
    }

    /// Writes the `GuardedControlPlane`'s status when it changed (only with exactly one).
    pub(super) async fn write_control_plane_status(&mut self, judged: &Judged<'_>) {
        let planes = self.world.control_planes.state();
        let [plane] = planes.as_slice() else {
            return;
        };
        let name = plane.name_any();
        let previous = match &self.written_control_plane {
            Some(written) if written.name_any() == name && super::newer(written, &**plane) => {
                written.status.clone().unwrap_or_default()
            }
            _ => plane.status.clone().unwrap_or_default(),
        };
        let observed = status::observe_control_plane(
            judged,
            &previous,
            plane.metadata.generation,
            judged.snapshot.observed_at,
        );
        if observed == previous {
            return;
        }
        let patch = json!({
            "apiVersion": "metalguard.io/v1alpha1",
            "kind": "GuardedControlPlane",
            "status": observed,
        });
        let api: Api<GuardedControlPlane> = Api::namespaced(self.client.clone(), self.ns());
        match api
            .patch_status(
                &name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
        {
            Ok(written) => self.written_control_plane = Some(written),
            Err(error) => {
                tracing::warn!(control_plane = %name, %error, "control plane status not written");
            }
        }
    }

    /// Sets `MetalguardAgentReady=Unknown` on the Node of each host whose agent has been
    /// silent longer than its heartbeat timeout (once; the agent's next report sets it back).
    pub(super) async fn mark_silent_agents(
        &mut self,
        judged: &Judged<'_>,
        deadline: tokio::time::Instant,
    ) {
        let now = judged.snapshot.observed_at;
        let mut marks: Vec<(String, String, String, serde_json::Value)> = Vec::new();
        // Most hosts are decided by the bounds alone: which checks select a host is asked
        // only of one whose silence lies between them.
        let (shortest, longest) =
            metalguard_core::health::agent_heartbeat_timeout_bounds(judged.policy);
        for host in &judged.snapshot.hosts {
            let silence = status::silence(host, now);
            if silence <= shortest {
                continue;
            }
            let timeout = if silence > longest {
                None
            } else {
                let timeout = status::heartbeat_timeout(judged.policy, host);
                if silence <= timeout {
                    continue;
                }
                Some(timeout)
            };
            let Some(node) = self.world.node_of(&host.name) else {
                continue;
            };
            let on_node = node
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|cs| cs.iter().find(|c| c.type_ == AGENT_READY).cloned());
            let already = self
                .mirrored
                .get(&host.name)
                .and_then(|m| m.get(AGENT_READY))
                .is_some_and(|(s, r)| s == "Unknown" && r == AGENT_SILENT);
            // Only a condition an agent once set is turned Unknown; none is added.
            let Some(condition) = on_node.filter(|c| c.status != "Unknown") else {
                continue;
            };
            if already {
                continue;
            }
            let timeout = timeout.unwrap_or_else(|| status::heartbeat_timeout(judged.policy, host));
            let last = host.agent.as_ref().map(|a| a.last_heartbeat);
            let message = match last {
                Some(at) => format!(
                    "no report from the metalguard agent since {} (heartbeat timeout {})",
                    status::second(at).0,
                    metalguard_api::duration::format_duration(timeout)
                ),
                None => format!(
                    "no report from the metalguard agent since this controller leads (heartbeat timeout {})",
                    metalguard_api::duration::format_duration(timeout)
                ),
            };
            let at = super::record::time(now);
            let patch = json!({ "status": { "conditions": [{
                "type": AGENT_READY, "status": "Unknown", "reason": AGENT_SILENT,
                "message": message, "lastHeartbeatTime": at, "lastTransitionTime": at,
            }]}});
            marks.push((host.name.clone(), node.name_any(), condition.status, patch));
        }
        let api: Api<Node> = Api::all(self.client.clone());
        let (done, _) = budget::within(
            marks,
            budget::CONCURRENCY,
            deadline,
            |(host, name, previous, patch)| {
                let api = api.clone();
                async move {
                    let written = api
                        .patch_status(&name, &PatchParams::default(), &Patch::Strategic(patch))
                        .await;
                    (host, name, previous, written)
                }
            },
        )
        .await;
        // One the budget left is marked at a next round: it is not recorded as mirrored.
        for (host, name, previous, written) in done {
            match written {
                Ok(_) => {
                    tracing::warn!(host = %host, node = %name, %previous, "agent silent: MetalguardAgentReady set to Unknown");
                    self.mirrored.entry(host).or_default().insert(
                        AGENT_READY.to_owned(),
                        ("Unknown".to_owned(), AGENT_SILENT.to_owned()),
                    );
                }
                Err(error) => {
                    tracing::warn!(node = %name, %error, "silent agent not marked on its Node");
                }
            }
        }
    }

    /// Puts [`LEADER_LABEL`] on this controller's pod while it leads and removes it when it
    /// does not, when that differs from what it last wrote (a failed write is retried at the
    /// next campaign).
    pub(super) async fn label_pod(&mut self, leading: bool) {
        let Some(pod) = self.settings.pod.clone() else {
            return;
        };
        if self.pod_labelled == Some(leading) {
            return;
        }
        let value = if leading { json!("true") } else { json!(null) };
        let patch = json!({ "metadata": { "labels": { LEADER_LABEL: value } } });
        let api: Api<Pod> = Api::namespaced(self.client.clone(), self.ns());
        match api
            .patch(&pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(%pod, leading, "leader label of the controller's pod written");
                self.pod_labelled = Some(leading);
            }
            Err(error) => {
                tracing::warn!(%pod, leading, %error, "leader label of the controller's pod not written");
            }
        }
    }
}
