//! The agent's configuration: `agent.toml` plus `agent.d/*.toml` drop-ins.
//!
//! Files are read in order (the main file, then drop-ins sorted by name); tables merge key by
//! key and a later file wins. Every file is first parsed on its own against the typed schema,
//! so an unknown key or a bad value is reported with the file that holds it; then the merged
//! document is parsed and [`validate`](AgentConfig::validate)d. A typo in a fencing setting
//! must fail loudly, never be ignored.

mod bounds;
pub(crate) mod files;
mod load;
mod schema;
mod validate;

use std::path::PathBuf;
use std::process::ExitCode;

pub use load::{load, load_lenient};
pub use schema::*;

/// Default path of the main configuration file.
pub const DEFAULT_CONFIG: &str = "/etc/metalguard/agent.toml";

/// Arguments of `metalguard-agent check-config`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// The main configuration file; drop-ins are read from `agent.d/` next to it.
    #[arg(long, short, env = "METALGUARD_AGENT_CONFIG", default_value = DEFAULT_CONFIG)]
    pub config: PathBuf,
    /// Only answer whether an operator has configured this host (exit 0 when `host` is set,
    /// or when the files cannot be judged, so that `run` reports the problem; exit 1 when
    /// `host` is unset). Used by the unit's ExecCondition.
    #[arg(long)]
    pub is_configured: bool,
}

/// Runs `check-config`: prints every problem (one per line) and exits 1, or prints a summary
/// and exits 0.
pub fn check(args: &CheckArgs) -> ExitCode {
    if args.is_configured {
        return if load::host_is_unset(&args.config) {
            println!(
                "{}: host is not set; metalguard-agent is not configured yet",
                args.config.display()
            );
            ExitCode::FAILURE
        } else {
            ExitCode::SUCCESS
        };
    }
    match load(&args.config) {
        Ok(loaded) => {
            println!("configuration OK: host {}", loaded.config.host_name());
            for file in &loaded.files {
                println!("  read {}", file.display());
            }
            ExitCode::SUCCESS
        }
        Err(err) => {
            eprintln!("configuration invalid:");
            for problem in err.problems() {
                eprintln!("  {problem}");
            }
            ExitCode::FAILURE
        }
    }
}
