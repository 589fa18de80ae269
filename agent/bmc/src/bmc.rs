//! [`Bmc`]: one value for either protocol, chosen from the address.

use std::time::Duration;

use crate::address::Transport;
use crate::identity::{ReadIdentity, SystemIdentity};
use crate::redfish::{RedfishClient, RedfishOptions};
use crate::{
    BmcAddress, BmcError, Capabilities, Credentials, PowerControl, PowerState, Timeline, TlsTrust,
};

/// Per-call timeouts shared by both protocols (each protocol maps them to its own knobs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CallTimeouts {
    /// Connect (TCP + TLS) timeout; for IPMI a cap on the first attempt's wait (UDP requests
    /// start at 250 ms and back off within `request`).
    pub connect: Duration,
    /// Timeout of one request.
    pub request: Duration,
}

/// A BMC of either protocol behind one type, so callers need no generics.
#[derive(Debug)]
#[non_exhaustive]
pub enum Bmc {
    /// Redfish over HTTPS or HTTP.
    Redfish(RedfishClient),
    /// IPMI v2.0 RMCP+ over UDP.
    Ipmi(crate::ipmi::IpmiClient),
}

/// Forwards a call to whichever client is inside.
macro_rules! dispatch {
    ($bmc:expr, $client:ident => $call:expr) => {
        match $bmc {
            Bmc::Redfish($client) => $call,
            Bmc::Ipmi($client) => $call,
        }
    };
}

impl Bmc {
    /// The client for `address`. No traffic until the first call.
    pub fn new(
        address: &BmcAddress,
        credentials: Credentials,
        trust: &TlsTrust,
        timeouts: CallTimeouts,
    ) -> Result<Self, BmcError> {
        match address.transport {
            Transport::RedfishHttps | Transport::RedfishHttp => {
                let options = RedfishOptions {
                    connect_timeout: timeouts.connect,
                    request_timeout: timeouts.request,
                    ..RedfishOptions::default()
                };
                Ok(Self::Redfish(RedfishClient::new(
                    address,
                    credentials,
                    trust,
                    options,
                )?))
            }
            Transport::Ipmi => Ok(Self::Ipmi(crate::ipmi::IpmiClient::new(
                address,
                &credentials,
                timeouts.connect,
                timeouts.request,
            ))),
        }
    }
}

impl PowerControl for Bmc {
    fn address(&self) -> &str {
        dispatch!(self, c => c.address())
    }

    async fn power_state(&mut self) -> Result<PowerState, BmcError> {
        dispatch!(self, c => c.power_state().await)
    }

    async fn power_on(&mut self) -> Result<(), BmcError> {
        dispatch!(self, c => c.power_on().await)
    }

    async fn force_off(&mut self) -> Result<(), BmcError> {
        dispatch!(self, c => c.force_off().await)
    }

    async fn graceful_off(&mut self) -> Result<(), BmcError> {
        dispatch!(self, c => c.graceful_off().await)
    }

    async fn hard_reset(&mut self) -> Result<(), BmcError> {
        dispatch!(self, c => c.hard_reset().await)
    }

    async fn power_cycle(&mut self) -> Result<(), BmcError> {
        dispatch!(self, c => c.power_cycle().await)
    }

    async fn capabilities(&mut self) -> Result<Capabilities, BmcError> {
        dispatch!(self, c => c.capabilities().await)
    }

    async fn close(&mut self) -> Result<(), BmcError> {
        dispatch!(self, c => c.close().await)
    }

    fn timeline_mut(&mut self) -> &mut Timeline {
        dispatch!(self, c => c.timeline_mut())
    }
}

impl ReadIdentity for Bmc {
    async fn identity(&mut self) -> Result<SystemIdentity, BmcError> {
        dispatch!(self, c => c.identity().await)
    }
}
