//! The agent-facing HTTPS API: what agents reach, and the meeting point with the loop.
//!
//! agents → [`server`] (mTLS, the host from the certificate, connection and request bounds in
//! `server/conn.rs` and `server/guard.rs`) → [`hub`] inbox → the controller loop
//! ([`crate::control`]) → [`hub`] → long-polls. [`rlimit`] raises the open-file limit the
//! connections need; [`openapi`] is the document of these routes.

pub mod hearing;
pub mod hub;
pub mod openapi;
pub mod rlimit;
pub mod server;
