//! The command line: `run`, `plan`, `status`, `fence`, `retire`, `certs`, `openapi`, `crd`. Each
//! subcommand wires the modules and maps errors to an exit status; no decisions are made here.

use std::path::PathBuf;
use std::process::ExitCode;

use std::fmt::Write as _;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use metalguard_api::snapshot::{FenceRequest, Retirement};
use tokio_util::sync::CancellationToken;

use crate::backend::Backend as _;
use crate::backend::access::EtcdAccess;
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
        /// Leave out the line per etcd endpoint (each endpoint is asked on its own, so a hung
        /// one costs one request timeout): for scripts that poll often, as the lab does.
        #[arg(long)]
        no_endpoint_probes: bool,
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
    /// Check the inventory, the files it names (BMC credentials, the etcd CA, client
    /// certificate, key and password) and the TLS files; print every problem.
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

/// The store of `run` and of every subcommand that reaches etcd: the inventory's endpoints
/// with its TLS files and credentials (read now; a bad file stops the command with its key
/// and path).
fn connect(inventory: &Inventory, id: String) -> anyhow::Result<EtcdBackend> {
    let etcd = &inventory.etcd;
    let access = EtcdAccess::load(etcd)?;
    Ok(EtcdBackend::new(
        &etcd.endpoints,
        access,
        id,
        etcd.lease_ttl,
    ))
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
        Command::Status {
            inventory,
            json,
            no_endpoint_probes,
        } => {
            let inventory = Inventory::load(&inventory)?;
            let access = EtcdAccess::load(&inventory.etcd)?;
            let mut backend = connect(&inventory, "status".to_owned())?;
            // Each endpoint on its own, at the same time as the state is read.
            let probes = async {
                if no_endpoint_probes {
                    Vec::new()
                } else {
                    crate::etcd_report::ask_each(&inventory.etcd.endpoints, &access).await
                }
            };
            let (endpoints, state) = tokio::join!(probes, backend.load());
            let state = match state {
                Ok(state) => state,
                Err(error) => {
                    eprint!(
                        "{}",
                        crate::status::store_unavailable(crate::etcd_report::no_quorum(&endpoints))
                    );
                    if !no_endpoint_probes {
                        eprint!("{}", crate::etcd_report::render(&endpoints, &access));
                    }
                    return Err(error.into());
                }
            };
            let alarms = backend
                .alarms()
                .await
                .map_err(|error| crate::cli::chain(&error));
            let at = now();
            if json {
                let mut document = crate::status::render_json(&inventory, &state, &alarms, at);
                if !no_endpoint_probes {
                    document["etcd_endpoints"] = serde_json::json!(endpoints);
                }
                println!("{document}");
            } else {
                if !no_endpoint_probes {
                    print!("{}", crate::etcd_report::render(&endpoints, &access));
                }
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
            let mut backend = connect(&inventory, "cli".to_owned())?;
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
        Command::CheckConfig { inventory } => {
            let inv = Inventory::load(&inventory)?;
            let mut problems: Vec<String> = inv.check_files().iter().map(|e| chain(e)).collect();
            problems.extend(
                crate::backend::access::check_files(&inv.etcd, std::time::SystemTime::now())
                    .iter()
                    .map(|e| chain(e)),
            );
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
    let mut backend = connect(&inventory, "cli".to_owned())?;
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

async fn run(inventory_path: &std::path::Path, id: String) -> anyhow::Result<()> {
    let inventory = Inventory::load(inventory_path)?;
    let backend = connect(&inventory, id.clone())?;
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
            ca_file: None,
            cert_file: None,
            key_file: None,
            username: None,
            password_file: None,
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
    tracing::info!(address = %settings.listen, identity = %id, "agent api listening");
    let (hub, inbox) = Hub::new();
    let metrics = Metrics::new();
    let cancel = CancellationToken::new();
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(crate::server::serve(
        listener,
        tls,
        hub.clone(),
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
