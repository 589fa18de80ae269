//! `run`: checks the controller's own files, connects the backend (standalone etcd or the
//! Kubernetes API) and serves the agent API, the metrics endpoint and the controller loop until
//! a signal.

use std::path::PathBuf;

use anyhow::Context as _;
use tokio_util::sync::CancellationToken;

use super::KubeArgs;
use super::connect;
use crate::api::hub::Hub;
use crate::control::metrics::Metrics;
use crate::control::service::Controller;
use crate::error::chain;
use crate::inventory::Inventory;
use crate::pki::certs;
use crate::pki::tls::{KeyModes, TlsFiles, server_config};

/// Every problem with the controller's own secrets and lists: `tls_dir`, the CA and the server
/// certificate writable by others or owned by a stranger, its private keys (and the CA's if
/// it is kept here) readable by others, the TLS files, the hmac key file, the deny list.
pub(super) fn check_controller_files(inventory: &Inventory) -> Vec<String> {
    let settings = &inventory.controller;
    let mut problems = Vec::new();
    match &settings.tls_dir {
        Some(dir) => {
            let files = TlsFiles::in_dir(dir, &settings.server_cert_name);
            problems.extend(files.check_authority(dir).iter().map(|e| chain(e)));
            problems.extend(
                files
                    .check_key_modes(KeyModes::OwnerOnly)
                    .iter()
                    .map(|e| chain(e)),
            );
            if let Err(e) = server_config(&files, crate::pki::revocation::Revoked::default()) {
                problems.push(chain(&e));
            }
        }
        None => problems.push("controller.tls_dir is not set".to_owned()),
    }
    match settings.hmac_key_path() {
        Some(path) => {
            if let Err(e) = crate::pki::seal::Keys::load(&path) {
                problems.push(chain(&e));
            }
        }
        None => problems.push("controller.hmac_key is not set (nor controller.tls_dir)".to_owned()),
    }
    if let Some(path) = &settings.revoked_certificates
        && let Err(e) = crate::pki::revocation::DenyList::load(path)
    {
        problems.push(chain(&e));
    }
    problems
}

pub(super) async fn run(inventory_path: &std::path::Path, id: String) -> anyhow::Result<()> {
    let inventory = Inventory::load(inventory_path)?;
    let problems = check_controller_files(&inventory);
    anyhow::ensure!(
        problems.is_empty(),
        "the controller's secrets are not safe to use:\n{}",
        problems.join("\n")
    );
    let backend = connect(&inventory, id.clone())?;
    let revoked = inventory.controller.revoked_certificates.clone();
    serve(backend, inventory, Some(inventory_path), id, revoked).await
}

#[cfg(feature = "kubernetes")]
pub(super) async fn run_kubernetes(args: KubeArgs, id: String) -> anyhow::Result<()> {
    let controller = crate::inventory::ControllerSettings {
        listen: args.listen,
        metrics_listen: args.metrics_listen,
        tls_dir: Some(args.tls_dir),
        ..crate::inventory::ControllerSettings::default()
    };
    if let Some(pod_namespace) = args
        .pod_namespace
        .as_ref()
        .filter(|_| args.pod_name.is_some())
    {
        anyhow::ensure!(
            *pod_namespace == args.namespace,
            "the controller's pod is in namespace {pod_namespace}, not in {}: it may label only pods of its own namespace",
            args.namespace
        );
    }
    let settings = crate::kube::KubeSettings {
        pod: args.pod_name,
        namespace: args.namespace,
        credentials_namespace: args.credentials_namespace,
        identity: id.clone(),
        lease_name: args.lease_name,
        controller,
        timing: crate::kube::run::timing(),
        node_leases: args.node_leases,
    };
    let revoked = args.revoked_certificates.clone();
    let (backend, inventory, watches) = crate::kube::run::backend(settings).await?;
    // A Secret volume is read through the pod's fsGroup: group read is allowed, others never.
    if let Some(dir) = &inventory.controller.tls_dir {
        let files = TlsFiles::in_dir(dir, &inventory.controller.server_cert_name);
        let problems: Vec<String> = files
            .check_key_modes(KeyModes::OwnerAndGroup)
            .iter()
            .map(|e| chain(e))
            .collect();
        if !problems.is_empty() {
            for watch in watches {
                watch.abort();
            }
            anyhow::bail!("{}", problems.join("\n"));
        }
    }
    let result = serve(backend, inventory, None, id, revoked).await;
    for watch in watches {
        watch.abort();
    }
    result
}

#[cfg(not(feature = "kubernetes"))]
#[allow(clippy::unused_async)] // the same signature as the real one
pub(super) async fn run_kubernetes(_args: KubeArgs, _id: String) -> anyhow::Result<()> {
    anyhow::bail!("this build has no Kubernetes backend (built without the `kubernetes` feature)")
}

/// The agent API, the metrics endpoint and the controller loop over `backend`, until a signal.
/// `revoked` names the deny list of agent certificates, read now (an error if it cannot be)
/// and re-read when it changes.
pub(super) async fn serve<B: crate::backend::Backend + 'static>(
    backend: B,
    inventory: Inventory,
    inventory_path: Option<&std::path::Path>,
    id: String,
    revoked: Option<PathBuf>,
) -> anyhow::Result<()> {
    let settings = inventory.controller.clone();
    let tls_dir = settings
        .tls_dir
        .clone()
        .context("controller.tls_dir is required to run the agent api")?;
    let (hub, inbox) = Hub::new();
    // Who may speak is known before the first connection is accepted.
    hub.set_hosts(inventory.hosts.iter().map(|h| h.name.clone()));
    let deny_list = match revoked {
        Some(path) => {
            let mut file = crate::pki::revocation::DenyListFile::new(&path);
            if let crate::pki::revocation::DenyListReload::Rejected(error) =
                file.check(&hub.revoked())
            {
                return Err(error.into());
            }
            Some(file)
        }
        None => None,
    };
    let files = TlsFiles::in_dir(&tls_dir, &settings.server_cert_name);
    let tls = server_config(&files, hub.revoked())?;
    let metrics = Metrics::new();
    let certificates = [
        ("server", Some(files.cert.as_path())),
        ("ca", Some(files.ca.as_path())),
        ("etcd-client", inventory.etcd.cert_file.as_deref()),
    ];
    for (role, path) in certificates {
        let Some(path) = path else { continue };
        match certs::not_after(path) {
            Ok(end) => {
                metrics
                    .certificate_expiry
                    .get_or_create(&crate::control::metrics::label("certificate", role))
                    .set(end);
            }
            Err(error) => {
                tracing::warn!(certificate = role, error = %crate::error::chain(&error), "end of validity not exported");
            }
        }
    }
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("agent api address {} could not be bound", settings.listen))?;
    let files = match crate::api::rlimit::raise_open_files() {
        Ok((before, now)) => {
            if before != now {
                tracing::info!(before, now, "open-file soft limit raised to the hard limit");
            }
            now
        }
        Err(error) => {
            tracing::warn!(%error, "open-file limit could not be read or raised");
            1024
        }
    };
    let max_connections =
        crate::api::rlimit::connection_budget(settings.limits.max_connections, files);
    if max_connections < settings.limits.max_connections {
        tracing::warn!(
            configured = settings.limits.max_connections,
            serving = max_connections,
            open_files = files,
            "the open-file limit allows fewer agent api connections than configured"
        );
    }
    tracing::info!(address = %settings.listen, identity = %id, max_connections, "agent api listening");
    let cancel = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(crate::api::server::serve(
        listener,
        tls,
        hub.clone(),
        settings.limits.clone(),
        max_connections,
        cancel.clone(),
    ));
    if let Some(addr) = settings.metrics_listen {
        match tokio::net::TcpListener::bind(addr).await {
            Ok(listener) => {
                tasks.spawn(crate::control::metrics::serve(
                    listener,
                    metrics.clone(),
                    settings.limits.clone(),
                    cancel.clone(),
                ));
            }
            Err(error) => tracing::error!(%addr, %error, "metrics endpoint failed"),
        }
    }
    let controller = Controller::new(backend, inventory, hub, metrics);
    let controller = match inventory_path {
        Some(path) => controller.reloading(path, id),
        None => controller.identified(id),
    };
    let controller = match deny_list {
        Some(file) => controller.revoking(file),
        None => controller,
    };
    tasks.spawn(controller.run(inbox, cancel.clone()));
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("sigterm handler could not be installed")?;
    let signal = async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = sigterm.recv() => {}
        }
    };
    supervise(tasks, signal, cancel).await
}

/// Runs until `signal`, or until one of `tasks` ends first: a task that panicked (the leader's
/// loop on an overflow, issue 28) or returned ends the process with an error, so systemd or
/// the kubelet restarts it, instead of leaving a controller that answers 503 forever. Either
/// way `cancel` stops the others and they are awaited.
pub(super) async fn supervise(
    mut tasks: tokio::task::JoinSet<()>,
    signal: impl std::future::Future<Output = ()>,
    cancel: CancellationToken,
) -> anyhow::Result<()> {
    let ended = tokio::select! {
        () = signal => None,
        Some(ended) = tasks.join_next() => Some(ended),
    };
    cancel.cancel();
    match &ended {
        None => tracing::info!("shutting down"),
        Some(Err(error)) if error.is_panic() => {
            tracing::error!(%error, "a controller task panicked; exiting so that it is restarted");
        }
        Some(_) => {
            tracing::error!("a controller task ended on its own; exiting so that it is restarted");
        }
    }
    while tasks.join_next().await.is_some() {}
    match ended {
        None => Ok(()),
        Some(Err(error)) if error.is_panic() => {
            anyhow::bail!(
                "a controller task panicked; the controller exits so that it is restarted"
            )
        }
        Some(_) => anyhow::bail!(
            "a controller task ended on its own; the controller exits so that it is restarted"
        ),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_panicking_task_ends_the_process_with_an_error_and_stops_the_others() {
        let cancel = CancellationToken::new();
        let mut tasks = tokio::task::JoinSet::new();
        let stopped = CancellationToken::new();
        let (others, done) = (cancel.clone(), stopped.clone());
        tasks.spawn(async move {
            others.cancelled().await;
            done.cancel();
        });
        tasks.spawn(async {
            tokio::time::sleep(Duration::from_millis(10)).await;
            #[allow(clippy::panic)]
            {
                panic!("attempt overflow");
            }
        });
        let never = std::future::pending::<()>();
        let outcome = tokio::time::timeout(Duration::from_secs(5), supervise(tasks, never, cancel))
            .await
            .expect("the controller kept running with a dead task");
        let error = outcome.unwrap_err().to_string();
        assert!(error.contains("panicked"), "{error}");
        assert!(stopped.is_cancelled(), "the other tasks were stopped");
    }

    #[tokio::test]
    async fn a_signal_ends_it_cleanly() {
        let cancel = CancellationToken::new();
        let mut tasks = tokio::task::JoinSet::new();
        let token = cancel.clone();
        tasks.spawn(async move { token.cancelled().await });
        supervise(tasks, async {}, cancel).await.unwrap();
    }
}
