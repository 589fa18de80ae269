//! # metalguard-controller
//!
//! The controller binary: runs the decision core against a backend (standalone or
//! Kubernetes) and executes its plans. This file only wires crates and maps errors to exit
//! codes; decisions live in `metalguard-core`, shared types in `metalguard-api`.

use clap::Parser;

/// metalguard controller.
#[derive(Debug, Parser)]
#[command(name = "metalguard-controller", version, about)]
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
