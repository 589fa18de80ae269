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

/// Kind of an option's value, as the metadata names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Flag,
    Text,
    Integer,
    Seconds,
}

/// One option of the agent.
#[derive(Debug)]
struct Spec {
    name: &'static str,
    short: Option<char>,
    aliases: &'static [&'static str],
    kind: Kind,
    default: Option<&'static str>,
    required: bool,
    description: &'static str,
}

const fn spec(name: &'static str, kind: Kind, description: &'static str) -> Spec {
    Spec {
        name,
        short: None,
        aliases: &[],
        kind,
        default: None,
        required: false,
        description,
    }
}

const SPECS: &[Spec] = &[
    Spec {
        short: Some('o'),
        default: Some("reboot"),
        required: true,
        ..spec("action", Kind::Text, "Fencing action")
    },
    Spec {
        short: Some('a'),
        aliases: &["ipaddr"],
        ..spec(
            "ip",
            Kind::Text,
            "IP address or hostname of the BMC (or use bmc)",
        )
    },
    Spec {
        short: Some('u'),
        default: Some("443"),
        ..spec("ipport", Kind::Integer, "TCP/UDP port of the BMC")
    },
    Spec {
        short: Some('l'),
        aliases: &["login"],
        ..spec("username", Kind::Text, "Login name (or use credentials)")
    },
    Spec {
        short: Some('p'),
        aliases: &["passwd"],
        ..spec(
            "password",
            Kind::Text,
            "Login password; prefer stdin or credentials",
        )
    },
    Spec {
        short: Some('n'),
        aliases: &["port"],
        ..spec(
            "plug",
            Kind::Text,
            "Accepted for compatibility; the BMC address names the system",
        )
    },
    spec(
        "nodename",
        Kind::Text,
        "Accepted for compatibility (sent by Pacemaker)",
    ),
    spec(
        "ssl",
        Kind::Flag,
        "Use HTTPS with certificate verification (the default)",
    ),
    spec(
        "ssl_secure",
        Kind::Flag,
        "Use HTTPS with certificate verification",
    ),
    spec(
        "ssl_insecure",
        Kind::Flag,
        "Use HTTPS without certificate verification",
    ),
    spec("notls", Kind::Flag, "Use plain HTTP"),
    Spec {
        short: Some('P'),
        ..spec(
            "lanplus",
            Kind::Flag,
            "Use IPMI v2.0 RMCP+ instead of Redfish (with ip)",
        )
    },
    spec(
        "systems_uri",
        Kind::Text,
        "Redfish System URI, e.g. /redfish/v1/Systems/1",
    ),
    spec(
        "bmc",
        Kind::Text,
        "BMC address URL (redfish+https://HOST/redfish/v1/Systems/ID, ipmi://HOST)",
    ),
    spec(
        "credentials",
        Kind::Text,
        "Credentials directory (username, password files) or key=value file, mode 0600",
    ),
    spec("ca", Kind::Text, "PEM CA bundle to trust for this BMC"),
    spec(
        "fingerprint",
        Kind::Text,
        "SHA-256 fingerprint of the BMC certificate to pin",
    ),
    Spec {
        default: Some("20"),
        ..spec(
            "power_timeout",
            Kind::Seconds,
            "Wait X seconds for a power change to be verified",
        )
    },
    Spec {
        default: Some("0"),
        ..spec(
            "power_wait",
            Kind::Seconds,
            "Accepted for compatibility; the state is read back instead",
        )
    },
    Spec {
        default: Some("5"),
        ..spec("login_timeout", Kind::Seconds, "Connect timeout in seconds")
    },
    Spec {
        default: Some("15"),
        ..spec(
            "shell_timeout",
            Kind::Seconds,
            "Timeout of one request in seconds",
        )
    },
    Spec {
        default: Some("0"),
        ..spec(
            "delay",
            Kind::Seconds,
            "Wait X seconds before a fencing action",
        )
    },
    Spec {
        short: Some('v'),
        ..spec(
            "verbose",
            Kind::Flag,
            "Verbose mode: print the timeline on stderr",
        )
    },
    Spec {
        short: Some('D'),
        ..spec(
            "debug_file",
            Kind::Text,
            "Accepted for compatibility; diagnostics go to stderr",
        )
    },
];

/// Options as given, by canonical name; later values win.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
struct Options {
    values: Vec<(&'static str, String)>,
    /// Whether the password came from the command line (visible to other users).
    password_on_argv: bool,
}

impl Options {
    fn set(&mut self, name: &'static str, value: String) {
        self.values.retain(|(n, _)| *n != name);
        self.values.push((name, value));
    }

    fn get(&self, name: &str) -> Option<&str> {
        self.values
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    fn flag(&self, name: &str) -> bool {
        self.get(name).is_some_and(|v| {
            matches!(
                v.to_ascii_lowercase().as_str(),
                "" | "1" | "true" | "yes" | "on"
            )
        })
    }

    fn seconds(&self, name: &str, default: Duration) -> Result<Duration, String> {
        match self.get(name) {
            None | Some("") => Ok(default),
            Some(text) => text
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .map(Duration::from_secs_f64)
                .ok_or_else(|| format!("option {name} is not a number of seconds: {text}")),
        }
    }
}

fn find(name: &str) -> Option<&'static Spec> {
    let name = name.replace('-', "_");
    SPECS
        .iter()
        .find(|s| s.name == name || s.aliases.contains(&name.as_str()))
}

/// Parses command-line options; unknown options are an error (as in fence-agents).
fn parse_args(args: &[String]) -> Result<Options, String> {
    let mut options = Options::default();
    let mut iter = args.iter();
    while let Some(arg) = iter.next() {
        let (spec, inline) = if let Some(long) = arg.strip_prefix("--") {
            let (name, inline) = match long.split_once('=') {
                Some((name, value)) => (name, Some(value.to_owned())),
                None => (long, None),
            };
            let spec = find(name).ok_or_else(|| format!("unrecognised option --{name}"))?;
            (spec, inline)
        } else if let Some(short) = arg.strip_prefix('-').filter(|s| !s.is_empty()) {
            let mut chars = short.chars();
            let letter = chars.next().unwrap_or('-');
            let spec = SPECS
                .iter()
                .find(|s| s.short == Some(letter))
                .ok_or_else(|| format!("unrecognised option -{letter}"))?;
            let rest: String = chars.collect();
            (spec, (!rest.is_empty()).then_some(rest))
        } else {
            return Err(format!("unexpected argument {arg}"));
        };
        let value = if spec.kind == Kind::Flag {
            inline.unwrap_or_default()
        } else {
            match inline {
                Some(value) => value,
                None => iter
                    .next()
                    .cloned()
                    .ok_or_else(|| format!("option {} needs a value", spec.name))?,
            }
        };
        if spec.name == "password" {
            options.password_on_argv = true;
        }
        options.set(spec.name, value);
    }
    Ok(options)
}

/// Parses `name=value` lines from stdin; returns the options and warnings for unknown keys.
fn parse_stdin(text: &str) -> (Options, Vec<String>) {
    let mut options = Options::default();
    let mut warnings = Vec::new();
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (name, value) = match line.split_once('=') {
            Some((name, value)) => (name.trim(), value.trim()),
            None => (line, ""),
        };
        let value = strip_quotes(value);
        match find(name) {
            Some(spec) => options.set(spec.name, value.to_owned()),
            None => warnings.push(format!("ignoring unknown option {name}")),
        }
    }
    (options, warnings)
}

fn strip_quotes(value: &str) -> &str {
    for quote in ['"', '\''] {
        if value.len() >= 2 && value.starts_with(quote) && value.ends_with(quote) {
            return &value[1..value.len() - 1];
        }
    }
    value
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

fn xml_escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// The agent's metadata XML (validates against fence-agents' `metadata.rng`).
fn metadata() -> String {
    use std::fmt::Write as _;
    let mut xml = String::from(
        "<?xml version=\"1.0\" ?>\n<resource-agent name=\"fence_metalguard\" shortdesc=\"Fence agent for Redfish and IPMI BMCs with verified power-off (metalguard)\" >\n\
         <longdesc>fence_metalguard (metalguard-agent fence-agent) powers a machine off, on or reboots it through its BMC over Redfish (HTTPS/HTTP) or IPMI v2.0 RMCP+, reads the power state back until the change is verified, bounds every call with timeouts, and never logs the password.</longdesc>\n\
         <vendor-url>https://example.invalid/metalguard</vendor-url>\n<parameters>\n",
    );
    for spec in SPECS {
        let getopt = {
            let value = match spec.kind {
                Kind::Flag => String::new(),
                _ => format!("=[{}]", spec.name),
            };
            let long = format!("--{}{value}", spec.name.replace('_', "-"));
            match spec.short {
                Some(short) => format!("-{short}, {long}"),
                None => long,
            }
        };
        let kind = match spec.kind {
            Kind::Flag => "boolean",
            Kind::Text => "string",
            Kind::Integer => "integer",
            Kind::Seconds => "second",
        };
        let default = spec
            .default
            .map(|d| format!(" default=\"{}\"", xml_escape(d)))
            .unwrap_or_default();
        let _ = write!(
            xml,
            "\t<parameter name=\"{}\" unique=\"0\" required=\"{}\">\n\t\t<getopt mixed=\"{}\" />\n\t\t<content type=\"{kind}\"{default} />\n\t\t<shortdesc lang=\"en\">{}</shortdesc>\n\t</parameter>\n",
            spec.name,
            u8::from(spec.required),
            xml_escape(&getopt),
            xml_escape(spec.description)
        );
        for alias in spec.aliases {
            let _ = write!(
                xml,
                "\t<parameter name=\"{alias}\" unique=\"0\" required=\"0\" deprecated=\"1\">\n\t\t<getopt mixed=\"{}\" />\n\t\t<content type=\"{kind}\" />\n\t\t<shortdesc lang=\"en\">{}</shortdesc>\n\t</parameter>\n",
                xml_escape(&getopt),
                xml_escape(spec.description)
            );
        }
    }
    xml.push_str("</parameters>\n<actions>\n");
    for (action, extra) in [
        ("on", " automatic=\"0\""),
        ("off", ""),
        ("reboot", ""),
        ("status", ""),
        ("monitor", ""),
        ("metadata", ""),
        ("validate-all", ""),
    ] {
        let _ = writeln!(xml, "\t<action name=\"{action}\"{extra} />");
    }
    xml.push_str("</actions>\n</resource-agent>\n");
    xml
}

#[cfg(test)]
mod tests;
