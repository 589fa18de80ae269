//! `metalguard-controller status --kubeconfig FILE`: the standalone status's shape, read from
//! the resources: `GuardedHost`s (remediations, operations, hooks), the
//! `GuardedControlPlane`, `HostHealthCheck`s, `FenceRequest`s, Nodes, and the leader from
//! the Lease. Secrets are not read (a person reading status needs no BMC credentials), and
//! the agents' reports live in the leader's memory, so no dry-run plan is shown.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::Context as _;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Node;
use kube::api::{Api, ListParams};
use kube::runtime::watcher::Event;
use kube::{Client, ResourceExt as _};
use metalguard_api::k8s::{FenceRequest, GuardedControlPlane, GuardedHost, HostHealthCheck};
use serde::de::DeserializeOwned;

use super::{REQUESTED_BY, Target};
use crate::backend::State;
use crate::inventory::{ControllerSettings, Inventory};
use crate::kube::world::{self, World};

/// Why the agents are shown as the leader wrote them, and there is no dry run.
const NO_REPORTS: &str = "agents' reports are kept in the leader's memory, not in the resources: below is what the leader wrote of them (GuardedHost status, the Nodes' conditions); no dry-run plan here";

/// Everything status shows, read once.
pub struct Seen {
    /// The inventory the resources make.
    pub inventory: Inventory,
    /// The state they hold (no agent reports).
    pub state: State,
    /// The fence requests, oldest first.
    pub fences: Vec<FenceRequest>,
    /// The hosts, by name.
    pub hosts: Vec<GuardedHost>,
    /// The Nodes, by name.
    pub nodes: BTreeMap<String, Node>,
    /// The control plane (the first, as the leader uses it).
    pub control_plane: Option<GuardedControlPlane>,
}

async fn fill<K>(
    api: Api<K>,
    writer: &mut crate::kube::changes::TrackedWriter<K>,
    what: &str,
) -> anyhow::Result<()>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let list = api
        .list(&ListParams::default())
        .await
        .with_context(|| format!("{what} could not be listed"))?;
    for object in list.items {
        writer.apply_watcher_event(&Event::Apply(object));
    }
    Ok(())
}

/// Lists the resources once and builds the inventory and state from them, as the leader's
/// watches do.
pub async fn read(client: &Client, namespace: &str, lease_name: &str) -> anyhow::Result<Seen> {
    let (world, mut writers) = World::new(namespace);
    fill::<GuardedHost>(
        Api::namespaced(client.clone(), namespace),
        &mut writers.hosts,
        "GuardedHosts",
    )
    .await?;
    fill::<GuardedControlPlane>(
        Api::namespaced(client.clone(), namespace),
        &mut writers.control_planes,
        "GuardedControlPlanes",
    )
    .await?;
    fill::<HostHealthCheck>(
        Api::namespaced(client.clone(), namespace),
        &mut writers.checks,
        "HostHealthChecks",
    )
    .await?;
    fill::<FenceRequest>(
        Api::namespaced(client.clone(), namespace),
        &mut writers.fences,
        "FenceRequests",
    )
    .await?;
    fill::<Node>(Api::all(client.clone()), &mut writers.nodes, "Nodes").await?;
    let inventory = world::inventory(
        &world,
        namespace,
        "",
        &ControllerSettings::default(),
        &crate::kube::run::timing(),
    )
    .map_err(|problem| anyhow::anyhow!("the resources make no valid inventory: {problem}"))?;
    let (mut state, problems) = world::state(&world, &BTreeMap::new());
    for problem in problems {
        eprintln!("warning: status entry ignored: {problem}");
    }
    state.leader = leader(client, namespace, lease_name).await;
    let mut fences: Vec<FenceRequest> = world
        .fences
        .state()
        .iter()
        .map(|f| {
            let mut f = (**f).clone();
            f.metadata.managed_fields = None;
            f
        })
        .collect();
    fences.sort_by_key(|f| (f.creation_timestamp().map(|t| t.0), f.name_any()));
    let hosts = world.sorted_hosts().iter().map(|h| (**h).clone()).collect();
    let nodes = world
        .nodes
        .state()
        .iter()
        .map(|n| (n.name_any(), (**n).clone()))
        .collect();
    let control_plane = world.control_planes.state().first().map(|c| (**c).clone());
    Ok(Seen {
        inventory,
        state,
        fences,
        hosts,
        nodes,
        control_plane,
    })
}

/// The Lease's holder while its renewal has not expired; `None` when it has, or when the
/// Lease cannot be read (a person without `get` on Leases sees no leader, with a warning).
async fn leader(client: &Client, namespace: &str, lease_name: &str) -> Option<String> {
    let api: Api<Lease> = Api::namespaced(client.clone(), namespace);
    let lease = match api.get_opt(lease_name).await {
        Ok(lease) => lease?,
        Err(error) => {
            eprintln!(
                "warning: Lease {namespace}/{lease_name} could not be read: {}",
                crate::error::chain(&error)
            );
            return None;
        }
    };
    let spec = lease.spec?;
    let renewed = spec.renew_time?.0;
    let seconds = i64::from(spec.lease_duration_seconds?);
    let until = renewed
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(seconds))
        .ok()?;
    (k8s_openapi::jiff::Timestamp::now() < until)
        .then_some(spec.holder_identity)
        .flatten()
}

/// One line per fence request: name, target, phase, who asked, its last word.
pub fn render_fences(fences: &[FenceRequest]) -> String {
    let mut out = String::from("fence requests:\n");
    if fences.is_empty() {
        out.push_str("  none\n");
    }
    for f in fences {
        let status = f.status.clone().unwrap_or_default();
        let phase = status
            .phase
            .map_or_else(|| "Pending".to_owned(), |p| format!("{p:?}"));
        let by = f
            .annotations()
            .get(REQUESTED_BY)
            .map_or_else(String::new, |who| format!(" by {who}"));
        let last = status
            .conditions
            .iter()
            .find(|c| c.type_ == "Accepted" && c.status == "False")
            .map(|c| c.message.clone())
            .or_else(|| status.timeline.last().map(|t| t.message.clone()))
            .unwrap_or_default();
        let _ = writeln!(
            out,
            "  {}: {} {}{}{}{} ({}){}",
            f.name_any(),
            f.spec.target,
            phase,
            if f.spec.action == metalguard_api::k8s::fence::FenceAction::Drill {
                " drill"
            } else {
                ""
            },
            if f.spec.force { " forced" } else { "" },
            by,
            f.spec.reason,
            if last.is_empty() {
                String::new()
            } else {
                format!(" — {last}")
            }
        );
    }
    out
}

/// The JSON document: the standalone one's fields this backend has, plus the requests.
pub fn render_json(seen: &Seen, now: metalguard_api::duration::Timestamp) -> serde_json::Value {
    let alarms: crate::cli::status::Alarms =
        Err("etcd alarms are not read in Kubernetes mode".to_owned());
    let mut document = crate::cli::status::render_json(&seen.inventory, &seen.state, &alarms, now);
    if let Some(map) = document.as_object_mut() {
        map.remove("plan");
        map.insert("agents_note".to_owned(), serde_json::json!(NO_REPORTS));
        map.insert(
            "observed".to_owned(),
            super::observed::to_json(&seen.hosts, &seen.nodes, seen.control_plane.as_ref()),
        );
        map.insert(
            "fence_request_objects".to_owned(),
            serde_json::json!(seen.fences),
        );
        // The leader's judgement as it wrote it: the reports it came from are in its memory.
        map.insert("fencing".to_owned(), fencing_json(&seen.hosts));
    }
    document
}

/// `fencing` of `status --json` from each `GuardedHost`'s `FencingReady` condition, in the
/// standalone document's shape (`state`, `failure`, `detail`).
fn fencing_json(hosts: &[metalguard_api::k8s::host::GuardedHost]) -> serde_json::Value {
    use kube::ResourceExt as _;
    hosts
        .iter()
        .filter_map(|h| {
            let c = h
                .status
                .as_ref()?
                .conditions
                .iter()
                .find(|c| c.type_ == "FencingReady" && c.reason != "NoBmc")?;
            let value = match c.status.as_str() {
                "True" => serde_json::json!({ "state": "ready", "detail": c.message }),
                "False" => serde_json::json!({
                    "state": "not-ready",
                    "failure": crate::control::fencing::failure_of_reason(&c.reason)
                        .map_or(c.reason.as_str(), |f| f.name()),
                    "detail": c.message,
                }),
                _ => serde_json::json!({ "state": "unchecked", "detail": c.message }),
            };
            Some((h.name_any(), value))
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// Prints status from the resources `target` names.
pub async fn status(target: &Target, lease_name: &str, json: bool) -> anyhow::Result<()> {
    let client = super::connect(&target.kubeconfig).await?;
    let seen = read(&client, &target.namespace, lease_name).await?;
    let now = crate::clock::now();
    if json {
        println!("{}", render_json(&seen, now));
        return Ok(());
    }
    // The standalone agents section is empty here (no reports): the one below replaces it.
    let text = crate::cli::status::render(&seen.inventory, &seen.state, now);
    print!(
        "{}",
        text.replacen("agents:\nremediations:", "remediations:", 1)
    );
    println!("note: {NO_REPORTS}");
    print!(
        "{}",
        super::observed::render(&seen.hosts, &seen.nodes, seen.control_plane.as_ref(), now)
    );
    print!(
        "{}",
        crate::cli::status::render_progress(&seen.inventory, &seen.state, now)
    );
    print!("{}", render_fences(&seen.fences));
    Ok(())
}
