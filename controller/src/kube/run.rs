//! `metalguard-controller run --backend=kubernetes`: connects (bounded), starts the watches
//! and leader election, then runs the same agent API and controller loop as standalone.

use std::time::Duration;

use anyhow::Context as _;
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::api::Api;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Client, Config, ResourceExt as _};
use kube_lease_manager::LeaseManagerBuilder;
use metalguard_api::k8s::{FenceRequest, GuardedControlPlane, GuardedHost, HostHealthCheck};
use serde::de::DeserializeOwned;

use super::changes::TrackedWriter;
use super::world::World;
use super::{KubeBackend, KubeSettings};

/// How long the first contact with the API server may take before the controller gives up.
pub const CONNECT_DEADLINE: Duration = Duration::from_secs(15);
/// How long the watches may take to list everything before the controller gives up.
const SYNC_DEADLINE: Duration = Duration::from_secs(60);
/// Lease duration; the holder renews 5 s before it ends.
pub const LEASE_SECONDS: u64 = 15;
/// Request timeout of the Kubernetes backend's leadership rounds (the hub's grace is the
/// Lease less this).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The Kubernetes backend's timing in the shape the controller loop reads (`lease_ttl`,
/// `timeout`): no etcd endpoint, credential or prefix is used in this mode.
pub fn timing() -> crate::inventory::EtcdSettings {
    crate::inventory::EtcdSettings {
        endpoints: Vec::new(),
        ca_file: None,
        cert_file: None,
        key_file: None,
        username: None,
        password_file: None,
        prefix: String::new(),
        lease_ttl: Duration::from_secs(LEASE_SECONDS),
        timeout: REQUEST_TIMEOUT,
    }
}

/// A client from the kubeconfig (`KUBECONFIG` / `~/.kube/config`) or the in-cluster service
/// account, checked by asking the server's version within [`CONNECT_DEADLINE`]: an
/// unreachable or refusing server is a clear error, never a hang.
pub async fn connect() -> anyhow::Result<Client> {
    let config = tokio::time::timeout(CONNECT_DEADLINE, Config::infer())
        .await
        .context("reading the kubeconfig took too long")?
        .context("no usable kubeconfig or in-cluster service account")?;
    connect_with(config).await
}

/// A client from `config`, checked as [`connect`] checks it.
pub async fn connect_with(mut config: Config) -> anyhow::Result<Client> {
    config.connect_timeout = Some(Duration::from_secs(5));
    let url = config.cluster_url.to_string();
    let client = Client::try_from(config).with_context(|| {
        format!("a client for the Kubernetes API server at {url} could not be built")
    })?;
    match tokio::time::timeout(CONNECT_DEADLINE, client.apiserver_version()).await {
        Ok(Ok(version)) => {
            tracing::info!(server = %url, version = %version.git_version, "connected to the Kubernetes API server");
            Ok(client)
        }
        Ok(Err(error)) => Err(anyhow::anyhow!(
            "the Kubernetes API server at {url} could not be reached: {}",
            crate::error::chain(&error)
        )),
        Err(_) => Err(anyhow::anyhow!(
            "the Kubernetes API server at {url} did not answer within {CONNECT_DEADLINE:?}"
        )),
    }
}

fn watch<K>(
    api: Api<K>,
    writer: TrackedWriter<K>,
    what: &'static str,
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    watch_slimmed(api, writer, what, |_| {})
}

/// [`watch`], with `slim` applied to every object as it arrives (before it is cached).
fn watch_slimmed<K>(
    api: Api<K>,
    writer: TrackedWriter<K>,
    what: &'static str,
    slim: fn(&mut K),
) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    tokio::spawn(async move {
        // managedFields are never read from the caches and are the bulk of a cached object
        // (every field of every manager, twice with server-side apply): dropped on arrival.
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            .modify(move |object| {
                object.managed_fields_mut().clear();
                slim(object);
            });
        // The store is written, and the change noted, as each event arrives (`changes.rs`).
        let mut writer = writer;
        stream
            .for_each(|event| {
                match event {
                    Ok(event) => writer.apply_watcher_event(&event),
                    Err(error) => {
                        tracing::warn!(%error, watch = what, "watch failed; retrying");
                    }
                }
                std::future::ready(())
            })
            .await;
    })
}

/// Starts the six watches (the custom resources in `namespace`, Secrets in
/// `credentials_namespace`, Nodes); returns when every store has its first full list.
pub async fn start_watches(
    client: &Client,
    namespace: &str,
    credentials_namespace: &str,
) -> anyhow::Result<(World, Vec<tokio::task::JoinHandle<()>>)> {
    let (world, writers) = World::new(namespace);
    let tasks = vec![
        watch_slimmed(
            Api::<Node>::all(client.clone()),
            writers.nodes,
            "nodes",
            super::slim::slim_node,
        ),
        watch(
            Api::<GuardedHost>::namespaced(client.clone(), namespace),
            writers.hosts,
            "guardedhosts",
        ),
        watch(
            Api::<GuardedControlPlane>::namespaced(client.clone(), namespace),
            writers.control_planes,
            "guardedcontrolplanes",
        ),
        watch(
            Api::<HostHealthCheck>::namespaced(client.clone(), namespace),
            writers.checks,
            "hosthealthchecks",
        ),
        watch(
            Api::<FenceRequest>::namespaced(client.clone(), namespace),
            writers.fences,
            "fencerequests",
        ),
        watch_slimmed(
            Api::<Secret>::namespaced(client.clone(), credentials_namespace),
            writers.secrets,
            "secrets",
            super::slim::slim_secret,
        ),
    ];
    let ready = async {
        world.nodes.wait_until_ready().await?;
        world.hosts.wait_until_ready().await?;
        world.control_planes.wait_until_ready().await?;
        world.checks.wait_until_ready().await?;
        world.fences.wait_until_ready().await?;
        world.secrets.wait_until_ready().await
    };
    if let Ok(Ok(())) = tokio::time::timeout(SYNC_DEADLINE, ready).await {
        return Ok((world, tasks));
    }
    for t in &tasks {
        t.abort();
    }
    anyhow::bail!(
        "the watches did not list everything within {SYNC_DEADLINE:?}: are the CRDs installed (kubectl apply -f packaging/kubernetes/crds.yaml) and the RBAC bound (see the warnings above)?"
    )
}

/// Connects, watches, starts leader election and returns the backend and the first inventory.
pub async fn backend(
    settings: KubeSettings,
) -> anyhow::Result<(
    KubeBackend,
    crate::inventory::Inventory,
    Vec<tokio::task::JoinHandle<()>>,
)> {
    let client = connect().await?;
    let (world, tasks) = start_watches(
        &client,
        &settings.namespace,
        &settings.credentials_namespace,
    )
    .await?;
    let manager = LeaseManagerBuilder::new(client.clone(), settings.lease_name.clone())
        .with_namespace(settings.namespace.clone())
        .with_identity(settings.identity.clone())
        .with_duration(LEASE_SECONDS)
        .with_grace(5)
        .with_field_manager(super::FIELD_MANAGER.to_owned())
        .build()
        .await
        .context("the leader election Lease could not be set up")?;
    let (flag, _task) = manager.watch().await;
    let backend = KubeBackend::new(client, settings, world).with_lease_flag(flag);
    let inventory = backend
        .build_inventory()
        .map_err(|e| anyhow::anyhow!("the cluster's metalguard resources are invalid: {e}"))?;
    Ok((backend, inventory, tasks))
}
