//! # metalguard-agent
//!
//! The host agent and admin CLI. This binary only wires the library crates together and maps
//! errors to exit codes: BMC power control comes from `metalguard-bmc`, etcd membership from
//! `metalguard-etcd`, the protocol types from `metalguard-api`.
//!
//! May depend on: the metalguard agent crates, tokio, clap, tracing. Never on the kube client
//! crates (enforced by `metalguard-e2e`'s dependency-rule test).

use std::process::ExitCode;

use clap::{Parser, Subcommand};

mod admin;
mod assets;
mod bmc_cmd;
mod break_glass;
mod client_tls;
mod config;
mod daemon;
mod etcd_cmd;
mod etcd_join;
mod fence_agent;
mod holds;

/// metalguard host agent.
#[derive(Debug, Parser)]
#[command(name = "metalguard-agent", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// The agent's subcommands. Each arm only parses and hands over to its module.
#[derive(Debug, Subcommand)]
enum Command {
    /// Run the agent daemon (systemd service).
    Run(daemon::RunArgs),
    /// Check the configuration (agent.toml and agent.d/*.toml) and exit.
    CheckConfig(config::CheckArgs),
    /// One host's BMC: power control (status, on, off, reboot, cycle) and a read-only check of
    /// the credentials and the system's identity (check).
    Bmc(bmc_cmd::BmcArgs),
    /// ClusterLabs fence-agent interface (for Pacemaker and medik8s FAR).
    FenceAgent(fence_agent::FenceAgentArgs),
    /// etcd membership: status, learner join, promote, remove (through the safety gate).
    Etcd(etcd_cmd::EtcdArgs),
    /// Print the running daemon's local view (probes and their verdicts).
    Status(admin::StatusArgs),
    /// Break-glass: fence a host straight through its BMC, bypassing the controller; records
    /// a hold first, so metalguard leaves the host alone until `metalguard-controller release`.
    Fence(break_glass::FenceArgs),
    /// Write the man page and shell completions (used by the packaging script).
    #[command(hide = true)]
    GenerateAssets(assets::AssetArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Run(args) => daemon::run(&args),
        Command::CheckConfig(args) => config::check(&args),
        Command::Bmc(args) => bmc_cmd::run(&args),
        Command::FenceAgent(args) => fence_agent::run(&args),
        Command::Etcd(args) => etcd_cmd::run(&args),
        Command::Status(args) => admin::status(&args),
        Command::Fence(args) => break_glass::fence(&args),
        Command::GenerateAssets(args) => assets::generate::<Cli>(&args),
    }
}

#[cfg(test)]
mod tests {
    use super::Cli;
    use clap::CommandFactory;

    #[test]
    fn cli_definition_is_consistent() {
        Cli::command().debug_assert();
    }
}
