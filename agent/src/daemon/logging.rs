//! Logging: structured events to journald (fields become journal fields) when its socket
//! exists, else to stderr. `tracing-journald` has no fallback of its own. Event fields become
//! journal fields prefixed with `MG_` (`journalctl -o json` shows `MG_CONDITION`, ...).

use std::path::Path;

use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

/// journald's native socket.
const JOURNAL_SOCKET: &str = "/run/systemd/journal/socket";

/// Where logs went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LogTarget {
    /// The systemd journal.
    Journald,
    /// Standard error.
    Stderr,
}

/// For admin commands whose events must be on record (the break-glass fence): journald
/// (`info` and above, fields prefixed `MG_`) when its socket exists, and stderr for the person
/// at the terminal (`warn` and above) either way. `RUST_LOG` overrides both levels.
pub fn init_admin() -> LogTarget {
    use tracing_subscriber::Layer as _;
    let level = |default: &str| {
        EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default))
    };
    let stderr = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_target(false)
        .without_time()
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(level("warn"));
    let journald = Path::new(JOURNAL_SOCKET)
        .exists()
        .then(tracing_journald::layer)
        .and_then(Result::ok)
        .map(|layer| {
            layer
                .with_syslog_identifier("metalguard-agent".to_owned())
                .with_field_prefix(Some("MG".to_owned()))
                .with_filter(level("info"))
        });
    let target = if journald.is_some() {
        LogTarget::Journald
    } else {
        LogTarget::Stderr
    };
    let installed = tracing_subscriber::registry()
        .with(stderr)
        .with(journald)
        .try_init();
    if installed.is_ok() {
        target
    } else {
        LogTarget::Stderr
    }
}

/// Installs the global subscriber; `RUST_LOG` overrides the default `info` level.
pub fn init(force_stderr: bool) -> LogTarget {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new("info"));
    if !force_stderr
        && Path::new(JOURNAL_SOCKET).exists()
        && let Ok(layer) = tracing_journald::layer()
    {
        let layer = layer
            .with_syslog_identifier("metalguard-agent".to_owned())
            .with_field_prefix(Some("MG".to_owned()));
        let installed = tracing_subscriber::registry()
            .with(filter)
            .with(layer)
            .try_init();
        return if installed.is_ok() {
            LogTarget::Journald
        } else {
            LogTarget::Stderr
        };
    }
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
    LogTarget::Stderr
}
