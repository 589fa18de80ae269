//! Which machine a BMC says it manages, read without changing anything: the [`ReadIdentity`]
//! trait both protocols implement.
//!
//! Redfish: the `UUID` and `SerialNumber` of the same `ComputerSystem` the power operations
//! use (one GET). IPMI: Get System GUID (NetFn App 0x06, cmd 0x37) in the RMCP+ session,
//! its 16 bytes read in SMBIOS order (see [`metalguard_api::identity`] for the rule and the
//! specification sections); IPMI has no standard command for the serial number, so it is
//! always absent there. A BMC that gives no usable identity (no UUID, a placeholder, a value
//! that is not a UUID, a completion code for Get System GUID) yields an identity whose fields
//! are absent with the reason; only a failed exchange (unreachable, TLS, credentials refused,
//! an answer that cannot be decoded) is an error.

use std::future::Future;

pub use metalguard_api::identity::{GuidByteOrder, SystemIdentity, SystemUuid};

use crate::BmcError;

/// The byte order metalguard reads an IPMI system GUID in.
pub const IPMI_GUID_ORDER: GuidByteOrder = GuidByteOrder::Smbios;

/// Reading the identity of the system a BMC manages. Never changes power.
pub trait ReadIdentity: Send {
    /// The system's UUID and serial number as the BMC reports them, each present or absent
    /// with the reason. Bounded by the client's connect and request timeouts, like every call.
    fn identity(&mut self) -> impl Future<Output = Result<SystemIdentity, BmcError>> + Send;
}
