//! The controller loop, the same for both backends: [`service`] campaigns for leadership,
//! takes reports from the [`crate::api::hub`], builds the decision [`snapshot`] (etcd
//! [`members`] judged from the agents' views), runs `metalguard_core::plan`, and hands the
//! plan to the [`executor`] (intent persisted first; [`membership`] for etcd member changes).
//! [`notes`] are what people must be told, [`metrics`] what an operator alerts on,
//! [`reachability`] which agents reach each BMC, [`reload`] notices inventory file changes.

pub mod credentials;
pub mod executor;
pub mod fencing;
pub mod members;
pub mod membership;
pub mod metrics;
pub mod mutation;
pub mod notes;
pub mod reachability;
pub mod reload;
pub mod revalidate;
pub mod service;
pub mod snapshot;
pub mod snapshot_cache;
