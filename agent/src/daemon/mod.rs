//! `metalguard-agent run`: the daemon.
//!
//! Data flow: probes run on their own periods and write their verdicts to the [`probes::Board`];
//! the local endpoint serves `/metrics` and `/status` from it; the supervisor tells systemd
//! READY once every probe has run once, pings the watchdog only while every loop beats, and
//! keeps a STATUS line; SIGTERM (or SIGINT) cancels everything and sends STOPPING.

mod bmc_check;
pub mod bmc_reach;
#[cfg(test)]
mod etcd_tests;
pub(crate) mod execute;
mod host_identity;
mod identity;
mod identity_gate;
mod join;
mod journal;
pub(crate) mod link;
mod local_http;
pub(crate) mod logging;
pub mod metrics;
mod mutation;
pub mod notify;
mod power_check;
pub mod probes;
mod terms;

use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio_util::sync::CancellationToken;

use crate::config::{self, AgentConfig, DEFAULT_CONFIG};
use metrics::AgentMetrics;
use notify::{Heartbeats, Notifier};
use probes::{Board, ProbeState};

/// Exit code when the configuration is invalid (the unit does not restart on it).
pub const EXIT_CONFIG: u8 = 2;
/// How often the supervisor looks at the loops and the board.
const SUPERVISOR_TICK: Duration = Duration::from_millis(50);
/// How long shutdown waits for the loops to finish.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(10);

/// Arguments of `metalguard-agent run`.
#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// The main configuration file; drop-ins are read from `agent.d/` next to it.
    #[arg(long, short, env = "METALGUARD_AGENT_CONFIG", default_value = DEFAULT_CONFIG)]
    pub config: PathBuf,
    /// Log to stderr even when journald is available.
    #[arg(long)]
    pub log_stderr: bool,
}

/// The local view served on `/status`.
#[derive(Debug, Clone, Serialize)]
pub struct LocalStatus {
    /// This host.
    pub host: String,
    /// Agent version.
    pub version: &'static str,
    /// Whether the first probe round completed.
    pub ready: bool,
    /// Every probe.
    pub probes: Vec<ProbeState>,
}

/// Runs the daemon; returns when stopped.
pub fn run(args: &RunArgs) -> ExitCode {
    let target = logging::init(args.log_stderr);
    let loaded = match config::load(&args.config) {
        Ok(loaded) => loaded,
        Err(err) => {
            for problem in err.problems() {
                tracing::error!(problem = %problem, "invalid configuration; refusing to start");
            }
            if target == logging::LogTarget::Journald {
                eprintln!("{err}");
            }
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            tracing::error!(error = %err, "cannot start the async runtime");
            return ExitCode::FAILURE;
        }
    };
    tracing::info!(host = loaded.config.host_name(), files = loaded.files.len(), log = ?target, "metalguard-agent starting");
    runtime.block_on(serve(loaded.config, Notifier::from_env()))
}

async fn serve(config: AgentConfig, notifier: Notifier) -> ExitCode {
    let cancel = CancellationToken::new();
    let beats = Heartbeats::default();
    let metrics = AgentMetrics::new();
    let board = Board::default();
    let probes = match probes::build(&config) {
        Ok(probes) => probes,
        Err(err) => {
            tracing::error!(error = %err, "cannot set up probes; refusing to start");
            return ExitCode::from(EXIT_CONFIG);
        }
    };
    board.register(&probes);
    let mut tasks = tokio::task::JoinSet::new();
    for probe in probes {
        tasks.spawn(probes::run(
            probe,
            board.clone(),
            beats.clone(),
            metrics.clone(),
            cancel.clone(),
        ));
    }

    let host = config.host_name().to_owned();
    if config.metrics.enabled {
        match local_http::bind(config.metrics.listen).await {
            Ok((listener, addr)) => {
                tracing::info!(address = %addr, "serving /metrics and /status");
                let board = board.clone();
                let host = host.clone();
                let status: local_http::StatusFn = Arc::new(move || {
                    let view = LocalStatus {
                        host: host.clone(),
                        version: env!("CARGO_PKG_VERSION"),
                        ready: board.first_round_done(),
                        probes: board.snapshot(),
                    };
                    serde_json::to_string_pretty(&view).unwrap_or_default()
                });
                tasks.spawn(local_http::serve(
                    listener,
                    metrics.clone(),
                    status,
                    cancel.clone(),
                ));
            }
            Err(err) => {
                tracing::error!(address = %config.metrics.listen, error = %err, "cannot bind the metrics address; refusing to start");
                cancel.cancel();
                return ExitCode::from(EXIT_CONFIG);
            }
        }
    }

    if let Some(controller) = &config.controller {
        let executor = match journal::Journal::open(&config.state.dir).and_then(|journal| {
            execute::Executor::new(
                journal.counting_ignored_in(metrics.journal_files_ignored()),
                etcd_settings(&config),
                joiner(&config),
                &config.state.dir,
            )
        }) {
            Ok(executor) => executor,
            Err(err) => {
                tracing::error!(dir = %config.state.dir.display(), error = %err, "cannot open the operation journal; refusing to start");
                cancel.cancel();
                return ExitCode::from(EXIT_CONFIG);
            }
        };
        let link = match link::Link::new(controller, &host) {
            Ok(link) => link
                .with_boot_id_file(&config.state.boot_id_file)
                .with_dmi_dir(&config.state.dmi_dir),
            Err(err) => {
                tracing::error!(error = %err, "cannot set up the controller client; refusing to start");
                cancel.cancel();
                return ExitCode::from(EXIT_CONFIG);
            }
        };
        tracing::info!(controllers = ?controller.all_urls().collect::<Vec<_>>(), "reporting to the controller");
        let reach = bmc_reach::Reachability::default();
        tasks.spawn(bmc_reach::run(
            reach.clone(),
            config.bmc_reachability,
            executor.ca_dir().to_owned(),
            metrics.clone(),
            beats.clone(),
            cancel.clone(),
        ));
        tasks.spawn(link::report_loop(
            link.clone(),
            board.clone(),
            executor.clone(),
            reach,
            beats.clone(),
            cancel.clone(),
        ));
        tasks.spawn(link::command_loop(
            link.clone(),
            executor.clone(),
            beats.clone(),
            cancel.clone(),
        ));
        tasks.spawn(link::result_loop(
            link,
            executor,
            beats.clone(),
            cancel.clone(),
        ));
    } else {
        tracing::warn!("no [controller] configured: probing and serving /status only");
    }

    tasks.spawn(supervise(
        board.clone(),
        beats.clone(),
        notifier.clone(),
        cancel.clone(),
    ));

    wait_for_stop_signal().await;
    tracing::info!("stop requested; shutting down");
    notifier.stopping();
    cancel.cancel();
    let drained = tokio::time::timeout(SHUTDOWN_GRACE, async {
        while tasks.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        tracing::warn!(grace = ?SHUTDOWN_GRACE, "some loops did not stop in time");
    }
    tracing::info!("metalguard-agent stopped");
    ExitCode::SUCCESS
}

fn etcd_settings(config: &AgentConfig) -> Option<metalguard_etcd::ClientSettings> {
    let etcd = config.etcd.as_ref()?;
    let mut settings = metalguard_etcd::ClientSettings::new(etcd.endpoints.clone());
    if etcd.ca.is_some() || etcd.cert.is_some() {
        settings.tls = Some(metalguard_etcd::TlsFiles {
            ca: etcd.ca.clone(),
            cert: etcd.cert.clone(),
            key: etcd.key.clone(),
        });
    }
    Some(settings)
}

/// The join go-ahead's runner, when `[etcd.join]` is configured.
fn joiner(config: &AgentConfig) -> Option<join::Joiner> {
    let etcd = config.etcd.as_ref()?;
    let setup = crate::etcd_join::JoinSetup::from_config(etcd, etcd_settings(config)?)?;
    Some(join::Joiner::new(setup, etcd.join.as_ref()?.timeout))
}

/// READY after the first probe round; WATCHDOG only while every loop beats; STATUS on change.
async fn supervise(board: Board, beats: Heartbeats, notifier: Notifier, cancel: CancellationToken) {
    let ping_every = notifier.watchdog().map(|w| w / 2);
    let mut last_ping = tokio::time::Instant::now();
    let mut ready = false;
    let mut last_status = String::new();
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep(SUPERVISOR_TICK) => {}
        }
        let probes = board.snapshot();
        let unhealthy: Vec<&str> = probes
            .iter()
            .filter(|s| s.healthy == Some(false))
            .map(|s| s.condition.as_str())
            .collect();
        let status = if unhealthy.is_empty() {
            format!("{} probes healthy", probes.len())
        } else {
            format!("unhealthy: {}", unhealthy.join(", "))
        };
        if !ready && board.first_round_done() {
            ready = true;
            notifier.ready(&status);
            tracing::info!(status = %status, "first probe round complete; ready");
            last_status.clone_from(&status);
        } else if ready && status != last_status {
            notifier.status(&status);
            last_status = status;
        }
        if let Some(every) = ping_every
            && last_ping.elapsed() >= every
        {
            let stale = beats.stale();
            if stale.is_empty() {
                notifier.watchdog_ping();
                last_ping = tokio::time::Instant::now();
            } else {
                tracing::error!(loops = ?stale, "loops stopped beating; withholding the watchdog ping");
            }
        }
    }
}

async fn wait_for_stop_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) else {
        tracing::error!("cannot install signal handlers; stopping");
        return;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}
