//! [`IpmiClient`]: the [`PowerControl`] implementation over an RMCP+ session.
//!
//! The session is set up on the first call and kept for the next ones (a verify loop polls
//! the power state many times), dropped after any error so the next call starts afresh, and
//! closed by [`PowerControl::close`] — or, when the client is dropped without it, by the
//! session's own `Drop`, so BMC session slots never leak.

use std::time::Duration;

use zeroize::Zeroizing;

use super::client::{DEFAULT_FIRST_TIMEOUT, Event, IpmiConfig, IpmiSession, RetryPolicy};
use super::commands::ChassisControl;
use super::crypto::CipherSuite;
use super::error::IpmiError;
use crate::identity::{IPMI_GUID_ORDER, ReadIdentity, SystemIdentity, SystemUuid};
use crate::{
    BmcAddress, BmcError, Capabilities, Credentials, Direction, PowerControl, PowerState, Timeline,
};

/// Why an IPMI BMC's identity never has a serial number.
pub const IPMI_NO_SERIAL: &str = "ipmi has no standard command for the system serial number";

/// Power control of one host over IPMI v2.0 RMCP+.
#[derive(Debug)]
pub struct IpmiClient {
    config: IpmiConfig,
    address: String,
    session: Option<IpmiSession>,
    timeline: Timeline,
}

impl IpmiClient {
    /// A client for `address`; no traffic until the first call. `request_timeout` bounds one
    /// request with all its retransmissions; the first attempt waits 250 ms, or
    /// `first_timeout` when shorter (a TCP-style connect timeout of seconds would delay the
    /// first retransmission of a lost UDP datagram that long).
    pub fn new(
        address: &BmcAddress,
        credentials: &Credentials,
        first_timeout: Duration,
        request_timeout: Duration,
    ) -> Self {
        let mut config = IpmiConfig::new(
            address.host.clone(),
            credentials.username(),
            Zeroizing::new(credentials.password().as_bytes().to_vec()),
        );
        config.port = address.port;
        config.retry = retry_within(first_timeout.min(DEFAULT_FIRST_TIMEOUT), request_timeout);
        Self {
            config,
            address: address.host_port(),
            session: None,
            timeline: Timeline::new(),
        }
    }

    /// Restricts the cipher suites (in order of preference).
    #[must_use]
    pub fn with_suites(mut self, suites: Vec<CipherSuite>) -> Self {
        self.config.suites = suites;
        self
    }

    /// The configuration used for sessions.
    pub fn config(&self) -> &IpmiConfig {
        &self.config
    }

    async fn session(&mut self) -> Result<&mut IpmiSession, BmcError> {
        if self.session.is_none() {
            let result = IpmiSession::connect(&self.config).await;
            match result {
                Ok(s) => self.session = Some(s),
                Err(e) => return Err(self.fail(e)),
            }
        }
        self.session.as_mut().ok_or_else(|| BmcError::Protocol {
            bmc: self.address.clone(),
            detail: "ipmi session vanished".to_owned(),
        })
    }

    /// Moves the session's events into the timeline.
    fn record(&mut self) {
        let events = self
            .session
            .as_mut()
            .map(IpmiSession::take_events)
            .unwrap_or_default();
        record_events(&mut self.timeline, &events);
    }

    /// Records the session's events, drops it (its `Drop` closes it) and maps the error.
    fn fail(&mut self, error: IpmiError) -> BmcError {
        self.record();
        self.timeline.note(format!("ipmi error: {error}"));
        self.session = None;
        to_bmc_error(error)
    }

    async fn control(&mut self, action: ChassisControl) -> Result<(), BmcError> {
        let result = self.session().await?.chassis_control(action).await;
        match result {
            Ok(()) => {
                self.record();
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }
}

/// Attempts that fit in `request_timeout`, starting at `first_timeout` and doubling.
pub(crate) fn retry_within(first_timeout: Duration, request_timeout: Duration) -> RetryPolicy {
    let first_timeout = first_timeout
        .min(request_timeout)
        .max(Duration::from_millis(10));
    let mut policy = RetryPolicy {
        first_timeout,
        max_timeout: request_timeout,
        attempts: 1,
    };
    while policy.attempts < 8 {
        let next = RetryPolicy {
            attempts: policy.attempts + 1,
            ..policy
        };
        if next.worst_case() > request_timeout {
            break;
        }
        policy = next;
    }
    policy
}

fn record_events(timeline: &mut Timeline, events: &[Event]) {
    for e in events {
        let (direction, what) = match e.what {
            "sent" | "retransmit" => (Direction::Sent, format!("ipmi {} ({})", e.step, e.detail)),
            "received" => (Direction::Seen, format!("ipmi {} ({})", e.step, e.detail)),
            other => (
                Direction::Note,
                format!("ipmi {other} {} ({})", e.step, e.detail),
            ),
        };
        timeline.record_at(e.at, direction, what);
    }
}

/// Maps an IPMI error onto the protocol-neutral error, keeping it as the cause where the
/// neutral message does not already say everything.
pub fn to_bmc_error(error: IpmiError) -> BmcError {
    match error {
        IpmiError::Resolve { ref bmc, .. }
        | IpmiError::Io { ref bmc, .. }
        | IpmiError::Unreachable { ref bmc }
        | IpmiError::Random { ref bmc }
        | IpmiError::SessionRefused { ref bmc, .. } => BmcError::Connect {
            bmc: bmc.clone(),
            source: Box::new(error),
        },
        IpmiError::Timeout {
            bmc, step, elapsed, ..
        } => BmcError::Timeout {
            bmc,
            what: step.to_owned(),
            timeout: elapsed,
        },
        IpmiError::AuthenticationFailed { bmc, .. } => BmcError::Authentication {
            bmc,
            detail: String::new(),
        },
        IpmiError::PrivilegeRefused {
            bmc, user, what, ..
        } => BmcError::Privilege {
            bmc,
            what: format!("{what} for user {user}"),
        },
        IpmiError::NotIpmiV2 { bmc } => BmcError::Unsupported {
            bmc,
            operation: "ipmi v2.0 (rmcp+)".to_owned(),
            allowed: "ipmi v1.5 only".to_owned(),
        },
        IpmiError::NoCommonCipherSuite {
            bmc,
            offered,
            allowed,
        } => BmcError::Unsupported {
            bmc,
            operation: format!("cipher suites {allowed:?}"),
            allowed: format!("cipher suites {offered:?}"),
        },
        IpmiError::Config { ref bmc, .. } | IpmiError::Rakp4Mismatch { ref bmc } => {
            BmcError::Protocol {
                bmc: bmc.clone(),
                detail: error.to_string(),
            }
        }
        IpmiError::Completion { ref bmc, .. } => BmcError::Protocol {
            bmc: bmc.clone(),
            detail: error.to_string(),
        },
        IpmiError::Malformed {
            bmc, step, source, ..
        } => BmcError::Decode {
            bmc,
            what: step.to_owned(),
            source: Box::new(source),
        },
    }
}

impl PowerControl for IpmiClient {
    fn address(&self) -> &str {
        &self.address
    }

    async fn power_state(&mut self) -> Result<PowerState, BmcError> {
        let result = self.session().await?.chassis_status().await;
        match result {
            Ok(status) => {
                self.record();
                let state = if status.power_on {
                    PowerState::On
                } else {
                    PowerState::Off
                };
                self.timeline.seen(format!("ipmi chassis power {state}"));
                Ok(state)
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    async fn power_on(&mut self) -> Result<(), BmcError> {
        self.control(ChassisControl::PowerUp).await
    }

    async fn force_off(&mut self) -> Result<(), BmcError> {
        self.control(ChassisControl::PowerDown).await
    }

    async fn graceful_off(&mut self) -> Result<(), BmcError> {
        self.control(ChassisControl::SoftShutdown).await
    }

    async fn hard_reset(&mut self) -> Result<(), BmcError> {
        self.control(ChassisControl::HardReset).await
    }

    async fn power_cycle(&mut self) -> Result<(), BmcError> {
        self.control(ChassisControl::PowerCycle).await
    }

    async fn capabilities(&mut self) -> Result<Capabilities, BmcError> {
        // IPMI has no way to ask: Chassis Control is mandatory, and a BMC that lacks an
        // action (cycle, soft shutdown) refuses it with a completion code when it is sent.
        Ok(Capabilities {
            power_on: true,
            force_off: true,
            graceful_off: true,
            hard_reset: true,
            power_cycle: true,
        })
    }

    async fn close(&mut self) -> Result<(), BmcError> {
        let Some(session) = self.session.take() else {
            return Ok(());
        };
        match session.close().await {
            Ok(events) => {
                record_events(&mut self.timeline, &events);
                Ok(())
            }
            Err(e) => Err(self.fail(e)),
        }
    }

    fn timeline_mut(&mut self) -> &mut Timeline {
        &mut self.timeline
    }
}

impl ReadIdentity for IpmiClient {
    /// Get System GUID in the session (opened if needed). A completion code makes the UUID
    /// absent with the code's meaning and keeps the session; any other error drops it.
    async fn identity(&mut self) -> Result<SystemIdentity, BmcError> {
        let result = self.session().await?.system_guid().await;
        let mut identity = SystemIdentity::default();
        match result {
            Ok(bytes) => {
                self.record();
                let hex: Vec<String> = bytes.iter().map(|b| format!("{b:02x}")).collect();
                self.timeline.seen(format!(
                    "ipmi system guid bytes {} (read in {} order)",
                    hex.join(" "),
                    IPMI_GUID_ORDER.as_str()
                ));
                identity.set_uuid(Ok(SystemUuid::from_guid_bytes(bytes, IPMI_GUID_ORDER)));
            }
            Err(IpmiError::Completion { code, meaning, .. }) => {
                self.record();
                identity.set_uuid(Err(format!(
                    "the bmc answered get system guid with completion code {code:#04x} ({meaning})"
                )));
            }
            Err(e) => return Err(self.fail(e)),
        }
        identity.set_serial_number(Err(IPMI_NO_SERIAL.to_owned()));
        self.timeline.note(format!("identity: {identity}"));
        Ok(identity)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_fits_the_request_timeout() {
        let p = retry_within(Duration::from_millis(250), Duration::from_secs(5));
        assert_eq!(p.attempts, 4, "{p:?}"); // 250 + 500 + 1000 + 2000 ms
        assert!(p.worst_case() <= Duration::from_secs(5));
        let p = retry_within(Duration::from_millis(250), Duration::from_millis(100));
        assert_eq!(
            (p.attempts, p.first_timeout),
            (1, Duration::from_millis(100))
        );
    }

    #[test]
    fn errors_map_without_losing_the_subject() {
        let e = to_bmc_error(IpmiError::PrivilegeRefused {
            bmc: "h:623".into(),
            user: "viewer".into(),
            what: "chassis control (power down)".into(),
            meaning: "insufficient privilege level",
        });
        assert_eq!(
            e.to_string(),
            "bmc h:623 refused chassis control (power down) for user viewer: insufficient privilege"
        );
        let e = to_bmc_error(IpmiError::Unreachable {
            bmc: "h:623".into(),
        });
        assert!(matches!(e, BmcError::Connect { .. }));
    }
}
