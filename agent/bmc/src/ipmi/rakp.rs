//! RMCP+ Open Session and RAKP messages 1-4 (IPMI v2.0 section 13), without I/O.

use super::crypto::CipherSuite;
use super::wire::{DecodeError, byte, le32, take};

/// Privilege levels of IPMI (the low nibble of the RAKP1 role byte).
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
#[repr(u8)]
pub enum Privilege {
    /// Callback level.
    Callback = 1,
    /// User level: reads only.
    User = 2,
    /// Operator level.
    Operator = 3,
    /// Administrator level: needed for chassis control on ipmi_sim and most BMCs.
    Administrator = 4,
}

impl Privilege {
    /// The name the specification uses.
    pub fn name(self) -> &'static str {
        match self {
            Self::Callback => "CALLBACK",
            Self::User => "USER",
            Self::Operator => "OPERATOR",
            Self::Administrator => "ADMINISTRATOR",
        }
    }
}

/// A human reading of an RMCP+ status code.
pub fn rmcp_status_meaning(code: u8) -> &'static str {
    match code {
        0x00 => "no errors",
        0x01 => "insufficient resources to create a session",
        0x02 => "invalid session id",
        0x03 => "invalid payload type",
        0x04 => "invalid authentication algorithm",
        0x05 => "invalid integrity algorithm",
        0x06 => "no matching authentication payload",
        0x07 => "no matching integrity payload",
        0x08 => "inactive session id",
        0x09 => "invalid role",
        0x0A => "unauthorized role or privilege level requested",
        0x0B => "insufficient resources to create a session at the requested role",
        0x0C => "invalid name length",
        0x0D => "unauthorized name",
        0x0E => "unauthorized guid",
        0x0F => "invalid integrity check value",
        0x10 => "invalid confidentiality algorithm",
        0x11 => "no cipher suite match with proposed security algorithms",
        0x12 => "illegal or unrecognized parameter",
        _ => "unknown status",
    }
}

/// RAKP3 status we send when RAKP2's auth code does not match (ends the half-open session).
pub const STATUS_INVALID_INTEGRITY_CHECK: u8 = 0x0F;

/// Open Session Request payload (32 bytes).
pub fn encode_open_session_request(
    tag: u8,
    max_privilege: Privilege,
    console_session_id: u32,
    suite: CipherSuite,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(32);
    out.extend_from_slice(&[tag, max_privilege as u8, 0, 0]);
    out.extend_from_slice(&console_session_id.to_le_bytes());
    for (kind, alg) in [
        (0x00, suite.auth_algorithm()),
        (0x01, suite.integrity_algorithm()),
        (0x02, suite.confidentiality_algorithm()),
    ] {
        out.extend_from_slice(&[kind, 0, 0, 0x08, alg, 0, 0, 0]);
    }
    out
}

/// The parts of an Open Session Response we use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OpenSessionResponse {
    /// Message tag echoed from the request.
    pub tag: u8,
    /// RMCP+ status code (0 = success).
    pub status: u8,
    /// Console session ID echoed.
    pub console_session_id: u32,
    /// Session ID the BMC assigned (0 on error).
    pub bmc_session_id: u32,
    /// Algorithms the BMC chose: (authentication, integrity, confidentiality).
    pub algorithms: Option<(u8, u8, u8)>,
}

/// Decodes an Open Session Response (short form on error, 36 bytes on success).
pub fn decode_open_session_response(p: &[u8]) -> Result<OpenSessionResponse, DecodeError> {
    let what = "open session response";
    let tag = byte(p, 0, what)?;
    let status = byte(p, 1, what)?;
    let console_session_id = le32(p, 4, what)?;
    if status != 0 {
        return Ok(OpenSessionResponse {
            tag,
            status,
            console_session_id,
            bmc_session_id: 0,
            algorithms: None,
        });
    }
    let bmc_session_id = le32(p, 8, what)?;
    let auth = take::<8>(p, 12, what)?;
    let integ = take::<8>(p, 20, what)?;
    let conf = take::<8>(p, 28, what)?;
    Ok(OpenSessionResponse {
        tag,
        status,
        console_session_id,
        bmc_session_id,
        algorithms: Some((auth[4] & 0x3F, integ[4] & 0x3F, conf[4] & 0x3F)),
    })
}

/// RAKP message 1.
pub fn encode_rakp1(
    tag: u8,
    bmc_session_id: u32,
    console_random: &[u8; 16],
    role: u8,
    username: &[u8],
) -> Vec<u8> {
    let mut out = Vec::with_capacity(28 + username.len());
    out.extend_from_slice(&[tag, 0, 0, 0]);
    out.extend_from_slice(&bmc_session_id.to_le_bytes());
    out.extend_from_slice(console_random);
    // Callers bound user names to 16 bytes.
    out.extend_from_slice(&[role, 0, 0, username.len() as u8]);
    out.extend_from_slice(username);
    out
}

/// RAKP message 2.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rakp2 {
    /// Message tag.
    pub tag: u8,
    /// RMCP+ status code.
    pub status: u8,
    /// Console session ID echoed.
    pub console_session_id: u32,
    /// BMC random number `Rc`.
    pub bmc_random: [u8; 16],
    /// BMC GUID.
    pub bmc_guid: [u8; 16],
    /// Key exchange auth code (empty when status is an error).
    pub auth_code: Vec<u8>,
}

/// Decodes RAKP message 2; `auth_code_len` comes from the negotiated suite.
pub fn decode_rakp2(p: &[u8], auth_code_len: usize) -> Result<Rakp2, DecodeError> {
    let what = "rakp message 2";
    let tag = byte(p, 0, what)?;
    let status = byte(p, 1, what)?;
    if status != 0 {
        return Ok(Rakp2 {
            tag,
            status,
            console_session_id: le32(p, 4, what).unwrap_or(0),
            bmc_random: [0; 16],
            bmc_guid: [0; 16],
            auth_code: Vec::new(),
        });
    }
    let console_session_id = le32(p, 4, what)?;
    let bmc_random = take::<16>(p, 8, what)?;
    let bmc_guid = take::<16>(p, 24, what)?;
    let auth_code = p
        .get(40..40 + auth_code_len)
        .ok_or(DecodeError::Truncated {
            what,
            need: 40 + auth_code_len,
            got: p.len(),
        })?
        .to_vec();
    Ok(Rakp2 {
        tag,
        status,
        console_session_id,
        bmc_random,
        bmc_guid,
        auth_code,
    })
}

/// RAKP message 3 (status 0 with our auth code, or an error status with none).
pub fn encode_rakp3(tag: u8, status: u8, bmc_session_id: u32, auth_code: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + auth_code.len());
    out.extend_from_slice(&[tag, status, 0, 0]);
    out.extend_from_slice(&bmc_session_id.to_le_bytes());
    out.extend_from_slice(auth_code);
    out
}

/// RAKP message 4.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rakp4 {
    /// Message tag.
    pub tag: u8,
    /// RMCP+ status code.
    pub status: u8,
    /// Console session ID echoed.
    pub console_session_id: u32,
    /// Integrity check value (empty when status is an error).
    pub integrity_check: Vec<u8>,
}

/// Decodes RAKP message 4; `icv_len` comes from the negotiated suite.
pub fn decode_rakp4(p: &[u8], icv_len: usize) -> Result<Rakp4, DecodeError> {
    let what = "rakp message 4";
    let tag = byte(p, 0, what)?;
    let status = byte(p, 1, what)?;
    if status != 0 {
        return Ok(Rakp4 {
            tag,
            status,
            console_session_id: le32(p, 4, what).unwrap_or(0),
            integrity_check: Vec::new(),
        });
    }
    let console_session_id = le32(p, 4, what)?;
    let integrity_check = p
        .get(8..8 + icv_len)
        .ok_or(DecodeError::Truncated {
            what,
            need: 8 + icv_len,
            got: p.len(),
        })?
        .to_vec();
    Ok(Rakp4 {
        tag,
        status,
        console_session_id,
        integrity_check,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn open_session_request_layout() {
        let p = encode_open_session_request(
            9,
            Privilege::Administrator,
            0x0403_0201,
            CipherSuite::Suite17,
        );
        assert_eq!(p.len(), 32);
        assert_eq!(&p[..8], &[9, 4, 0, 0, 1, 2, 3, 4]);
        assert_eq!(&p[8..16], &[0, 0, 0, 8, 3, 0, 0, 0]);
        assert_eq!(&p[16..24], &[1, 0, 0, 8, 4, 0, 0, 0]);
        assert_eq!(&p[24..32], &[2, 0, 0, 8, 1, 0, 0, 0]);
    }

    #[test]
    fn open_session_response_success_and_error_forms() {
        let mut ok = vec![9, 0, 4, 0, 1, 2, 3, 4, 0xAA, 0xBB, 0xCC, 0xDD];
        ok.extend_from_slice(&[
            0, 0, 0, 8, 1, 0, 0, 0, 1, 0, 0, 8, 1, 0, 0, 0, 2, 0, 0, 8, 1, 0, 0, 0,
        ]);
        let r = decode_open_session_response(&ok).unwrap();
        assert_eq!(r.bmc_session_id, 0xDDCC_BBAA);
        assert_eq!(r.algorithms, Some((1, 1, 1)));
        let err = decode_open_session_response(&[9, 0x11, 0, 0, 1, 2, 3, 4]).unwrap();
        assert_eq!((err.status, err.algorithms), (0x11, None));
        for cut in 0..ok.len() {
            assert!(decode_open_session_response(&ok[..cut]).is_err());
        }
    }

    #[test]
    fn rakp_messages_reject_truncation() {
        let mut r2 = vec![1, 0, 0, 0, 5, 6, 7, 8];
        r2.extend_from_slice(&[0x11; 32]);
        r2.extend_from_slice(&[0x22; 20]);
        assert_eq!(decode_rakp2(&r2, 20).unwrap().auth_code, vec![0x22; 20]);
        assert!(decode_rakp2(&r2, 32).is_err());
        let r4 = [
            1, 0, 0, 0, 5, 6, 7, 8, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12,
        ];
        assert_eq!(decode_rakp4(&r4, 12).unwrap().integrity_check.len(), 12);
        assert!(decode_rakp4(&r4, 16).is_err());
        assert_eq!(decode_rakp4(&[1, 0x0F], 12).unwrap().status, 0x0F);
    }
}
