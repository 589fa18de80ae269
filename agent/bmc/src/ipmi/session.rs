//! An active RMCP+ session without I/O: seals outgoing IPMI requests (sequence number, AES,
//! integrity trailer) and opens incoming datagrams (session ID, integrity, replay window,
//! decryption, IPMI checksums).

use super::crypto::{AES_BLOCK, SessionKeys};
use super::wire::{
    DecodeError, Envelope, IpmiRequest, IpmiResponse, PayloadType, decode_envelope,
    encode_rmcp_plus,
};

/// State of one activated session.
#[derive(Debug)]
pub struct ActiveSession {
    keys: SessionKeys,
    bmc_session_id: u32,
    console_session_id: u32,
    next_sequence: u32,
    last_received: u32,
    next_rq_seq: u8,
}

impl ActiveSession {
    /// A session just activated by RAKP4.
    pub fn new(keys: SessionKeys, bmc_session_id: u32, console_session_id: u32) -> Self {
        Self {
            keys,
            bmc_session_id,
            console_session_id,
            next_sequence: 1,
            last_received: 0,
            next_rq_seq: 1,
        }
    }

    /// The BMC's ID of this session.
    pub fn bmc_session_id(&self) -> u32 {
        self.bmc_session_id
    }

    /// A new request with the next requester sequence number.
    pub fn request(&mut self, netfn: u8, cmd: u8, data: Vec<u8>) -> IpmiRequest {
        let rq_seq = self.next_rq_seq;
        self.next_rq_seq = (self.next_rq_seq % 0x3F) + 1;
        IpmiRequest {
            netfn,
            cmd,
            rq_seq,
            data,
        }
    }

    /// Seals a request into an encrypted, authenticated datagram with the next session
    /// sequence number.
    pub fn seal(&mut self, req: &IpmiRequest, iv: [u8; AES_BLOCK]) -> Vec<u8> {
        let seq = self.next_sequence;
        self.next_sequence = self.next_sequence.wrapping_add(1).max(1);
        let payload = self.keys.encrypt(iv, &req.encode());
        let (mut out, signed_start) = encode_rmcp_plus(
            PayloadType::Ipmi,
            true,
            true,
            self.bmc_session_id,
            seq,
            &payload,
        );
        let code = self.keys.packet_auth_code(&out[signed_start..]);
        out.extend_from_slice(&code);
        out
    }

    /// Verifies and decrypts a datagram from the BMC. Checks, in order: RMCP+ format, IPMI
    /// payload, authenticated and encrypted, our session ID, auth code, sequence number
    /// (non-zero and newer than the last accepted), confidentiality pad, IPMI checksums.
    pub fn open(&mut self, datagram: &[u8]) -> Result<IpmiResponse, DecodeError> {
        let env = decode_envelope(datagram, self.keys.suite.integrity_len())?;
        let Envelope::V20(p) = env else {
            return Err(DecodeError::MissingProtection("rmcp+ format"));
        };
        if p.payload_type != PayloadType::Ipmi as u8 {
            return Err(DecodeError::UnexpectedPayloadType(p.payload_type));
        }
        if !p.authenticated {
            return Err(DecodeError::MissingProtection("integrity"));
        }
        if !p.encrypted {
            return Err(DecodeError::MissingProtection("confidentiality"));
        }
        if p.session_id != self.console_session_id {
            return Err(DecodeError::WrongSession {
                expected: self.console_session_id,
                got: p.session_id,
            });
        }
        if !self.keys.verify_packet(p.signed, p.auth_code) {
            return Err(DecodeError::IntegrityMismatch);
        }
        if p.sequence == 0 || p.sequence <= self.last_received {
            return Err(DecodeError::BadSequence {
                got: p.sequence,
                last: self.last_received,
            });
        }
        let plain = self.keys.decrypt(p.payload)?;
        let resp = IpmiResponse::decode(&plain)?;
        self.last_received = p.sequence;
        Ok(resp)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ipmi::crypto::CipherSuite;
    use crate::ipmi::wire::{checksum, push_rmcp_header};

    /// Builds what a BMC would send: an encrypted, authenticated response.
    fn bmc_reply(keys: &SessionKeys, console_sid: u32, seq: u32, req: &IpmiRequest) -> Vec<u8> {
        let mut msg = vec![
            0x81,
            (req.netfn | 1) << 2,
            0,
            0x20,
            req.rq_seq << 2,
            req.cmd,
            0x00,
            0x01,
        ];
        msg[2] = checksum(&msg[0..2]);
        let c = checksum(&msg[3..]);
        msg.push(c);
        let payload = keys.encrypt([9; 16], &msg);
        let (mut out, start) =
            encode_rmcp_plus(PayloadType::Ipmi, true, true, console_sid, seq, &payload);
        let code = keys.packet_auth_code(&out[start..]);
        out.extend_from_slice(&code);
        out
    }

    fn pair(suite: CipherSuite) -> (ActiveSession, SessionKeys) {
        let keys = SessionKeys::derive(suite, &[0x55; 20]);
        (ActiveSession::new(keys.clone(), 0xB0B0, 0xC0C0), keys)
    }

    #[test]
    fn round_trip_and_replay_rejection() {
        for suite in CipherSuite::PREFERRED {
            let (mut s, keys) = pair(suite);
            let req = s.request(0x00, 0x01, vec![]);
            let sealed = s.seal(&req, [1; 16]);
            assert!(sealed.len() > 20);
            let reply = bmc_reply(&keys, 0xC0C0, 1, &req);
            let resp = s.open(&reply).unwrap();
            assert!(resp.answers(&req));
            assert_eq!(resp.data, vec![0x01]);
            assert!(matches!(
                s.open(&reply),
                Err(DecodeError::BadSequence { got: 1, last: 1 })
            ));
        }
    }

    #[test]
    fn tampering_wrong_session_and_plaintext_are_rejected() {
        let (mut s, keys) = pair(CipherSuite::Suite3);
        let req = s.request(0x00, 0x01, vec![]);
        let reply = bmc_reply(&keys, 0xC0C0, 5, &req);
        for i in 4..reply.len() {
            let mut bad = reply.clone();
            bad[i] ^= 0x01;
            assert!(s.open(&bad).is_err(), "flipped byte {i} accepted");
        }
        let other = bmc_reply(&keys, 0xDEAD, 6, &req);
        assert!(matches!(
            s.open(&other),
            Err(DecodeError::WrongSession { .. })
        ));
        let (_, wrong_keys) = pair(CipherSuite::Suite17);
        let forged = bmc_reply(&wrong_keys, 0xC0C0, 7, &req);
        assert!(s.open(&forged).is_err());
        let mut v15 = Vec::new();
        push_rmcp_header(&mut v15);
        v15.extend_from_slice(&[0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert!(matches!(
            s.open(&v15),
            Err(DecodeError::MissingProtection(_))
        ));
        assert_eq!(s.open(&reply).unwrap().rq_seq, req.rq_seq);
    }

    #[test]
    fn sequence_numbers_increase_and_skip_zero() {
        let (mut s, _) = pair(CipherSuite::Suite3);
        let req = s.request(0x06, 0x3B, vec![4]);
        let a = s.seal(&req, [0; 16]);
        let b = s.seal(&req, [0; 16]);
        assert_eq!(u32::from_le_bytes(a[10..14].try_into().unwrap()), 1);
        assert_eq!(u32::from_le_bytes(b[10..14].try_into().unwrap()), 2);
        let mut rq = std::collections::HashSet::new();
        for _ in 0..63 {
            rq.insert(s.request(0, 1, vec![]).rq_seq);
        }
        assert_eq!(rq.len(), 63);
        assert!(!rq.contains(&0));
    }
}
