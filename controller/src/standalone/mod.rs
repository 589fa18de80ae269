//! The standalone backend: the controller's state, intent and leadership in the guarded etcd
//! itself (under a key prefix), reached with the inventory's `[etcd]` settings.
//!
//! [`access`] turns those settings into connect options; [`failover`] keeps one client per
//! endpoint and tries the next when one fails; [`diagnosis`] says in words what went wrong
//! with an endpoint; [`etcd`] is the [`crate::backend::Backend`] on top of them.

pub mod access;
pub mod diagnosis;
pub mod etcd;
mod failover;
