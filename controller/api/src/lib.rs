//! # metalguard-api
//!
//! The types every part of metalguard agrees on: the decision snapshot and plan that
//! `metalguard-core` consumes and produces, the agent ↔ controller protocol, and (behind the
//! `k8s` feature, which only the controller enables) the Kubernetes custom resources.
//!
//! Data flow: adapters (agent, controller backends) build these types from the world; the
//! core turns a snapshot into a plan; executors carry the plan out.
//!
//! May depend on: `serde`, `serde_json`, `serde_path_to_error`, `thiserror`, `url` (BMC addresses); with `k8s`, `kube-core`, `k8s-openapi`,
//! `schemars`. Must never depend on tokio, hyper, reqwest, the kube client crates or
//! etcd-client (enforced by `metalguard-e2e`'s dependency-rule test).

pub mod bmc;
pub mod duration;
pub mod identity;
#[cfg(feature = "k8s")]
pub mod k8s;
pub mod limits;
pub mod mutation;
pub mod plan;
pub mod policy;
pub mod protocol;
pub mod remediation;
pub mod skew;
pub mod snapshot;
pub mod text;
