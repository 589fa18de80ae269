//! # metalguard-core
//!
//! metalguard's decisions, as pure functions: given a snapshot of the cluster, a policy and
//! `now`, return a plan (an ordered list of actions, each with a stable operation id and a
//! reason). Machine health with MachineHealthCheck semantics, the etcd quorum guard,
//! failure-domain placement and the external-baremetal remediation planner live here.
//!
//! May depend on: `metalguard-api`, `serde`, `thiserror`. No I/O, no clock, no async runtime:
//! never tokio, hyper, reqwest, the kube client crates or etcd-client (enforced by
//! `metalguard-e2e`'s dependency-rule test).
