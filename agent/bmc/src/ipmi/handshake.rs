//! Session set-up: cipher suite choice, Open Session and RAKP 1-4, with the half-open
//! session aborted on every way out before activation.

use std::sync::Arc;

use tokio::net::UdpSocket;

use super::client::{IpmiConfig, IpmiSession};
use super::commands::{self, CMD_GET_CHANNEL_CIPHER_SUITES};
use super::crypto::{self, CipherSuite, RakpContext, SessionKeys, constant_time_eq};
use super::error::IpmiError;
use super::rakp::{self, rmcp_status_meaning};
use super::session::ActiveSession;
use super::transport::{Transport, random};
use super::wire::{DecodeError, PayloadType, encode_rmcp_plus};

/// RAKP1 role bit: look the user up by name only.
const NAME_ONLY_LOOKUP: u8 = 0x10;

/// A session the BMC opened but that is not activated yet. Unless disarmed, dropping it sends
/// RAKP message 3 with an error status, which makes the BMC free the slot (checked on ipmi_sim);
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

/// Asks the BMC which suites it offers and returns the allowed ones it offers, in our
/// order of preference. A BMC that cannot list them gets the allowed list to try in order.
pub(super) async fn choose_suites(
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
pub(super) async fn handshake(
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
