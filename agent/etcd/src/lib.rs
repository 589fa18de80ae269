//! # metalguard-etcd
//!
//! Exact, idempotent etcd membership mechanics and truthful observation: a per-endpoint
//! cluster view, learner add, promotion, quorum-safe removal, the safety gate for
//! membership changes and learner catch-up tracking. The decisions of *when* to change
//! membership live in `metalguard-core`.
//!
//! May depend on: etcd-client, tokio. Never on the kube client crates (enforced by
//! `metalguard-e2e`'s dependency-rule test).
