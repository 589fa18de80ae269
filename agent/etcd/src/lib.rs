//! # metalguard-etcd
//!
//! Exact, idempotent etcd membership mechanics and truthful observation: a per-endpoint
//! cluster view, learner add, promotion, quorum-safe removal, the safety gate for
//! membership changes and learner catch-up tracking. The decisions of *when* to change
//! membership live in `metalguard-core`.
//!
//! May depend on: etcd-client, tokio. Never on the kube client crates (enforced by
//! `metalguard-e2e`'s dependency-rule test).
//!
//! Data flow: [`observe::observe`] probes every endpoint with its own client and builds a
//! [`view::ClusterView`]; [`gate`] decides from the view whether a change is safe; [`ops`]
//! carries out idempotent changes ([`leader`] moves raft leadership); [`catchup::CatchUp`] turns views over time into a
//! promotable/stalled verdict; [`join`] is the host's learner-join state machine with its
//! persisted state and the etcd launchers.

pub mod catchup;
pub mod client;
pub mod error;
pub mod gate;
pub mod join;
pub mod leader;
pub mod observe;
pub mod ops;
pub mod power_gate;
pub mod view;

pub use client::{ClientSettings, TlsFiles};
pub use error::{EtcdError, EtcdErrorKind};
