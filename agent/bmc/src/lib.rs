//! # metalguard-bmc
//!
//! Power control of a host through its BMC, over Redfish (HTTPS/HTTP) and IPMI v2.0 RMCP+
//! (UDP), behind one narrow [`PowerControl`] trait, with a verified [`fence`] operation on top.
//!
//! Data flow: a [`BmcAddress`] (URL) + [`Credentials`] (file, never arguments) + [`TlsTrust`]
//! → a protocol client implementing [`PowerControl`] → [`fence()`] drives it (command, then read
//! the state back until verified, under one overall deadline) and returns a [`FenceOutcome`]
//! with a [`Timeline`] of what was sent and seen. [`ReadIdentity`] reads which machine the BMC
//! says it manages (system UUID, serial number), for checking it against the host's own.
//!
//! May depend on: tokio, reqwest with rustls, RustCrypto primitives, serde. Never on the kube
//! client crates (enforced by `metalguard-e2e`'s dependency-rule test).

pub mod address;
pub mod bmc;
pub mod control;
pub mod credentials;
pub mod error;
pub mod fence;
pub mod identity;
pub mod ipmi;
pub mod power;
pub mod reach;
pub mod redfish;
pub mod timeline;
pub mod tls;

pub use address::{AddressError, BmcAddress, Transport};
pub use bmc::{Bmc, CallTimeouts};
pub use control::PowerControl;
pub use credentials::{Credentials, CredentialsError};
pub use error::BmcError;
pub use fence::{FenceAction, FenceOptions, FenceOutcome, FenceStatus, fence};
pub use identity::{ReadIdentity, SystemIdentity, SystemUuid};
pub use power::{Capabilities, PowerState};
pub use reach::check_reachable;
pub use timeline::{Direction, Timeline, TimelineEntry};
pub use tls::{TlsError, TlsTrust};
