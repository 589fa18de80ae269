//! BMC addressing shared by the agent (which drives BMCs) and the controller (which checks the
//! inventory's BMCs when it loads or reloads it, and hands them to the agents): the address
//! parser and the certificate fingerprint format. Pure: no I/O.

pub mod address;

pub use address::{AddressError, BmcAddress, Transport};

/// Parses a SHA-256 certificate fingerprint: 64 hex digits, optionally colon-separated and
/// optionally prefixed `sha256:`, `sha256=` or `SHA256 Fingerprint=` (as `openssl x509
/// -fingerprint -sha256` prints it). `None` for anything else.
pub fn parse_sha256_fingerprint(text: &str) -> Option<[u8; 32]> {
    let lower = text.trim().to_ascii_lowercase();
    let body = lower
        .strip_prefix("sha256 fingerprint=")
        .or_else(|| lower.strip_prefix("sha256:"))
        .or_else(|| lower.strip_prefix("sha256="))
        .unwrap_or(&lower);
    let digits: Vec<u8> = body.bytes().filter(|b| *b != b':').collect();
    // `from_str_radix` alone would take a sign (`+a`): only hex digits count.
    if digits.len() != 64 || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let mut digest = [0u8; 32];
    for (byte, pair) in digest.iter_mut().zip(digits.chunks_exact(2)) {
        let text = std::str::from_utf8(pair).ok()?;
        *byte = u8::from_str_radix(text, 16).ok()?;
    }
    Some(digest)
}

#[cfg(test)]
mod tests {
    use super::parse_sha256_fingerprint;

    #[test]
    fn fingerprint_spellings() {
        let plain = "ab".repeat(32);
        let colons = vec!["AB"; 32].join(":");
        assert_eq!(parse_sha256_fingerprint(&plain), Some([0xab; 32]));
        assert_eq!(parse_sha256_fingerprint(&colons), Some([0xab; 32]));
        assert_eq!(
            parse_sha256_fingerprint(&format!("SHA256 Fingerprint={colons}")),
            Some([0xab; 32])
        );
        for bad in [
            "zz",
            "",
            &"ab".repeat(31),
            &"zz".repeat(32),
            &"+a".repeat(32),
        ] {
            assert_eq!(parse_sha256_fingerprint(bad), None, "{bad}");
        }
    }
}
