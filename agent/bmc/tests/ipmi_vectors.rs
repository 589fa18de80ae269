//! Cipher suites 17 and 3 against vectors computed independently by
//! `tests/vectors/ipmi_vectors.py` (Python standard library only). Suite 17 cannot be tested
//! live here, so this is its proof: RAKP2/RAKP3 auth codes, SIK, RAKP4 integrity check, K1,
//! K2 and packet integrity must match byte for byte.

use std::path::Path;

use metalguard_bmc::ipmi::crypto::{self, CipherSuite, RakpContext, SessionKeys};
use metalguard_bmc::ipmi::wire::{Envelope, PayloadType, decode_envelope, encode_rmcp_plus};
use serde_json::Value;

type TestResult = Result<(), Box<dyn std::error::Error>>;

fn vectors() -> Result<Value, Box<dyn std::error::Error>> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors/ipmi_vectors.json");
    Ok(serde_json::from_str(&std::fs::read_to_string(path)?)?)
}

/// Hex decoding of a JSON string; an empty vector for anything else (never matches a code).
fn hex(v: &Value) -> Vec<u8> {
    let s = v.as_str().unwrap_or_default();
    (0..s.len() / 2)
        .filter_map(|i| u8::from_str_radix(s.get(2 * i..2 * i + 2)?, 16).ok())
        .collect()
}

fn arr16(v: &Value) -> [u8; 16] {
    let mut out = [0u8; 16];
    for (o, b) in out.iter_mut().zip(hex(v)) {
        *o = b;
    }
    out
}

#[test]
fn both_suites_match_the_independent_vectors() -> TestResult {
    let all = vectors()?;
    let list = all["vectors"].as_array().unwrap();
    assert_eq!(list.len(), 4);
    let mut suites_seen = Vec::new();
    for v in list {
        let suite = CipherSuite::from_id(v["suite"].as_u64().unwrap() as u8).unwrap();
        suites_seen.push(suite);
        let username = v["username"].as_str().unwrap().as_bytes().to_vec();
        let kuid = crypto::user_key(v["password"].as_str().unwrap().as_bytes()).unwrap();
        let ctx = RakpContext {
            console_session_id: v["console_session_id"].as_u64().unwrap() as u32,
            bmc_session_id: v["bmc_session_id"].as_u64().unwrap() as u32,
            console_random: arr16(&v["console_random"]),
            bmc_random: arr16(&v["bmc_random"]),
            bmc_guid: arr16(&v["bmc_guid"]),
            role: v["role"].as_u64().unwrap() as u8,
            username: &username,
        };
        let case = format!("suite {} {}", suite.id(), v["case"]);
        assert_eq!(
            *crypto::rakp2_auth_code(suite, &kuid[..], &ctx),
            hex(&v["rakp2_auth_code"]),
            "{case}"
        );
        assert_eq!(
            *crypto::rakp3_auth_code(suite, &kuid[..], &ctx),
            hex(&v["rakp3_auth_code"]),
            "{case}"
        );
        let sik = crypto::session_integrity_key(suite, &kuid[..], &ctx);
        assert_eq!(*sik, hex(&v["sik"]), "{case}");
        assert_eq!(
            *crypto::rakp4_integrity_check(suite, &sik, &ctx),
            hex(&v["rakp4_integrity_check"]),
            "{case}"
        );
        let keys = SessionKeys::derive(suite, &sik);
        assert_eq!(*keys.k1, hex(&v["k1"]), "{case}");
        assert_eq!(keys.aes_key().to_vec(), hex(&v["aes_key"]), "{case}");
        assert_eq!(&hex(&v["k2"])[..16], &hex(&v["aes_key"])[..], "{case}");

        for p in v["packets"].as_array().unwrap() {
            let payload = hex(&p["payload"]);
            let seq = p["seq"].as_u64().unwrap() as u32;
            let (mut built, start) = encode_rmcp_plus(
                PayloadType::Ipmi,
                false,
                true,
                ctx.bmc_session_id,
                seq,
                &payload,
            );
            let code = keys.packet_auth_code(&built[start..]);
            built.extend_from_slice(&code);
            let expected = hex(&p["packet"]);
            assert_eq!(built, expected, "{case} seq {seq}");
            let Ok(Envelope::V20(parsed)) = decode_envelope(&expected, suite.integrity_len())
            else {
                panic!("{case}: vector packet does not parse");
            };
            assert!(
                keys.verify_packet(parsed.signed, parsed.auth_code),
                "{case}"
            );
            assert_eq!(parsed.payload, &payload[..]);
        }
    }
    assert!(suites_seen.contains(&CipherSuite::Suite17));
    assert!(suites_seen.contains(&CipherSuite::Suite3));
    Ok(())
}

#[test]
fn a_wrong_password_changes_every_suite_17_code() -> TestResult {
    let all = vectors()?;
    let v = &all["vectors"][0];
    assert_eq!(v["suite"], 17);
    let username = v["username"].as_str().unwrap().as_bytes().to_vec();
    let ctx = RakpContext {
        console_session_id: v["console_session_id"].as_u64().unwrap() as u32,
        bmc_session_id: v["bmc_session_id"].as_u64().unwrap() as u32,
        console_random: arr16(&v["console_random"]),
        bmc_random: arr16(&v["bmc_random"]),
        bmc_guid: arr16(&v["bmc_guid"]),
        role: v["role"].as_u64().unwrap() as u8,
        username: &username,
    };
    let wrong = crypto::user_key(b"passwore").unwrap();
    let suite = CipherSuite::Suite17;
    assert_ne!(
        *crypto::rakp2_auth_code(suite, &wrong[..], &ctx),
        hex(&v["rakp2_auth_code"])
    );
    assert_ne!(
        *crypto::session_integrity_key(suite, &wrong[..], &ctx),
        hex(&v["sik"])
    );
    Ok(())
}

/// The committed JSON is what the script prints today (python3 is part of the test tooling).
#[test]
fn the_committed_vectors_are_current() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/vectors");
    let out = std::process::Command::new("python3")
        .arg(dir.join("ipmi_vectors.py"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let committed = std::fs::read(dir.join("ipmi_vectors.json")).unwrap();
    assert!(
        out.stdout == committed,
        "tests/vectors/ipmi_vectors.json is stale: regenerate it with the script"
    );
}
