//! The command line: `run`, `plan`, `status`, `fence`, `retire`, `release`, `certs`, `openapi`,
//! `crd`. Each
//! subcommand wires the modules and maps errors to an exit status; no decisions are made here.

mod etcd_report;
mod holds;
#[cfg(feature = "kubernetes")]
pub mod kube;
pub mod plan;
pub mod retire;
pub mod status;

use std::path::PathBuf;
use std::process::ExitCode;

use std::fmt::Write as _;

use anyhow::Context as _;
use clap::{Parser, Subcommand};
use metalguard_api::snapshot::{FenceRequest, Retirement};
use tokio_util::sync::CancellationToken;

use crate::api::hub::Hub;
use crate::backend::Backend as _;
use crate::clock::now;
use crate::control::metrics::Metrics;
use crate::control::service::Controller;
use crate::error::chain;
use crate::inventory::Inventory;
use crate::pki::certs::{self, Usage};
use crate::pki::tls::{KeyModes, TlsFiles, server_config};
use crate::standalone::access::EtcdAccess;
use crate::standalone::etcd::EtcdBackend;

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
    Plan(crate::cli::plan::PlanArgs),
    /// Print the leader, agents' last reports, remediations and operations from the store,
    /// and what the planner would decide now, with its reasons.
    Status {
        /// The inventory file.
        #[arg(
            long,
            env = "METALGUARD_INVENTORY",
            required_unless_present = "kubeconfig"
        )]
        inventory: Option<PathBuf>,
        /// Kubernetes mode: read the cluster's metalguard resources instead.
        #[command(flatten)]
        cluster: ClusterArgs,
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
        /// Power off and leave off: the Node is handled as in a remediation, then the host
        /// stays off and its remediation needs a person (`action: PowerOff`).
        #[arg(long)]
        power_off: bool,
        /// The inventory file.
        #[arg(
            long,
            env = "METALGUARD_INVENTORY",
            required_unless_present = "kubeconfig"
        )]
        inventory: Option<PathBuf>,
        /// Kubernetes mode: create a `FenceRequest` and wait for the leader's verdict.
        #[command(flatten)]
        cluster: ClusterArgs,
        /// How long to wait for the verdict (Kubernetes mode); without one the command
        /// fails and the request stays, to be answered when a controller leads.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        wait: std::time::Duration,
    },
    /// Retire a control-plane host: its etcd member is replaced (add its replacement to the
    /// inventory), removed, its hooks released, and then it is powered off.
    Retire {
        /// The host.
        host: String,
        /// Why (recorded, shown by `status`).
        #[arg(long, required_unless_present = "cancel")]
        reason: Option<String>,
        /// Who asks, when not the person running the command (recorded next to that
        /// person's own identity, `$SUDO_USER`/`$USER` and this host's name).
        #[arg(long)]
        requested_by: Option<String>,
        /// Withdraw the retirement (refused once a replacement votes or the member is gone;
        /// standalone mode only).
        #[arg(long, conflicts_with = "kubeconfig")]
        cancel: bool,
        /// The inventory file.
        #[arg(
            long,
            env = "METALGUARD_INVENTORY",
            required_unless_present = "kubeconfig"
        )]
        inventory: Option<PathBuf>,
        /// Kubernetes mode: declare it in the `GuardedHost`'s `spec.retirement`.
        #[command(flatten)]
        cluster: ClusterArgs,
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

/// The default leader election Lease (`run --lease-name`).
#[cfg(feature = "kubernetes")]
const LEASE_NAME: &str = "metalguard-controller";

/// The backends of `run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum BackendKind {
    /// An inventory file; state and leadership in the guarded etcd.
    Standalone,
    /// The cluster's metalguard resources; state in their status, leadership in a Lease.
    Kubernetes,
}

/// Where `status`, `fence` and `retire` reach the cluster in Kubernetes mode.
#[derive(Debug, clap::Args)]
struct ClusterArgs {
    /// A kubeconfig (its current context): reach the state through the cluster's metalguard
    /// resources, as that user (the API server's RBAC decides what it may do).
    #[arg(long, conflicts_with = "inventory")]
    kubeconfig: Option<PathBuf>,
    /// The namespace of the metalguard resources (with `--kubeconfig`).
    #[arg(
        long,
        env = "METALGUARD_NAMESPACE",
        default_value = "metalguard-system"
    )]
    namespace: String,
}

impl ClusterArgs {
    /// The cluster to reach, when `--kubeconfig` was given.
    #[cfg(feature = "kubernetes")]
    fn target(&self) -> Option<crate::cli::kube::Target> {
        self.kubeconfig
            .clone()
            .map(|kubeconfig| crate::cli::kube::Target {
                kubeconfig,
                namespace: self.namespace.clone(),
            })
    }

    /// Without the Kubernetes backend, `--kubeconfig` is an error.
    #[cfg(not(feature = "kubernetes"))]
    fn refuse_kubeconfig(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.kubeconfig.is_none(),
            "--kubeconfig: this metalguard-controller was built without the Kubernetes backend"
        );
        Ok(())
    }
}

/// The standalone inventory, required when no cluster is named.
fn inventory_path(inventory: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    inventory.context("--inventory (or --kubeconfig) is required")
}

/// Settings of the Kubernetes backend (ignored by the standalone one, whose inventory file has them).
#[derive(Debug, clap::Args)]
struct KubeArgs {
    /// The namespace of the metalguard resources, Lease and Events.
    #[arg(
        long,
        env = "METALGUARD_NAMESPACE",
        default_value = "metalguard-system"
    )]
    namespace: String,
    /// The namespace of the BMC credentials Secrets that `GuardedHost`s name (the only
    /// Secrets the controller may read; keep nothing else there).
    #[arg(
        long,
        env = "METALGUARD_CREDENTIALS_NAMESPACE",
        default_value = "metalguard-bmc"
    )]
    credentials_namespace: String,
    /// The leader election Lease.
    #[arg(long, default_value = "metalguard-controller")]
    lease_name: String,
    /// This controller's pod (the Deployment sets it from the downward API): labelled
    /// `metalguard.io/leader=true` while it leads, so the Service reaches only the leader.
    #[arg(long, env = "METALGUARD_POD_NAME")]
    pod_name: Option<String>,
    /// The pod's namespace; it must be `--namespace` (RBAC lets the controller patch pods
    /// there only).
    #[arg(long, env = "METALGUARD_POD_NAMESPACE")]
    pod_namespace: Option<String>,
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
    /// A deny list of agent certificates (`serial HEX` / `sha256 HEX` per line), re-read
    /// when it changes (a mounted ConfigMap).
    #[arg(long, env = "METALGUARD_REVOKED_CERTIFICATES")]
    revoked_certificates: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
enum CertsCommand {
    /// Create a CA in DIR, and the controllers' hmac key (`hmac.key`) unless DIR has one.
    /// Run it on an offline machine: the CA key never goes to the controller hosts.
    Init {
        /// Directory.
        dir: PathBuf,
        /// How long the CA is valid, in days.
        #[arg(long, default_value_t = certs::DEFAULT_CA_DAYS)]
        days: u32,
    },
    /// Issue a certificate for NAME signed by the CA in DIR (valid one year by default);
    /// prints its serial and fingerprint, which a deny list names to revoke it.
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
        /// How long the certificate is valid, in days (never past the CA's end).
        #[arg(long, default_value_t = certs::DEFAULT_DAYS)]
        days: u32,
        /// Replace NAME's existing certificate and key (a renewal; a running agent picks the
        /// new pair up by itself). Prints the old serial, to revoke once renewed everywhere.
        #[arg(long)]
        renew: bool,
    },
    /// Print a certificate's host, serial, SHA-256 fingerprint and end of validity.
    Show {
        /// The certificate (PEM).
        cert: PathBuf,
    },
    /// Create or rotate the controllers' hmac key file: with no option, create FILE with one
    /// key; `--add` appends a key that verifies but does not sign yet; `--promote ID` makes
    /// it the signing key; `--remove ID` drops a key (docs/threat-model.md, rotation).
    HmacKey {
        /// The key file (mode 0600).
        file: PathBuf,
        /// Append a new key.
        #[arg(long, conflicts_with_all = ["promote", "remove"])]
        add: bool,
        /// Make the key with this id the signing key.
        #[arg(long, conflicts_with = "remove")]
        promote: Option<String>,
        /// Drop the key with this id.
        #[arg(long)]
        remove: Option<String>,
    },
}

/// Runs the parsed command line.
pub fn main(cli: Cli) -> ExitCode {
    if let Command::Plan(args) = &cli.command {
        return crate::cli::plan::run(args);
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
/// and path), sealing and opening records with the controllers' hmac key.
fn connect(inventory: &Inventory, id: String) -> anyhow::Result<EtcdBackend> {
    let etcd = &inventory.etcd;
    let access = EtcdAccess::load(etcd)?;
    let path = inventory.controller.hmac_key_path().context(
        "controller.tls_dir or controller.hmac_key must name the controllers' hmac key file",
    )?;
    let keys = crate::pki::seal::KeyFile::open(&path)?;
    Ok(EtcdBackend::new(&etcd.endpoints, access, id, etcd.lease_ttl).sealing(keys))
}

/// Who runs this command, for the records of what it asks: the invoking user (`$SUDO_USER`
/// when run through sudo, else `$USER`, else the real user id) at this host. It is what the
/// operating system says, not a proof: whoever can run the command with the hmac key can
/// claim any environment (docs/threat-model.md).
fn invoker() -> String {
    let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .ok()
        .filter(|h| !h.is_empty())
        .unwrap_or_else(|| "unknown-host".to_owned());
    match (var("SUDO_USER"), var("USER").or_else(|| var("LOGNAME"))) {
        (Some(sudoer), Some(user)) if sudoer != user => format!("{sudoer}@{host} (sudo as {user})"),
        (Some(sudoer), _) => format!("{sudoer}@{host}"),
        (None, Some(user)) => format!("{user}@{host}"),
        (None, None) => {
            // No login environment (a unit, a container): the real user id is still known.
            let uid = std::fs::read_to_string("/proc/self/status")
                .ok()
                .and_then(|status| {
                    status
                        .lines()
                        .find_map(|l| l.strip_prefix("Uid:"))
                        .and_then(|ids| ids.split_whitespace().next().map(str::to_owned))
                })
                .unwrap_or_else(|| "unknown".to_owned());
            format!("uid {uid}@{host}")
        }
    }
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
            cluster,
            json,
            no_endpoint_probes,
        } => {
            #[cfg(feature = "kubernetes")]
            if let Some(target) = cluster.target() {
                return crate::cli::kube::status::status(&target, LEASE_NAME, json).await;
            }
            #[cfg(not(feature = "kubernetes"))]
            cluster.refuse_kubeconfig()?;
            let inventory = Inventory::load(&inventory_path(inventory)?)?;
            let access = EtcdAccess::load(&inventory.etcd)?;
            let mut backend = connect(&inventory, "status".to_owned())?;
            // Each endpoint on its own, at the same time as the state is read.
            let probes = async {
                if no_endpoint_probes {
                    Vec::new()
                } else {
                    crate::cli::etcd_report::ask_each(&inventory.etcd.endpoints, &access).await
                }
            };
            let (endpoints, state) = tokio::join!(probes, backend.load());
            let state = match state {
                Ok(state) => state,
                Err(error) => {
                    eprint!(
                        "{}",
                        crate::cli::status::store_unavailable(crate::cli::etcd_report::no_quorum(
                            &endpoints
                        ))
                    );
                    if !no_endpoint_probes {
                        eprint!("{}", crate::cli::etcd_report::render(&endpoints, &access));
                    }
                    return Err(error.into());
                }
            };
            let alarms = backend
                .alarms()
                .await
                .map_err(|error| crate::error::chain(&error));
            let at = now();
            if json {
                let mut document = crate::cli::status::render_json(&inventory, &state, &alarms, at);
                if !no_endpoint_probes {
                    document["etcd_endpoints"] = serde_json::json!(endpoints);
                }
                println!("{document}");
            } else {
                if !no_endpoint_probes {
                    print!("{}", crate::cli::etcd_report::render(&endpoints, &access));
                }
                print!("{}", crate::cli::status::render_alarms(&alarms));
                print!(
                    "{}",
                    crate::cli::status::render_rejected(&inventory, &state)
                );
                print!("{}", crate::cli::status::render(&inventory, &state, at));
                print!(
                    "{}",
                    crate::cli::status::render_progress(&inventory, &state, at)
                );
                print!(
                    "{}",
                    crate::control::reachability::render(&inventory, &state, at)
                );
                println!("decisions now (dry run over the stored state):");
                print!("{}", crate::cli::status::explain(&inventory, &state, at));
            }
            Ok(())
        }
        Command::Fence {
            host,
            reason,
            force,
            power_off,
            inventory,
            cluster,
            wait,
        } => {
            #[cfg(feature = "kubernetes")]
            if let Some(target) = cluster.target() {
                let ask = crate::cli::kube::fence::Ask {
                    host,
                    reason,
                    force,
                    power_off,
                    wait,
                };
                return crate::cli::kube::fence::fence(&target, &ask).await;
            }
            #[cfg(not(feature = "kubernetes"))]
            {
                cluster.refuse_kubeconfig()?;
                let _ = wait;
            }
            let inventory = Inventory::load(&inventory_path(inventory)?)?;
            anyhow::ensure!(
                inventory.host(&host).is_some(),
                "host {host} is not in the inventory"
            );
            let mut backend = connect(&inventory, "cli".to_owned())?;
            let request = FenceRequest {
                requested_at: now(),
                requested_by: Some(format!("{} (cli): {reason}", invoker())),
                force_reason: force.then(|| reason.clone()),
                stay_off: power_off,
            };
            backend.request_fence(&host, &request).await?;
            println!("fence of {host} requested; the leader plans it on its next round");
            // The same decision the leader will make, computed here from the stored state.
            let state = backend.load().await?;
            println!(
                "{}",
                crate::cli::status::fence_verdict(&inventory, &state, &host, now())
            );
            Ok(())
        }
        Command::Retire {
            host,
            reason,
            requested_by,
            cancel,
            inventory,
            cluster,
        } => {
            #[cfg(feature = "kubernetes")]
            if let Some(target) = cluster.target() {
                let declare = crate::cli::kube::retire::Declare {
                    host,
                    reason: reason.unwrap_or_default(),
                    requested_by,
                };
                return crate::cli::kube::retire::retire(&target, &declare).await;
            }
            #[cfg(not(feature = "kubernetes"))]
            cluster.refuse_kubeconfig()?;
            retire(
                &inventory_path(inventory)?,
                &host,
                reason,
                requested_by,
                cancel,
            )
            .await
        }
        Command::Release {
            host,
            reason,
            inventory,
        } => release(&inventory, &host, &reason).await,
        Command::CheckConfig { inventory } => {
            let inv = Inventory::load(&inventory)?;
            let mut problems: Vec<String> = inv.check_files().iter().map(|e| chain(e)).collect();
            problems.extend(
                crate::standalone::access::check_files(&inv.etcd, std::time::SystemTime::now())
                    .iter()
                    .map(|e| chain(e)),
            );
            problems.extend(check_controller_files(&inv));
            if let Some(dir) = &inv.controller.tls_dir
                && dir.join(certs::CA_KEY).exists()
            {
                eprintln!(
                    "warning: {} is on this host: the CA key belongs on an offline machine (docs/threat-model.md); whoever reads it can make certificates for any host",
                    dir.join(certs::CA_KEY).display()
                );
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
            print!("{}", crate::api::openapi::render());
            Ok(())
        }
        #[cfg(feature = "kubernetes")]
        Command::Crd => {
            print!("{}", crate::kube::crd::render()?);
            Ok(())
        }
        Command::Certs(CertsCommand::Init { dir, days }) => {
            let issued = certs::init_ca(&dir, certs::Validity { days })?;
            println!("{}", issued.describe());
            println!("{}", dir.join(crate::pki::seal::KEY_FILE).display());
            Ok(())
        }
        Command::Certs(CertsCommand::Issue {
            name,
            dir,
            server,
            sans,
            days,
            renew,
        }) => {
            let usage = if server { Usage::Server } else { Usage::Client };
            let validity = certs::Validity { days };
            let issued = if renew {
                certs::renew(&dir, &name, usage, &sans, validity)?
            } else {
                certs::issue(&dir, &name, usage, &sans, validity)?
            };
            println!("{}", issued.describe());
            Ok(())
        }
        Command::Certs(CertsCommand::Show { cert }) => {
            let (identity, not_after) = certs::show(&cert)?;
            let end = std::time::UNIX_EPOCH
                + std::time::Duration::from_secs(u64::try_from(not_after).unwrap_or(0));
            println!(
                "host {}\nserial {}\nsha256 {}\nvalid until {}",
                identity.host,
                identity.serial,
                identity.sha256,
                humantime::format_rfc3339_seconds(end)
            );
            Ok(())
        }
        Command::Certs(CertsCommand::HmacKey {
            file,
            add,
            promote,
            remove,
        }) => {
            use crate::pki::seal::{Rotation, create_file, rotate};
            let step = match (add, promote, remove) {
                (true, _, _) => Some(Rotation::Add),
                (_, Some(id), _) => Some(Rotation::Promote(id)),
                (_, _, Some(id)) => Some(Rotation::Remove(id)),
                _ => None,
            };
            match step {
                None => println!(
                    "created {} with key {}",
                    file.display(),
                    create_file(&file)?
                ),
                Some(step) => {
                    let id = rotate(&file, &step)?;
                    let keys = crate::pki::seal::Keys::load(&file)?;
                    println!(
                        "{step:?} {id}: {} now holds {} (the first signs); copy it to every controller host",
                        file.display(),
                        keys.ids().join(", ")
                    );
                }
            }
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
    crate::cli::retire::check_retirable(&inventory, host)?;
    let mut backend = connect(&inventory, "cli".to_owned())?;
    if cancel {
        let state = backend.load().await?;
        let blockers = crate::cli::retire::check_cancellable(&inventory, &state, host, now())?;
        anyhow::ensure!(
            backend.cancel_retirement(host, &blockers).await?,
            "the retirement of {host} cannot be withdrawn: the leader has just started removing its member"
        );
        println!("retirement of {host} withdrawn");
        return Ok(());
    }
    let me = invoker();
    let requested_by = match requested_by {
        Some(who) => format!("{who} (cli, run by {me})"),
        None => format!("{me} (cli)"),
    };
    let request = Retirement {
        requested_at: now(),
        requested_by: Some(requested_by),
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
    let mut backend = connect(&inventory, "cli".to_owned())?;
    let state = backend.load().await?;
    crate::cli::holds::check_releasable(&state, host, inventory.host(host).is_some())?;
    let release = crate::cli::holds::release_by(&crate::cli::holds::invoking_user(), reason, now());
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
        crate::cli::holds::ReleaseError::NotHeld(host.to_owned())
    );
    for record in &released {
        println!("{}", crate::cli::holds::released_line(record));
    }
    println!(
        "released by {} ({reason}); the leader picks it up at once (watch), and each agent that recorded a hold deletes it at its next report",
        release.by
    );
    Ok(())
}

/// Every problem with the controller's own secrets and lists: its private keys (and the CA's
/// if it is kept here) readable by others, the TLS files, the hmac key file, the deny list.
fn check_controller_files(inventory: &Inventory) -> Vec<String> {
    let settings = &inventory.controller;
    let mut problems = Vec::new();
    match &settings.tls_dir {
        Some(dir) => {
            let files = TlsFiles::in_dir(dir, &settings.server_cert_name);
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

async fn run(inventory_path: &std::path::Path, id: String) -> anyhow::Result<()> {
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
async fn run_kubernetes(args: KubeArgs, id: String) -> anyhow::Result<()> {
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
async fn run_kubernetes(_args: KubeArgs, _id: String) -> anyhow::Result<()> {
    anyhow::bail!("this build has no Kubernetes backend (built without the `kubernetes` feature)")
}

/// The agent API, the metrics endpoint and the controller loop over `backend`, until a signal.
/// `revoked` names the deny list of agent certificates, read now (an error if it cannot be)
/// and re-read when it changes.
async fn serve<B: crate::backend::Backend + 'static>(
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
        let (metrics, cancel) = (metrics.clone(), cancel.clone());
        tasks.spawn(async move {
            if let Err(error) = crate::control::metrics::serve(addr, metrics, cancel).await {
                tracing::error!(%addr, %error, "metrics endpoint failed");
            }
        });
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
