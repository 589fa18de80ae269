//! Fuzzes the IPMI decoders with untrusted datagrams: no input may panic them, and an active
//! session (suite 3 and 17) must reject or accept without panicking. The same entry points run
//! as proptests in `agent/bmc/tests/ipmi_decoders.rs`.
#![no_main]

use libfuzzer_sys::fuzz_target;
use metalguard_bmc::ipmi::commands::{
    parse_chassis_status, parse_cipher_suite_records, supports_ipmi_v2,
};
use metalguard_bmc::ipmi::crypto::{CipherSuite, SessionKeys, decrypt_aes_cbc_128};
use metalguard_bmc::ipmi::rakp::{decode_open_session_response, decode_rakp2, decode_rakp4};
use metalguard_bmc::ipmi::session::ActiveSession;
use metalguard_bmc::ipmi::wire::{IpmiResponse, decode_envelope};

fuzz_target!(|data: &[u8]| {
    for auth_len in [0, 12, 16] {
        let _ = decode_envelope(data, auth_len);
    }
    let _ = IpmiResponse::decode(data);
    let _ = decode_open_session_response(data);
    let _ = decode_rakp2(data, 20);
    let _ = decode_rakp2(data, 32);
    let _ = decode_rakp4(data, 12);
    let _ = decode_rakp4(data, 16);
    let _ = parse_cipher_suite_records(data);
    let _ = supports_ipmi_v2(data);
    let _ = parse_chassis_status(data);
    let _ = decrypt_aes_cbc_128(&[7; 16], data);
    for suite in CipherSuite::PREFERRED {
        let keys = SessionKeys::derive(suite, &[0x42; 32]);
        let _ = ActiveSession::new(keys, 0x0A0B_0C0D, 0x0102_0304).open(data);
    }
});
