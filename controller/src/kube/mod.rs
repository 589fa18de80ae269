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

mod budget;
pub mod changes;
mod checks;
pub mod crd;
mod events;
pub mod evidence;
mod fence_requests;
mod holds;
pub mod hooks;
mod host_writes;
mod incremental;
#[cfg(test)]
mod manifests;
mod node_leases;
mod nodes;
pub mod observe;
mod observe_scope;
pub mod record;
mod round_index;
pub mod run;
mod slim;
pub mod status;
mod term;
#[cfg(test)]
mod tests;
mod verdict;
pub mod world;
mod written;

/// The annotation in which the command line records who asked (the user the API server
/// authenticated, from a `SelfSubjectReview`).
pub const REQUESTED_BY: &str = "metalguard.io/requested-by";
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::jiff;
use kube::api::Api;
use kube::{Client, ResourceExt as _};
use metalguard_api::k8s::{FenceRequest, GuardedHost};
use metalguard_api::snapshot::ConditionStatus;

use crate::backend::{
    Backend, BackendError, ControllerNotes, Leadership, State, StoredReport, Write,
};
use crate::inventory::{ControllerSettings, EtcdSettings, Inventory};
use world::World;

/// The field manager of status and hook writes.
pub const FIELD_MANAGER: &str = "metalguard-controller";
/// The `reportingController` of Events.
pub const REPORTING_CONTROLLER: &str = "metalguard.io/controller";
/// The Node condition that says the host's agent reports.
pub const AGENT_READY: &str = "MetalguardAgentReady";
/// The Node condition that mirrors the `GuardedHost`'s `FencingReady` (issue 25).
pub const FENCING_READY: &str = "MetalguardFencingReady";
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
    /// Take each host's node lease (`medik8s-leases/node-<name>`) before disrupting it and
    /// start nothing while another actor holds it (`node_leases.rs`).
    pub node_leases: bool,
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
    /// Each host's `FencingReady` as last observed (status, reason, message), mirrored onto
    /// its Node as [`FENCING_READY`].
    fencing_ready: BTreeMap<String, (String, String, String)>,
    /// Whether the node leases could not be read at the last try (logged once per change).
    node_leases_unreadable: bool,
    /// Objects as this controller last wrote them, until the watch shows them.
    written_hosts: written::Written<GuardedHost>,
    written_fences: written::Written<FenceRequest>,
    /// The pending fence requests the last loaded state held (target → request name): the
    /// ones a refusal in that round's plan answers ([`verdict`]).
    considered_fences: BTreeMap<String, String>,
    /// Last notes (kept here: their content reaches people as Events).
    notes: Option<ControllerNotes>,
    /// The hosts' state kept across rounds, updated for what changed (`incremental.rs`).
    kept_state: incremental::StateCache,
    /// The inventory's hosts kept across ticks.
    kept_inventory: incremental::InventoryCache,
    /// The decisions and refusals already told as Events (by key), and health-check verdicts
    /// already written.
    announced: BTreeSet<String>,
    check_verdicts: BTreeMap<String, String>,
    /// Until when the Lease read back makes this controller leader.
    leading_until: Option<tokio::time::Instant>,
    /// The term of the leadership under way ([`Leadership::Leader`]).
    term: Option<u64>,
    /// Dropping it makes kube-lease-manager release the Lease.
    lease_flag: Option<tokio::sync::watch::Receiver<bool>>,
    /// The control plane as last written, until the watch shows it.
    written_control_plane: Option<metalguard_api::k8s::GuardedControlPlane>,
    /// Whether the pod's leader label was last written present (`Some(true)`) or removed.
    pod_labelled: Option<bool>,
    /// How many hosts the last load read again and the last publish observed (issue 27: the
    /// work of a round).
    loaded_hosts: usize,
    observed_hosts: usize,
    /// Which hosts a round observes (`observe_scope.rs`), and those whose status write a
    /// round left over or failed: written first at the next.
    observe_scope: observe_scope::ObserveScope,
    waiting_observations: BTreeSet<String>,
    /// A round's budget for best-effort writes ([`budget::BUDGET`]; tests set their own).
    write_budget: std::time::Duration,
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
            fencing_ready: BTreeMap::new(),
            node_leases_unreadable: false,
            written_hosts: written::Written::default(),
            written_fences: written::Written::default(),
            considered_fences: BTreeMap::new(),
            notes: None,
            kept_state: incremental::StateCache::default(),
            kept_inventory: incremental::InventoryCache::default(),
            announced: BTreeSet::new(),
            check_verdicts: BTreeMap::new(),
            leading_until: None,
            term: None,
            lease_flag: None,
            written_control_plane: None,
            pod_labelled: None,
            loaded_hosts: 0,
            observed_hosts: 0,
            observe_scope: observe_scope::ObserveScope::default(),
            waiting_observations: BTreeSet::new(),
            write_budget: budget::BUDGET,
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
        self.host_shared(name).map(|h| (*h).clone())
    }

    /// [`KubeBackend::host`] without copying the watched object (a round reads every host's).
    fn host_shared(&self, name: &str) -> Option<std::sync::Arc<GuardedHost>> {
        let seen = self.world.host(name);
        match (self.written_hosts.get(name), seen) {
            (Some(written), Some(seen)) if !newer(written, &*seen) => Some(seen),
            (Some(written), _) => Some(std::sync::Arc::new(written.clone())),
            (None, seen) => seen,
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
    fn current_state(&mut self) -> State {
        let changed = self.world.changes.take(changes::Consumer::State);
        let update = self.kept_state.update(&self.world, &changed);
        for problem in update.problems {
            tracing::warn!(%problem, "status entry ignored");
        }
        // Our own writes the watch has not shown yet are laid over this round's state: the
        // hosts they touch count as changed for whoever builds per host from it.
        for name in self.written_hosts.keys() {
            self.kept_state.note(name);
        }
        self.loaded_hosts = update.visited;
        let mut state = self.kept_state.state();
        world::finish_state(&self.world, &self.reports, &mut state);
        let mut written_holds = false;
        for name in self.written_hosts.keys() {
            let Some(h) = self.host(name) else { continue };
            state.remediations.retain(|_, r| r.target != *name);
            state.operations.retain(|_, op| record::home_of(op) != name);
            state.hold_records.retain(|_, r| r.hold.target != *name);
            // Problems were logged from the watched copy already.
            let _ = world::host_records(name, &h, &mut state);
            written_holds = true;
        }
        if written_holds {
            state.refresh_holds();
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
        let (meta, spec) = match lease {
            Some(l) => (Some(l.metadata), l.spec),
            None => (None, None),
        };
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
                let continuing = self.term.filter(|_| self.is_leading());
                let term = if let Some(term) = continuing {
                    term
                } else if let Some(term) = self.begin_term(&api, meta.as_ref()).await? {
                    // A new leadership observes every host once.
                    self.observe_scope.forget();
                    term
                } else {
                    // Someone wrote the Lease since we read it: judge again next round.
                    self.leading_until = None;
                    self.term = None;
                    self.label_pod(false).await;
                    return Ok(Leadership::Follower { holder });
                };
                self.term = Some(term);
                self.leading_until = Some(tokio::time::Instant::now() + left - LEASE_MARGIN);
                self.label_pod(true).await;
                Ok(Leadership::Leader { term })
            }
            _ => {
                self.leading_until = None;
                self.term = None;
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
        self.keep_node_leases(&mut state).await?;
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
        self.apply_writes(writes).await
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

    fn inventory(&mut self) -> Option<Inventory> {
        let changed = self.world.changes.take(changes::Consumer::Inventory);
        if !self
            .kept_inventory
            .update(&self.world, &self.settings.credentials_namespace, &changed)
        {
            return None;
        }
        match self.kept_inventory.inventory(
            &self.world,
            &self.settings.namespace,
            &self.settings.controller,
            &self.settings.timing,
        ) {
            Ok(inventory) => Some(inventory),
            Err(error) => {
                tracing::error!(%error, "resources rejected; the previous inventory stays in use");
                None
            }
        }
    }

    fn hosts_visited(&self) -> crate::backend::HostsVisited {
        crate::backend::HostsVisited {
            loaded: Some(self.loaded_hosts),
            observed: Some(self.observed_hosts),
        }
    }

    async fn publish(&mut self, judged: crate::backend::Judged<'_>) {
        if !self.is_leading() {
            return;
        }
        // Best-effort writes stop starting when this is spent (`budget.rs`).
        let deadline = tokio::time::Instant::now() + self.write_budget;
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
            events.push((
                key,
                host,
                "Normal".to_owned(),
                reason,
                camel(kind),
                action.reason.clone(),
            ));
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
                key,
                refusal.subject.clone(),
                "Warning".to_owned(),
                "Refused".to_owned(),
                "Refuse".to_owned(),
                format!(
                    "{} {}: {}",
                    refusal.refused, refusal.subject, refusal.reason
                ),
            ));
        }
        // An Event the budget left unsent is not announced: the next round tries it again.
        for key in self.announce(events, deadline).await {
            now.remove(&key);
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
        self.write_host_observations(&judged, deadline).await;
        self.write_control_plane_status(&judged).await;
        self.mark_silent_agents(&judged, deadline).await;
    }
}
