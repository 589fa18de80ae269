//! Whether a BMC answers at all, checked without credentials: the agent probes the BMCs it
//! may be asked to fence so that the controller can pick an executor that reaches the target
//! and people can see, before a fence is needed, who cannot.
//!
//! Redfish: one unauthenticated `GET /redfish/v1/` over TLS verified with the BMC's trust;
//! any HTTP status is an answer (a 401 still proves the BMC is there), a refused certificate
//! is not. IPMI: Get Channel Authentication Capabilities, which needs no session. Neither
//! says anything about the credentials.

use crate::address::Transport;
use crate::ipmi::client::DEFAULT_FIRST_TIMEOUT;
use crate::ipmi::{IpmiConfig, IpmiSession, control::to_bmc_error};
use crate::redfish::{RedfishClient, RedfishOptions};
use crate::{BmcAddress, BmcError, CallTimeouts, Credentials, TlsTrust};

/// What answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Answer {
    /// A Redfish service answered the service root with this HTTP status.
    Redfish {
        /// The HTTP status (200, or 401 where even the service root needs credentials).
        status: u16,
    },
    /// An IPMI v2.0 BMC answered Get Channel Authentication Capabilities.
    Ipmi,
}

/// Checks that the BMC at `address` answers, within `timeouts` (IPMI: attempts that fit in
/// `timeouts.request`), sending no credentials.
pub async fn check_reachable(
    address: &BmcAddress,
    trust: &TlsTrust,
    timeouts: CallTimeouts,
) -> Result<Answer, BmcError> {
    match address.transport {
        Transport::RedfishHttps | Transport::RedfishHttp => {
            let options = RedfishOptions {
                connect_timeout: timeouts.connect,
                request_timeout: timeouts.request,
                read_attempts: 1,
                ..RedfishOptions::default()
            };
            let mut client = RedfishClient::new(address, Credentials::new("", ""), trust, options)?;
            let status = client.service_root_status().await?;
            Ok(Answer::Redfish { status })
        }
        Transport::Ipmi => {
            let mut config = IpmiConfig::new(
                address.host.clone(),
                "",
                zeroize::Zeroizing::new(Vec::new()),
            );
            config.port = address.port;
            // As for fences: the first attempt waits at most 250 ms, a lost datagram is resent.
            let first = timeouts.connect.min(DEFAULT_FIRST_TIMEOUT);
            config.retry = crate::ipmi::control::retry_within(first, timeouts.request);
            IpmiSession::probe(&config).await.map_err(to_bmc_error)?;
            Ok(Answer::Ipmi)
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::UdpSocket;
    use std::time::Duration;

    use super::*;

    const QUICK: CallTimeouts = CallTimeouts {
        connect: Duration::from_millis(100),
        request: Duration::from_millis(400),
    };

    #[tokio::test]
    async fn nothing_listening_is_unreachable_and_says_so() {
        // Bound, then dropped: nothing listens on the port (ICMP port unreachable, or silence).
        let port = UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let address: BmcAddress = format!("ipmi://127.0.0.1:{port}").parse().unwrap();
        let error = check_reachable(&address, &TlsTrust::SystemRoots, QUICK)
            .await
            .unwrap_err();
        let mut text = error.to_string();
        let mut cause = std::error::Error::source(&error);
        while let Some(c) = cause {
            text = format!("{text}: {c}");
            cause = c.source();
        }
        assert!(text.contains(&format!("127.0.0.1:{port}")), "{text}");
        assert!(text.contains("nothing listens on that udp port"), "{text}");
    }

    #[tokio::test]
    async fn a_closed_redfish_port_is_unreachable_and_says_so() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let address: BmcAddress = format!("redfish+https://127.0.0.1:{port}").parse().unwrap();
        let error = check_reachable(&address, &TlsTrust::Insecure, QUICK)
            .await
            .unwrap_err();
        assert!(matches!(error, BmcError::Connect { .. }), "{error:?}");
        assert!(
            error.to_string().contains(&format!("127.0.0.1:{port}")),
            "{error}"
        );
    }
}
