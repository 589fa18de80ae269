//! The Kubernetes backend: the same controller loop ([`crate::control::service::Controller`]) with
//! its inputs from watches and its state in the custom resources' status.
//!
//! - **Inputs**: reflectors ([`world`]) keep Nodes, `GuardedHost`s, `GuardedControlPlane`s,
//!   `HostHealthCheck`s, `FenceRequest`s and Secrets; [`KubeBackend::inventory`] rebuilds the
//!   inventory when one of them changes, [`KubeBackend::load`] the [`State`].
//! - **Leadership**: a `Lease` kept by `kube-lease-manager` ([`run`]). Before acting, every
//!   round reads the Lease back: only a Lease held by this identity and not yet expired makes
//!   it leader, and only until the renewal it read expires (less a margin). The manager's own
//!   flag is not trusted alone: its watch loop keeps the last value while the API server is
//!   unreachable.
//! - **Writes**, in the order the executor gives them: the remediation and its operations
//!   through server-side apply of `GuardedHost` status (intent before the command is offered,
//!   and before anything is done to a Node), Node deletion or the out-of-service taint, the
//!   metadata merge, hook annotations, fence request status; Events for decisions and
//!   refusals; agent conditions mirrored onto Node conditions.
//!
//! Each object this controller wrote is kept as the API server returned it until the watch
//! catches up, so a round never plans from a status older than its own last write.

pub mod crd;
pub mod evidence;
pub mod hooks;
#[cfg(test)]
mod manifests;
pub mod observe;
pub mod record;
pub mod run;
pub mod status;
#[cfg(test)]
mod tests;
mod verdict;
pub mod world;

/// The annotation in which the command line records who asked (the user the API server
/// authenticated, from a `SelfSubjectReview`).
pub const REQUESTED_BY: &str = "metalguard.io/requested-by";
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt as _};
use metalguard_api::k8s::fence::{FencePhase, FenceRequestStatus, TimelineEntry};
use metalguard_api::k8s::host::RemediationPhaseName;
use metalguard_api::k8s::{FenceRequest, GuardedHost, HostHealthCheck};
use metalguard_api::remediation::{Remediation, RemediationPhase};
use metalguard_api::snapshot::ConditionStatus;
use serde_json::json;

use crate::backend::{
    Backend, BackendError, ControllerNotes, Leadership, NodeWrite, State, StoredOperation,
    StoredReport, Write,
};
use crate::inventory::{ControllerSettings, EtcdSettings, Inventory};
use world::{OUT_OF_SERVICE_TAINT, World};

/// The field manager of status and hook writes.
pub const FIELD_MANAGER: &str = "metalguard-controller";
/// The `reportingController` of Events.
pub const REPORTING_CONTROLLER: &str = "metalguard.io/controller";
/// The Node condition that says the host's agent reports.
pub const AGENT_READY: &str = "MetalguardAgentReady";
/// Leadership is given up this long before the Lease it read expires.
const LEASE_MARGIN: Duration = Duration::from_secs(2);
/// Operations kept in a host's status besides those of its current remediation.
const KEEP_OPERATIONS: usize = 16;

/// The process settings of the Kubernetes backend.
#[derive(Debug, Clone)]
pub struct KubeSettings {
    /// The namespace of the custom resources, Lease and Events.
    pub namespace: String,
    /// The namespace of the BMC credentials Secrets (and of nothing else: RBAC lets the
    /// controller read every Secret there and no other).
    pub credentials_namespace: String,
    /// This controller's identity (the pod name).
    pub identity: String,
    /// The Lease's name.
    pub lease_name: String,
    /// This controller's pod in `namespace` (downward API), labelled while it leads; `None`
    /// outside a pod.
    pub pod: Option<String>,
    /// Agent API, TLS directory, plan interval.
    pub controller: ControllerSettings,
    /// Lease duration (`lease_ttl`) and request timeout (`timeout`); no etcd endpoints are used.
    pub timing: EtcdSettings,
}

/// The Kubernetes [`Backend`].
pub struct KubeBackend {
    client: Client,
    settings: KubeSettings,
    world: World,
    /// The agents' latest reports (mirrored onto their Nodes).
    reports: BTreeMap<String, StoredReport>,
    /// The agent conditions last mirrored per host: type → (status, reason).
    mirrored: BTreeMap<String, BTreeMap<String, (String, String)>>,
    /// Objects as this controller last wrote them, until the watch shows them.
    written_hosts: BTreeMap<String, GuardedHost>,
    written_fences: BTreeMap<String, FenceRequest>,
    /// The pending fence requests the last loaded state held (target → request name): the
    /// ones a refusal in that round's plan answers ([`verdict`]).
    considered_fences: BTreeMap<String, String>,
    /// Last notes (kept here: their content reaches people as Events).
    notes: Option<ControllerNotes>,
    /// Inventory fingerprint of the last build.
    fingerprint: Option<String>,
    /// The decisions and refusals already told as Events (by key), and health-check verdicts
    /// already written.
    announced: BTreeSet<String>,
    check_verdicts: BTreeMap<String, String>,
    /// Until when the Lease read back makes this controller leader.
    leading_until: Option<tokio::time::Instant>,
    /// Dropping it makes kube-lease-manager release the Lease.
    lease_flag: Option<tokio::sync::watch::Receiver<bool>>,
    /// The control plane as last written, until the watch shows it.
    written_control_plane: Option<metalguard_api::k8s::GuardedControlPlane>,
    /// Whether the pod's leader label was last written present (`Some(true)`) or removed.
    pod_labelled: Option<bool>,
}

impl KubeBackend {
    /// A backend over `world` (filled by reflectors or a test).
    pub fn new(client: Client, settings: KubeSettings, world: World) -> Self {
        Self {
            client,
            settings,
            world,
            reports: BTreeMap::new(),
            mirrored: BTreeMap::new(),
            written_hosts: BTreeMap::new(),
            written_fences: BTreeMap::new(),
            considered_fences: BTreeMap::new(),
            notes: None,
            fingerprint: None,
            announced: BTreeSet::new(),
            check_verdicts: BTreeMap::new(),
            leading_until: None,
            lease_flag: None,
            written_control_plane: None,
            pod_labelled: None,
        }
    }

    /// Keeps kube-lease-manager's flag (dropping it releases the Lease on resign).
    pub fn with_lease_flag(mut self, flag: tokio::sync::watch::Receiver<bool>) -> Self {
        self.lease_flag = Some(flag);
        self
    }

    /// The inventory as the resources say now, or why it cannot be built.
    pub fn build_inventory(&self) -> Result<Inventory, String> {
        world::inventory(
            &self.world,
            &self.settings.namespace,
            &self.settings.credentials_namespace,
            &self.settings.controller,
            &self.settings.timing,
        )
    }

    fn ns(&self) -> &str {
        &self.settings.namespace
    }

    fn hosts_api(&self) -> Api<GuardedHost> {
        Api::namespaced(self.client.clone(), self.ns())
    }

    fn unavailable(what: impl Into<String>, error: kube::Error) -> BackendError {
        match &error {
            kube::Error::Api(status) if status.code == 409 => BackendError::Refused {
                what: format!("{} (conflict: {})", what.into(), status.message),
            },
            _ => BackendError::Unavailable {
                what: what.into(),
                source: Box::new(error),
            },
        }
    }

    fn is_leading(&self) -> bool {
        self.leading_until
            .is_some_and(|until| tokio::time::Instant::now() < until)
    }

    /// The host object, as last written by us if the watch has not caught up.
    fn host(&self, name: &str) -> Option<GuardedHost> {
        let seen = self.world.host(name);
        match (self.written_hosts.get(name), seen) {
            (Some(written), Some(seen)) if !newer(written, &*seen) => Some((*seen).clone()),
            (Some(written), _) => Some(written.clone()),
            (None, seen) => seen.map(|h| (*h).clone()),
        }
    }

    fn fence_request(&self, name: &str) -> Option<FenceRequest> {
        let seen = self
            .world
            .fences
            .state()
            .into_iter()
            .find(|f| f.name_any() == name);
        match (self.written_fences.get(name), seen) {
            (Some(written), Some(seen)) if !newer(written, &*seen) => Some((*seen).clone()),
            (Some(written), _) => Some(written.clone()),
            (None, seen) => seen.map(|f| (*f).clone()),
        }
    }

    /// The world with our own writes laid over it, as a [`State`].
    fn current_state(&self) -> State {
        let (mut state, problems) = world::state(&self.world, &self.reports);
        for problem in problems {
            tracing::warn!(%problem, "status entry ignored");
        }
        for name in self.written_hosts.keys() {
            let Some(h) = self.host(name) else { continue };
            state.remediations.retain(|_, r| r.target != *name);
            state.operations.retain(|_, op| record::home_of(op) != name);
            if let Some(status) = &h.status {
                if let Some(r) = &status.remediation {
                    state
                        .remediations
                        .insert(r.id.clone(), record::remediation(name, r));
                }
                for entry in &status.operations {
                    if let Ok(op) = record::operation(entry) {
                        state.operations.insert(op.id.clone(), op);
                    }
                }
            }
        }
        // A request this controller already answered is not pending, whatever the watch says.
        for name in self.written_fences.keys() {
            if let Some(f) = self
                .fence_request(name)
                .filter(|f| !world::pending_fence(f))
            {
                let answered_at = f.creation_timestamp().map(|t| record::timestamp(&t));
                state.fence_requests.retain(|target, r| {
                    !(*target == f.spec.target && Some(r.requested_at) == answered_at)
                });
            }
        }
        // After our own writes are laid over: a power-off verified in this round counts.
        evidence::discount_stale_ready(&mut state, |host| self.world.node_of(host));
        state.notes.clone_from(&self.notes);
        state.leader = self.is_leading().then(|| self.settings.identity.clone());
        state
    }

    /// Server-side applies `status.remediation` and `status.operations` of `host`.
    async fn apply_host_status(
        &mut self,
        host: &str,
        remediation: Option<Remediation>,
        operations: Vec<StoredOperation>,
    ) -> Result<(), BackendError> {
        // Only this host's status holds its records (and every operation kept there is
        // at home there): no need to rebuild the whole state for one write.
        let status = self.host(host).and_then(|h| h.status).unwrap_or_default();
        let remediation = remediation.or_else(|| {
            status
                .remediation
                .as_ref()
                .map(|r| record::remediation(host, r))
        });
        let mut ops: BTreeMap<String, StoredOperation> = status
            .operations
            .iter()
            .filter_map(|entry| record::operation(entry).ok())
            .map(|op| (op.id.to_string(), op))
            .collect();
        for op in operations {
            ops.insert(op.id.to_string(), op);
        }
        let current_id = remediation.as_ref().map(|r| r.id.clone());
        let (mine, mut others): (Vec<_>, Vec<_>) = ops
            .into_values()
            .partition(|op| op.remediation_id.is_some() && op.remediation_id == current_id);
        // Older remediations' operations are history; membership operations stay while in
        // flight and the latest few after.
        others.retain(|op| op.remediation_id.is_none());
        others.sort_by_key(|op| std::cmp::Reverse(op.created_at));
        let mut kept: Vec<StoredOperation> = mine;
        let mut finished = 0;
        for op in others {
            if op.in_flight() || finished < KEEP_OPERATIONS {
                finished += usize::from(!op.in_flight());
                kept.push(op);
            }
        }
        kept.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        // The observed fields go along: one manager owns the whole status, and an apply
        // without a field it owns would drop that field.
        let mut status = status;
        status.operations = kept.iter().map(record::operation_status).collect();
        status.remediation = remediation.as_ref().map(record::remediation_status);
        let patch = observe::host_status_apply(&status);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let written = self
            .hosts_api()
            .patch_status(host, &params, &Patch::Apply(&patch))
            .await
            .map_err(|e| Self::unavailable(format!("status of GuardedHost {host}"), e))?;
        self.written_hosts.insert(host.to_owned(), written);
        if let Some(r) = &remediation {
            self.follow_fence_request(r).await?;
        }
        Ok(())
    }

    /// Answers the oldest pending fence request for `target`: it became `remediation`.
    async fn accept_fence_request(
        &mut self,
        target: &str,
        remediation: Option<&Remediation>,
    ) -> Result<(), BackendError> {
        let mut pending: Vec<FenceRequest> = self
            .world
            .fences
            .state()
            .iter()
            .filter_map(|f| self.fence_request(&f.name_any()))
            .filter(|f| f.spec.target == target && world::pending_fence(f))
            .collect();
        pending.sort_by_key(|f| (f.creation_timestamp().map(|t| t.0), f.name_any()));
        let Some(request) = pending.first() else {
            return Ok(());
        };
        let now = record::time(crate::clock::now());
        let status = FenceRequestStatus {
            phase: Some(FencePhase::InProgress),
            remediation_id: remediation.map(|r| r.id.clone()),
            remediation_phase: remediation.map(|r| (&r.phase).into()),
            timeline: vec![TimelineEntry {
                time: now,
                phase: FencePhase::InProgress,
                remediation_phase: remediation.map(|r| (&r.phase).into()),
                message: format!(
                    "accepted by {}: remediation {} started",
                    self.settings.identity,
                    remediation.map_or("?", |r| r.id.as_str())
                ),
            }],
            conditions: Vec::new(),
        };
        self.put_fence_status(&request.name_any(), &status).await
    }

    async fn put_fence_status(
        &mut self,
        name: &str,
        status: &FenceRequestStatus,
    ) -> Result<(), BackendError> {
        let patch = json!({
            "apiVersion": "metalguard.io/v1alpha1",
            "kind": "FenceRequest",
            "status": status,
        });
        let api: Api<FenceRequest> = Api::namespaced(self.client.clone(), self.ns());
        let written = api
            .patch_status(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(|e| Self::unavailable(format!("status of FenceRequest {name}"), e))?;
        self.written_fences.insert(name.to_owned(), written);
        Ok(())
    }

    /// Appends a remediation's new phase to the timeline of the fence request that started it.
    async fn follow_fence_request(&mut self, r: &Remediation) -> Result<(), BackendError> {
        let names: BTreeSet<String> = self
            .world
            .fences
            .state()
            .iter()
            .map(|f| f.name_any())
            .chain(self.written_fences.keys().cloned())
            .collect();
        let requests: Vec<FenceRequest> =
            names.iter().filter_map(|n| self.fence_request(n)).collect();
        let Some(request) = requests.into_iter().find(|f| {
            f.status.as_ref().and_then(|s| s.remediation_id.as_deref()) == Some(r.id.as_str())
        }) else {
            return Ok(());
        };
        let mut status = request.status.clone().unwrap_or_default();
        let phase_name: RemediationPhaseName = (&r.phase).into();
        if status.remediation_phase == Some(phase_name) {
            return Ok(());
        }
        let phase = match &r.phase {
            RemediationPhase::Done => FencePhase::Succeeded,
            // Powered off and left off, as a `PowerOff` request asks: done, for a person now.
            RemediationPhase::NeedsPerson { .. } if r.stay_off => FencePhase::Succeeded,
            RemediationPhase::Failed { .. } | RemediationPhase::NeedsPerson { .. } => {
                FencePhase::Failed
            }
            RemediationPhase::Cancelled { .. } => FencePhase::Cancelled,
            _ => FencePhase::InProgress,
        };
        status.phase = Some(phase);
        status.remediation_phase = Some(phase_name);
        let detail = match &r.phase {
            RemediationPhase::Failed { reason }
            | RemediationPhase::NeedsPerson { reason }
            | RemediationPhase::Cancelled { reason } => format!(": {reason}"),
            _ => String::new(),
        };
        status.timeline.push(TimelineEntry {
            time: record::time(r.phase_since),
            phase,
            remediation_phase: Some(phase_name),
            message: format!("remediation {} is {}{detail}", r.id, r.phase.name()),
        });
        self.put_fence_status(&request.name_any(), &status).await
    }

    async fn node_write(&mut self, write: NodeWrite) -> Result<(), BackendError> {
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
    async fn patch_node(
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
    async fn refresh_nodes_to_back_up(&self, state: &mut State) -> Result<(), BackendError> {
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

    fn node_name(&self, host: &str) -> Option<String> {
        self.host(host).map(|h| h.spec.node_name)
    }

    /// Places or releases metalguard's preDrain hook annotations (the spec's hooks belong to
    /// their owners and are never touched).
    async fn put_hooks(
        &mut self,
        host: &str,
        wanted: &BTreeSet<String>,
    ) -> Result<(), BackendError> {
        let Some(object) = self.host(host) else {
            return Ok(());
        };
        let from_spec: BTreeSet<&str> = object
            .spec
            .lifecycle_hooks
            .pre_drain
            .iter()
            .map(|h| h.name.as_str())
            .collect();
        let mut annotations: BTreeMap<String, String> = BTreeMap::new();
        for hook in wanted.iter().filter(|h| !from_spec.contains(h.as_str())) {
            match hooks::annotation_for(hook) {
                Some(key) => {
                    annotations.insert(key, "metalguard".to_owned());
                }
                None => {
                    return Err(BackendError::Refused {
                        what: format!(
                            "hook {hook} of GuardedHost {host}: no annotation key can carry it"
                        ),
                    });
                }
            }
        }
        let patch = json!({
            "apiVersion": "metalguard.io/v1alpha1",
            "kind": "GuardedHost",
            "metadata": { "name": host, "annotations": annotations },
        });
        let written = self
            .hosts_api()
            .patch(
                host,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(|e| Self::unavailable(format!("hooks of GuardedHost {host}"), e))?;
        self.written_hosts.insert(host.to_owned(), written);
        Ok(())
    }

    /// Mirrors an agent's conditions onto its Node (strategic merge on `status.conditions`,
    /// keyed by type: the kubelet's conditions are untouched) when a status or reason changed.
    async fn mirror(&mut self, stored: &StoredReport) -> Result<(), BackendError> {
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

    async fn event(
        &self,
        regarding: ObjectReference,
        type_: &str,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        let mut note = note.to_owned();
        if note.len() > 1000 {
            let mut cut = 1000;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
        }
        let event = Event {
            metadata: ObjectMeta {
                // A generateName must itself be a valid name prefix: `w-1-`, never `w-1.`.
                generate_name: Some(format!(
                    "{}-",
                    regarding
                        .name
                        .clone()
                        .unwrap_or_else(|| "metalguard".to_owned())
                )),
                namespace: Some(self.ns().to_owned()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(jiff::Timestamp::now())),
            action: Some(action.to_owned()),
            reason: Some(reason.to_owned()),
            note: Some(note),
            type_: Some(type_.to_owned()),
            regarding: Some(regarding),
            reporting_controller: Some(REPORTING_CONTROLLER.to_owned()),
            reporting_instance: Some(self.settings.identity.clone()),
            ..Event::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), self.ns());
        if let Err(error) = api.create(&PostParams::default(), &event).await {
            tracing::warn!(%error, reason, "event could not be written");
        }
    }

    fn reference(&self, kind: &str, name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("metalguard.io/v1alpha1".to_owned()),
            kind: Some(kind.to_owned()),
            name: Some(name.to_owned()),
            namespace: Some(self.ns().to_owned()),
            ..ObjectReference::default()
        }
    }

    /// Writes a health check's verdict (`RemediationAllowed` and the counts) when it changed.
    async fn check_status(&mut self, check: &metalguard_api::plan::CheckSummary) {
        let allowed = check.short_circuit.is_none();
        let message = check.short_circuit.clone().unwrap_or_else(|| {
            format!(
                "{} of {} hosts unhealthy; within maxUnhealthy",
                check.unhealthy.len(),
                check.targets
            )
        });
        let verdict = format!("{allowed}:{message}");
        if self.check_verdicts.get(&check.name) == Some(&verdict) {
            return;
        }
        let expected = u32::try_from(check.targets).unwrap_or(u32::MAX);
        let unhealthy = u32::try_from(check.unhealthy.len()).unwrap_or(u32::MAX);
        let remaining = check
            .max_unhealthy
            .map_or(0, |m| m.saturating_sub(check.unhealthy.len()));
        let patch = json!({
            "apiVersion": "metalguard.io/v1alpha1",
            "kind": "HostHealthCheck",
            "status": {
                "expectedHosts": expected,
                "currentHealthy": expected.saturating_sub(unhealthy),
                "remediationsAllowed": if allowed { u32::try_from(remaining).unwrap_or(u32::MAX) } else { 0 },
                "conditions": [{
                    "type": "RemediationAllowed",
                    "status": if allowed { "True" } else { "False" },
                    "reason": if allowed { "WithinMaxUnhealthy" } else { "TooManyUnhealthy" },
                    "message": message,
                    "lastTransitionTime": record::time(crate::clock::now()),
                }],
            },
        });
        let api: Api<HostHealthCheck> = Api::namespaced(self.client.clone(), self.ns());
        match api
            .patch_status(
                &check.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
        {
            Ok(_) => {
                if !allowed {
                    let regarding = self.reference("HostHealthCheck", &check.name);
                    self.event(
                        regarding,
                        "Warning",
                        "RemediationShortCircuited",
                        "Evaluate",
                        &message,
                    )
                    .await;
                }
                self.check_verdicts.insert(check.name.clone(), verdict);
            }
            Err(error) => {
                tracing::warn!(check = %check.name, %error, "health check status not written");
            }
        }
    }
}

/// True when `a`'s resource version is newer than `b`'s (numeric, as the API server's are;
/// when they do not parse, only equal versions count as caught up).
fn newer<K: kube::Resource>(a: &K, b: &K) -> bool {
    let (va, vb) = (
        a.meta().resource_version.as_deref(),
        b.meta().resource_version.as_deref(),
    );
    match (
        va.and_then(|v| v.parse::<u64>().ok()),
        vb.and_then(|v| v.parse::<u64>().ok()),
    ) {
        (Some(a), Some(b)) => a > b,
        _ => va != vb,
    }
}

fn status_name(status: ConditionStatus) -> &'static str {
    match status {
        ConditionStatus::True => "True",
        ConditionStatus::False => "False",
        ConditionStatus::Unknown => "Unknown",
    }
}

/// `remediate` + `power-off` → `PowerOff`.
fn camel(words: &str) -> String {
    words
        .split(['-', '_', ' '])
        .map(|w| {
            let mut chars = w.chars();
            chars.next().map_or_else(String::new, |c| {
                c.to_ascii_uppercase().to_string() + chars.as_str()
            })
        })
        .collect()
}

/// The host an action or refusal is about, if it names one.
fn subject_of(action: &metalguard_api::plan::Action) -> Option<String> {
    let value = serde_json::to_value(&action.kind).ok()?;
    ["host", "target"]
        .iter()
        .find_map(|k| value.get(*k).and_then(|v| v.as_str()).map(str::to_owned))
        .or_else(|| {
            value
                .pointer("/remediation/target")
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        })
}

impl Backend for KubeBackend {
    async fn campaign(&mut self) -> Result<Leadership, BackendError> {
        let api: Api<Lease> = Api::namespaced(self.client.clone(), self.ns());
        let lease = api
            .get_opt(&self.settings.lease_name)
            .await
            .map_err(|e| Self::unavailable(format!("Lease {}", self.settings.lease_name), e))?;
        let spec = lease.and_then(|l| l.spec);
        let holder = spec.as_ref().and_then(|s| s.holder_identity.clone());
        let expires = spec.as_ref().and_then(|s| {
            let renewed = s.renew_time.as_ref()?.0;
            let seconds = i64::from(s.lease_duration_seconds?);
            renewed
                .checked_add(jiff::SignedDuration::from_secs(seconds))
                .ok()
        });
        let remaining = expires.and_then(|e| {
            let left = jiff::Timestamp::now().duration_until(e);
            Duration::try_from(left).ok()
        });
        match (
            holder.as_deref() == Some(&self.settings.identity),
            remaining,
        ) {
            (true, Some(left)) if left > LEASE_MARGIN => {
                self.leading_until = Some(tokio::time::Instant::now() + left - LEASE_MARGIN);
                self.label_pod(true).await;
                Ok(Leadership::Leader)
            }
            _ => {
                self.leading_until = None;
                self.label_pod(false).await;
                Ok(Leadership::Follower { holder })
            }
        }
    }

    async fn resign(&mut self) {
        self.leading_until = None;
        self.label_pod(false).await;
        // kube-lease-manager releases the Lease when its flag's last receiver is dropped.
        self.lease_flag = None;
    }

    async fn load(&mut self) -> Result<State, BackendError> {
        // Drop our copies once the watch has caught up with them.
        let world = self.world.clone();
        self.written_hosts
            .retain(|name, written| world.host(name).is_none_or(|seen| newer(written, &*seen)));
        let fences: BTreeMap<String, std::sync::Arc<FenceRequest>> = world
            .fences
            .state()
            .into_iter()
            .map(|f| (f.name_any(), f))
            .collect();
        self.written_fences
            .retain(|name, written| fences.get(name).is_some_and(|seen| newer(written, &**seen)));
        let mut state = self.current_state();
        self.considered_fences = self.considered_fences(&state);
        self.refresh_nodes_to_back_up(&mut state).await?;
        Ok(state)
    }

    async fn record_report(&mut self, report: &StoredReport) -> Result<(), BackendError> {
        self.reports
            .insert(report.report.host.clone(), report.clone());
        self.mirror(report).await
    }

    async fn apply(&mut self, writes: Vec<Write>) -> Result<(), BackendError> {
        if !self.is_leading() {
            return Err(BackendError::Refused {
                what: "leadership (the Lease is not held)".to_owned(),
            });
        }
        // Consecutive record writes of one host become one status apply (intent and phase
        // together); everything else is one request, in the executor's order.
        let mut i = 0;
        let writes: Vec<Write> = writes;
        while i < writes.len() {
            match &writes[i] {
                Write::CreateOperation(_) | Write::PutOperation(_) | Write::PutRemediation(_) => {
                    let home = |w: &Write| match w {
                        Write::CreateOperation(op) | Write::PutOperation(op) => {
                            Some(record::home_of(op).to_owned())
                        }
                        Write::PutRemediation(r) => Some(r.target.clone()),
                        _ => None,
                    };
                    let host = home(&writes[i]).unwrap_or_default();
                    let mut remediation = None;
                    let mut ops = Vec::new();
                    while i < writes.len() && home(&writes[i]).as_deref() == Some(host.as_str()) {
                        match &writes[i] {
                            Write::CreateOperation(op) | Write::PutOperation(op) => {
                                ops.push(op.clone());
                            }
                            Write::PutRemediation(r) => remediation = Some(r.clone()),
                            _ => {}
                        }
                        i += 1;
                    }
                    self.apply_host_status(&host, remediation.clone(), ops)
                        .await?;
                    if let Some(Write::DeleteFenceRequest(target)) = writes.get(i) {
                        self.accept_fence_request(target, remediation.as_ref())
                            .await?;
                        i += 1;
                    }
                    continue;
                }
                Write::DeleteFenceRequest(target) => {
                    self.accept_fence_request(target, None).await?;
                }
                Write::PutHooks(host, hooks) => self.put_hooks(host, hooks).await?,
                Write::PutNotes(notes) => self.notes = Some(notes.clone()),
                Write::Node(node) => self.node_write(node.clone()).await?,
                // Never planned here (`keeps_holds` is false): holds are honoured from the
                // agents' reports only (docs/design-kubernetes.md, "Not built").
                Write::CreateHold(record) => {
                    tracing::warn!(hold = %record.hold.id, "hold not stored: the kubernetes backend does not store holds");
                }
                // Never planned here: GuardedHost status is not sealed (RBAC is the boundary,
                // docs/threat-model.md), so no record is ever stale.
                Write::Reseal(stale) => {
                    tracing::warn!(key = %stale.key, "reseal ignored: the kubernetes backend does not seal records");
                }
            }
            i += 1;
        }
        Ok(())
    }

    fn watch_inputs(
        &self,
        wake: tokio::sync::mpsc::Sender<()>,
    ) -> impl Future<Output = ()> + Send + 'static {
        // A new or changed fence request re-plans at once (Nodes change on every kubelet
        // heartbeat; they are read on the plan timer).
        let world = self.world.clone();
        async move {
            let mut last = String::new();
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                let mut now: Vec<String> = world
                    .fences
                    .state()
                    .iter()
                    .map(|f| {
                        format!(
                            "{}@{}",
                            f.name_any(),
                            f.resource_version().unwrap_or_default()
                        )
                    })
                    .collect();
                now.sort();
                let now = now.join(",");
                if now != last {
                    last = now;
                    if wake.send(()).await.is_err() {
                        return;
                    }
                }
            }
        }
    }

    fn keeps_holds(&self) -> bool {
        false
    }

    fn inventory(&mut self) -> Option<Inventory> {
        let fingerprint = self.world.inventory_fingerprint();
        if self.fingerprint.as_ref() == Some(&fingerprint) {
            return None;
        }
        self.fingerprint = Some(fingerprint);
        match self.build_inventory() {
            Ok(inventory) => Some(inventory),
            Err(error) => {
                tracing::error!(%error, "resources rejected; the previous inventory stays in use");
                None
            }
        }
    }

    async fn publish(&mut self, judged: crate::backend::Judged<'_>) {
        if !self.is_leading() {
            return;
        }
        let plan = judged.plan;
        self.reject_refused_fences(plan).await;
        let mut now: BTreeSet<String> = BTreeSet::new();
        let mut events = Vec::new();
        for action in &plan.actions {
            let key = format!("action:{}:{}", action.id, action.reason);
            now.insert(key.clone());
            if self.announced.contains(&key) {
                continue;
            }
            let Some(host) = subject_of(action) else {
                continue;
            };
            let value = serde_json::to_value(&action.kind).unwrap_or_default();
            let kind = value.get("kind").and_then(|k| k.as_str()).unwrap_or("act");
            let reason = match &action.kind {
                metalguard_api::plan::ActionKind::Remediate { step, .. } => camel(step.name()),
                _ => camel(kind),
            };
            events.push((host, "Normal", reason, camel(kind), action.reason.clone()));
        }
        for refusal in &plan.refusals {
            let key = format!(
                "refusal:{}:{}:{}",
                refusal.subject, refusal.refused, refusal.reason
            );
            now.insert(key.clone());
            if self.announced.contains(&key) || self.world.host(&refusal.subject).is_none() {
                continue;
            }
            events.push((
                refusal.subject.clone(),
                "Warning",
                "Refused".to_owned(),
                "Refuse".to_owned(),
                format!(
                    "{} {}: {}",
                    refusal.refused, refusal.subject, refusal.reason
                ),
            ));
        }
        for (host, type_, reason, action, note) in events {
            let regarding = self.reference("GuardedHost", &host);
            self.event(regarding, type_, &reason, &action, &note).await;
        }
        self.announced = now;
        for check in &plan.health {
            if self
                .world
                .checks
                .state()
                .iter()
                .any(|c| c.name_any() == check.name)
            {
                self.check_status(check).await;
            }
        }
        self.write_host_observations(&judged).await;
        self.write_control_plane_status(&judged).await;
        self.mark_silent_agents(&judged).await;
    }
}
