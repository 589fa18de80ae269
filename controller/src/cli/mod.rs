//! The command line: `run`, `plan`, `status`, `fence`, `drill`, `check-bmc`, `retire`,
//! `release`, `certs`, `openapi`, `crd`. Each
//! subcommand wires the modules and maps errors to an exit status; no decisions are made here.

mod args;
pub mod check_bmc;
mod etcd_report;
mod holds;
#[cfg(feature = "kubernetes")]
pub mod kube;
pub mod plan;
pub mod retire;
mod run;
pub mod status;

use std::process::ExitCode;

use std::fmt::Write as _;

use anyhow::Context as _;
use metalguard_api::snapshot::{FenceRequest, Retirement};

pub use args::Cli;
#[cfg(feature = "kubernetes")]
use args::LEASE_NAME;
use args::{BackendKind, CertsCommand, Command, KubeArgs, inventory_path};
use run::{check_controller_files, run, run_kubernetes};

use crate::backend::Backend as _;
use crate::clock::now;
use crate::error::chain;
use crate::inventory::Inventory;
use crate::pki::certs::{self, Usage};
use crate::standalone::access::EtcdAccess;
use crate::standalone::etcd::EtcdBackend;

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
                let plan = crate::cli::status::explain(&inventory, &state, at);
                print!(
                    "{}",
                    crate::control::fencing::render(&inventory, &state, &plan.fence_executors, at)
                );
                println!("decisions now (dry run over the stored state):");
                print!("{plan}");
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
            let ask = FenceAsk {
                host,
                reason,
                force,
                power_off,
                drill: false,
                wait,
            };
            request_fence(ask, inventory, &cluster).await
        }
        Command::Drill {
            host,
            reason,
            inventory,
            cluster,
            wait,
        } => {
            let ask = FenceAsk {
                host,
                reason,
                force: false,
                power_off: false,
                drill: true,
                wait,
            };
            request_fence(ask, inventory, &cluster).await
        }
        Command::CheckBmc {
            host,
            inventory,
            cluster,
            wait,
        } => {
            #[cfg(feature = "kubernetes")]
            if let Some(target) = cluster.target() {
                return crate::cli::kube::check_bmc::check_bmc(&target, &host, wait).await;
            }
            #[cfg(not(feature = "kubernetes"))]
            cluster.refuse_kubeconfig()?;
            let inventory = Inventory::load(&inventory_path(inventory)?)?;
            crate::cli::check_bmc::check_bmc(
                &inventory,
                &host,
                format!("{} (cli)", invoker()),
                wait,
            )
            .await
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
                if cancel {
                    return crate::cli::kube::retire::cancel(&target, &host).await;
                }
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
            cluster,
        } => {
            #[cfg(feature = "kubernetes")]
            if let Some(target) = cluster.target() {
                return crate::cli::kube::release::release(&target, &host, &reason).await;
            }
            #[cfg(not(feature = "kubernetes"))]
            cluster.refuse_kubeconfig()?;
            release(&inventory_path(inventory)?, &host, &reason).await
        }
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

/// A fence or a fence drill a person asks for (`fence`, `drill`).
struct FenceAsk {
    host: String,
    reason: String,
    force: bool,
    power_off: bool,
    drill: bool,
    wait: std::time::Duration,
}

/// Records `ask` as the host's fence request (standalone: in the store, with the leader's
/// decision computed here from the stored state; Kubernetes: a `FenceRequest`, waiting for
/// the leader's verdict).
async fn request_fence(
    ask: FenceAsk,
    inventory: Option<std::path::PathBuf>,
    cluster: &crate::cli::args::ClusterArgs,
) -> anyhow::Result<()> {
    let FenceAsk {
        host,
        reason,
        force,
        power_off,
        drill,
        wait,
    } = ask;
    #[cfg(feature = "kubernetes")]
    if let Some(target) = cluster.target() {
        let ask = crate::cli::kube::fence::Ask {
            host,
            reason,
            force,
            power_off,
            drill,
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
        nonce: Some(
            crate::standalone::etcd::new_nonce()
                .map_err(|e| anyhow::anyhow!("no random nonce for the fence request: {e}"))?,
        ),
        drill,
    };
    backend.request_fence(&host, &request).await?;
    println!(
        "{} of {host} requested; the leader plans it on its next round",
        if drill { "fence drill" } else { "fence" }
    );
    // The same decision the leader will make, computed here from the stored state.
    let state = backend.load().await?;
    println!(
        "{}",
        crate::cli::status::fence_verdict(&inventory, &state, &host, now())
    );
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
