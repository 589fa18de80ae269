//! `metalguard-agent fence HOST --direct`: break-glass power fencing straight through a BMC,
//! bypassing the controller and its quorum guard.
//!
//! Before the BMC is touched, the fence records a **hold** (`metalguard_api::snapshot::Hold`,
//! id `<this host>/<ms since the epoch>`): durably in this host's state directory
//! ([`crate::holds`]), where the agent daemon finds it and carries it in every report, and in
//! the controller's store when the controller answers within a short deadline (posted with
//! this host's agent certificate; a failure is reported, not fatal). While the hold stands,
//! metalguard does not touch the held host's power, until a person runs
//! `metalguard-controller release HOST`. The event is logged to journald (stderr when there is
//! no journal) with the user, target, reason, action and hold id; the `--bmc` value is logged
//! redacted (a URL may carry a password).

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use clap::{Args, ValueEnum};
use metalguard_api::duration::Timestamp;
use metalguard_api::snapshot::Hold;

use crate::bmc_cmd::{self, BmcAction, Output, TrustArgs};
use crate::config::{self, AgentConfig, DEFAULT_CONFIG};
use crate::daemon::link::Link;
use crate::holds::HoldStore;

/// The longest the fence waits for the controller to take the hold, in all.
const HOLD_POST_DEADLINE: Duration = Duration::from_secs(10);
/// The timeout of one request to one controller.
const HOLD_POST_TIMEOUT: Duration = Duration::from_secs(4);

/// What a break-glass fence does.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum FenceKind {
    /// Force off and verify Off.
    Off,
    /// Verified off, then on and verified On.
    Reboot,
    /// Power on and verify On.
    On,
}

impl FenceKind {
    /// The name recorded in the hold (`off`, `reboot`, `on`).
    fn name(self) -> &'static str {
        match self {
            Self::Off => "off",
            Self::Reboot => "reboot",
            Self::On => "on",
        }
    }
}

/// Arguments of `metalguard-agent fence`.
#[derive(Debug, Args)]
pub(crate) struct FenceArgs {
    /// The host being fenced (recorded in the hold; must be its inventory name).
    host: String,
    /// Talk to the BMC directly, bypassing the controller and its quorum guard. Required: the
    /// guarded path is `metalguard-controller fence`.
    #[arg(long, required = true)]
    direct: bool,
    /// Why (recorded in the hold and the log).
    #[arg(long)]
    reason: String,
    /// What to do.
    #[arg(long, value_enum, default_value = "off")]
    action: FenceKind,
    /// The host's BMC address.
    #[arg(long, value_name = "URL")]
    bmc: String,
    /// Credentials directory or file (refused when readable by group or others).
    #[arg(long, value_name = "PATH")]
    credentials: PathBuf,
    #[command(flatten)]
    trust: TrustArgs,
    /// Overall deadline.
    #[arg(long, value_parser = humantime::parse_duration, default_value = "60s")]
    timeout: Duration,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: Output,
    /// The agent configuration of this host: its name, state directory and controller (the
    /// hold is recorded with them).
    #[arg(long, short, env = "METALGUARD_AGENT_CONFIG", default_value = DEFAULT_CONFIG)]
    config: PathBuf,
    /// Fence without recording a hold. The controller then sees a silent host and powers it
    /// back on; for a host without a usable agent configuration only.
    #[arg(long)]
    no_hold: bool,
}

/// Break-glass fence: a hold first, loud in the log, guarded by nothing but the operator.
pub(crate) fn fence(args: &FenceArgs) -> ExitCode {
    crate::daemon::logging::init_admin();
    if args.reason.trim().is_empty() {
        eprintln!("--reason must say why: it is recorded in the hold and the log");
        return ExitCode::from(bmc_cmd::EXIT_CONFIG);
    }
    if metalguard_api::text::has_control(&args.reason) {
        eprintln!(
            "--reason contains a control character: it would reach terminals and logs as it is; write it as plain text"
        );
        return ExitCode::from(bmc_cmd::EXIT_CONFIG);
    }
    // From the environment: escaped, never refused (the person's fence must go on).
    let user = metalguard_api::text::escaped(&invoking_user());
    let config = if args.no_hold {
        None
    } else {
        match hold_config(&args.config) {
            Ok(config) => Some(config),
            Err(problem) => {
                eprintln!("{problem}");
                eprintln!(
                    "nothing was done: without a hold the controller would power {} back on; fix the configuration, or pass --no-hold to fence anyway",
                    args.host
                );
                return ExitCode::from(bmc_cmd::EXIT_CONFIG);
            }
        }
    };
    let hold = config
        .as_ref()
        .map(|c| new_hold(args, c.host_name(), &user, now()));
    tracing::error!(
        user = %user,
        target_host = %args.host,
        reason = %args.reason,
        action = args.action.name(),
        hold_id = hold.as_ref().map_or("none (--no-hold)", |h| h.id.as_str()),
        executing_host = config.as_ref().map_or("unknown", |c| c.host_name()),
        bmc = %redact_bmc(&args.bmc),
        "BREAK-GLASS FENCE: bypassing the controller and the etcd quorum guard"
    );
    let target = match bmc_cmd::load_target(&args.bmc, &args.credentials, &args.trust) {
        Ok(target) => target,
        Err(err) => {
            bmc_cmd::print_error(&bmc_cmd::chain(&err));
            return ExitCode::from(bmc_cmd::EXIT_CONFIG);
        }
    };
    if let (Some(config), Some(hold)) = (&config, &hold) {
        if let Err(problem) = record_locally(config, hold) {
            eprintln!("{problem}");
            eprintln!("nothing was done: the hold could not be recorded before the fence");
            return ExitCode::from(bmc_cmd::EXIT_CONFIG);
        }
        post_to_controller(config, hold);
    } else {
        tracing::warn!(target_host = %args.host, "no hold recorded (--no-hold): the controller will treat the host as silent and power it back on");
    }
    let action = match args.action {
        FenceKind::Off => BmcAction::Off,
        FenceKind::Reboot => BmcAction::Reboot,
        FenceKind::On => BmcAction::On,
    };
    let exit = match bmc_cmd::execute(
        target,
        action,
        args.timeout,
        bmc_cmd::call_timeouts(args.timeout),
    ) {
        Ok(report) => {
            bmc_cmd::print_report(&report, args.output, false);
            report.exit
        }
        Err(err) => {
            bmc_cmd::print_error(&bmc_cmd::chain(&err));
            bmc_cmd::EXIT_CONFIG
        }
    };
    tracing::error!(
        target_host = %args.host,
        hold_id = hold.as_ref().map_or("none (--no-hold)", |h| h.id.as_str()),
        exit,
        "break-glass fence finished"
    );
    if hold.is_some() {
        eprintln!(
            "{} is held: metalguard leaves its power alone until `metalguard-controller release {} --reason TEXT`",
            args.host, args.host
        );
    }
    ExitCode::from(exit)
}

/// The configuration the hold needs: the host name (its id) and the state directory (where
/// the daemon reads it). Problems elsewhere in the file are told, not fatal.
fn hold_config(path: &std::path::Path) -> Result<AgentConfig, String> {
    let (loaded, problems) = config::load_lenient(path).map_err(|err| {
        format!(
            "the agent configuration {} cannot be read, so no hold can be recorded:\n  {}",
            path.display(),
            err.problems().join("\n  ")
        )
    })?;
    let (needed, other): (Vec<&String>, Vec<&String>) = problems
        .iter()
        .partition(|p| p.starts_with("host:") || p.starts_with("state.dir:"));
    if !needed.is_empty() {
        return Err(format!(
            "the agent configuration {} does not name this host or its state directory, so no hold can be recorded:\n  {}",
            path.display(),
            needed
                .iter()
                .map(|p| p.as_str())
                .collect::<Vec<_>>()
                .join("\n  ")
        ));
    }
    for problem in other {
        tracing::warn!(problem = %problem, "agent configuration problem (not needed for the break-glass fence)");
    }
    Ok(loaded.config)
}

/// The hold of this fence, made on `host` at `at`.
fn new_hold(args: &FenceArgs, host: &str, user: &str, at: Timestamp) -> Hold {
    Hold {
        id: format!("{host}/{}", at.as_millis()),
        target: args.host.clone(),
        since: at,
        by: format!("{user} on {host}"),
        reason: args.reason.clone(),
        action: args.action.name().to_owned(),
    }
}

/// Writes the hold where the daemon finds it; an error means the fence must not go on.
fn record_locally(config: &AgentConfig, hold: &Hold) -> Result<(), String> {
    let store = HoldStore::new(&config.state.dir);
    let recorded = store.record(hold).map_err(|err| {
        format!(
            "hold {} could not be recorded: {}",
            hold.id,
            bmc_cmd::chain(&err).join(": ")
        )
    })?;
    tracing::warn!(hold_id = %hold.id, path = %recorded.path.display(), "break-glass hold recorded on this host");
    eprintln!("hold {} recorded in {}", hold.id, recorded.path.display());
    if let Some(warning) = recorded.ownership_warning {
        tracing::error!(hold_id = %hold.id, problem = %warning, "the agent daemon may not be able to read the hold");
        eprintln!("warning: {warning}");
    }
    Ok(())
}

/// Posts the hold to the controller under [`HOLD_POST_DEADLINE`]; tells what happened.
fn post_to_controller(config: &AgentConfig, hold: &Hold) {
    let Some(controller) = &config.controller else {
        eprintln!(
            "no [controller] configured: hold {} is known to this host only",
            hold.id
        );
        return;
    };
    let outcome = Link::new(controller, config.host_name()).and_then(|link| {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the async runtime: {e}"))?;
        runtime.block_on(async {
            match tokio::time::timeout(HOLD_POST_DEADLINE, link.post_hold(hold, HOLD_POST_TIMEOUT))
                .await
            {
                Ok(Ok(ack)) => Ok(ack),
                Ok(Err(err)) => Err(crate::daemon::execute::error_chain(&err)),
                Err(_) => Err(format!(
                    "no controller answered within {}",
                    humantime::format_duration(HOLD_POST_DEADLINE)
                )),
            }
        })
    });
    match outcome {
        Ok(ack) => {
            tracing::warn!(hold_id = %ack.id, first = ack.first, "break-glass hold recorded by the controller");
            eprintln!("hold {} recorded by the controller", ack.id);
        }
        Err(problem) => {
            tracing::error!(hold_id = %hold.id, problem = %problem, "break-glass hold not recorded by the controller; the agent daemon's reports carry it");
            eprintln!(
                "warning: hold {} not recorded by the controller ({problem}); the agent daemon on this host reports it once it runs and reaches the controller",
                hold.id
            );
        }
    }
}

/// The person running this command: `SUDO_USER` (who ran sudo), else `USER`, else the uid.
fn invoking_user() -> String {
    let named = |key: &str| std::env::var(key).ok().filter(|v| !v.is_empty());
    named("SUDO_USER")
        .or_else(|| named("USER"))
        .unwrap_or_else(|| {
            use std::os::unix::fs::MetadataExt as _;
            std::fs::metadata("/proc/self").map_or_else(
                |_| "unknown user".to_owned(),
                |m| format!("uid {}", m.uid()),
            )
        })
}

fn now() -> Timestamp {
    Timestamp(
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    )
}

/// The `--bmc` value as it may be logged: the parsed address (scheme, host, port and system
/// path: never user information or a query), or, for an address that does not parse, its
/// scheme and host only.
fn redact_bmc(text: &str) -> String {
    if let Ok(address) = text.parse::<metalguard_bmc::BmcAddress>() {
        return address.to_string();
    }
    let Some((scheme, rest)) = text.split_once("://") else {
        return "<unparseable address, redacted>".to_owned();
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    let host = authority.rsplit('@').next().unwrap_or_default();
    let note = if authority.contains('@') {
        " (credentials in the address redacted)"
    } else {
        ""
    };
    format!("{scheme}://{host}{note}")
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(flatten)]
        fence: FenceArgs,
    }

    #[test]
    fn the_bmc_address_is_logged_without_credentials() {
        // A query is refused by the address parser (the fence is refused too): scheme and
        // host only.
        assert_eq!(
            redact_bmc("redfish+https://10.0.0.5/redfish/v1/Systems/1?password=hunter2"),
            "redfish+https://10.0.0.5"
        );
        assert_eq!(
            redact_bmc("redfish+https://10.0.0.5/redfish/v1/Systems/1"),
            "redfish+https://10.0.0.5:443/redfish/v1/Systems/1"
        );
        let text = redact_bmc("redfish+https://admin:hunter2@10.0.0.5/redfish/v1/Systems/1");
        assert_eq!(
            text,
            "redfish+https://10.0.0.5 (credentials in the address redacted)"
        );
        assert_eq!(
            redact_bmc("ipmi://u:hunter2@bmc?x"),
            "ipmi://bmc (credentials in the address redacted)"
        );
        assert_eq!(redact_bmc("hunter2"), "<unparseable address, redacted>");
        for text in [
            redact_bmc("redfish+https://admin:hunter2@10.0.0.5/redfish/v1/Systems/1"),
            redact_bmc("ipmi://u:hunter2@bmc"),
            redact_bmc("nope://x/?pw=hunter2"),
        ] {
            assert!(!text.contains("hunter2"), "{text}");
        }
    }

    #[test]
    fn the_hold_names_this_host_the_user_and_the_action() {
        let cli = Cli::try_parse_from([
            "fence",
            "cp-1",
            "--direct",
            "--reason",
            "disk resets",
            "--action",
            "reboot",
            "--bmc",
            "ipmi://10.0.0.5",
            "--credentials",
            "/etc/metalguard/bmc/cp-1",
            "--config",
            "/tmp/agent.toml",
        ])
        .unwrap();
        assert!(!cli.fence.no_hold);
        let hold = new_hold(&cli.fence, "cp-2", "alice", Timestamp(1_700_000_000_123));
        assert_eq!(
            hold,
            Hold {
                id: "cp-2/1700000000123".into(),
                target: "cp-1".into(),
                since: Timestamp(1_700_000_000_123),
                by: "alice on cp-2".into(),
                reason: "disk resets".into(),
                action: "reboot".into(),
            }
        );
        let missing = Cli::try_parse_from([
            "fence",
            "cp-1",
            "--reason",
            "r",
            "--bmc",
            "x",
            "--credentials",
            "y",
        ]);
        assert!(missing.unwrap_err().to_string().contains("--direct"));
    }

    #[test]
    fn a_hold_needs_the_host_name_and_state_directory_but_not_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("agent.toml");
        std::fs::write(
            &path,
            "host = \"cp-2\"\n[state]\ndir = \"/var/lib/mg\"\n[[probes.exec]]\nname = \"x\"\ncommand = [\"/nonexistent/probe\"]\n",
        )
        .unwrap();
        let config = hold_config(&path).unwrap();
        assert_eq!(config.host_name(), "cp-2");
        std::fs::write(&path, "[state]\ndir = \"/var/lib/mg\"\n").unwrap();
        let err = hold_config(&path).unwrap_err();
        assert!(err.contains("host: must be set"), "{err}");
        std::fs::write(&path, "host = \"cp-2\"\nbogus = 1\n").unwrap();
        let err = hold_config(&path).unwrap_err();
        assert!(
            err.contains("cannot be read") && err.contains("bogus"),
            "{err}"
        );
    }
}
