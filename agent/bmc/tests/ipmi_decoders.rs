//! Property tests of the IPMI decoders: no input makes them panic, every single-byte change
//! of an authenticated packet is rejected, and framing round-trips for every payload size.
//! (The cargo-fuzz target `fuzz/fuzz_targets/ipmi_decode.rs` runs the same entry points.)

use metalguard_bmc::ipmi::commands::{
    parse_chassis_status, parse_cipher_suite_records, supports_ipmi_v2,
};
use metalguard_bmc::ipmi::crypto::{CipherSuite, SessionKeys, decrypt_aes_cbc_128};
use metalguard_bmc::ipmi::rakp::{decode_open_session_response, decode_rakp2, decode_rakp4};
use metalguard_bmc::ipmi::session::ActiveSession;
use metalguard_bmc::ipmi::wire::{
    Envelope, IpmiRequest, IpmiResponse, PayloadType, checksum, decode_envelope, encode_rmcp_plus,
};
use proptest::prelude::*;

const CONSOLE_SID: u32 = 0x0102_0304;

fn session(suite: CipherSuite) -> (ActiveSession, SessionKeys) {
    let keys = SessionKeys::derive(suite, &[0x42; 32]);
    (
        ActiveSession::new(keys.clone(), 0x0A0B_0C0D, CONSOLE_SID),
        keys,
    )
}

/// What a BMC sends back for `req`: an encrypted, authenticated IPMI response.
fn reply(keys: &SessionKeys, seq: u32, req: &IpmiRequest, data: &[u8]) -> Vec<u8> {
    let mut msg = vec![
        0x81,
        (req.netfn | 1) << 2,
        0,
        0x20,
        req.rq_seq << 2,
        req.cmd,
        0x00,
    ];
    msg[2] = checksum(&msg[0..2]);
    msg.extend_from_slice(data);
    let c = checksum(&msg[3..]);
    msg.push(c);
    let payload = keys.encrypt([0x33; 16], &msg);
    let (mut out, start) =
        encode_rmcp_plus(PayloadType::Ipmi, true, true, CONSOLE_SID, seq, &payload);
    let code = keys.packet_auth_code(&out[start..]);
    out.extend_from_slice(&code);
    out
}

/// Every decoder on the same bytes; the test is that none of them panics.
fn decode_everything(bytes: &[u8]) {
    for auth_len in [0, 12, 16] {
        let _ = decode_envelope(bytes, auth_len);
    }
    let _ = IpmiResponse::decode(bytes);
    let _ = decode_open_session_response(bytes);
    let _ = decode_rakp2(bytes, 20);
    let _ = decode_rakp2(bytes, 32);
    let _ = decode_rakp4(bytes, 12);
    let _ = decode_rakp4(bytes, 16);
    let _ = parse_cipher_suite_records(bytes);
    let _ = supports_ipmi_v2(bytes);
    let _ = parse_chassis_status(bytes);
    let _ = decrypt_aes_cbc_128(&[7; 16], bytes);
    for suite in CipherSuite::PREFERRED {
        let _ = session(suite).0.open(bytes);
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
        decode_everything(&bytes);
    }

    #[test]
    fn arbitrary_bytes_behind_a_valid_header_never_panic(
        rmcp_plus in any::<bool>(),
        ptype in any::<u8>(),
        len in any::<u16>(),
        tail in proptest::collection::vec(any::<u8>(), 0..120),
    ) {
        let mut bytes = vec![0x06, 0x00, 0xFF, 0x07];
        if rmcp_plus {
            bytes.extend_from_slice(&[0x06, ptype, 4, 3, 2, 1, 1, 0, 0, 0]);
            bytes.extend_from_slice(&len.to_le_bytes());
        } else {
            bytes.extend_from_slice(&[0x00, 0, 0, 0, 0, 0, 0, 0, 0, len as u8]);
        }
        bytes.extend_from_slice(&tail);
        decode_everything(&bytes);
    }

    #[test]
    fn every_truncation_and_byte_flip_of_an_answer_is_rejected(
        suite17 in any::<bool>(),
        data in proptest::collection::vec(any::<u8>(), 0..40),
        at in any::<prop::sample::Index>(),
        flip in 1u8..=255,
        cut in any::<prop::sample::Index>(),
    ) {
        let suite = if suite17 { CipherSuite::Suite17 } else { CipherSuite::Suite3 };
        let (mut s, keys) = session(suite);
        let req = s.request(0x00, 0x01, vec![]);
        let good = reply(&keys, 9, &req, &data);
        let mut bad = good.clone();
        let i = at.index(bad.len() - 4) + 4; // the RMCP header is not covered by the auth code
        bad[i] ^= flip;
        prop_assert!(s.open(&bad).is_err(), "flipped byte {} accepted", i);
        let c = cut.index(good.len());
        prop_assert!(s.open(&good[..c]).is_err(), "truncation to {} accepted", c);
        let resp = s.open(&good).unwrap();
        prop_assert!(resp.answers(&req));
        prop_assert_eq!(resp.data, data);
        prop_assert!(s.open(&good).is_err(), "replay accepted");
    }

    #[test]
    fn rmcp_plus_framing_round_trips(
        payload in proptest::collection::vec(any::<u8>(), 0..300),
        sid in any::<u32>(),
        seq in any::<u32>(),
        authenticated in any::<bool>(),
    ) {
        let (mut bytes, start) = encode_rmcp_plus(PayloadType::Ipmi, false, authenticated, sid, seq, &payload);
        let auth_len = if authenticated { 16 } else { 0 };
        bytes.extend(std::iter::repeat_n(0xAB, auth_len));
        let Ok(Envelope::V20(p)) = decode_envelope(&bytes, auth_len) else {
            return Err(TestCaseError::fail("does not decode"));
        };
        prop_assert_eq!((p.session_id, p.sequence, p.payload), (sid, seq, &payload[..]));
        prop_assert_eq!(p.signed.len() % if authenticated { 4 } else { 1 }, 0);
        prop_assert_eq!(p.signed, &bytes[start..bytes.len() - auth_len]);
    }

    #[test]
    fn aes_round_trips_with_any_key_and_iv(
        key in any::<[u8; 16]>(),
        iv in any::<[u8; 16]>(),
        plain in proptest::collection::vec(any::<u8>(), 0..100),
    ) {
        let out = metalguard_bmc::ipmi::crypto::encrypt_aes_cbc_128(&key, iv, &plain);
        prop_assert_eq!(decrypt_aes_cbc_128(&key, &out).unwrap(), plain);
    }
}
