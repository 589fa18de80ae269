//! # metalguard-agent
//!
//! The host agent and admin CLI. This binary only wires the library crates together and maps
//! errors to exit codes: BMC power control comes from `metalguard-bmc`, etcd membership from
//! `metalguard-etcd`, the protocol types from `metalguard-api`.
//!
//! May depend on: the metalguard agent crates, tokio, clap, tracing. Never on the kube client
//! crates (enforced by `metalguard-e2e`'s dependency-rule test).

use clap::Parser;

/// metalguard host agent.
#[derive(Debug, Parser)]
#[command(name = "metalguard-agent", version, about)]
struct Cli {}

fn main() {
    let _cli = Cli::parse();
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
