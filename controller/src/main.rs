//! # metalguard-controller
//!
//! The controller binary: runs the decision core against a backend (standalone now,
//! Kubernetes next) and executes its plans.
//!
//! Data flow: agents → [`server`] (mTLS, host from the certificate) → [`hub`] inbox →
//! [`service`] loop (leadership and state through [`backend`]) → [`snapshot`] →
//! `metalguard_core::plan` → [`executor`] (intent persisted first) → [`hub`] → long-polls.
//! This file only declares modules and hands the command line to [`cli`].

mod backend;
mod certs;
mod cli;
mod clock;
#[cfg(feature = "kubernetes")]
mod crd;
mod error;
mod etcd_report;
mod executor;
mod holds;
mod hub;
mod inventory;
#[cfg(feature = "kubernetes")]
mod kube;
#[cfg(all(test, feature = "kubernetes"))]
mod manifests;
mod members;
mod membership;
mod metrics;
mod notes;
mod openapi;
mod plan_cmd;
mod reachability;
mod reload;
mod retire;
mod revocation;
mod rlimit;
mod seal;
mod server;
mod service;
mod snapshot;
mod status;
#[cfg(test)]
mod testkit;
mod tls;

use clap::Parser as _;

fn main() -> std::process::ExitCode {
    cli::main(cli::Cli::parse())
}
