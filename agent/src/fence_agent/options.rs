//! fence-agent options: the option table (shared with the metadata), command-line and stdin
//! parsing, following the ClusterLabs fence-agents conventions.

use std::time::Duration;

/// The largest number of seconds an option takes (a day).
pub(super) const MAX_SECONDS: Duration = Duration::from_secs(24 * 60 * 60);
/// How much of an unknown option's name a warning quotes.
const MAX_NAME_CHARS: usize = 40;

/// Kind of an option's value, as the metadata names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Kind {
    Flag,
    Text,
    Integer,
    Seconds,
}

/// One option of the agent.
#[derive(Debug)]
pub(super) struct Spec {
    pub(super) name: &'static str,
    pub(super) short: Option<char>,
    pub(super) aliases: &'static [&'static str],
    pub(super) kind: Kind,
    pub(super) default: Option<&'static str>,
    pub(super) required: bool,
    pub(super) description: &'static str,
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

pub(super) const SPECS: &[Spec] = &[
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
pub(super) struct Options {
    values: Vec<(&'static str, String)>,
    /// Whether the password came from the command line (visible to other users).
    pub(super) password_on_argv: bool,
}

impl Options {
    fn set(&mut self, name: &'static str, value: String) {
        self.values.retain(|(n, _)| *n != name);
        self.values.push((name, value));
    }

    pub(super) fn get(&self, name: &str) -> Option<&str> {
        self.values
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, v)| v.as_str())
    }

    pub(super) fn flag(&self, name: &str) -> bool {
        self.get(name).is_some_and(|v| {
            matches!(
                v.to_ascii_lowercase().as_str(),
                "" | "1" | "true" | "yes" | "on"
            )
        })
    }

    /// A number of seconds: finite, not negative, at most [`MAX_SECONDS`] (a day; larger
    /// values would overflow the deadlines computed from them).
    pub(super) fn seconds(&self, name: &str, default: Duration) -> Result<Duration, String> {
        match self.get(name) {
            None | Some("") => Ok(default),
            Some(text) => text
                .parse::<f64>()
                .ok()
                .filter(|s| s.is_finite() && *s >= 0.0)
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .filter(|d| *d <= MAX_SECONDS)
                .ok_or_else(|| {
                    format!(
                        "option {name} is not a number of seconds from 0 to {}: {}",
                        MAX_SECONDS.as_secs(),
                        metalguard_api::text::excerpt(text, 40)
                    )
                }),
        }
    }
}

pub(super) fn find(name: &str) -> Option<&'static Spec> {
    let name = name.replace('-', "_");
    SPECS
        .iter()
        .find(|s| s.name == name || s.aliases.contains(&name.as_str()))
}

/// Parses command-line options; unknown options are an error (as in fence-agents).
pub(super) fn parse_args(args: &[String]) -> Result<Options, String> {
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

/// Parses `name=value` lines from stdin; returns the options and warnings for unknown keys
/// and stray lines. A warning never quotes a value or a line without `=` (a password pasted
/// on its own line must not reach Pacemaker's logs); an unknown key's name is quoted escaped
/// and cut.
pub(super) fn parse_stdin(text: &str) -> (Options, Vec<String>) {
    let mut options = Options::default();
    let mut warnings = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once('=') else {
            if let Some(spec) = find(line) {
                options.set(spec.name, String::new());
            } else {
                warnings.push(format!(
                    "ignoring stdin line {}: not name=value (content not shown)",
                    number + 1
                ));
            }
            continue;
        };
        let (name, value) = (name.trim(), value.trim());
        let value = strip_quotes(value);
        match find(name) {
            Some(spec) => options.set(spec.name, value.to_owned()),
            None => warnings.push(format!(
                "ignoring unknown option {} on stdin line {} (value not shown)",
                metalguard_api::text::excerpt(name, MAX_NAME_CHARS),
                number + 1
            )),
        }
    }
    (options, warnings)
}

pub(super) fn strip_quotes(value: &str) -> &str {
    for quote in ['"', '\''] {
        if value.len() >= 2 && value.starts_with(quote) && value.ends_with(quote) {
            return &value[1..value.len() - 1];
        }
    }
    value
}
