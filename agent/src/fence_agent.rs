//! `metalguard-agent fence-agent`: the ClusterLabs fence-agents interface, so Pacemaker and
//! medik8s FAR can fence through metalguard.
//!
//! Options come as `--long-options` (and the usual short ones) or, when there are no
//! arguments, as `name=value` lines on stdin (comments and blank lines ignored, surrounding
//! quotes stripped, the last repeated key wins, unknown keys warned about and ignored).
//! Actions: on, off, reboot (default), status, monitor, metadata, validate-all. Exit codes:
//! 0 success, 1 failure, and `status` exits 2 when the machine is off. `reboot` exits 0 once
//! off is verified, even if powering on fails (said on stderr).
//!
//! Prefer `credentials=PATH` (or `password` on stdin) to `--password` on the command line,
//! where other users can read it.

use std::io::Read as _;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use metalguard_bmc::{BmcAddress, CallTimeouts, Credentials};

use crate::bmc_cmd::{self, BmcAction, Output, Target, TrustArgs};

mod metadata;
mod options;

use self::metadata::metadata;
use self::options::{Options, parse_args, parse_stdin};

/// Exit: success.
const EC_OK: u8 = 0;
/// Exit: failure.
const EC_FAILED: u8 = 1;
/// Exit: `status` found the machine off.
const EC_STATUS_OFF: u8 = 2;
/// Default `power_timeout` (fence-agents' default).
const DEFAULT_POWER_TIMEOUT: Duration = Duration::from_secs(20);
/// Default `login_timeout`: the connect timeout.
const DEFAULT_LOGIN_TIMEOUT: Duration = Duration::from_secs(5);
/// Default `shell_timeout`: one request's timeout.
const DEFAULT_SHELL_TIMEOUT: Duration = Duration::from_secs(15);

/// Arguments of `metalguard-agent fence-agent`: fence-agent options, parsed by this module.
#[derive(Debug, Args)]
pub(crate) struct FenceAgentArgs {
    /// fence-agent options (`-o off -a HOST ...`, `--action=off`); none: read them from stdin.
    #[arg(
        trailing_var_arg = true,
        allow_hyphen_values = true,
        value_name = "OPTION"
    )]
    pub(crate) options: Vec<String>,
}

/// The action, validated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Run(BmcAction),
    Monitor,
    Metadata,
    ValidateAll,
}

fn action_of(options: &Options) -> Result<Action, String> {
    Ok(match options.get("action").unwrap_or("reboot") {
        "on" => Action::Run(BmcAction::On),
        "off" => Action::Run(BmcAction::Off),
        "reboot" => Action::Run(BmcAction::Reboot),
        "status" => Action::Run(BmcAction::Status),
        "monitor" => Action::Monitor,
        "metadata" => Action::Metadata,
        "validate-all" => Action::ValidateAll,
        other => return Err(format!("action {other} is not supported")),
    })
}

/// The BMC address from `bmc`, or from `ip`, `ipport`, TLS flags and `systems_uri`.
fn address_of(options: &Options) -> Result<BmcAddress, String> {
    if let Some(bmc) = options.get("bmc").filter(|b| !b.is_empty()) {
        return bmc
            .parse()
            .map_err(|e: metalguard_bmc::AddressError| e.to_string());
    }
    let ip = options
        .get("ip")
        .filter(|ip| !ip.is_empty())
        .ok_or("no bmc address: give bmc or ip")?;
    let host = if ip.contains(':') && !ip.starts_with('[') {
        format!("[{ip}]")
    } else {
        ip.to_owned()
    };
    let url = if options.flag("lanplus") {
        let port = options.get("ipport").unwrap_or("623");
        format!("ipmi://{host}:{port}")
    } else {
        let scheme = if options.flag("notls") {
            "redfish+http"
        } else {
            "redfish+https"
        };
        let port =
            options
                .get("ipport")
                .unwrap_or(if options.flag("notls") { "80" } else { "443" });
        let path = options.get("systems_uri").unwrap_or("");
        format!("{scheme}://{host}:{port}{path}")
    };
    url.parse()
        .map_err(|e: metalguard_bmc::AddressError| e.to_string())
}

fn target_of(options: &Options) -> Result<Target, String> {
    let address = address_of(options)?;
    let credentials = if let Some(path) = options.get("credentials").filter(|c| !c.is_empty()) {
        Credentials::load(std::path::Path::new(path)).map_err(|e| bmc_cmd::chain(&e).join(": "))?
    } else {
        let username = options.get("username").filter(|u| !u.is_empty());
        let password = options.get("password").filter(|p| !p.is_empty());
        match (username, password) {
            (Some(username), Some(password)) => Credentials::new(username, password),
            _ => return Err("no credentials: give credentials, or username and password".into()),
        }
    };
    let trust_args = TrustArgs {
        ca: options.get("ca").filter(|c| !c.is_empty()).map(Into::into),
        fingerprint: options
            .get("fingerprint")
            .filter(|f| !f.is_empty())
            .map(str::to_owned),
        insecure: options.flag("ssl_insecure"),
    };
    let trust = bmc_cmd::trust_from(&trust_args).map_err(|e| bmc_cmd::chain(&e).join(": "))?;
    Ok(Target {
        address,
        credentials,
        trust,
    })
}

/// Runs `metalguard-agent fence-agent`.
pub(crate) fn run(args: &FenceAgentArgs) -> ExitCode {
    let options = if args.options.is_empty() {
        let mut text = String::new();
        if std::io::stdin().read_to_string(&mut text).is_err() {
            eprintln!("ERROR: cannot read options from stdin");
            return ExitCode::from(EC_FAILED);
        }
        let (options, warnings) = parse_stdin(&text);
        for warning in warnings {
            eprintln!("WARNING: {warning}");
        }
        options
    } else {
        match parse_args(&args.options) {
            Ok(options) => options,
            Err(problem) => {
                eprintln!("ERROR: {problem}");
                return ExitCode::from(EC_FAILED);
            }
        }
    };
    bmc_cmd::init_logging(options.flag("verbose"));
    ExitCode::from(perform(&options))
}

fn perform(options: &Options) -> u8 {
    let action = match action_of(options) {
        Ok(action) => action,
        Err(problem) => {
            eprintln!("ERROR: {problem}");
            return EC_FAILED;
        }
    };
    if action == Action::Metadata {
        print!("{}", metadata());
        return EC_OK;
    }
    if options.password_on_argv {
        eprintln!(
            "WARNING: a password on the command line is visible to other users; pass it on stdin or use credentials"
        );
    }
    let timings = (|| {
        Ok::<_, String>((
            options.seconds("power_timeout", DEFAULT_POWER_TIMEOUT)?,
            options.seconds("login_timeout", DEFAULT_LOGIN_TIMEOUT)?,
            options.seconds("shell_timeout", DEFAULT_SHELL_TIMEOUT)?,
            options.seconds("delay", Duration::ZERO)?,
        ))
    })();
    let target = timings.and_then(|t| target_of(options).map(|target| (t, target)));
    let ((power_timeout, login_timeout, shell_timeout, delay), target) = match target {
        Ok(ready) => ready,
        Err(problem) => {
            eprintln!("ERROR: {problem}");
            return EC_FAILED;
        }
    };
    let bmc_action = match action {
        Action::ValidateAll | Action::Metadata => return EC_OK,
        Action::Monitor => BmcAction::Status,
        Action::Run(action) => action,
    };
    let deadline = match bmc_action {
        BmcAction::Status => login_timeout + shell_timeout,
        BmcAction::Reboot => power_timeout * 2 + login_timeout,
        _ => power_timeout + login_timeout,
    };
    if !delay.is_zero() && bmc_action != BmcAction::Status {
        std::thread::sleep(delay);
    }
    let timeouts = CallTimeouts {
        connect: login_timeout,
        request: shell_timeout,
    };
    let report = match bmc_cmd::execute(target, bmc_action, deadline, timeouts) {
        Ok(report) => report,
        Err(error) => {
            bmc_cmd::print_error(&bmc_cmd::chain(&error));
            return EC_FAILED;
        }
    };
    if options.flag("verbose") {
        bmc_cmd::print_report(&report, Output::Text, true);
    }
    exit_of(action, &report)
}

/// Maps a report to the fence-agents exit code and prints their usual line.
fn exit_of(action: Action, report: &bmc_cmd::Report) -> u8 {
    if report.exit == bmc_cmd::EXIT_FAILED {
        for (i, line) in report.error.iter().enumerate() {
            let prefix = if i == 0 { "ERROR: " } else { "  caused by: " };
            eprintln!("{prefix}{line}");
        }
        return EC_FAILED;
    }
    match action {
        Action::Monitor | Action::Metadata | Action::ValidateAll => EC_OK,
        Action::Run(BmcAction::Status) => match report.exit {
            bmc_cmd::EXIT_OK => {
                println!("Status: ON");
                EC_OK
            }
            bmc_cmd::EXIT_OFF => {
                println!("Status: OFF");
                EC_STATUS_OFF
            }
            _ => {
                println!("Status: UNKNOWN");
                EC_FAILED
            }
        },
        Action::Run(BmcAction::Off) => {
            println!("Success: Powered OFF");
            EC_OK
        }
        Action::Run(BmcAction::On) => {
            println!("Success: Powered ON");
            EC_OK
        }
        Action::Run(_) => {
            if report.exit == bmc_cmd::EXIT_FENCED_POWER_ON_FAILED {
                eprintln!(
                    "WARNING: fenced (power off verified) but powering the machine on again failed"
                );
                for line in &report.error {
                    eprintln!("  caused by: {line}");
                }
            }
            println!("Success: Rebooted");
            EC_OK
        }
    }
}

#[cfg(test)]
mod tests;
