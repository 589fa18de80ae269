//! `fence`, `status`, `retire` and `release` with `--kubeconfig`: the same commands as in standalone
//! mode, reaching the state through the cluster's metalguard resources instead of the
//! guarded etcd. They only declare (a `FenceRequest`, a retirement on a `GuardedHost`) and
//! read; the leader decides, with the same planner and guards, and answers in status. The
//! API server's own authentication and RBAC decide who may declare.

pub mod check_bmc;
pub mod fence;
pub mod observed;
pub mod release;
pub mod retire;
pub mod status;

use std::path::Path;

use anyhow::Context as _;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use metalguard_api::k8s::GuardedHost;

pub use crate::kube::REQUESTED_BY;

/// Where a command reaches the cluster.
#[derive(Debug, Clone)]
pub struct Target {
    /// The kubeconfig file (its current context).
    pub kubeconfig: std::path::PathBuf,
    /// The namespace of the metalguard resources.
    pub namespace: String,
}

/// A client from `kubeconfig`'s current context, checked by asking the server's version
/// within [`crate::kube::run::CONNECT_DEADLINE`].
pub async fn connect(kubeconfig: &Path) -> anyhow::Result<Client> {
    let file = Kubeconfig::read_from(kubeconfig)
        .with_context(|| format!("kubeconfig {} could not be read", kubeconfig.display()))?;
    let config = Config::from_custom_kubeconfig(file, &KubeConfigOptions::default())
        .await
        .with_context(|| format!("kubeconfig {} is not usable", kubeconfig.display()))?;
    crate::kube::run::connect_with(config).await
}

/// Who the API server says this client is (`SelfSubjectReview`, allowed to every
/// authenticated user), for the records of what the command asks.
pub async fn who_am_i(client: &Client) -> anyhow::Result<String> {
    let api: Api<SelfSubjectReview> = Api::all(client.clone());
    let review = api
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .context("the API server did not say who this kubeconfig's user is (SelfSubjectReview)")?;
    review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .filter(|u| !u.is_empty())
        .context("the API server's SelfSubjectReview named no user")
}

/// How many times a spec write that conflicted with another writer is read and tried again.
const CONFLICT_TRIES: u32 = 5;

/// What a command decided from the `GuardedHost` it read.
pub enum Decided<T> {
    /// Merge this into the spec, with the object's resource version as precondition.
    Write(serde_json::Value, T),
    /// Nothing to write.
    Stop(T),
}

/// Reads the `GuardedHost` `host` (with whatever else `decide` needs), lets `decide` check
/// it, and merge-patches its spec with the resource version it read as precondition: a
/// compare-and-swap. The leader's status writes move that version too, so a conflict (409)
/// is read and decided again, as kubectl does, a few times; anything written meanwhile is
/// never overwritten unseen.
pub async fn write_host_spec<T>(
    api: &Api<GuardedHost>,
    host: &str,
    what: &str,
    mut decide: impl AsyncFnMut() -> anyhow::Result<(GuardedHost, Decided<T>)>,
) -> anyhow::Result<T> {
    let mut attempt = 0;
    loop {
        attempt += 1;
        let (current, decided) = decide().await?;
        let (spec, outcome) = match decided {
            Decided::Stop(outcome) => return Ok(outcome),
            Decided::Write(spec, outcome) => (spec, outcome),
        };
        let patch = serde_json::json!({
            "metadata": {"resourceVersion": current.metadata.resource_version},
            "spec": spec,
        });
        match api
            .patch(host, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => return Ok(outcome),
            Err(kube::Error::Api(status)) if status.code == 409 && attempt < CONFLICT_TRIES => {
                tracing::debug!(
                    attempt,
                    "GuardedHost {host} changed meanwhile; reading it again"
                );
            }
            Err(error) => {
                return Err(error)
                    .with_context(|| format!("{what} of GuardedHost {host} could not be written"));
            }
        }
    }
}
