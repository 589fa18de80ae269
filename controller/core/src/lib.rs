//! # metalguard-core
//!
//! metalguard's decisions, as pure functions: given a snapshot of the cluster, a policy and
//! `now`, return a plan (an ordered list of actions, each with a stable operation id and a
//! reason). Machine health with MachineHealthCheck semantics, the etcd quorum guard,
//! failure-domain placement and the external-baremetal remediation planner live here.
//!
//! Data flow: [`health`] judges hosts per check → [`quorum`] builds the etcd view and its
//! safety rules → [`guard`] plans hooks, one membership change and then [`scaling`] (placing
//! hosts with [`domains`]) → [`retire`] powers off retired hosts once etcd is off them →
//! [`remediation`] drives remediations through their gates → [`judge`] judges the assembled
//! plan as a whole and drops what it rejects → [`plan::plan`] returns the
//! [`metalguard_api::plan::Plan`], whose `Display` explains it. A reason that follows a seed
//! rule quotes the seed's words from [`seeds`].
//!
//! May depend on: `metalguard-api`, `serde`, `thiserror`. No I/O, no clock, no async runtime:
//! never tokio, hyper, reqwest, the kube client crates or etcd-client (enforced by
//! `metalguard-e2e`'s dependency-rule test).

pub mod domains;
pub mod guard;
pub mod health;
pub mod judge;
pub mod plan;
pub mod quorum;
pub mod remediation;
pub mod retire;
pub mod scaling;
pub mod seeds;
pub mod validate;

#[cfg(test)]
mod arbitrary;
#[cfg(test)]
mod fuzz;
#[cfg(test)]
mod props;
#[cfg(test)]
mod remediation_tests;
#[cfg(test)]
mod scenarios;
#[cfg(test)]
mod scenarios_quorum;
#[cfg(test)]
mod scenarios_retire;
#[cfg(test)]
mod scenarios_safety;
#[cfg(test)]
mod scenarios_scaling;
#[cfg(test)]
mod sim;
#[cfg(test)]
mod testkit;

pub use plan::plan;
