//! The async IPMI v2.0 (RMCP+) client on a connected tokio UDP socket.
//!
//! [`IpmiSession::connect`] runs: Get Channel Authentication Capabilities → Get Channel Cipher
//! Suites (prefer 17, else 3, within the configured list) → Open Session → RAKP 1-4 → Set
//! Session Privilege Level. Every request is retransmitted with exponential backoff; a
//! connected socket turns ICMP port-unreachable into an immediate error. The session is
//! closed by [`IpmiSession::close`], and on every other path (an error, a dropped future) by
//! `Drop`, which sends a sealed Close Session without waiting for the answer.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::UdpSocket;
use tokio::time::Instant;
use zeroize::Zeroizing;

use super::commands::{
    self, CC_INSUFFICIENT_PRIVILEGE, CMD_CHASSIS_CONTROL, CMD_CLOSE_SESSION,
    CMD_GET_CHANNEL_AUTH_CAPS, CMD_GET_CHASSIS_STATUS, CMD_GET_SYSTEM_GUID,
    CMD_SET_SESSION_PRIVILEGE, ChassisControl, ChassisStatus, NETFN_APP, NETFN_CHASSIS,
};
use super::crypto::{self, CipherSuite, MAX_PASSWORD_LEN, MAX_USERNAME_LEN};
use super::error::IpmiError;
use super::handshake::{choose_suites, handshake};
use super::rakp::Privilege;
use super::session::ActiveSession;
use super::transport::{AcceptError, Retransmit, Transport, completion_error, random, resolve};

/// Default timeout of the first attempt of a request.
pub const DEFAULT_FIRST_TIMEOUT: Duration = Duration::from_millis(250);
/// Default cap on the timeout of one attempt.
pub const DEFAULT_MAX_TIMEOUT: Duration = Duration::from_secs(2);
/// Default number of attempts (first send plus retransmissions).
pub const DEFAULT_ATTEMPTS: u32 = 4;
/// Default IPMI port.
pub const DEFAULT_PORT: u16 = 623;

/// How requests are retransmitted: the attempt timeout starts at `first_timeout` and doubles
/// up to `max_timeout`, for `attempts` sends in all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Timeout of the first attempt.
    pub first_timeout: Duration,
    /// Cap on one attempt's timeout.
    pub max_timeout: Duration,
    /// Total sends of one request (at least 1).
    pub attempts: u32,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self {
            first_timeout: DEFAULT_FIRST_TIMEOUT,
            max_timeout: DEFAULT_MAX_TIMEOUT,
            attempts: DEFAULT_ATTEMPTS,
        }
    }
}

impl RetryPolicy {
    /// The timeout of attempt `n` (0-based).
    pub fn attempt_timeout(&self, n: u32) -> Duration {
        let factor = 1u32.checked_shl(n.min(16)).unwrap_or(u32::MAX);
        self.first_timeout
            .saturating_mul(factor)
            .min(self.max_timeout)
    }

    /// The longest a request can take before it fails with a timeout.
    pub fn worst_case(&self) -> Duration {
        (0..self.attempts.max(1))
            .map(|n| self.attempt_timeout(n))
            .sum()
    }
}

/// Where and how to reach one BMC.
#[derive(Clone)]
pub struct IpmiConfig {
    /// Host name or address.
    pub host: String,
    /// UDP port (623 by default).
    pub port: u16,
    /// User name (at most 16 bytes).
    pub username: String,
    /// Password (at most 20 bytes); never logged or printed.
    pub password: Zeroizing<Vec<u8>>,
    /// Allowed cipher suites in order of preference.
    pub suites: Vec<CipherSuite>,
    /// Privilege level the session is raised to.
    pub privilege: Privilege,
    /// Retransmission policy of every request.
    pub retry: RetryPolicy,
}

impl fmt::Debug for IpmiConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpmiConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field("suites", &self.suites)
            .field("privilege", &self.privilege)
            .field("retry", &self.retry)
            .finish()
    }
}

impl IpmiConfig {
    /// A configuration with the defaults: port 623, suites 17 then 3, ADMINISTRATOR.
    pub fn new(
        host: impl Into<String>,
        username: impl Into<String>,
        password: Zeroizing<Vec<u8>>,
    ) -> Self {
        Self {
            host: host.into(),
            port: DEFAULT_PORT,
            username: username.into(),
            password,
            suites: CipherSuite::PREFERRED.to_vec(),
            privilege: Privilege::Administrator,
            retry: RetryPolicy::default(),
        }
    }

    /// `host:port` as used in messages.
    pub fn bmc(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]:{}", self.host, self.port)
        } else {
            format!("{}:{}", self.host, self.port)
        }
    }
}

/// A UDP socket connected to the BMC (so ICMP port-unreachable surfaces as an error).
async fn open_transport(config: &IpmiConfig) -> Result<Transport, IpmiError> {
    let bmc = config.bmc();
    let addr = resolve(&config.host, config.port, &bmc).await?;
    let local: SocketAddr = if addr.is_ipv4() {
        SocketAddr::from(([0, 0, 0, 0], 0))
    } else {
        SocketAddr::from(([0u16; 8], 0))
    };
    let io = |source| IpmiError::Io {
        bmc: bmc.clone(),
        source,
    };
    let socket = UdpSocket::bind(local).await.map_err(io)?;
    socket.connect(addr).await.map_err(io)?;
    Ok(Transport {
        socket: Arc::new(socket),
        bmc,
        retry: config.retry,
        events: Vec::new(),
    })
}

/// Get Channel Authentication Capabilities (pre-session); fails unless the BMC speaks v2.0.
async fn require_ipmi_v2(t: &mut Transport, privilege: Privilege) -> Result<(), IpmiError> {
    let step = "get channel authentication capabilities";
    let caps = t
        .presession(
            1,
            CMD_GET_CHANNEL_AUTH_CAPS,
            commands::get_channel_auth_caps(privilege),
            step,
        )
        .await?;
    match commands::supports_ipmi_v2(&caps) {
        Ok(true) => Ok(()),
        Ok(false) => Err(IpmiError::NotIpmiV2 { bmc: t.bmc.clone() }),
        Err(source) => Err(IpmiError::Malformed {
            bmc: t.bmc.clone(),
            step,
            source,
        }),
    }
}

/// One step of the conversation with the BMC, for the operation's timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    /// When it happened.
    pub at: Instant,
    /// What happened (`sent`, `received`, `retransmit`, `ignored`).
    pub what: &'static str,
    /// The request or answer concerned.
    pub step: &'static str,
    /// Detail (attempt number, decode error, completion code).
    pub detail: String,
}

/// An activated RMCP+ session at the configured privilege level.
pub struct IpmiSession {
    pub(super) transport: Transport,
    pub(super) active: ActiveSession,
    pub(super) user: String,
    pub(super) closed: bool,
}

impl fmt::Debug for IpmiSession {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("IpmiSession")
            .field("bmc", &self.transport.bmc)
            .field("user", &self.user)
            .field("bmc_session_id", &self.active.bmc_session_id())
            .field("closed", &self.closed)
            .finish_non_exhaustive()
    }
}

impl IpmiSession {
    /// Establishes a session with the BMC and raises it to the configured privilege.
    pub async fn connect(config: &IpmiConfig) -> Result<Self, IpmiError> {
        let bmc = config.bmc();
        let invalid = |reason| IpmiError::Config {
            bmc: bmc.clone(),
            reason,
        };
        if config.username.len() > MAX_USERNAME_LEN {
            return Err(invalid("user name longer than 16 bytes"));
        }
        let kuid = crypto::user_key(&config.password)
            .ok_or_else(|| invalid("password longer than 20 bytes"))?;
        debug_assert_eq!(kuid.len(), MAX_PASSWORD_LEN);
        if config.suites.is_empty() {
            return Err(invalid("no cipher suite allowed"));
        }
        let mut t = open_transport(config).await?;
        require_ipmi_v2(&mut t, config.privilege).await?;
        let candidates = choose_suites(&mut t, config).await?;
        let mut last_err = None;
        for suite in candidates {
            match handshake(t, config, suite, &kuid[..]).await {
                Ok(session) => return session.raise_privilege(config.privilege).await,
                Err((
                    back,
                    e @ IpmiError::SessionRefused {
                        status: 0x04 | 0x05 | 0x10 | 0x11,
                        ..
                    },
                )) => {
                    t = back;
                    last_err = Some(e);
                }
                Err((_, e)) => return Err(e),
            }
        }
        Err(last_err.unwrap_or(IpmiError::Config {
            bmc,
            reason: "no cipher suite allowed",
        }))
    }

    /// Asks the BMC for its channel authentication capabilities, which needs no session and
    /// no credentials: `Ok` when it answers and speaks IPMI v2.0 (RMCP+). A reachability
    /// check: it proves the BMC answers on its port, not that the credentials work.
    pub async fn probe(config: &IpmiConfig) -> Result<(), IpmiError> {
        let mut t = open_transport(config).await?;
        require_ipmi_v2(&mut t, config.privilege).await
    }

    async fn raise_privilege(mut self, privilege: Privilege) -> Result<Self, IpmiError> {
        let step = "set session privilege level";
        match self
            .command(
                NETFN_APP,
                CMD_SET_SESSION_PRIVILEGE,
                commands::set_session_privilege(privilege),
                step,
                Retransmit::Fresh,
            )
            .await
        {
            // The answer carries the level now in force; a BMC may grant less than asked.
            Ok(data) if data.first().map(|b| b & 0x0F) == Some(privilege as u8) => Ok(self),
            Ok(data) => {
                tracing::warn!(bmc = %self.transport.bmc, granted = ?data.first(), "ipmi privilege not granted");
                let e = IpmiError::PrivilegeRefused {
                    bmc: self.transport.bmc.clone(),
                    user: self.user.clone(),
                    what: format!("privilege {}", privilege.name()),
                    meaning: "the bmc granted a lower level",
                };
                let _ = self.close().await;
                Err(e)
            }
            Err(e) => {
                let e = match e {
                    IpmiError::Completion {
                        bmc,
                        code: code @ (0x80 | 0x81 | CC_INSUFFICIENT_PRIVILEGE),
                        ..
                    } => IpmiError::PrivilegeRefused {
                        bmc,
                        user: self.user.clone(),
                        what: format!("privilege {}", privilege.name()),
                        meaning: commands::completion_meaning(code),
                    },
                    other => other,
                };
                // Best effort: the error that brought us here matters more than the close.
                let _ = self.close().await;
                Err(e)
            }
        }
    }

    /// The BMC address as `host:port`.
    pub fn bmc(&self) -> &str {
        &self.transport.bmc
    }

    /// What was sent and seen so far.
    pub fn events(&self) -> &[Event] {
        &self.transport.events
    }

    /// Takes the events recorded since the last call.
    pub fn take_events(&mut self) -> Vec<Event> {
        std::mem::take(&mut self.transport.events)
    }

    /// Get Chassis Status.
    pub async fn chassis_status(&mut self) -> Result<ChassisStatus, IpmiError> {
        let step = "get chassis status";
        let data = self
            .command(
                NETFN_CHASSIS,
                CMD_GET_CHASSIS_STATUS,
                Vec::new(),
                step,
                Retransmit::Fresh,
            )
            .await?;
        commands::parse_chassis_status(&data).map_err(|source| IpmiError::Malformed {
            bmc: self.transport.bmc.clone(),
            step,
            source,
        })
    }

    /// Get System GUID: the 16 bytes as the BMC sent them. A completion code is
    /// [`IpmiError::Completion`] (the session stays usable).
    pub async fn system_guid(&mut self) -> Result<[u8; 16], IpmiError> {
        let step = "get system guid";
        let data = self
            .command(
                NETFN_APP,
                CMD_GET_SYSTEM_GUID,
                Vec::new(),
                step,
                Retransmit::Fresh,
            )
            .await?;
        commands::parse_system_guid(&data).map_err(|source| IpmiError::Malformed {
            bmc: self.transport.bmc.clone(),
            step,
            source,
        })
    }

    /// Chassis Control. A completion code 0xD4 becomes [`IpmiError::PrivilegeRefused`].
    pub async fn chassis_control(&mut self, action: ChassisControl) -> Result<(), IpmiError> {
        let (retransmit, step) = if action.is_idempotent() {
            (Retransmit::Fresh, "chassis control")
        } else {
            (
                Retransmit::Never,
                "chassis control (sent once, never repeated: it may have run)",
            )
        };
        match self
            .command(
                NETFN_CHASSIS,
                CMD_CHASSIS_CONTROL,
                vec![action as u8],
                step,
                retransmit,
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(IpmiError::Completion {
                bmc,
                code: CC_INSUFFICIENT_PRIVILEGE,
                ..
            }) => Err(IpmiError::PrivilegeRefused {
                bmc,
                user: self.user.clone(),
                what: format!("chassis control ({})", action.name()),
                meaning: commands::completion_meaning(CC_INSUFFICIENT_PRIVILEGE),
            }),
            Err(e) => Err(e),
        }
    }

    /// Closes the session and waits for the BMC's answer.
    pub async fn close(mut self) -> Result<Vec<Event>, IpmiError> {
        self.closed = true;
        let id = self.active.bmc_session_id();
        let result = self
            .command(
                NETFN_APP,
                CMD_CLOSE_SESSION,
                commands::close_session(id),
                "close session",
                Retransmit::Fresh,
            )
            .await;
        let events = std::mem::take(&mut self.transport.events);
        match result {
            // 0x87: the BMC no longer knows the session (it closed already).
            Ok(_) | Err(IpmiError::Completion { code: 0x87, .. }) => Ok(events),
            Err(e) => Err(e),
        }
    }

    async fn command(
        &mut self,
        netfn: u8,
        cmd: u8,
        data: Vec<u8>,
        step: &'static str,
        retransmit: Retransmit,
    ) -> Result<Vec<u8>, IpmiError> {
        let req = self.active.request(netfn, cmd, data);
        let bmc = self.transport.bmc.clone();
        self.transport
            .exchange(
                &mut self.active,
                step,
                retransmit,
                |active| Ok(active.seal(&req, random(&bmc)?)),
                |active, dg| {
                    let resp = active.open(dg)?;
                    if !resp.answers(&req) {
                        return Ok(None);
                    }
                    if resp.completion != 0 {
                        return Err(AcceptError::Fatal(completion_error(
                            &bmc,
                            step,
                            resp.completion,
                        )));
                    }
                    Ok(Some(resp.data))
                },
            )
            .await
    }
}

impl Drop for IpmiSession {
    fn drop(&mut self) {
        if self.closed {
            return;
        }
        // Cancelled or abandoned: free the BMC's session slot with one sealed Close Session.
        let req = self.active.request(
            NETFN_APP,
            CMD_CLOSE_SESSION,
            commands::close_session(self.active.bmc_session_id()),
        );
        if let Ok(iv) = random::<16>(&self.transport.bmc) {
            let datagram = self.active.seal(&req, iv);
            let sent = self.transport.socket.try_send(&datagram).is_ok();
            tracing::debug!(bmc = %self.transport.bmc, sent, "ipmi session closed on drop");
        }
    }
}
