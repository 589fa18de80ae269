//! What the watches see (Nodes, the four custom resources and the credentials namespace's
//! Secrets) and how
//! it becomes the controller's [`Inventory`] and [`State`]. Pure: no request is made here, so
//! the tests fill the stores by hand and the reflectors fill them in production.
//!
//! Mapping, per `GuardedHost` (the core's host name is the object's name):
//! - `spec.nodeName` → the Node whose conditions, labels and annotations the core reads;
//! - `spec.bmc` + its credentials Secret (`username`, `password`) → the fence command's BMC;
//! - `status.remediation` / `status.operations` → the persisted remediation and operations;
//! - annotations `pre-drain.hook.metalguard.io/<name>` (hook `metalguard.io/<name>`,
//!   [`super::hooks`]) and `spec.lifecycleHooks.preDrain` → the host's preDrain hooks (the quorum guard's hook is such an annotation; deleting it
//!   is the administrator's escape hatch, as deleting the etcd key is in standalone mode).

use std::collections::{BTreeMap, BTreeSet};

use k8s_openapi::api::core::v1::{Node, Secret};
use kube::ResourceExt as _;
use kube::runtime::reflector::{ObjectRef, Store};
use metalguard_api::duration::Timestamp;
use metalguard_api::k8s::fence::{FenceAction, FencePhase};
use metalguard_api::k8s::host::HostRole;
use metalguard_api::k8s::{FenceRequest, GuardedControlPlane, GuardedHost, HostHealthCheck};
use metalguard_api::policy::Policy;
use metalguard_api::protocol::{BmcCredentials, Secret as SecretText};
use metalguard_api::snapshot::{
    ConditionStatus, ControlPlaneSpec, NodeCondition, NodeStatus, Role,
};

use super::changes::{Changes, Kind, TrackedWriter};
use super::record;
use crate::backend::{State, StoredReport};
use crate::inventory::{
    BmcSettings, ClusterBmc, ControllerSettings, EtcdSettings, Inventory, InventoryHost,
    TrustSetting,
};

/// The taint metalguard puts on the Node of a host that is verified off.
pub const OUT_OF_SERVICE_TAINT: &str = "node.kubernetes.io/out-of-service";

/// The watched objects (read side).
#[derive(Clone)]
pub struct World {
    /// Nodes (cluster-scoped).
    pub nodes: Store<Node>,
    /// `GuardedHost`s of the namespace.
    pub hosts: Store<GuardedHost>,
    /// `GuardedControlPlane`s of the namespace (at most one is used).
    pub control_planes: Store<GuardedControlPlane>,
    /// `HostHealthCheck`s of the namespace.
    pub checks: Store<HostHealthCheck>,
    /// `FenceRequest`s of the namespace.
    pub fences: Store<FenceRequest>,
    /// Secrets of the credentials namespace (BMC credentials).
    pub secrets: Store<Secret>,
    /// The namespace of the custom resources: with it, a host is looked up by its key in
    /// the store instead of by a scan (a round looks up every host's Node: at 5,000 hosts a
    /// scan per host was 25 million comparisons, a second per round).
    namespace: String,
    /// What changed since each consumer last looked.
    pub changes: Changes,
}

/// The write side of [`World`]: the reflectors' (or a test's).
pub struct WorldWriters {
    /// Nodes.
    pub nodes: TrackedWriter<Node>,
    /// `GuardedHost`s.
    pub hosts: TrackedWriter<GuardedHost>,
    /// `GuardedControlPlane`s.
    pub control_planes: TrackedWriter<GuardedControlPlane>,
    /// `HostHealthCheck`s.
    pub checks: TrackedWriter<HostHealthCheck>,
    /// `FenceRequest`s.
    pub fences: TrackedWriter<FenceRequest>,
    /// Secrets.
    pub secrets: TrackedWriter<Secret>,
}

impl World {
    /// Empty stores and their writers, for the custom resources of `namespace`.
    pub fn new(namespace: &str) -> (World, WorldWriters) {
        let changes = Changes::default();
        let writers = WorldWriters {
            nodes: TrackedWriter::new(&changes, Kind::Node),
            hosts: TrackedWriter::new(&changes, Kind::Host),
            control_planes: TrackedWriter::new(&changes, Kind::Policy),
            checks: TrackedWriter::new(&changes, Kind::Policy),
            fences: TrackedWriter::new(&changes, Kind::Fence),
            secrets: TrackedWriter::new(&changes, Kind::Secret),
        };
        let world = World {
            nodes: writers.nodes.as_reader(),
            hosts: writers.hosts.as_reader(),
            control_planes: writers.control_planes.as_reader(),
            checks: writers.checks.as_reader(),
            fences: writers.fences.as_reader(),
            secrets: writers.secrets.as_reader(),
            namespace: namespace.to_owned(),
            changes,
        };
        (world, writers)
    }

    /// The `GuardedHost`s sorted by name.
    pub fn sorted_hosts(&self) -> Vec<std::sync::Arc<GuardedHost>> {
        let mut hosts = self.hosts.state();
        // By reference: a key function would copy each name ~13 times at 5,000 hosts.
        hosts.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        hosts
    }

    /// The `GuardedHost` named `host` (a key lookup).
    pub fn host(&self, host: &str) -> Option<std::sync::Arc<GuardedHost>> {
        self.hosts
            .get(&ObjectRef::new(host).within(&self.namespace))
    }

    /// The Node of `host` (by `spec.nodeName`; key lookups).
    pub fn node_of(&self, host: &str) -> Option<std::sync::Arc<Node>> {
        let host = self.host(host)?;
        self.nodes.get(&ObjectRef::new(&host.spec.node_name))
    }
}

/// Builds the inventory from the resources; `base` supplies the process settings (agent API
/// address, TLS directory, lease timing). An error names the object and field at fault; the
/// caller keeps the previous inventory, as with a rejected inventory file.
pub fn inventory(
    world: &World,
    namespace: &str,
    credentials_namespace: &str,
    controller: &ControllerSettings,
    etcd: &EtcdSettings,
) -> Result<Inventory, String> {
    let hosts: Vec<InventoryHost> = world
        .sorted_hosts()
        .iter()
        .map(|h| inventory_host(world, credentials_namespace, h))
        .collect();
    assemble(world, namespace, hosts, controller, etcd)
}

/// The inventory of `hosts` (sorted by name, as [`inventory_host`] made them) with the
/// control plane and policy of `world`'s resources, checked.
pub fn assemble(
    world: &World,
    namespace: &str,
    hosts: Vec<InventoryHost>,
    controller: &ControllerSettings,
    etcd: &EtcdSettings,
) -> Result<Inventory, String> {
    let control_planes = world.control_planes.state();
    let control_plane = match control_planes.as_slice() {
        [] => ControlPlaneSpec {
            desired_replicas: u32::try_from(
                hosts
                    .iter()
                    .filter(|h| h.role == Role::ControlPlane)
                    .count(),
            )
            .unwrap_or(u32::MAX),
            failure_domains: Vec::new(),
        },
        [one] => one.spec.to_core(),
        _ => {
            return Err(format!(
                "namespace {namespace} has {} GuardedControlPlanes; exactly one is used",
                control_planes.len()
            ));
        }
    };
    let mut checks = world.checks.state();
    checks.sort_by_key(|c| c.name_any());
    let mut policy = Policy::default();
    let mut settings_from: Option<String> = None;
    for check in &checks {
        policy
            .health_checks
            .push(super::checks::health_check(check)?);
        if settings_from.is_none() {
            policy.remediation = super::checks::remediation_settings(check)?;
            settings_from = Some(check.name_any());
        }
    }
    let inventory = Inventory {
        controller: controller.clone(),
        etcd: etcd.clone(),
        control_plane,
        hosts,
        policy,
        index: crate::inventory::HostIndex::default(),
    };
    crate::inventory::checks::check_resources(&inventory)
        .map_err(|problem| format!("namespace {namespace}: {problem}"))?;
    Ok(inventory)
}

/// `h`'s inventory entry, its BMC credentials read from the credentials namespace.
pub fn inventory_host(
    world: &World,
    credentials_namespace: &str,
    h: &GuardedHost,
) -> InventoryHost {
    let bmc = h.spec.bmc.as_ref().map(|b| BmcSettings {
        address: b.address.clone(),
        credentials_dir: std::path::PathBuf::new(),
        tls: TrustSetting {
            ca_file: None,
            fingerprint_sha256: b.fingerprint_sha256.clone(),
            insecure: b.insecure,
        },
        from_cluster: Some(ClusterBmc {
            credentials: credentials(world, credentials_namespace, &b.credentials_secret.name),
            ca_pem: b.ca_bundle.clone(),
        }),
    });
    InventoryHost {
        name: h.name_any(),
        role: match h.spec.role {
            HostRole::ControlPlane => Role::ControlPlane,
            HostRole::Worker => Role::Worker,
        },
        failure_domain: h.spec.failure_domain.clone(),
        labels: h.labels().clone(),
        annotations: h.annotations().clone(),
        bmc,
    }
}

/// The BMC credentials in Secret `name` of the credentials namespace: keys `username` and
/// `password`. The error names the Secret and key, never a value.
fn credentials(world: &World, namespace: &str, name: &str) -> Result<BmcCredentials, String> {
    let secret = world
        .secrets
        .get(&ObjectRef::new(name).within(namespace))
        .ok_or_else(|| format!("Secret {namespace}/{name} was not found"))?;
    let key = |key: &str| -> Result<String, String> {
        let bytes = secret
            .data
            .as_ref()
            .and_then(|d| d.get(key))
            .ok_or_else(|| format!("Secret {namespace}/{name} has no key {key:?}"))?;
        String::from_utf8(bytes.0.clone())
            .map(|s| s.trim_end_matches(['\n', '\r']).to_owned())
            .map_err(|_| format!("Secret {namespace}/{name} key {key:?} is not UTF-8"))
    };
    Ok(BmcCredentials {
        username: key("username")?,
        password: SecretText::new(key("password")?),
    })
}

/// The Node as the core reads it.
pub fn node_status(node: &Node) -> NodeStatus {
    let conditions = node
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .map(|conditions| {
            conditions
                .iter()
                .map(|c| NodeCondition {
                    type_: c.type_.clone(),
                    status: match c.status.as_str() {
                        "True" => ConditionStatus::True,
                        "False" => ConditionStatus::False,
                        _ => ConditionStatus::Unknown,
                    },
                    last_transition: c
                        .last_transition_time
                        .as_ref()
                        .map_or(Timestamp(0), record::timestamp),
                })
                .collect()
        })
        .unwrap_or_default();
    NodeStatus {
        created_at: node
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(Timestamp(0), record::timestamp),
        conditions,
        labels: node.labels().clone(),
        annotations: node.annotations().clone(),
        out_of_service: node
            .spec
            .as_ref()
            .and_then(|s| s.taints.as_ref())
            .is_some_and(|t| t.iter().any(|t| t.key == OUT_OF_SERVICE_TAINT)),
    }
}

/// The preDrain hooks of a host: its spec's and its hook annotations'.
pub fn hooks(h: &GuardedHost) -> BTreeSet<String> {
    let mut hooks: BTreeSet<String> = h
        .spec
        .lifecycle_hooks
        .pre_drain
        .iter()
        .map(|hook| hook.name.clone())
        .collect();
    hooks.extend(
        h.annotations()
            .keys()
            .filter_map(|k| super::hooks::hook_for(k)),
    );
    hooks
}

/// A fence request the leader has not answered yet, if `request` is one.
pub fn pending_fence(request: &FenceRequest) -> bool {
    request
        .status
        .as_ref()
        .and_then(|s| s.phase)
        .is_none_or(|p| p == FencePhase::Pending)
}

/// Who asked for `request`: its name, and the user `metalguard-controller fence` recorded
/// (the one the API server's `SelfSubjectReview` named). Whoever may create requests can
/// write that annotation too: it is a record, the API server's audit log is the proof.
fn requested_by(request: &FenceRequest) -> String {
    let name = request.name_any();
    match request.annotations().get(super::REQUESTED_BY) {
        Some(who) => format!("FenceRequest/{name} by {who}"),
        None => format!("FenceRequest/{name}"),
    }
}

/// The persisted state: records from the hosts' status, pending fence requests, Nodes;
/// `reports` are the agents' latest (kept in memory, mirrored onto Nodes). A malformed
/// operation entry is left out and returned as a problem. Built whole: the leader keeps it
/// across rounds and updates only what changed (`incremental.rs`), to the same result.
pub fn state(world: &World, reports: &BTreeMap<String, StoredReport>) -> (State, Vec<String>) {
    let mut state = State {
        nodes: Some(imbl::OrdMap::new()),
        ..State::default()
    };
    let mut problems = Vec::new();
    // One pass over the Nodes per round, not one per host.
    let nodes_by_name: BTreeMap<String, std::sync::Arc<Node>> = world
        .nodes
        .state()
        .into_iter()
        .map(|n| (n.name_any(), n))
        .collect();
    for h in world.sorted_hosts() {
        let node = nodes_by_name.get(&h.spec.node_name).map(|n| &**n);
        problems.extend(host_state(&h.name_any(), &h, node, &mut state));
    }
    finish_state(world, reports, &mut state);
    (state, problems)
}

/// Adds what host `name` (its object `h` and its Node) puts into `state`: its Node as the core
/// reads it, hooks, retirement, BMC check request and the records of its status. Returns the
/// entries it could not read.
pub fn host_state(
    name: &str,
    h: &GuardedHost,
    node: Option<&Node>,
    state: &mut State,
) -> Vec<String> {
    if let (Some(node), Some(nodes)) = (node, state.nodes.as_mut()) {
        nodes.insert(name.to_owned(), node_status(node));
    }
    let hooks = hooks(h);
    if !hooks.is_empty() {
        state.hooks.insert(name.to_owned(), hooks);
    }
    if let Some(r) = &h.spec.retirement {
        state.retirements.insert(
            name.to_owned(),
            metalguard_api::snapshot::Retirement {
                requested_at: record::timestamp(&r.requested_at),
                requested_by: r.requested_by.clone(),
                reason: r.reason.clone(),
            },
        );
    }
    host_records(name, h, state)
}

/// What is not any one host's: the agents' `reports`, the pending fence requests (oldest
/// first, one per target) and the holds.
pub fn finish_state(world: &World, reports: &BTreeMap<String, StoredReport>, state: &mut State) {
    state.reports.clone_from(reports);
    state.fence_requests.clear();
    let mut requests = world.fences.state();
    requests.sort_by_key(|r| (r.creation_timestamp().map(|t| t.0), r.name_any()));
    for request in requests.iter().filter(|r| pending_fence(r)) {
        let target = request.spec.target.clone();
        state.fence_requests.entry(target).or_insert_with(|| {
            metalguard_api::snapshot::FenceRequest {
                requested_at: request
                    .creation_timestamp()
                    .as_ref()
                    .map_or(Timestamp(0), record::timestamp),
                requested_by: Some(requested_by(request)),
                // A drill skips no gate: its `force` is ignored.
                force_reason: (request.spec.force && request.spec.action != FenceAction::Drill)
                    .then(|| request.spec.reason.clone()),
                stay_off: request.spec.action == FenceAction::PowerOff,
                drill: request.spec.action == FenceAction::Drill,
                nonce: None,
            }
        });
    }
    state.refresh_holds();
}

/// Adds what `h`'s status records to `state`: its remediation, the operations kept there and
/// its break-glass holds (those its `spec.holdRelease` names released, whether or not the
/// leader has recorded that yet). Returns the entries it could not read.
pub fn host_records(name: &str, h: &GuardedHost, state: &mut State) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(request) = &h.spec.bmc_check_request {
        state.bmc_check_requests.insert(
            name.to_owned(),
            crate::backend::BmcCheckRequest {
                id: request.id.clone(),
                at: record::timestamp(&request.requested_at),
                by: request.requested_by.clone().unwrap_or_default(),
            },
        );
    }
    let Some(status) = &h.status else {
        return problems;
    };
    if let Some(r) = &status.remediation {
        state
            .remediations
            .insert(r.id.clone(), record::remediation(name, r));
    }
    for entry in &status.operations {
        match record::operation(entry) {
            Ok(op) => {
                state.operations.insert(op.id.clone(), op);
            }
            Err(problem) => problems.push(format!(
                "GuardedHost {name}: operation {}: {problem}",
                entry.id
            )),
        }
    }
    let mut holds = status.holds.clone();
    super::holds::apply_release(&mut holds, h.spec.hold_release.as_ref());
    for entry in &holds {
        state
            .hold_records
            .insert(entry.id.clone(), super::holds::stored_hold(name, entry));
    }
    problems
}

/// Feeds one object into a writer, as a watch event would (tests).
#[cfg(test)]
pub fn apply<K>(writer: &mut TrackedWriter<K>, object: K)
where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone + Default,
{
    writer.apply_watcher_event(&kube::runtime::watcher::Event::Apply(object));
}

#[cfg(test)]
#[path = "world_tests.rs"]
mod tests;
