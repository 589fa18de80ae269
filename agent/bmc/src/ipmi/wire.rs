//! RMCP and IPMI LAN framing, without I/O and without cryptography.
//!
//! Layout of a datagram (IPMI v2.0 section 13):
//!
//! ```text
//! RMCP header   06 00 FF 07
//! IPMI 1.5      auth-type(00) seq(4) session-id(4) [auth-code(16)] length(1) message
//! RMCP+         auth-type(06) payload-type(1) session-id(4) seq(4) length(2) payload
//!               [pad(0-3 x FF) pad-length(1) next-header(07) auth-code]   when authenticated
//! ```
//!
//! Every decoder takes untrusted bytes and returns a [`DecodeError`] instead of panicking.

use thiserror::Error;

/// RMCP version byte (RMCP 1.0 as used by ASF and IPMI).
pub const RMCP_VERSION: u8 = 0x06;
/// RMCP sequence number meaning "no RMCP ACK wanted".
pub const RMCP_SEQ_NO_ACK: u8 = 0xFF;
/// RMCP message class of IPMI messages (normal, not ACK).
pub const RMCP_CLASS_IPMI: u8 = 0x07;
/// Session authentication type of IPMI 1.5 packets without authentication.
pub const AUTH_TYPE_NONE: u8 = 0x00;
/// Session authentication type ("format") that marks an RMCP+ (IPMI v2.0) packet.
pub const AUTH_TYPE_RMCP_PLUS: u8 = 0x06;
/// Next-header byte of the RMCP+ integrity trailer.
pub const NEXT_HEADER: u8 = 0x07;
/// Slave address of the BMC.
pub const BMC_SLAVE_ADDR: u8 = 0x20;
/// Software ID used for the remote console (requester).
pub const CONSOLE_SOFTWARE_ID: u8 = 0x81;

/// Why an IPMI datagram could not be decoded.
#[derive(Debug, Clone, PartialEq, Eq, Error)]
pub enum DecodeError {
    /// The datagram ended before a field it must contain.
    #[error("{what} truncated: needs {need} bytes, got {got}")]
    Truncated {
        /// Which structure was being read.
        what: &'static str,
        /// Bytes required.
        need: usize,
        /// Bytes available.
        got: usize,
    },
    /// The RMCP header is not version 6 / class IPMI.
    #[error("not an rmcp ipmi packet (version {version:#04x}, class {class:#04x})")]
    NotRmcpIpmi {
        /// RMCP version byte seen.
        version: u8,
        /// RMCP class byte seen.
        class: u8,
    },
    /// The session authentication type is one this client does not speak.
    #[error("unsupported session auth type {0:#04x}")]
    UnsupportedAuthType(u8),
    /// A length field disagrees with the datagram size.
    #[error("{what} length field says {declared} bytes, datagram holds {available}")]
    LengthMismatch {
        /// Which length field.
        what: &'static str,
        /// Value of the length field.
        declared: usize,
        /// Bytes actually present.
        available: usize,
    },
    /// An IPMI message checksum does not add up to zero.
    #[error("ipmi message {which} checksum is wrong")]
    BadChecksum {
        /// `header` or `data`.
        which: &'static str,
    },
    /// The integrity trailer is malformed (pad, pad length or next header).
    #[error("rmcp+ integrity trailer is malformed")]
    BadTrailer,
    /// The integrity auth code does not match the packet.
    #[error("rmcp+ integrity check failed")]
    IntegrityMismatch,
    /// The AES confidentiality pad is malformed (wrong key or corrupted packet).
    #[error("rmcp+ confidentiality pad is malformed")]
    BadConfidentialityPad,
    /// A packet that must be authenticated (or encrypted) was not.
    #[error("rmcp+ packet is missing required {0}")]
    MissingProtection(&'static str),
    /// The payload type is not the one expected at this point.
    #[error("unexpected rmcp+ payload type {0:#04x}")]
    UnexpectedPayloadType(u8),
    /// The packet carries another session's ID.
    #[error("packet for session {got:#010x}, expected {expected:#010x}")]
    WrongSession {
        /// Session ID expected.
        expected: u32,
        /// Session ID seen.
        got: u32,
    },
    /// The session sequence number is zero, replayed or out of order.
    #[error("session sequence number {got} rejected (last accepted {last})")]
    BadSequence {
        /// Sequence number seen.
        got: u32,
        /// Last sequence number accepted.
        last: u32,
    },
}

/// Reads `N` bytes at `at`, or reports what was truncated.
pub(crate) fn take<const N: usize>(
    bytes: &[u8],
    at: usize,
    what: &'static str,
) -> Result<[u8; N], DecodeError> {
    bytes
        .get(at..at + N)
        .and_then(|s| <[u8; N]>::try_from(s).ok())
        .ok_or(DecodeError::Truncated {
            what,
            need: at + N,
            got: bytes.len(),
        })
}

/// Reads one byte at `at`.
pub(crate) fn byte(bytes: &[u8], at: usize, what: &'static str) -> Result<u8, DecodeError> {
    take::<1>(bytes, at, what).map(|b| b[0])
}

/// Reads a little-endian `u32` at `at`.
pub(crate) fn le32(bytes: &[u8], at: usize, what: &'static str) -> Result<u32, DecodeError> {
    take::<4>(bytes, at, what).map(u32::from_le_bytes)
}

/// Two's-complement checksum of IPMI messages: the bytes plus it sum to zero.
pub fn checksum(bytes: &[u8]) -> u8 {
    bytes
        .iter()
        .fold(0u8, |acc, b| acc.wrapping_add(*b))
        .wrapping_neg()
}

/// Writes the 4-byte RMCP header for an IPMI message.
pub fn push_rmcp_header(out: &mut Vec<u8>) {
    out.extend_from_slice(&[RMCP_VERSION, 0x00, RMCP_SEQ_NO_ACK, RMCP_CLASS_IPMI]);
}

/// Checks the RMCP header and returns the rest of the datagram.
pub fn strip_rmcp_header(datagram: &[u8]) -> Result<&[u8], DecodeError> {
    let h = take::<4>(datagram, 0, "rmcp header")?;
    if h[0] != RMCP_VERSION || h[3] & 0x1F != RMCP_CLASS_IPMI || h[3] & 0x80 != 0 {
        return Err(DecodeError::NotRmcpIpmi {
            version: h[0],
            class: h[3],
        });
    }
    Ok(&datagram[4..])
}

/// An IPMI request message (the part inside the session wrapper).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpmiRequest {
    /// Network function (even: request).
    pub netfn: u8,
    /// Command number.
    pub cmd: u8,
    /// Requester sequence number (6 bits) used to match the response.
    pub rq_seq: u8,
    /// Request data.
    pub data: Vec<u8>,
}

impl IpmiRequest {
    /// Encodes the message with both checksums (BMC at 0x20, LUN 0, console SWID 0x81).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(7 + self.data.len());
        out.push(BMC_SLAVE_ADDR);
        out.push(self.netfn << 2);
        out.push(checksum(&out[0..2]));
        out.push(CONSOLE_SOFTWARE_ID);
        out.push((self.rq_seq & 0x3F) << 2);
        out.push(self.cmd);
        out.extend_from_slice(&self.data);
        out.push(checksum(&out[3..]));
        out
    }
}

/// A decoded IPMI response message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpmiResponse {
    /// Network function (odd: response).
    pub netfn: u8,
    /// Command number.
    pub cmd: u8,
    /// Requester sequence number echoed by the BMC.
    pub rq_seq: u8,
    /// Completion code (0x00 = success).
    pub completion: u8,
    /// Response data after the completion code.
    pub data: Vec<u8>,
}

impl IpmiResponse {
    /// Decodes a response message and verifies both checksums.
    pub fn decode(msg: &[u8]) -> Result<Self, DecodeError> {
        if msg.len() < 8 {
            return Err(DecodeError::Truncated {
                what: "ipmi response message",
                need: 8,
                got: msg.len(),
            });
        }
        if checksum(&msg[0..2]) != msg[2] {
            return Err(DecodeError::BadChecksum { which: "header" });
        }
        let last = msg.len() - 1;
        if checksum(&msg[3..last]) != msg[last] {
            return Err(DecodeError::BadChecksum { which: "data" });
        }
        Ok(Self {
            netfn: msg[1] >> 2,
            rq_seq: msg[4] >> 2,
            cmd: msg[5],
            completion: msg[6],
            data: msg[7..last].to_vec(),
        })
    }

    /// Whether this response answers `req` (response netfn, same command and sequence).
    pub fn answers(&self, req: &IpmiRequest) -> bool {
        self.netfn == req.netfn | 1 && self.cmd == req.cmd && self.rq_seq == req.rq_seq & 0x3F
    }
}

/// Encodes an IPMI 1.5 session-less datagram (auth type none, session 0) around `msg`.
pub fn encode_v15(msg: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(14 + msg.len());
    push_rmcp_header(&mut out);
    out.push(AUTH_TYPE_NONE);
    out.extend_from_slice(&0u32.to_le_bytes());
    out.extend_from_slice(&0u32.to_le_bytes());
    // Messages here are far below 255 bytes; the cast is range-checked by construction.
    out.push(msg.len() as u8);
    out.extend_from_slice(msg);
    out
}

/// RMCP+ payload types.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum PayloadType {
    /// An IPMI message.
    Ipmi = 0x00,
    /// RMCP+ Open Session Request.
    OpenSessionRequest = 0x10,
    /// RMCP+ Open Session Response.
    OpenSessionResponse = 0x11,
    /// RAKP message 1.
    Rakp1 = 0x12,
    /// RAKP message 2.
    Rakp2 = 0x13,
    /// RAKP message 3.
    Rakp3 = 0x14,
    /// RAKP message 4.
    Rakp4 = 0x15,
}

impl PayloadType {
    /// Maps the 6-bit payload type to a known type.
    pub fn from_bits(bits: u8) -> Option<Self> {
        Some(match bits & 0x3F {
            0x00 => Self::Ipmi,
            0x10 => Self::OpenSessionRequest,
            0x11 => Self::OpenSessionResponse,
            0x12 => Self::Rakp1,
            0x13 => Self::Rakp2,
            0x14 => Self::Rakp3,
            0x15 => Self::Rakp4,
            _ => return None,
        })
    }
}

/// Any datagram a BMC may send us, split at the session layer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Envelope<'a> {
    /// IPMI 1.5 format (used for pre-session commands).
    V15 {
        /// Session ID (0 outside a session).
        session_id: u32,
        /// The IPMI message.
        message: &'a [u8],
    },
    /// RMCP+ format.
    V20(RmcpPlus<'a>),
}

/// A parsed (not yet verified or decrypted) RMCP+ packet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RmcpPlus<'a> {
    /// Payload type.
    pub payload_type: u8,
    /// Payload encrypted bit.
    pub encrypted: bool,
    /// Payload authenticated bit.
    pub authenticated: bool,
    /// Session ID.
    pub session_id: u32,
    /// Session sequence number.
    pub sequence: u32,
    /// Payload bytes (ciphertext when encrypted).
    pub payload: &'a [u8],
    /// Bytes covered by the integrity auth code (auth type through next header).
    pub signed: &'a [u8],
    /// Auth code bytes after the next-header byte (empty when not authenticated).
    pub auth_code: &'a [u8],
}

/// Splits a datagram into its session envelope. `auth_code_len` is the integrity auth code
/// length of the active session (0 outside a session).
pub fn decode_envelope(datagram: &[u8], auth_code_len: usize) -> Result<Envelope<'_>, DecodeError> {
    let body = strip_rmcp_header(datagram)?;
    match byte(body, 0, "session header")? {
        AUTH_TYPE_RMCP_PLUS => decode_rmcp_plus(body, auth_code_len).map(Envelope::V20),
        auth @ (0x00 | 0x01 | 0x02 | 0x04 | 0x05) => {
            let session_id = le32(body, 5, "ipmi 1.5 session header")?;
            let len_at = if auth == AUTH_TYPE_NONE { 9 } else { 25 };
            let len = usize::from(byte(body, len_at, "ipmi 1.5 session header")?);
            let start = len_at + 1;
            let message = body
                .get(start..start + len)
                .ok_or(DecodeError::LengthMismatch {
                    what: "ipmi 1.5 message",
                    declared: len,
                    available: body.len().saturating_sub(start),
                })?;
            Ok(Envelope::V15 {
                session_id,
                message,
            })
        }
        other => Err(DecodeError::UnsupportedAuthType(other)),
    }
}

fn decode_rmcp_plus(body: &[u8], auth_code_len: usize) -> Result<RmcpPlus<'_>, DecodeError> {
    let what = "rmcp+ session header";
    let ptype = byte(body, 1, what)?;
    let encrypted = ptype & 0x80 != 0;
    let authenticated = ptype & 0x40 != 0;
    let payload_type = ptype & 0x3F;
    // OEM explicit payloads (type 2) carry 6 more header bytes; we never negotiate them.
    if payload_type == 0x02 {
        return Err(DecodeError::UnexpectedPayloadType(payload_type));
    }
    let session_id = le32(body, 2, what)?;
    let sequence = le32(body, 6, what)?;
    let len = usize::from(u16::from_le_bytes(take::<2>(body, 10, what)?));
    let payload = body.get(12..12 + len).ok_or(DecodeError::LengthMismatch {
        what: "rmcp+ payload",
        declared: len,
        available: body.len().saturating_sub(12),
    })?;
    let after = 12 + len;
    if !authenticated {
        if body.len() != after {
            return Err(DecodeError::LengthMismatch {
                what: "rmcp+ packet",
                declared: after,
                available: body.len(),
            });
        }
        return Ok(RmcpPlus {
            payload_type,
            encrypted,
            authenticated,
            session_id,
            sequence,
            payload,
            signed: body,
            auth_code: &[],
        });
    }
    // Trailer: pad (0xFF...), pad length, next header, auth code.
    let trailer_len = body
        .len()
        .checked_sub(after)
        .ok_or(DecodeError::BadTrailer)?;
    if trailer_len < 2 + auth_code_len || auth_code_len == 0 {
        return Err(DecodeError::BadTrailer);
    }
    let signed_end = body.len() - auth_code_len;
    let next_header = body[signed_end - 1];
    let pad_len = usize::from(body[signed_end - 2]);
    if next_header != NEXT_HEADER || after + pad_len + 2 != signed_end || pad_len > 3 {
        return Err(DecodeError::BadTrailer);
    }
    if body[after..after + pad_len].iter().any(|b| *b != 0xFF) || !signed_end.is_multiple_of(4) {
        return Err(DecodeError::BadTrailer);
    }
    Ok(RmcpPlus {
        payload_type,
        encrypted,
        authenticated,
        session_id,
        sequence,
        payload,
        signed: &body[..signed_end],
        auth_code: &body[signed_end..],
    })
}

/// Builds an RMCP+ packet up to and including the next-header byte (when `authenticated`),
/// leaving the auth code for the caller to append. Returns the datagram and the offset where
/// the signed part (auth type) starts.
pub fn encode_rmcp_plus(
    payload_type: PayloadType,
    encrypted: bool,
    authenticated: bool,
    session_id: u32,
    sequence: u32,
    payload: &[u8],
) -> (Vec<u8>, usize) {
    let mut out = Vec::with_capacity(4 + 12 + payload.len() + 4 + 32);
    push_rmcp_header(&mut out);
    let signed_start = out.len();
    out.push(AUTH_TYPE_RMCP_PLUS);
    let mut ptype = payload_type as u8;
    if encrypted {
        ptype |= 0x80;
    }
    if authenticated {
        ptype |= 0x40;
    }
    out.push(ptype);
    out.extend_from_slice(&session_id.to_le_bytes());
    out.extend_from_slice(&sequence.to_le_bytes());
    // Payloads here are far below 64 KiB.
    out.extend_from_slice(&(payload.len() as u16).to_le_bytes());
    out.extend_from_slice(payload);
    if authenticated {
        let covered = out.len() - signed_start + 2;
        let pad = (4 - covered % 4) % 4;
        out.extend(std::iter::repeat_n(0xFF, pad));
        out.push(pad as u8);
        out.push(NEXT_HEADER);
    }
    (out, signed_start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn checksum_makes_the_sum_zero() {
        let bytes = [0x20, 0x18];
        let c = checksum(&bytes);
        assert_eq!(bytes[0].wrapping_add(bytes[1]).wrapping_add(c), 0);
        assert_eq!(checksum(&[]), 0);
    }

    #[test]
    fn get_channel_auth_caps_request_has_the_hand_computed_bytes() {
        // Checksums computed by hand: -(0x20+0x18) = 0xC8, -(0x81+0x38+0x8E+0x04) = 0xB5.
        let req = IpmiRequest {
            netfn: 0x06,
            cmd: 0x38,
            rq_seq: 0,
            data: vec![0x8E, 0x04],
        };
        let dgram = encode_v15(&req.encode());
        assert_eq!(
            dgram,
            [
                0x06, 0x00, 0xFF, 0x07, 0x00, 0, 0, 0, 0, 0, 0, 0, 0, 0x09, 0x20, 0x18, 0xC8, 0x81,
                0x00, 0x38, 0x8E, 0x04, 0xB5
            ]
        );
    }

    #[test]
    fn response_round_trip_and_checksum_errors() {
        let mut msg = vec![0x81, 0x07 << 2, 0, 0x20, 5 << 2, 0x38, 0x00, 0x01, 0x02];
        msg[2] = checksum(&msg[0..2]);
        let c = checksum(&msg[3..]);
        msg.push(c);
        let r = IpmiResponse::decode(&msg).unwrap();
        assert_eq!((r.netfn, r.cmd, r.rq_seq, r.completion), (0x07, 0x38, 5, 0));
        assert_eq!(r.data, vec![1, 2]);
        let req = IpmiRequest {
            netfn: 0x06,
            cmd: 0x38,
            rq_seq: 5,
            data: vec![],
        };
        assert!(r.answers(&req));
        let mut bad = msg.clone();
        bad[7] ^= 1;
        assert_eq!(
            IpmiResponse::decode(&bad),
            Err(DecodeError::BadChecksum { which: "data" })
        );
        bad = msg.clone();
        bad[1] ^= 4;
        assert_eq!(
            IpmiResponse::decode(&bad),
            Err(DecodeError::BadChecksum { which: "header" })
        );
    }

    #[test]
    fn rmcp_plus_trailer_round_trip() {
        for len in 0..9 {
            let payload = vec![0xAB; len];
            let (mut dgram, start) =
                encode_rmcp_plus(PayloadType::Ipmi, false, true, 7, 9, &payload);
            assert_eq!((dgram.len() - start) % 4, 0);
            dgram.extend_from_slice(&[0xEE; 12]);
            let Envelope::V20(p) = decode_envelope(&dgram, 12).unwrap() else {
                panic!("not rmcp+");
            };
            assert_eq!((p.session_id, p.sequence, p.payload), (7, 9, &payload[..]));
            assert_eq!(p.auth_code, &[0xEE; 12]);
            assert_eq!(p.signed, &dgram[start..dgram.len() - 12]);
        }
    }

    #[test]
    fn truncated_datagrams_are_errors() {
        let (dgram, _) = encode_rmcp_plus(PayloadType::Rakp2, false, false, 1, 0, &[1, 2, 3]);
        for cut in 0..dgram.len() {
            assert!(decode_envelope(&dgram[..cut], 0).is_err(), "cut at {cut}");
        }
        assert!(decode_envelope(&dgram, 0).is_ok());
    }
}
