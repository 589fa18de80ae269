//! `metalguard-agent etcd status|join|promote|remove`: the etcd membership mechanics of
//! `metalguard-etcd` from the command line.
//!
//! Wiring only: arguments → [`ClientSettings`] / [`JoinConfig`] → the library call under a
//! tokio runtime → a report on stdout (table or JSON) and an exit code (see [`EXIT_CODES`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Subcommand, ValueEnum};
use metalguard_etcd::join::launcher::Launcher;
use metalguard_etcd::join::launcher::static_pod::manifest::PodSettings;
use metalguard_etcd::join::{self, JoinConfig, JoinFlow};
use metalguard_etcd::observe::observe;
use metalguard_etcd::ops::{self, PromoteRetry, Promoted, Removed};

use crate::etcd_join::{JoinSetup, LauncherChoice, LauncherKind};
use metalguard_etcd::view::ClusterView;
use metalguard_etcd::{ClientSettings, TlsFiles};

/// Exit codes of `etcd`, also printed by `--help`.
const EXIT_CODES: &str = "\
Exit codes:
  0  success (status: every voter answered healthy and there is a leader)
  1  the operation failed or the gate refused it (see the error)
  2  usage error (invalid arguments)
  3  status: the cluster answered but is degraded (a voter unhealthy, or no leader)
  4  status: the healthy voters do not make a quorum";

const EXIT_FAILED: u8 = 1;
const EXIT_DEGRADED: u8 = 3;
const EXIT_NO_QUORUM: u8 = 4;

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum Output {
    /// Human-readable table.
    Table,
    /// JSON on one line.
    Json,
}

/// `etcd` arguments.
#[derive(Debug, Args)]
#[command(after_help = EXIT_CODES)]
pub(crate) struct EtcdArgs {
    /// etcd client endpoints, comma-separated.
    #[arg(
        long,
        env = "METALGUARD_ETCD_ENDPOINTS",
        value_delimiter = ',',
        required = true
    )]
    endpoints: Vec<String>,
    /// CA bundle (PEM) for https endpoints.
    #[arg(long, env = "METALGUARD_ETCD_CACERT")]
    cacert: Option<PathBuf>,
    /// Client certificate (PEM) for https endpoints.
    #[arg(long, env = "METALGUARD_ETCD_CERT", requires = "key")]
    cert: Option<PathBuf>,
    /// Client key (PEM) for https endpoints.
    #[arg(long, env = "METALGUARD_ETCD_KEY", requires = "cert")]
    key: Option<PathBuf>,
    /// Deadline of each member probe: a member that does not answer within it is unhealthy.
    #[arg(long, default_value = "1500ms", value_parser = humantime::parse_duration)]
    probe_timeout: Duration,
    /// Deadline of each membership change call.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    change_timeout: Duration,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    output: Output,
    /// Log debug details to stderr.
    #[arg(long, short)]
    verbose: bool,
    #[command(subcommand)]
    command: EtcdCommand,
}

/// The `etcd` subcommands.
#[derive(Debug, Subcommand)]
pub(crate) enum EtcdCommand {
    /// Show the cluster as every member answers our own probe.
    Status,
    /// Join this host as a learner and run until it is a voter (foreground).
    Join(Box<JoinArgs>),
    /// Promote a learner (member ID in hex) through the safety gate.
    Promote {
        /// Member ID in hex, as `etcdctl member list` shows it.
        #[arg(value_parser = parse_member_id)]
        id: u64,
        /// How many times to try while etcd says the learner is not in sync.
        #[arg(long, default_value_t = 400)]
        attempts: u32,
        /// Wait between attempts.
        #[arg(long, default_value = "25ms", value_parser = humantime::parse_duration)]
        interval: Duration,
    },
    /// Remove a member (member ID in hex) through the safety gate, moving leadership first.
    Remove {
        /// Member ID in hex.
        #[arg(value_parser = parse_member_id)]
        id: u64,
    },
}

/// `etcd join` arguments.
#[derive(Debug, Args)]
pub(crate) struct JoinArgs {
    /// This host's member name.
    #[arg(long)]
    name: String,
    /// Advertised peer URL (this host's identity in the member list).
    #[arg(long)]
    peer_url: String,
    /// Advertised client URL.
    #[arg(long)]
    client_url: String,
    /// Peer listen URL, when it differs from the peer URL.
    #[arg(long)]
    listen_peer_url: Option<String>,
    /// Client listen URL, when it differs from the client URL.
    #[arg(long)]
    listen_client_url: Option<String>,
    /// etcd data directory (the join state file is written next to it unless --state-file).
    #[arg(long)]
    data_dir: PathBuf,
    /// Where the join keeps its state (default: `<data dir>.metalguard-join.json`).
    #[arg(long)]
    state_file: Option<PathBuf>,
    /// How to run the local etcd.
    #[arg(long, value_enum, default_value = "exec")]
    launcher: LauncherKind,
    /// etcd binary (exec launcher).
    #[arg(long, env = "METALGUARD_ETCD_BIN", default_value = "etcd")]
    etcd_bin: PathBuf,
    /// systemd unit (systemd launcher).
    #[arg(long, default_value = "etcd.service")]
    unit: String,
    /// EnvironmentFile the unit reads (systemd launcher), or the environment file the host's
    /// supervisor starts etcd from (env-file launcher).
    #[arg(long, default_value = crate::config::DEFAULT_SYSTEMD_ENV_FILE)]
    env_file: PathBuf,
    /// The static Pod manifest the kubelet runs (static-pod launcher).
    #[arg(long, default_value = crate::config::DEFAULT_STATIC_POD_MANIFEST)]
    manifest: PathBuf,
    /// An existing member's manifest to take the image and further flags from (static-pod
    /// launcher).
    #[arg(long)]
    template: Option<PathBuf>,
    /// The etcd image (static-pod launcher; default: the template's).
    #[arg(long)]
    image: Option<String>,
    /// kubeadm's etcd certificate directory (static-pod launcher).
    #[arg(long, default_value = crate::config::DEFAULT_STATIC_POD_PKI_DIR)]
    pki_dir: PathBuf,
    /// Replace a static Pod manifest the agent did not write (moved aside first).
    #[arg(long)]
    overwrite_foreign_manifest: bool,
    /// Command run after the environment file is written (env-file launcher; argv, no
    /// shell). Give it last: every following argument belongs to it.
    #[arg(long, num_args = 1.., allow_hyphen_values = true)]
    start_command: Vec<String>,
    /// Deadline of the start command and of the local member answering (env-file and
    /// static-pod launchers).
    #[arg(long, default_value = "2m", value_parser = humantime::parse_duration)]
    start_timeout: Duration,
    /// Bootstrap mode: promote ourselves once caught up while voters < N. Without it the
    /// controller promotes.
    #[arg(long)]
    bootstrap_desired_voters: Option<usize>,
    /// Report the learner stalled after this long without catch-up progress.
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    stall_after: Duration,
    /// Exit once a voter instead of supervising etcd (exec launcher).
    #[arg(long)]
    exit_when_member: bool,
}

fn parse_member_id(text: &str) -> Result<u64, String> {
    u64::from_str_radix(text.trim_start_matches("0x"), 16)
        .map_err(|e| format!("member id must be hex as etcdctl shows it: {e}"))
}

fn init_logging(verbose: bool) {
    let filter = if verbose { "debug" } else { "info" };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter)),
        )
        .with_writer(std::io::stderr)
        .try_init();
}

impl EtcdArgs {
    fn settings(&self) -> ClientSettings {
        let mut settings = ClientSettings::new(self.endpoints.clone());
        if self.cacert.is_some() || self.cert.is_some() {
            settings.tls = Some(TlsFiles {
                ca: self.cacert.clone(),
                cert: self.cert.clone(),
                key: self.key.clone(),
            });
        }
        settings.probe_timeout = self.probe_timeout;
        settings.change_timeout = self.change_timeout;
        settings
    }
}

/// Runs `etcd …` and returns the exit code.
pub(crate) fn run(args: &EtcdArgs) -> ExitCode {
    init_logging(args.verbose);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return failed(&error, args.output),
    };
    runtime.block_on(async {
        let settings = args.settings();
        match &args.command {
            EtcdCommand::Status => match observe(&settings).await {
                Ok(view) => {
                    print_view(&view, args.output);
                    ExitCode::from(status_exit(&view))
                }
                Err(error) => failed(&error, args.output),
            },
            EtcdCommand::Promote {
                id,
                attempts,
                interval,
            } => {
                let retry = PromoteRetry {
                    attempts: *attempts,
                    interval: *interval,
                };
                match ops::promote(&settings, *id, retry).await {
                    Ok(Promoted::Promoted { attempts }) => {
                        done(args.output, "promoted", *id, Some(attempts))
                    }
                    Ok(Promoted::AlreadyVoter) => done(args.output, "already_voter", *id, None),
                    Err(error) => failed(&error, args.output),
                }
            }
            EtcdCommand::Remove { id } => match ops::remove(&settings, *id).await {
                Ok(Removed::Removed { moved_leader }) => done(
                    args.output,
                    if moved_leader {
                        "removed_after_moving_leadership"
                    } else {
                        "removed"
                    },
                    *id,
                    None,
                ),
                Ok(Removed::AlreadyGone) => done(args.output, "already_gone", *id, None),
                Err(error) => failed(&error, args.output),
            },
            EtcdCommand::Join(join_args) => run_join(settings, join_args, args.output).await,
        }
    })
}

impl JoinArgs {
    fn setup(&self, client: ClientSettings) -> JoinSetup {
        let launcher = match self.launcher {
            LauncherKind::Exec => LauncherChoice::Exec {
                binary: self.etcd_bin.clone(),
            },
            LauncherKind::Systemd => LauncherChoice::Systemd {
                unit: self.unit.clone(),
                env_file: self.env_file.clone(),
            },
            LauncherKind::EnvFile => LauncherChoice::EnvFile {
                env_file: self.env_file.clone(),
                start_command: self.start_command.clone(),
                start_timeout: self.start_timeout,
            },
            LauncherKind::StaticPod => LauncherChoice::StaticPod {
                manifest: self.manifest.clone(),
                template: self.template.clone(),
                pod: PodSettings {
                    image: self.image.clone(),
                    pki_dir: self.pki_dir.clone(),
                },
                overwrite_foreign: self.overwrite_foreign_manifest,
                start_timeout: self.start_timeout,
            },
        };
        let config = JoinConfig {
            client,
            name: self.name.clone(),
            peer_url: self.peer_url.clone(),
            client_url: self.client_url.clone(),
            listen_peer_url: self.listen_peer_url.clone(),
            listen_client_url: self.listen_client_url.clone(),
            data_dir: self.data_dir.clone(),
            state_file: self.state_file.clone(),
            extra_env: Vec::new(),
            bootstrap_desired_voters: self.bootstrap_desired_voters,
            poll_interval: join::DEFAULT_POLL_INTERVAL,
            stall_after: self.stall_after,
            promote_retry: ops::DEFAULT_PROMOTE_RETRY,
        };
        JoinSetup { config, launcher }
    }
}

async fn run_join(settings: ClientSettings, args: &JoinArgs, output: Output) -> ExitCode {
    let setup = args.setup(settings);
    let launcher = setup.launcher();
    let mut flow = match JoinFlow::load(setup.config, launcher) {
        Ok(flow) => flow,
        Err(error) => return failed(&error, output),
    };
    let state = loop {
        let result = tokio::select! {
            result = flow.run() => result,
            _ = tokio::signal::ctrl_c() => {
                tracing::info!(step = flow.state().name(), "etcd join interrupted, state kept");
                return ExitCode::from(EXIT_FAILED);
            }
        };
        match result {
            Ok(state) => break state,
            Err(error) if join::is_retryable(&error) => {
                tracing::warn!(error = %chain(&error), "etcd join step failed, retrying");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(error) => return failed(&error, output),
        }
    };
    match output {
        Output::Json => println!(
            "{}",
            serde_json::to_string(&state).unwrap_or_else(|_| "{}".into())
        ),
        Output::Table => println!(
            "joined: member {:x} is a voter",
            state.member_id().unwrap_or(0)
        ),
    }
    if args.launcher == LauncherKind::Exec && !args.exit_when_member {
        tracing::info!("supervising etcd until interrupted");
        let _ = tokio::signal::ctrl_c().await;
        if let Launcher::Exec(exec) = flow.launcher_mut() {
            exec.stop().await;
        }
    }
    ExitCode::SUCCESS
}

fn status_exit(view: &ClusterView) -> u8 {
    let s = &view.summary;
    if !s.has_quorum {
        EXIT_NO_QUORUM
    } else if s.healthy_voters < s.voters || s.leader.is_none() {
        EXIT_DEGRADED
    } else {
        0
    }
}

fn done(output: Output, outcome: &str, id: u64, attempts: Option<u32>) -> ExitCode {
    match output {
        Output::Json => println!(
            "{}",
            serde_json::json!({"outcome": outcome, "member_id": format!("{id:x}"), "attempts": attempts})
        ),
        Output::Table => println!("member {id:x}: {}", outcome.replace('_', " ")),
    }
    ExitCode::SUCCESS
}

fn chain(error: &dyn std::error::Error) -> String {
    let mut out = error.to_string();
    let mut source = error.source();
    while let Some(cause) = source {
        out.push_str("\n  caused by: ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}

fn failed(error: &dyn std::error::Error, output: Output) -> ExitCode {
    match output {
        Output::Json => println!("{}", serde_json::json!({"error": chain(error)})),
        Output::Table => eprintln!("error: {}", chain(error)),
    }
    ExitCode::from(EXIT_FAILED)
}

fn print_view(view: &ClusterView, output: Output) {
    if output == Output::Json {
        println!(
            "{}",
            serde_json::to_string(view).unwrap_or_else(|_| "{}".into())
        );
        return;
    }
    println!(
        "{:<16} {:<10} {:<8} {:<8} {:<7} {:<6} {:>10} {:>10} {:>10} {:<8} NOTE",
        "ID", "NAME", "ROLE", "STARTED", "HEALTHY", "LEADER", "RAFT", "APPLIED", "DB", "VERSION"
    );
    for m in &view.members {
        let status = m.status();
        let note = match (&m.probe, status) {
            (_, Some(s)) if !s.alarms.is_empty() => format!("alarms {}", s.alarm_names()),
            (Some(p), None) => p.error.clone().unwrap_or_default(),
            (None, None) => "not probed".to_owned(),
            _ => String::new(),
        };
        println!(
            "{:<16x} {:<10} {:<8} {:<8} {:<7} {:<6} {:>10} {:>10} {:>10} {:<8} {}",
            m.id,
            if m.name.is_empty() { "-" } else { &m.name },
            if m.is_learner { "learner" } else { "voter" },
            m.started,
            m.healthy(),
            view.summary.leader == Some(m.id),
            status.map_or_else(|| "-".into(), |s| s.raft_index.to_string()),
            status.map_or_else(|| "-".into(), |s| s.raft_applied_index.to_string()),
            status.map_or_else(|| "-".into(), |s| s.db_size.to_string()),
            status.map_or("-", |s| s.version.as_str()),
            note
        );
    }
    for p in &view.stray_endpoints {
        println!(
            "endpoint {} matches no member: {}",
            p.endpoint,
            p.error.clone().unwrap_or_default()
        );
    }
    let s = &view.summary;
    println!(
        "voters {} (healthy {}), learners {}, unstarted {}, quorum {}, failure tolerance {}, leader {}",
        s.voters,
        s.healthy_voters,
        s.learners,
        s.unstarted,
        s.quorum,
        s.failure_tolerance,
        s.leader.map_or_else(|| "none".into(), |l| format!("{l:x}"))
    );
}

#[cfg(test)]
mod tests {
    use super::parse_member_id;

    #[test]
    fn member_ids_are_hex_as_etcdctl_prints_them() {
        assert_eq!(
            parse_member_id("8e9e05c52164694d"),
            Ok(0x8e9e_05c5_2164_694d)
        );
        assert_eq!(parse_member_id("0x10"), Ok(16));
        assert!(parse_member_id("12345678901234567890").is_err());
    }
}
