//! The narrow, transport-agnostic power-control trait both protocols implement.

use std::future::Future;

use crate::{BmcError, Capabilities, PowerState, Timeline};

/// Power control of one host through its BMC.
///
/// Implementations: [`crate::redfish::RedfishClient`] and the IPMI RMCP+ client in
/// [`crate::ipmi`]. Every call is bounded by the implementation's connect and request timeouts;
/// [`crate::fence`] adds an overall deadline on top. Commands (`power_on`, `force_off`, ...) only
/// *ask*; they do not wait for the state to change — verification is the caller's job (see
/// [`crate::fence`]). Implementations record every request and answer in their [`Timeline`]
/// and never put a secret in it.
pub trait PowerControl: Send {
    /// The BMC address, without credentials, for messages.
    fn address(&self) -> &str;

    /// The power state the BMC reports now.
    fn power_state(&mut self) -> impl Future<Output = Result<PowerState, BmcError>> + Send;

    /// Asks the BMC to power the host on.
    fn power_on(&mut self) -> impl Future<Output = Result<(), BmcError>> + Send;

    /// Asks the BMC to cut power at once (Redfish `ForceOff`, IPMI chassis power down).
    fn force_off(&mut self) -> impl Future<Output = Result<(), BmcError>> + Send;

    /// Asks the BMC for a graceful (ACPI) shutdown.
    fn graceful_off(&mut self) -> impl Future<Output = Result<(), BmcError>> + Send;

    /// Asks the BMC for a hard reset.
    fn hard_reset(&mut self) -> impl Future<Output = Result<(), BmcError>> + Send;

    /// Asks the BMC to power-cycle the host; fails with [`BmcError::Unsupported`] when it cannot.
    fn power_cycle(&mut self) -> impl Future<Output = Result<(), BmcError>> + Send;

    /// The operations the BMC says it supports.
    fn capabilities(&mut self) -> impl Future<Output = Result<Capabilities, BmcError>> + Send;

    /// Ends the session with the BMC (Redfish logout, IPMI Close Session). Idempotent.
    fn close(&mut self) -> impl Future<Output = Result<(), BmcError>> + Send;

    /// The record of requests and answers so far, for [`crate::fence`] to add its decisions to.
    fn timeline_mut(&mut self) -> &mut Timeline;
}
