//! # metalguard-controller
//!
//! The controller binary: runs the decision core against a backend (standalone now,
//! Kubernetes next) and executes its plans.
//!
//! Data flow: agents → [`api`] (mTLS server, host from the certificate) → [`api::hub`] inbox →
//! [`control`] loop (leadership and state through a [`backend`]: [`standalone`] etcd or
//! `kube`) → snapshot → `metalguard_core::plan` → executor (intent persisted first) →
//! [`api::hub`] → long-polls. Certificates are in [`pki`], the hosts and policy in
//! [`inventory`]. This file only declares modules and hands the command line to [`cli`].

mod api;
mod backend;
mod cli;
mod clock;
mod control;
mod error;
mod inventory;
#[cfg(feature = "kubernetes")]
mod kube;
#[cfg(test)]
mod layout_tests;
mod pki;
mod standalone;
#[cfg(test)]
mod testkit;

use clap::Parser as _;

fn main() -> std::process::ExitCode {
    cli::main(cli::Cli::parse())
}
