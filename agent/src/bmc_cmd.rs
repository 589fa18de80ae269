//! `metalguard-agent bmc status|check|on|off|reboot|cycle`: one operation against one BMC.
//!
//! Wiring only: arguments → address, credentials file, TLS trust → [`metalguard_bmc::Bmc`] →
//! [`metalguard_bmc::fence()`] (or a state read; `check` also reads the system's identity)
//! under `--timeout` → a report on stdout (text or JSON) and an exit code a script can use
//! (see [`EXIT_CODES`]).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, ValueEnum};
use metalguard_api::bmc::CheckFailure;
use metalguard_bmc::tls::{insecure_handshakes, parse_fingerprint};
use metalguard_bmc::{
    Bmc, BmcAddress, BmcError, CallTimeouts, Credentials, FenceAction, FenceOptions, FenceStatus,
    PowerControl, PowerState, ReadIdentity, SystemIdentity, TimelineEntry, TlsTrust, fence,
};
use serde::Serialize;

/// Exit codes of `bmc`, also printed by `--help`.
pub(crate) const EXIT_CODES: &str = "\
Exit codes:
  0  success (status: the host is on; check: the power state and the identity were read)
  1  the operation failed or could not be verified (see the error)
  2  usage error (invalid arguments)
  3  status: the host is off
  4  status: the host is in a transitional or unknown power state
  5  reboot: the host was fenced (off verified) but powering it on again failed
  6  configuration error (address, credentials file, TLS options); the BMC was not contacted";

/// Exit code: success.
pub(crate) const EXIT_OK: u8 = 0;
/// Exit code: failed or not verified.
pub(crate) const EXIT_FAILED: u8 = 1;
/// Exit code: status found the host off.
pub(crate) const EXIT_OFF: u8 = 3;
/// Exit code: status found a transitional or unknown state.
pub(crate) const EXIT_TRANSITIONAL: u8 = 4;
/// Exit code: fenced, but power-on after the fence failed.
pub(crate) const EXIT_FENCED_POWER_ON_FAILED: u8 = 5;
/// Exit code: configuration error.
pub(crate) const EXIT_CONFIG: u8 = 6;

/// Default overall deadline of one `bmc` operation.
const DEFAULT_TIMEOUT: &str = "60s";
/// Upper bound of the TCP/TLS connect timeout.
const MAX_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// Upper bound of one request's timeout.
const MAX_REQUEST_TIMEOUT: Duration = Duration::from_secs(15);
/// How long logging out may take after the operation.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// The power operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum BmcAction {
    /// Read the power state.
    Status,
    /// Log in and read the power state and the system's identity (UUID, serial number);
    /// changes nothing. Exit 0 whatever the power state.
    Check,
    /// Power on and verify On.
    On,
    /// Force off and verify Off (the fence).
    Off,
    /// Verified off, then on and verify On.
    Reboot,
    /// Ask the BMC for a power cycle (not verifiable; fails when unsupported).
    Cycle,
}

impl BmcAction {
    fn as_str(self) -> &'static str {
        match self {
            Self::Status => "status",
            Self::Check => "check",
            Self::On => "on",
            Self::Off => "off",
            Self::Reboot => "reboot",
            Self::Cycle => "cycle",
        }
    }
}

/// Output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, ValueEnum)]
pub(crate) enum Output {
    /// One human-readable line on stdout; errors on stderr.
    #[default]
    Text,
    /// One JSON object on stdout, including the timeline.
    Json,
}

/// How to trust the BMC's TLS certificate (at most one; default: the system CA bundle).
#[derive(Debug, Clone, Args)]
#[group(multiple = false)]
pub(crate) struct TrustArgs {
    /// Trust only the CA certificates in this PEM file.
    #[arg(long, value_name = "FILE")]
    pub(crate) ca: Option<PathBuf>,
    /// Accept exactly the certificate with this SHA-256 fingerprint (hex, colons allowed);
    /// works for self-signed CA:TRUE certificates.
    #[arg(long, value_name = "SHA256")]
    pub(crate) fingerprint: Option<String>,
    /// Do not verify the certificate at all (logged as a warning and counted).
    #[arg(long)]
    pub(crate) insecure: bool,
}

/// Arguments of `metalguard-agent bmc`.
#[derive(Debug, Args)]
#[command(after_help = EXIT_CODES)]
pub(crate) struct BmcArgs {
    /// The operation.
    #[arg(value_enum)]
    pub(crate) action: BmcAction,
    /// BMC address: redfish+https://HOST[:PORT][/redfish/v1/Systems/ID], redfish+http://…,
    /// ipmi://HOST[:PORT]; metal3's redfish://, idrac-redfish://, ilo5-redfish:// too.
    #[arg(long, value_name = "URL", env = "METALGUARD_BMC")]
    pub(crate) bmc: String,
    /// A directory with `username` and `password` files, or a file of `username=` and
    /// `password=` lines; refused when readable by group or others.
    #[arg(long, value_name = "PATH", env = "METALGUARD_BMC_CREDENTIALS")]
    pub(crate) credentials: PathBuf,
    #[command(flatten)]
    pub(crate) trust: TrustArgs,
    /// Overall deadline of the operation (e.g. 30s, 2m).
    #[arg(long, value_name = "DURATION", default_value = DEFAULT_TIMEOUT, value_parser = humantime::parse_duration)]
    pub(crate) timeout: Duration,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    pub(crate) output: Output,
    /// Print the timeline of requests and answers on stderr (always printed on failure).
    #[arg(long, short)]
    pub(crate) verbose: bool,
}

/// What one operation produced, printed as text or JSON.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    /// The BMC address (no credentials).
    pub(crate) bmc: String,
    /// The operation.
    pub(crate) action: &'static str,
    /// `ok`, `failed` or `fenced-power-on-failed`.
    pub(crate) result: &'static str,
    /// The last power state read, for `status` and `check`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) power_state: Option<String>,
    /// The system's identity as the BMC reports it, for `check`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) identity: Option<SystemIdentity>,
    /// Whether Off was verified (fencing operations only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) fenced: Option<bool>,
    /// A one-line summary.
    pub(crate) message: String,
    /// The class of the failure (`unreachable`, `tls`, `credentials-refused`,
    /// `account-locked`, `insufficient-privilege`, `unexpected-answer`), when it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) failure: Option<CheckFailure>,
    /// The error and its causes, outermost first.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) error: Vec<String>,
    /// Wall time in milliseconds.
    pub(crate) elapsed_ms: f64,
    /// TLS handshakes accepted without verification in this run.
    pub(crate) insecure_tls_handshakes: u64,
    /// Requests, answers and decisions.
    pub(crate) timeline: Vec<TimelineEntry>,
    /// The exit code.
    #[serde(skip)]
    pub(crate) exit: u8,
}

/// Everything needed to talk to one BMC, checked before any traffic.
#[derive(Debug)]
pub(crate) struct Target {
    pub(crate) address: BmcAddress,
    pub(crate) credentials: Credentials,
    pub(crate) trust: TlsTrust,
}

/// A configuration problem, found before the BMC is contacted.
#[derive(Debug, thiserror::Error)]
pub(crate) enum SetupError {
    /// The address is invalid.
    #[error(transparent)]
    Address(#[from] metalguard_bmc::AddressError),
    /// The credentials could not be loaded.
    #[error(transparent)]
    Credentials(#[from] metalguard_bmc::CredentialsError),
    /// The TLS options are invalid.
    #[error(transparent)]
    Tls(#[from] metalguard_bmc::TlsError),
    /// The client could not be built.
    #[error(transparent)]
    Bmc(#[from] BmcError),
    /// The async runtime could not start.
    #[error("cannot start the async runtime")]
    Runtime(#[source] std::io::Error),
}

/// Turns the trust flags into a [`TlsTrust`].
pub(crate) fn trust_from(args: &TrustArgs) -> Result<TlsTrust, SetupError> {
    if args.insecure {
        return Ok(TlsTrust::Insecure);
    }
    if let Some(ca) = &args.ca {
        return Ok(TlsTrust::CaBundle(ca.clone()));
    }
    if let Some(fingerprint) = &args.fingerprint {
        return Ok(TlsTrust::Fingerprint(parse_fingerprint(fingerprint)?));
    }
    Ok(TlsTrust::SystemRoots)
}

/// Per-call timeouts that fit under the overall deadline.
pub(crate) fn call_timeouts(deadline: Duration) -> CallTimeouts {
    CallTimeouts {
        connect: MAX_CONNECT_TIMEOUT.min(deadline),
        request: MAX_REQUEST_TIMEOUT.min(deadline),
    }
}

/// Runs `metalguard-agent bmc`.
pub(crate) fn run(args: &BmcArgs) -> ExitCode {
    init_logging(args.verbose);
    let target = match load_target(&args.bmc, &args.credentials, &args.trust) {
        Ok(target) => target,
        Err(error) => return setup_failed(&error, args.output),
    };
    if target.trust == TlsTrust::Insecure {
        tracing::warn!(bmc = %target.address, "tls certificate verification disabled by --insecure");
    }
    let timeouts = call_timeouts(args.timeout);
    let report = match execute(target, args.action, args.timeout, timeouts) {
        Ok(report) => report,
        Err(error) => return setup_failed(&error, args.output),
    };
    print_report(&report, args.output, args.verbose);
    ExitCode::from(report.exit)
}

/// Parses the address, loads the credentials and checks the TLS options.
pub(crate) fn load_target(
    bmc: &str,
    credentials: &std::path::Path,
    trust: &TrustArgs,
) -> Result<Target, SetupError> {
    Ok(Target {
        address: bmc.parse()?,
        credentials: Credentials::load(credentials)?,
        trust: trust_from(trust)?,
    })
}

/// Runs one operation on a fresh single-threaded runtime.
pub(crate) fn execute(
    target: Target,
    action: BmcAction,
    deadline: Duration,
    timeouts: CallTimeouts,
) -> Result<Report, SetupError> {
    let mut bmc = Bmc::new(&target.address, target.credentials, &target.trust, timeouts)?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(SetupError::Runtime)?;
    Ok(runtime.block_on(operate(&mut bmc, action, deadline)))
}

async fn operate(bmc: &mut Bmc, action: BmcAction, deadline: Duration) -> Report {
    let started = tokio::time::Instant::now();
    let mut report = match action {
        BmcAction::Status => status(bmc, deadline).await,
        BmcAction::Check => check(bmc, deadline).await,
        BmcAction::Cycle => cycle(bmc, deadline).await,
        BmcAction::On => fenced(bmc, action, FenceAction::On, deadline).await,
        BmcAction::Off => fenced(bmc, action, FenceAction::Off, deadline).await,
        BmcAction::Reboot => fenced(bmc, action, FenceAction::Reboot, deadline).await,
    };
    if let Ok(Err(error)) = tokio::time::timeout(CLOSE_TIMEOUT, bmc.close()).await {
        tracing::warn!(bmc = bmc.address(), error = %error, "bmc logout failed");
    }
    report
        .timeline
        .extend(std::mem::take(bmc.timeline_mut()).entries().iter().cloned());
    report.elapsed_ms = started.elapsed().as_secs_f64() * 1000.0;
    report.insecure_tls_handshakes = insecure_handshakes();
    report
}

fn base_report(bmc: &Bmc, action: BmcAction) -> Report {
    Report {
        bmc: bmc.address().to_owned(),
        action: action.as_str(),
        result: "ok",
        power_state: None,
        identity: None,
        fenced: None,
        message: String::new(),
        failure: None,
        error: Vec::new(),
        elapsed_ms: 0.0,
        insecure_tls_handshakes: 0,
        timeline: Vec::new(),
        exit: EXIT_OK,
    }
}

fn failed(mut report: Report, error: &BmcError) -> Report {
    report.result = "failed";
    report.message = error.to_string();
    report.failure = Some(error.check_failure());
    report.error = chain(error);
    report.exit = EXIT_FAILED;
    report
}

fn deadline_error(bmc: &Bmc, operation: &str, deadline: Duration) -> BmcError {
    BmcError::Deadline {
        bmc: bmc.address().to_owned(),
        operation: operation.to_owned(),
        deadline,
    }
}

async fn status(bmc: &mut Bmc, deadline: Duration) -> Report {
    let report = base_report(bmc, BmcAction::Status);
    let result = match tokio::time::timeout(deadline, bmc.power_state()).await {
        Ok(result) => result,
        Err(_) => Err(deadline_error(bmc, "power status", deadline)),
    };
    match result {
        Ok(state) => {
            let exit = match state {
                PowerState::On => EXIT_OK,
                PowerState::Off => EXIT_OFF,
                _ => EXIT_TRANSITIONAL,
            };
            Report {
                power_state: Some(state.as_str().to_owned()),
                message: format!("power is {state}"),
                exit,
                ..report
            }
        }
        Err(error) => failed(report, &error),
    }
}

/// The power state, then the identity, under one deadline; nothing is sent that could change
/// power.
async fn check(bmc: &mut Bmc, deadline: Duration) -> Report {
    let report = base_report(bmc, BmcAction::Check);
    let read = async {
        let state = bmc.power_state().await?;
        let identity = bmc.identity().await?;
        Ok::<_, BmcError>((state, identity))
    };
    let result = match tokio::time::timeout(deadline, read).await {
        Ok(result) => result,
        Err(_) => Err(deadline_error(bmc, "check", deadline)),
    };
    match result {
        Ok((state, identity)) => Report {
            power_state: Some(state.as_str().to_owned()),
            message: format!("power is {state}; {identity}"),
            identity: Some(identity),
            ..report
        },
        Err(error) => failed(report, &error),
    }
}

async fn cycle(bmc: &mut Bmc, deadline: Duration) -> Report {
    let report = base_report(bmc, BmcAction::Cycle);
    let result = match tokio::time::timeout(deadline, bmc.power_cycle()).await {
        Ok(result) => result,
        Err(_) => Err(deadline_error(bmc, "power cycle", deadline)),
    };
    match result {
        Ok(()) => Report {
            message: "power cycle requested (a cycle cannot be verified)".to_owned(),
            ..report
        },
        Err(error) => failed(report, &error),
    }
}

async fn fenced(
    bmc: &mut Bmc,
    action: BmcAction,
    fence_action: FenceAction,
    deadline: Duration,
) -> Report {
    let report = base_report(bmc, action);
    let options = FenceOptions {
        deadline,
        ..FenceOptions::default()
    };
    let outcome = fence(bmc, fence_action, &options).await;
    let fenced = (fence_action != FenceAction::On).then(|| outcome.status.is_fenced());
    let mut report = Report {
        fenced,
        message: outcome.status.summary().to_owned(),
        timeline: outcome.timeline.entries().to_vec(),
        ..report
    };
    match &outcome.status {
        FenceStatus::PoweredOff | FenceStatus::PoweredOn | FenceStatus::Rebooted => {}
        FenceStatus::FencedPowerOnFailed(error) => {
            report.result = "fenced-power-on-failed";
            report.error = chain(error);
            report.exit = EXIT_FENCED_POWER_ON_FAILED;
        }
        FenceStatus::Failed(error) => {
            let timeline = std::mem::take(&mut report.timeline);
            report = failed(report, error);
            report.timeline = timeline;
        }
    }
    report
}

/// An error and its causes, outermost first, one entry each.
pub(crate) fn chain(error: &dyn std::error::Error) -> Vec<String> {
    let mut lines = vec![error.to_string()];
    let mut source = error.source();
    while let Some(cause) = source {
        lines.push(cause.to_string());
        source = cause.source();
    }
    lines
}

fn setup_failed(error: &SetupError, output: Output) -> ExitCode {
    let lines = chain(error);
    match output {
        Output::Json => {
            let value = serde_json::json!({
                "result": "config-error",
                "message": lines.first().cloned().unwrap_or_default(),
                "error": lines,
            });
            println!("{value}");
        }
        Output::Text => print_error(&lines),
    }
    ExitCode::from(EXIT_CONFIG)
}

pub(crate) fn print_error(lines: &[String]) {
    for (i, line) in lines.iter().enumerate() {
        if i == 0 {
            eprintln!("error: {line}");
        } else {
            eprintln!("  caused by: {line}");
        }
    }
}

pub(crate) fn print_report(report: &Report, output: Output, verbose: bool) {
    match output {
        Output::Json => match serde_json::to_string(report) {
            Ok(text) => println!("{text}"),
            Err(error) => eprintln!("error: cannot encode the report: {error}"),
        },
        Output::Text => {
            if report.result == "failed" {
                print_error(&report.error);
                if let Some(class) = report.failure {
                    eprintln!("  class: {} ({})", class.name(), class.remedy());
                }
            } else {
                println!(
                    "{}: {} (bmc {}, {:.0} ms)",
                    report.action, report.message, report.bmc, report.elapsed_ms
                );
                if report.result == "fenced-power-on-failed" {
                    print_error(&report.error);
                }
            }
        }
    }
    if verbose || (output == Output::Text && report.exit == EXIT_FAILED) {
        for entry in &report.timeline {
            eprintln!(
                "{:>9.1} ms {:?} {}",
                entry.elapsed.as_secs_f64() * 1000.0,
                entry.direction,
                entry.what
            );
        }
    }
}

/// Logs to stderr (warnings by default, debug with `--verbose`; `RUST_LOG` overrides).
pub(crate) fn init_logging(verbose: bool) {
    let default = if verbose {
        "warn,metalguard_bmc=debug,metalguard_agent=debug"
    } else {
        "warn"
    };
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .without_time()
        .try_init();
}
