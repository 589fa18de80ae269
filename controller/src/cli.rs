//! The command line: `run`, `plan`, `status`, `fence`, `retire`, `release`, `certs`, `openapi`,
//! `crd`. Each
//! subcommand wires the modules and maps errors to an exit status; no decisions are made here.

use std::path::PathBuf;
use std::process::ExitCode;

use std::fmt::Write as _;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use metalguard_api::snapshot::{FenceRequest, Retirement};
use tokio_util::sync::CancellationToken;

use crate::backend::Backend as _;
use crate::backend::etcd::EtcdBackend;
use crate::certs::{self, Usage};
use crate::clock::now;
use crate::hub::Hub;
use crate::inventory::Inventory;
use crate::metrics::Metrics;
use crate::service::Controller;
use crate::tls::{TlsFiles, server_config};

/// metalguard controller.
#[derive(Debug, Parser)]
#[command(name = "metalguard-controller", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Run the controller: agent API, leader election, planner, executor.
    Run {
        /// Where inputs, state and leadership live: `standalone` (an inventory file and the
        /// guarded etcd) or `kubernetes` (the cluster's resources and a Lease).
        #[arg(long, value_enum, default_value_t = BackendKind::Standalone)]
        backend: BackendKind,
        /// The inventory file (standalone backend).
        #[arg(
            long,
            env = "METALGUARD_INVENTORY",
            required_if_eq("backend", "standalone")
        )]
        inventory: Option<PathBuf>,
        /// This controller's identity in leader election (default: random).
        #[arg(long, env = "METALGUARD_CONTROLLER_ID")]
        id: Option<String>,
        /// Kubernetes backend settings.
        #[command(flatten)]
        kube: KubeArgs,
    },
    /// Dry run: print the plan for a snapshot with its reasons (text or JSON); exit 2 when
    /// an input cannot be read, 3 when the snapshot is inconsistent.
    Plan(crate::plan_cmd::PlanArgs),
    /// Print the leader, agents' last reports, remediations and operations from the store,
    /// and what the planner would decide now, with its reasons.
    Status {
        /// The inventory file.
        #[arg(long, env = "METALGUARD_INVENTORY")]
        inventory: PathBuf,
        /// One JSON document instead of text.
        #[arg(long)]
        json: bool,
    },
    /// Ask the leader to fence a host.
    Fence {
        /// The host.
        host: String,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
        /// Skip policy gates (never the safety rules).
        #[arg(long)]
        force: bool,
        /// The inventory file.
        #[arg(long, env = "METALGUARD_INVENTORY")]
        inventory: PathBuf,
    },
    /// Retire a control-plane host: its etcd member is replaced (add its replacement to the
    /// inventory), removed, its hooks released, and then it is powered off.
    Retire {
        /// The host.
        host: String,
        /// Why (recorded, shown by `status`).
        #[arg(long, required_unless_present = "cancel")]
        reason: Option<String>,
        /// Who asks (recorded).
        #[arg(long, env = "USER")]
        requested_by: Option<String>,
        /// Withdraw the retirement (refused once a replacement votes or the member is gone).
        #[arg(long)]
        cancel: bool,
        /// The inventory file.
        #[arg(long, env = "METALGUARD_INVENTORY")]
        inventory: PathBuf,
    },
    /// Hand a host held after a break-glass fence (`metalguard-agent fence --direct`) back to
    /// metalguard: its holds are marked released (and never honoured again); a silent host is
    /// then remediated like any other (powered on).
    Release {
        /// The held host.
        host: String,
        /// Why (recorded with the release).
        #[arg(long)]
        reason: String,
        /// The inventory file.
        #[arg(long, env = "METALGUARD_INVENTORY")]
        inventory: PathBuf,
    },
    /// Check the inventory, the files it names and the TLS files; print every problem.
    CheckConfig {
        /// The inventory file.
        #[arg(long, env = "METALGUARD_INVENTORY")]
        inventory: PathBuf,
    },
    /// Print the OpenAPI document of the agent API.
    Openapi,
    /// Print the CustomResourceDefinitions of the Kubernetes backend as YAML
    /// (`packaging/kubernetes/crds.yaml`).
    #[cfg(feature = "kubernetes")]
    Crd,
    /// Create the cluster CA and certificates.
    #[command(subcommand)]
    Certs(CertsCommand),
}

/// The backends of `run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum BackendKind {
    /// An inventory file; state and leadership in the guarded etcd.
    Standalone,
    /// The cluster's metalguard resources; state in their status, leadership in a Lease.
    Kubernetes,
}

/// Settings of the Kubernetes backend (ignored by the standalone one, whose inventory file has them).
#[derive(Debug, clap::Args)]
struct KubeArgs {
    /// The namespace of the metalguard resources, Secrets, Lease and Events.
    #[arg(
        long,
        env = "METALGUARD_NAMESPACE",
        default_value = "metalguard-system"
    )]
    namespace: String,
    /// The leader election Lease.
    #[arg(long, default_value = "metalguard-controller")]
    lease_name: String,
    /// The agent API address (mTLS).
    #[arg(long, env = "METALGUARD_LISTEN", default_value = "0.0.0.0:8443")]
    listen: std::net::SocketAddr,
    /// The Prometheus endpoint address.
    #[arg(long, env = "METALGUARD_METRICS_LISTEN")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// The directory with `controller.pem`, `controller-key.pem` and `ca.pem` (a mounted Secret).
    #[arg(
        long,
        env = "METALGUARD_TLS_DIR",
        default_value = "/etc/metalguard/tls"
    )]
    tls_dir: PathBuf,
}

#[derive(Debug, Subcommand)]
enum CertsCommand {
    /// Create a CA in DIR.
    Init {
        /// Directory.
        dir: PathBuf,
    },
    /// Issue a certificate for NAME signed by the CA in DIR.
    Issue {
        /// Host name (agent) or controller name (`--server`).
        name: String,
        /// Directory holding the CA.
        dir: PathBuf,
        /// A server certificate for the controller (adds localhost and 127.0.0.1).
        #[arg(long)]
        server: bool,
        /// Extra subject alternative names (names or IP addresses).
        #[arg(long = "san")]
        sans: Vec<String>,
    },
}

/// The error and its causes, one per line.
pub fn chain(error: &dyn std::error::Error) -> String {
    let mut text = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        text.push_str("\n  caused by: ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text
}

/// Runs the parsed command line.
pub fn main(cli: Cli) -> ExitCode {
    if let Command::Plan(args) = &cli.command {
        return crate::plan_cmd::run(args);
    }
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let result = match tokio::runtime::Runtime::new() {
        Ok(runtime) => runtime.block_on(dispatch(cli.command)),
        Err(e) => Err(e.into()),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error}");
            for cause in error.chain().skip(1) {
                eprintln!("  caused by: {cause}");
            }
            ExitCode::FAILURE
        }
    }
}

fn connect(inventory: &Inventory, id: String) -> EtcdBackend {
    let etcd = &inventory.etcd;
    EtcdBackend::new(
        &etcd.endpoints,
        &etcd.prefix,
        id,
        etcd.lease_ttl,
        etcd.timeout,
    )
}

fn random_id() -> String {
    let mut bytes = [0u8; 6];
    let _ = getrandom::fill(&mut bytes);
    let hex = bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    });
    format!("controller-{hex}")
}

async fn dispatch(command: Command) -> anyhow::Result<()> {
    match command {
        Command::Run {
            backend,
            inventory,
            id,
            kube,
        } => {
            let id = id.unwrap_or_else(random_id);
            match (backend, inventory) {
                (BackendKind::Standalone, Some(inventory)) => run(&inventory, id).await,
                (BackendKind::Standalone, None) => anyhow::bail!("--inventory is required"),
                (BackendKind::Kubernetes, _) => run_kubernetes(kube, id).await,
            }
        }
        // Handled in `main` before the runtime starts (it has its own exit statuses).
        Command::Plan(_) => Ok(()),
        Command::Status { inventory, json } => {
            let inventory = Inventory::load(&inventory)?;
            let mut backend = connect(&inventory, "status".to_owned());
            let state = match backend.load().await {
                Ok(state) => state,
                Err(error) => {
                    eprintln!(
                        "{}",
                        crate::status::store_unavailable(&inventory, &error).await
                    );
                    return Err(error.into());
                }
            };
            let alarms = backend
                .alarms()
                .await
                .map_err(|error| crate::cli::chain(&error));
            let at = now();
            if json {
                println!(
                    "{}",
                    crate::status::render_json(&inventory, &state, &alarms, at)
                );
            } else {
                print!("{}", crate::status::render_alarms(&alarms));
                print!("{}", crate::status::render(&state, at));
                print!("{}", crate::status::render_progress(&inventory, &state, at));
                print!("{}", crate::reachability::render(&inventory, &state, at));
                println!("decisions now (dry run over the stored state):");
                print!("{}", crate::status::explain(&inventory, &state, at));
            }
            Ok(())
        }
        Command::Fence {
            host,
            reason,
            force,
            inventory,
        } => {
            let inventory = Inventory::load(&inventory)?;
            anyhow::ensure!(
                inventory.host(&host).is_some(),
                "host {host} is not in the inventory"
            );
            let mut backend = connect(&inventory, "cli".to_owned());
            let request = FenceRequest {
                requested_at: now(),
                requested_by: Some(format!("cli: {reason}")),
                force_reason: force.then(|| reason.clone()),
            };
            backend.request_fence(&host, &request).await?;
            println!("fence of {host} requested; the leader plans it on its next round");
            // The same decision the leader will make, computed here from the stored state.
            let state = backend.load().await?;
            println!(
                "{}",
                crate::status::fence_verdict(&inventory, &state, &host, now())
            );
            Ok(())
        }
        Command::Retire {
            host,
            reason,
            requested_by,
            cancel,
            inventory,
        } => retire(&inventory, &host, reason, requested_by, cancel).await,
        Command::Release {
            host,
            reason,
            inventory,
        } => release(&inventory, &host, &reason).await,
        Command::CheckConfig { inventory } => {
            let inv = Inventory::load(&inventory)?;
            let mut problems: Vec<String> = inv.check_files().iter().map(|e| chain(e)).collect();
            match &inv.controller.tls_dir {
                Some(dir) => {
                    let files = TlsFiles::in_dir(dir, &inv.controller.server_cert_name);
                    if let Err(e) = server_config(&files) {
                        problems.push(chain(&e));
                    }
                }
                None => problems.push("controller.tls_dir is not set".to_owned()),
            }
            for p in &problems {
                eprintln!("{p}");
            }
            anyhow::ensure!(
                problems.is_empty(),
                "inventory {} has {} problem(s)",
                inventory.display(),
                problems.len()
            );
            println!("inventory {} is valid", inventory.display());
            Ok(())
        }
        Command::Openapi => {
            print!("{}", crate::openapi::render());
            Ok(())
        }
        #[cfg(feature = "kubernetes")]
        Command::Crd => {
            print!("{}", crate::crd::render()?);
            Ok(())
        }
        Command::Certs(CertsCommand::Init { dir }) => {
            let issued = certs::init_ca(&dir)?;
            println!("{}\n{}", issued.cert.display(), issued.key.display());
            Ok(())
        }
        Command::Certs(CertsCommand::Issue {
            name,
            dir,
            server,
            sans,
        }) => {
            let usage = if server { Usage::Server } else { Usage::Client };
            let issued = certs::issue(&dir, &name, usage, &sans)?;
            println!("{}\n{}", issued.cert.display(), issued.key.display());
            Ok(())
        }
    }
}

async fn retire(
    inventory: &std::path::Path,
    host: &str,
    reason: Option<String>,
    requested_by: Option<String>,
    cancel: bool,
) -> anyhow::Result<()> {
    let inventory = Inventory::load(inventory)?;
    crate::retire::check_retirable(&inventory, host)?;
    let mut backend = connect(&inventory, "cli".to_owned());
    if cancel {
        let state = backend.load().await?;
        let blockers = crate::retire::check_cancellable(&inventory, &state, host, now())?;
        anyhow::ensure!(
            backend.cancel_retirement(host, &blockers).await?,
            "the retirement of {host} cannot be withdrawn: the leader has just started removing its member"
        );
        println!("retirement of {host} withdrawn");
        return Ok(());
    }
    let request = Retirement {
        requested_at: now(),
        requested_by: requested_by.map(|who| format!("{who} (cli)")),
        reason: reason.unwrap_or_default(),
    };
    let in_force = backend.request_retirement(host, &request).await?;
    if in_force == request {
        println!(
            "retirement of {host} requested; the leader replaces its etcd member once a new control-plane host is in the inventory, then powers it off (see status)"
        );
    } else {
        println!(
            "{host} was already retired at {} ({}); that request stays in force",
            in_force.requested_at, in_force.reason
        );
    }
    Ok(())
}

/// Tries a release this often when a hold changes under it (the leader recording it).
const RELEASE_ATTEMPTS: usize = 3;

async fn release(inventory: &std::path::Path, host: &str, reason: &str) -> anyhow::Result<()> {
    let inventory = Inventory::load(inventory)?;
    let mut backend = connect(&inventory, "cli".to_owned());
    let state = backend.load().await?;
    crate::holds::check_releasable(&state, host, inventory.host(host).is_some())?;
    let release = crate::holds::release_by(&crate::holds::invoking_user(), reason, now());
    let mut attempt = 0;
    let released = loop {
        attempt += 1;
        match backend.release_holds(host, &release).await {
            Err(crate::backend::BackendError::Refused { .. }) if attempt < RELEASE_ATTEMPTS => {}
            other => break other?,
        }
    };
    anyhow::ensure!(
        !released.is_empty(),
        crate::holds::ReleaseError::NotHeld(host.to_owned())
    );
    for record in &released {
        println!("{}", crate::holds::released_line(record));
    }
    println!(
        "released by {} ({reason}); the leader picks it up at once (watch), and each agent that recorded a hold deletes it at its next report",
        release.by
    );
    Ok(())
}

async fn run(inventory_path: &std::path::Path, id: String) -> anyhow::Result<()> {
    let inventory = Inventory::load(inventory_path)?;
    let backend = connect(&inventory, id.clone());
    serve(backend, inventory, Some(inventory_path), id).await
}

#[cfg(feature = "kubernetes")]
async fn run_kubernetes(args: KubeArgs, id: String) -> anyhow::Result<()> {
    let controller = crate::inventory::ControllerSettings {
        listen: args.listen,
        metrics_listen: args.metrics_listen,
        tls_dir: Some(args.tls_dir),
        ..crate::inventory::ControllerSettings::default()
    };
    let settings = crate::kube::KubeSettings {
        namespace: args.namespace,
        identity: id.clone(),
        lease_name: args.lease_name,
        controller,
        timing: crate::inventory::EtcdSettings {
            endpoints: Vec::new(),
            prefix: String::new(),
            lease_ttl: std::time::Duration::from_secs(crate::kube::run::LEASE_SECONDS),
            timeout: std::time::Duration::from_secs(5),
        },
    };
    let (backend, inventory, watches) = crate::kube::run::backend(settings).await?;
    let result = serve(backend, inventory, None, id).await;
    for watch in watches {
        watch.abort();
    }
    result
}

#[cfg(not(feature = "kubernetes"))]
#[allow(clippy::unused_async)] // the same signature as the real one
async fn run_kubernetes(_args: KubeArgs, _id: String) -> anyhow::Result<()> {
    anyhow::bail!("this build has no Kubernetes backend (built without the `kubernetes` feature)")
}

/// The agent API, the metrics endpoint and the controller loop over `backend`, until a signal.
async fn serve<B: crate::backend::Backend + 'static>(
    backend: B,
    inventory: Inventory,
    inventory_path: Option<&std::path::Path>,
    id: String,
) -> anyhow::Result<()> {
    let settings = inventory.controller.clone();
    let tls_dir = settings
        .tls_dir
        .clone()
        .context("controller.tls_dir is required to run the agent api")?;
    let tls = server_config(&TlsFiles::in_dir(&tls_dir, &settings.server_cert_name))?;
    let listener = tokio::net::TcpListener::bind(settings.listen)
        .await
        .with_context(|| format!("agent api address {} could not be bound", settings.listen))?;
    let files = match crate::rlimit::raise_open_files() {
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
    let max_connections = crate::rlimit::connection_budget(settings.limits.max_connections, files);
    if max_connections < settings.limits.max_connections {
        tracing::warn!(
            configured = settings.limits.max_connections,
            serving = max_connections,
            open_files = files,
            "the open-file limit allows fewer agent api connections than configured"
        );
    }
    tracing::info!(address = %settings.listen, identity = %id, max_connections, "agent api listening");
    let (hub, inbox) = Hub::new();
    let metrics = Metrics::new();
    let cancel = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(crate::server::serve(
        listener,
        tls,
        hub.clone(),
        settings.limits.clone(),
        max_connections,
        cancel.clone(),
    ));
    if let Some(addr) = settings.metrics_listen {
        let (metrics, cancel) = (metrics.clone(), cancel.clone());
        tasks.spawn(async move {
            if let Err(error) = crate::metrics::serve(addr, metrics, cancel).await {
                tracing::error!(%addr, %error, "metrics endpoint failed");
            }
        });
    }
    let controller = Controller::new(backend, inventory, hub, metrics);
    let controller = match inventory_path {
        Some(path) => controller.reloading(path, id),
        None => controller.identified(id),
    };
    tasks.spawn(controller.run(inbox, cancel.clone()));
    let mut sigterm = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("sigterm handler could not be installed")?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = sigterm.recv() => {}
    }
    tracing::info!("shutting down");
    cancel.cancel();
    while tasks.join_next().await.is_some() {}
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
