//! `fence`, `status`, `retire` and `release` with `--kubeconfig`: the same commands as in standalone
//! mode, reaching the state through the cluster's metalguard resources instead of the
//! guarded etcd. They only declare (a `FenceRequest`, a retirement on a `GuardedHost`) and
//! read; the leader decides, with the same planner and guards, and answers in status. The
//! API server's own authentication and RBAC decide who may declare.

pub mod fence;
pub mod observed;
pub mod release;
pub mod retire;
pub mod status;

use std::path::Path;

use anyhow::Context as _;
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use kube::api::{Api, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

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
