//! Admin subcommands that work on this host: `status` (the running daemon's local view). The
//! break-glass `fence --direct` is in [`crate::break_glass`].

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;

use crate::config::{self, DEFAULT_CONFIG};

/// How long `status` waits for the daemon.
const STATUS_TIMEOUT: Duration = Duration::from_secs(3);

/// Arguments of `metalguard-agent status`.
#[derive(Debug, Args)]
pub(crate) struct StatusArgs {
    /// The agent's configuration (to find its local endpoint).
    #[arg(long, short, env = "METALGUARD_AGENT_CONFIG", default_value = DEFAULT_CONFIG)]
    config: PathBuf,
    /// Print the raw JSON instead of a table.
    #[arg(long)]
    json: bool,
}

/// Prints the running daemon's local view; exit 1 when it is unreachable, 3 when a probe is
/// unhealthy.
pub(crate) fn status(args: &StatusArgs) -> ExitCode {
    let loaded = match config::load(&args.config) {
        Ok(loaded) => loaded,
        Err(err) => {
            eprintln!("{err}");
            return ExitCode::from(2);
        }
    };
    let addr = loaded.config.metrics.listen;
    let body = match fetch_status(addr) {
        Ok(body) => body,
        Err(err) => {
            eprintln!(
                "the agent's local endpoint {addr} did not answer: {err} (is metalguard-agent running?)"
            );
            return ExitCode::FAILURE;
        }
    };
    let view: serde_json::Value = match serde_json::from_str(&body) {
        Ok(view) => view,
        Err(err) => {
            eprintln!("unreadable status from {addr}: {err}");
            return ExitCode::FAILURE;
        }
    };
    if args.json {
        println!("{body}");
    } else {
        println!(
            "host {}  agent {}  ready {}",
            view["host"], view["version"], view["ready"]
        );
        println!(
            "{:<24} {:<8} {:<22} MESSAGE",
            "CONDITION", "HEALTHY", "REASON"
        );
        for probe in view["probes"].as_array().into_iter().flatten() {
            println!(
                "{:<24} {:<8} {:<22} {}",
                probe["condition"].as_str().unwrap_or("?"),
                probe["healthy"]
                    .as_bool()
                    .map_or("pending", |h| if h { "yes" } else { "NO" }),
                probe["reason"].as_str().unwrap_or(""),
                probe["message"].as_str().unwrap_or("")
            );
        }
    }
    let unhealthy = view["probes"]
        .as_array()
        .into_iter()
        .flatten()
        .any(|p| p["healthy"] == false);
    if unhealthy {
        ExitCode::from(3)
    } else {
        ExitCode::SUCCESS
    }
}

fn fetch_status(addr: std::net::SocketAddr) -> std::io::Result<String> {
    let mut stream = TcpStream::connect_timeout(&addr, STATUS_TIMEOUT)?;
    stream.set_read_timeout(Some(STATUS_TIMEOUT))?;
    stream.write_all(b"GET /status HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")?;
    let mut text = String::new();
    stream.read_to_string(&mut text)?;
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    if !head.starts_with("HTTP/1.1 200") {
        return Err(std::io::Error::other(
            head.lines().next().unwrap_or("no answer").to_owned(),
        ));
    }
    Ok(body.to_owned())
}
