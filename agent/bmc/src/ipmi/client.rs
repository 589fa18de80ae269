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
    CMD_GET_CHANNEL_AUTH_CAPS, CMD_GET_CHANNEL_CIPHER_SUITES, CMD_GET_CHASSIS_STATUS,
    CMD_SET_SESSION_PRIVILEGE, ChassisControl, ChassisStatus, NETFN_APP, NETFN_CHASSIS,
};
use super::crypto::{
    self, CipherSuite, MAX_PASSWORD_LEN, MAX_USERNAME_LEN, RakpContext, SessionKeys,
    constant_time_eq,
};
use super::error::IpmiError;
use super::rakp::{self, Privilege, rmcp_status_meaning};
use super::session::ActiveSession;
use super::wire::{
    DecodeError, Envelope, IpmiRequest, IpmiResponse, PayloadType, decode_envelope,
    encode_rmcp_plus, encode_v15,
};

/// Default timeout of the first attempt of a request.
pub const DEFAULT_FIRST_TIMEOUT: Duration = Duration::from_millis(250);
/// Default cap on the timeout of one attempt.
pub const DEFAULT_MAX_TIMEOUT: Duration = Duration::from_secs(2);
/// Default number of attempts (first send plus retransmissions).
pub const DEFAULT_ATTEMPTS: u32 = 4;
/// Default IPMI port.
pub const DEFAULT_PORT: u16 = 623;
/// RAKP1 role bit: look the user up by name only.
const NAME_ONLY_LOOKUP: u8 = 0x10;
/// Largest datagram we accept.
const MAX_DATAGRAM: usize = 1024;

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

/// How a request may be retransmitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Retransmit {
    /// Resend with a new session sequence number (safe for idempotent requests).
    Fresh,
    /// Resend the identical datagram: a BMC that saw it rejects the replay, so the command
    /// runs at most once (for power cycle and hard reset).
    Identical,
}

/// The socket and the bookkeeping shared by the handshake and the session.
struct Transport {
    socket: Arc<UdpSocket>,
    bmc: String,
    retry: RetryPolicy,
    events: Vec<Event>,
}

impl Transport {
    fn record(&mut self, what: &'static str, step: &'static str, detail: String) {
        tracing::debug!(bmc = %self.bmc, what, step, detail = %detail, "ipmi exchange");
        self.events.push(Event {
            at: Instant::now(),
            what,
            step,
            detail,
        });
    }

    fn io_error(&self, source: std::io::Error) -> IpmiError {
        if source.kind() == std::io::ErrorKind::ConnectionRefused {
            IpmiError::Unreachable {
                bmc: self.bmc.clone(),
            }
        } else {
            IpmiError::Io {
                bmc: self.bmc.clone(),
                source,
            }
        }
    }

    /// Sends what `make` builds and waits for a datagram `accept` takes, retransmitting per
    /// the policy. `accept` returns `None` for datagrams that are not the answer (ignored),
    /// `Some(Err)` for an answer that ends the exchange with an error.
    async fn exchange<S, T>(
        &mut self,
        state: &mut S,
        step: &'static str,
        mut make: impl FnMut(&mut S) -> Result<Vec<u8>, IpmiError>,
        mut accept: impl FnMut(&mut S, &[u8]) -> Result<Option<T>, AcceptError>,
    ) -> Result<T, IpmiError> {
        let begun = Instant::now();
        let mut buf = [0u8; MAX_DATAGRAM];
        let mut last_malformed: Option<DecodeError> = None;
        let attempts = self.retry.attempts.max(1);
        for attempt in 0..attempts {
            let datagram = make(state)?;
            self.record(
                if attempt == 0 { "sent" } else { "retransmit" },
                step,
                format!("attempt {}", attempt + 1),
            );
            self.socket
                .send(&datagram)
                .await
                .map_err(|e| self.io_error(e))?;
            let deadline = Instant::now() + self.retry.attempt_timeout(attempt);
            loop {
                let received = tokio::time::timeout_at(deadline, self.socket.recv(&mut buf)).await;
                let Ok(received) = received else { break };
                let len = received.map_err(|e| self.io_error(e))?;
                match accept(state, &buf[..len]) {
                    Ok(Some(v)) => {
                        self.record("received", step, format!("{len} bytes"));
                        return Ok(v);
                    }
                    Ok(None) => {
                        self.record("ignored", step, format!("{len} bytes, not the answer"));
                    }
                    Err(AcceptError::Malformed(e)) => {
                        self.record("ignored", step, e.to_string());
                        last_malformed = Some(e);
                    }
                    Err(AcceptError::Fatal(e)) => {
                        self.record("received", step, e.to_string());
                        return Err(e);
                    }
                }
            }
        }
        if let Some(source) = last_malformed {
            return Err(IpmiError::Malformed {
                bmc: self.bmc.clone(),
                step,
                source,
            });
        }
        Err(IpmiError::Timeout {
            bmc: self.bmc.clone(),
            step,
            attempts,
            elapsed: begun.elapsed(),
        })
    }

    /// Sends a session-less IPMI 1.5 request and returns the response data (completion 0).
    async fn presession(
        &mut self,
        rq_seq: u8,
        cmd: u8,
        data: Vec<u8>,
        step: &'static str,
    ) -> Result<Vec<u8>, IpmiError> {
        let req = IpmiRequest {
            netfn: NETFN_APP,
            cmd,
            rq_seq,
            data,
        };
        let datagram = encode_v15(&req.encode());
        let bmc = self.bmc.clone();
        self.exchange(
            &mut (),
            step,
            |()| Ok(datagram.clone()),
            |(), dg| {
                // Some BMCs (pyghmi) answer session-less requests in RMCP+ format.
                let message = match decode_envelope(dg, 0)? {
                    Envelope::V15 { message, .. } => message,
                    Envelope::V20(p)
                        if p.payload_type == PayloadType::Ipmi as u8
                            && !p.authenticated
                            && !p.encrypted =>
                    {
                        p.payload
                    }
                    Envelope::V20(p) => {
                        return Err(DecodeError::UnexpectedPayloadType(p.payload_type).into());
                    }
                };
                let resp = IpmiResponse::decode(message)?;
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

    /// Sends an unauthenticated RMCP+ session-setup payload and returns the answer's payload.
    async fn setup(
        &mut self,
        ptype: PayloadType,
        expect: PayloadType,
        payload: &[u8],
        step: &'static str,
    ) -> Result<Vec<u8>, IpmiError> {
        let (datagram, _) = encode_rmcp_plus(ptype, false, false, 0, 0, payload);
        self.exchange(
            &mut (),
            step,
            |()| Ok(datagram.clone()),
            |(), dg| match decode_envelope(dg, 0)? {
                Envelope::V20(p) if p.payload_type == expect as u8 => Ok(Some(p.payload.to_vec())),
                _ => Ok(None),
            },
        )
        .await
    }
}

/// How `accept` rejects a datagram.
enum AcceptError {
    /// Undecodable: ignored, remembered for the final error.
    Malformed(DecodeError),
    /// The answer says the exchange failed.
    Fatal(IpmiError),
}

impl From<DecodeError> for AcceptError {
    fn from(e: DecodeError) -> Self {
        Self::Malformed(e)
    }
}

fn completion_error(bmc: &str, command: &'static str, code: u8) -> IpmiError {
    IpmiError::Completion {
        bmc: bmc.to_owned(),
        command,
        code,
        meaning: commands::completion_meaning(code),
    }
}

fn random<const N: usize>(bmc: &str) -> Result<[u8; N], IpmiError> {
    let mut out = [0u8; N];
    getrandom::fill(&mut out).map_err(|_| IpmiError::Random {
        bmc: bmc.to_owned(),
    })?;
    Ok(out)
}

/// An activated RMCP+ session at the configured privilege level.
pub struct IpmiSession {
    transport: Transport,
    active: ActiveSession,
    user: String,
    closed: bool,
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
        let mut t = Transport {
            socket: Arc::new(socket),
            bmc: bmc.clone(),
            retry: config.retry,
            events: Vec::new(),
        };

        let caps = t
            .presession(
                1,
                CMD_GET_CHANNEL_AUTH_CAPS,
                commands::get_channel_auth_caps(config.privilege),
                "get channel authentication capabilities",
            )
            .await?;
        match commands::supports_ipmi_v2(&caps) {
            Ok(true) => {}
            Ok(false) => return Err(IpmiError::NotIpmiV2 { bmc }),
            Err(source) => {
                return Err(IpmiError::Malformed {
                    bmc,
                    step: "get channel authentication capabilities",
                    source,
                });
            }
        }
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

    /// Chassis Control. A completion code 0xD4 becomes [`IpmiError::PrivilegeRefused`].
    pub async fn chassis_control(&mut self, action: ChassisControl) -> Result<(), IpmiError> {
        let retransmit = if action.is_idempotent() {
            Retransmit::Fresh
        } else {
            Retransmit::Identical
        };
        match self
            .command(
                NETFN_CHASSIS,
                CMD_CHASSIS_CONTROL,
                vec![action as u8],
                "chassis control",
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
        let mut sealed: Option<Vec<u8>> = None;
        self.transport
            .exchange(
                &mut self.active,
                step,
                |active| {
                    if let (Retransmit::Identical, Some(s)) = (retransmit, &sealed) {
                        return Ok(s.clone());
                    }
                    let s = active.seal(&req, random(&bmc)?);
                    sealed = Some(s.clone());
                    Ok(s)
                },
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

/// A session the BMC opened but that is not activated yet. Unless disarmed, dropping it sends
/// RAKP message 3 with an error status, which makes the BMC free the slot (IPMI v2.0 §13.22);
/// this covers a wrong password, a lost RAKP answer and a cancelled handshake alike.
struct HalfOpen {
    socket: Arc<UdpSocket>,
    bmc_session_id: u32,
    armed: bool,
}

impl Drop for HalfOpen {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let abort = rakp::encode_rakp3(
            3,
            rakp::STATUS_INVALID_INTEGRITY_CHECK,
            self.bmc_session_id,
            &[],
        );
        let (datagram, _) = encode_rmcp_plus(PayloadType::Rakp3, false, false, 0, 0, &abort);
        let sent = self.socket.try_send(&datagram).is_ok();
        tracing::debug!(sent, "ipmi half-open session aborted");
    }
}

async fn resolve(host: &str, port: u16, bmc: &str) -> Result<SocketAddr, IpmiError> {
    let mut addrs = tokio::net::lookup_host((host, port))
        .await
        .map_err(|source| IpmiError::Resolve {
            bmc: bmc.to_owned(),
            source,
        })?;
    addrs.next().ok_or_else(|| IpmiError::Resolve {
        bmc: bmc.to_owned(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no address"),
    })
}

/// Asks the BMC which suites it offers and returns the allowed ones it offers, in our
/// order of preference. A BMC that cannot list them gets the allowed list to try in order.
async fn choose_suites(
    t: &mut Transport,
    config: &IpmiConfig,
) -> Result<Vec<CipherSuite>, IpmiError> {
    let mut records = Vec::new();
    // 16 pages of 16 bytes hold ~50 suite records, more than any BMC lists.
    for page in 0..16u8 {
        let data = match t
            .presession(
                2 + page,
                CMD_GET_CHANNEL_CIPHER_SUITES,
                commands::get_channel_cipher_suites(page),
                "get channel cipher suites",
            )
            .await
        {
            Ok(d) => d,
            Err(IpmiError::Completion { .. }) if page == 0 => return Ok(config.suites.clone()),
            Err(e) => return Err(e),
        };
        let Ok((page_records, more)) = commands::cipher_suite_page(&data) else {
            break;
        };
        records.extend_from_slice(page_records);
        if !more {
            break;
        }
    }
    let offered = commands::parse_cipher_suite_records(&records);
    let chosen: Vec<CipherSuite> = config
        .suites
        .iter()
        .copied()
        .filter(|s| offered.contains(&s.id()))
        .collect();
    if chosen.is_empty() {
        return Err(IpmiError::NoCommonCipherSuite {
            bmc: t.bmc.clone(),
            offered,
            allowed: config.suites.iter().map(|s| s.id()).collect(),
        });
    }
    t.record(
        "chose",
        "cipher suite",
        format!("offered {offered:?}, using {}", chosen[0].id()),
    );
    Ok(chosen)
}

/// Open Session and RAKP 1-4 with one suite. On failure, gives the transport back so the
/// caller may try another suite.
async fn handshake(
    mut t: Transport,
    config: &IpmiConfig,
    suite: CipherSuite,
    kuid: &[u8],
) -> Result<IpmiSession, (Transport, IpmiError)> {
    match handshake_steps(&mut t, config, suite, kuid).await {
        Ok((keys, bmc_sid, console_sid)) => Ok(IpmiSession {
            transport: t,
            active: ActiveSession::new(keys, bmc_sid, console_sid),
            user: config.username.clone(),
            closed: false,
        }),
        Err(e) => Err((t, e)),
    }
}

async fn handshake_steps(
    t: &mut Transport,
    config: &IpmiConfig,
    suite: CipherSuite,
    kuid: &[u8],
) -> Result<(SessionKeys, u32, u32), IpmiError> {
    let bmc = t.bmc.clone();
    let user = config.username.clone();
    let refused = |step, status| IpmiError::SessionRefused {
        bmc: bmc.clone(),
        step,
        status,
        meaning: rmcp_status_meaning(status),
    };
    let malformed = |step, source| IpmiError::Malformed {
        bmc: bmc.clone(),
        step,
        source,
    };
    let mut console_sid = 0;
    while console_sid == 0 {
        console_sid = u32::from_le_bytes(random(&bmc)?);
    }

    // Open Session.
    let step = "open session";
    let open = rakp::encode_open_session_request(1, config.privilege, console_sid, suite);
    let answer = t
        .setup(
            PayloadType::OpenSessionRequest,
            PayloadType::OpenSessionResponse,
            &open,
            step,
        )
        .await?;
    let r = rakp::decode_open_session_response(&answer).map_err(|e| malformed(step, e))?;
    if r.status != 0 {
        return Err(refused(step, r.status));
    }
    let wanted = (
        suite.auth_algorithm(),
        suite.integrity_algorithm(),
        suite.confidentiality_algorithm(),
    );
    if r.console_session_id != console_sid || r.algorithms != Some(wanted) || r.bmc_session_id == 0
    {
        return Err(malformed(
            step,
            DecodeError::UnexpectedPayloadType(PayloadType::OpenSessionResponse as u8),
        ));
    }
    let bmc_sid = r.bmc_session_id;
    // From here until activation the BMC holds a slot for us: free it on every way out.
    let mut half_open = HalfOpen {
        socket: Arc::clone(&t.socket),
        bmc_session_id: bmc_sid,
        armed: true,
    };

    // RAKP 1 and 2.
    let step = "rakp message 2";
    let console_random: [u8; 16] = random(&bmc)?;
    let role = config.privilege as u8 | NAME_ONLY_LOOKUP;
    let rakp1 = rakp::encode_rakp1(2, bmc_sid, &console_random, role, user.as_bytes());
    let answer = t
        .setup(PayloadType::Rakp1, PayloadType::Rakp2, &rakp1, step)
        .await?;
    let r2 = rakp::decode_rakp2(&answer, suite.auth_code_len()).map_err(|e| malformed(step, e))?;
    let auth_failed = || IpmiError::AuthenticationFailed {
        bmc: bmc.clone(),
        user: user.clone(),
    };
    match r2.status {
        0 => {}
        0x0D | 0x0F => return Err(auth_failed()),
        0x09..=0x0B => {
            return Err(IpmiError::PrivilegeRefused {
                bmc: bmc.clone(),
                user: user.clone(),
                what: format!("privilege {}", config.privilege.name()),
                meaning: rmcp_status_meaning(r2.status),
            });
        }
        s => return Err(refused(step, s)),
    }
    let ctx = RakpContext {
        console_session_id: console_sid,
        bmc_session_id: bmc_sid,
        console_random,
        bmc_random: r2.bmc_random,
        bmc_guid: r2.bmc_guid,
        role,
        username: user.as_bytes(),
    };
    if !constant_time_eq(&crypto::rakp2_auth_code(suite, kuid, &ctx), &r2.auth_code) {
        // `half_open` tells the BMC to drop the session as we return.
        return Err(auth_failed());
    }

    // RAKP 3 and 4.
    let step = "rakp message 4";
    let code = crypto::rakp3_auth_code(suite, kuid, &ctx);
    let rakp3 = rakp::encode_rakp3(3, 0, bmc_sid, &code);
    let answer = t
        .setup(PayloadType::Rakp3, PayloadType::Rakp4, &rakp3, step)
        .await?;
    let r4 = rakp::decode_rakp4(&answer, suite.integrity_len()).map_err(|e| malformed(step, e))?;
    match r4.status {
        0 => {}
        0x0D | 0x0F => return Err(auth_failed()),
        s => return Err(refused(step, s)),
    }
    let sik = crypto::session_integrity_key(suite, kuid, &ctx);
    if !constant_time_eq(
        &crypto::rakp4_integrity_check(suite, &sik, &ctx),
        &r4.integrity_check,
    ) {
        return Err(IpmiError::Rakp4Mismatch { bmc });
    }
    half_open.armed = false;
    t.record("activated", "session", format!("suite {}", suite.id()));
    Ok((SessionKeys::derive(suite, &sik), bmc_sid, console_sid))
}
