//! BMC addressing shared by the agent (which drives BMCs) and the controller (which checks the
//! inventory's BMCs when it loads or reloads it, and hands them to the agents): the address
//! parser and the certificate fingerprint format. Pure: no I/O.

pub mod address;

pub use address::{AddressError, BmcAddress, Transport};

/// Why a check of a BMC failed, in the classes a person acts on differently (issue 25): the
/// network or the BMC is down, the trust is wrong, the password is wrong, the account is
/// locked, the account may not do enough, the BMC answered something unexpected, or it
/// answers for another machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CheckFailure {
    /// Nothing answered in time (refused, unreachable, timed out).
    Unreachable,
    /// The TLS handshake failed against the configured trust, or the trust is unusable.
    Tls,
    /// The BMC refused the user name or password.
    CredentialsRefused,
    /// The BMC refused the login and said the account is locked or disabled.
    AccountLocked,
    /// Logged in, but the account lacks the privilege a fence needs.
    InsufficientPrivilege,
    /// The BMC answered, but not as Redfish or IPMI should (a status, a body, a protocol
    /// step it should not have sent).
    UnexpectedAnswer,
    /// The BMC answers for a machine other than the host it is configured for.
    IdentityMismatch,
}

impl CheckFailure {
    /// Every class, in declaration order (for metrics that show zeros).
    pub const ALL: [CheckFailure; 7] = [
        CheckFailure::Unreachable,
        CheckFailure::Tls,
        CheckFailure::CredentialsRefused,
        CheckFailure::AccountLocked,
        CheckFailure::InsufficientPrivilege,
        CheckFailure::UnexpectedAnswer,
        CheckFailure::IdentityMismatch,
    ];

    /// A short, stable name for logs, metrics and JSON (kebab-case, as serialized).
    pub fn name(self) -> &'static str {
        match self {
            CheckFailure::Unreachable => "unreachable",
            CheckFailure::Tls => "tls",
            CheckFailure::CredentialsRefused => "credentials-refused",
            CheckFailure::AccountLocked => "account-locked",
            CheckFailure::InsufficientPrivilege => "insufficient-privilege",
            CheckFailure::UnexpectedAnswer => "unexpected-answer",
            CheckFailure::IdentityMismatch => "identity-mismatch",
        }
    }

    /// What a person does about it, in one line.
    pub fn remedy(self) -> &'static str {
        match self {
            CheckFailure::Unreachable => {
                "check the BMC's power, cable and address, and the route from the executing hosts"
            }
            CheckFailure::Tls => {
                "check the BMC's certificate against the configured CA bundle or fingerprint"
            }
            CheckFailure::CredentialsRefused => {
                "check the user name and password in the BMC's credentials file or Secret"
            }
            CheckFailure::AccountLocked => {
                "unlock or enable the account on the BMC (failed logins may have locked it)"
            }
            CheckFailure::InsufficientPrivilege => {
                "give the account the operator (power control) privilege on the BMC"
            }
            CheckFailure::UnexpectedAnswer => {
                "check the BMC's firmware and the address's system path or protocol"
            }
            CheckFailure::IdentityMismatch => {
                "the address points at another machine's BMC: fix the inventory or the cabling"
            }
        }
    }
}

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
    use super::{CheckFailure, parse_sha256_fingerprint};

    #[test]
    fn check_failure_names_are_what_json_says() {
        for class in CheckFailure::ALL {
            assert_eq!(
                serde_json::to_value(class).unwrap(),
                serde_json::Value::String(class.name().to_owned())
            );
            assert!(!class.remedy().is_empty());
        }
    }

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
