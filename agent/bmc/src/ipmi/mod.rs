//! IPMI v2.0 over LAN (RMCP+), our own session layer.
//!
//! Data flow: [`IpmiClient`] implements [`crate::PowerControl`] on top of
//! [`client::IpmiSession`], which owns a connected UDP socket and drives the handshake
//! (pre-session commands, Open Session, RAKP 1-4, privilege raise), then seals requests and
//! opens answers through [`session::ActiveSession`]. Everything below the client is I/O-free
//! and tested on bytes: [`wire`] (RMCP, IPMI 1.5 and RMCP+ framing, IPMI message checksums),
//! [`rakp`] (Open Session and RAKP messages), [`crypto`] (suites 3 and 17: auth codes, SIK,
//! K1, K2, integrity, AES-CBC-128) and [`commands`] (the request bytes and answer parsers).
//!
//! Why not `ipmi-rs` 0.6.0: it has no chassis commands, no privilege raise, no Close
//! Session, no retransmission, no suite 17, blocks, and panics on network paths (see
//! `docs/design-bmc.md`).

pub mod client;
pub mod commands;
pub mod control;
pub mod crypto;
pub mod error;
mod handshake;
pub mod rakp;
pub mod session;
mod transport;
pub mod wire;

pub use client::{Event, IpmiConfig, IpmiSession, RetryPolicy};
pub use commands::{ChassisControl, ChassisStatus};
pub use control::IpmiClient;
pub use crypto::CipherSuite;
pub use error::IpmiError;
pub use rakp::Privilege;
pub use wire::DecodeError;
