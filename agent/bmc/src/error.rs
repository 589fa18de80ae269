//! Errors of power operations. Every message names the BMC and never holds a secret.

use std::time::Duration;

use metalguard_api::bmc::CheckFailure;

/// How many characters of a string a BMC sent (a power state, reset types, system paths, an
/// error message) an error or a timeline entry quotes; longer text is cut and control
/// characters are escaped (a broken BMC once filled an error with 480 KB of escape sequences).
pub const BMC_TEXT_CHARS: usize = 256;

/// `text`, as sent by a BMC, fit to quote: control characters escaped, cut to
/// [`BMC_TEXT_CHARS`].
pub fn bmc_text(text: &str) -> String {
    metalguard_api::text::excerpt(text, BMC_TEXT_CHARS)
}

/// A boxed cause kept in the error chain (never interpolated into the message).
pub type Cause = Box<dyn std::error::Error + Send + Sync + 'static>;

/// Why a power operation against a BMC failed.
///
/// `bmc` is always the address without any credentials (`host:port` or the Redfish base URL).
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum BmcError {
    /// The TCP connection or UDP exchange could not be set up (refused, unreachable, DNS).
    #[error("could not connect to bmc {bmc}")]
    Connect {
        /// The BMC address.
        bmc: String,
        /// The transport error.
        #[source]
        source: Cause,
    },
    /// The connection broke during an exchange (reset, truncated answer, TLS alert).
    #[error("exchange {what} with bmc {bmc} failed")]
    Transport {
        /// The BMC address.
        bmc: String,
        /// The call, e.g. `GET /redfish/v1/Systems/1`.
        what: String,
        /// The transport error.
        #[source]
        source: Cause,
    },
    /// The BMC did not answer one call within its timeout.
    #[error("bmc {bmc} did not answer {what} within {timeout:?}")]
    Timeout {
        /// The BMC address.
        bmc: String,
        /// The call, e.g. `GET /redfish/v1/Systems/1`.
        what: String,
        /// The per-call timeout that expired.
        timeout: Duration,
    },
    /// The whole operation did not finish within its overall deadline.
    #[error("{operation} of bmc {bmc} did not finish within {deadline:?}")]
    Deadline {
        /// The BMC address.
        bmc: String,
        /// The operation, e.g. `power off`.
        operation: String,
        /// The overall deadline.
        deadline: Duration,
    },
    /// The BMC refused the credentials (HTTP 401, IPMI RAKP failure).
    #[error("bmc {bmc} rejected the credentials{detail}")]
    Authentication {
        /// The BMC address.
        bmc: String,
        /// The message the BMC gave (Redfish), prefixed with `: `, or empty.
        detail: String,
    },
    /// The BMC accepted the credentials but not the privilege the operation needs.
    #[error("bmc {bmc} refused {what}: insufficient privilege")]
    Privilege {
        /// The BMC address.
        bmc: String,
        /// What was refused.
        what: String,
    },
    /// The BMC answered with an HTTP status that means failure.
    #[error("bmc {bmc} answered {what} with http status {status}{detail}")]
    HttpStatus {
        /// The BMC address.
        bmc: String,
        /// The call, e.g. `POST /redfish/v1/Systems/1/Actions/ComputerSystem.Reset`.
        what: String,
        /// The HTTP status code.
        status: u16,
        /// The Redfish error message the BMC gave, prefixed with `: `, or empty.
        detail: String,
    },
    /// The BMC's answer could not be decoded.
    #[error("bmc {bmc} sent an answer to {what} that could not be decoded")]
    Decode {
        /// The BMC address.
        bmc: String,
        /// The call whose answer was bad.
        what: String,
        /// The decoder error.
        #[source]
        source: Cause,
    },
    /// The BMC broke its protocol (bad sequence number, integrity check, missing field).
    #[error("bmc {bmc} broke the protocol: {detail}")]
    Protocol {
        /// The BMC address.
        bmc: String,
        /// What was wrong.
        detail: String,
    },
    /// The BMC does not offer the requested operation.
    #[error("bmc {bmc} does not support {operation} (it allows: {allowed})")]
    Unsupported {
        /// The BMC address.
        bmc: String,
        /// The operation, e.g. `power cycle`.
        operation: String,
        /// What the BMC allows instead, comma-separated.
        allowed: String,
    },
    /// The BMC lists several systems and the address names none of them.
    #[error("bmc {bmc} lists several systems and the address names none; name one of: {systems}")]
    AmbiguousSystem {
        /// The BMC address.
        bmc: String,
        /// The system URIs the BMC listed, comma-separated.
        systems: String,
    },
    /// The BMC lists no system, or not the one named in the address.
    #[error("bmc {bmc} has no system {wanted} (it lists: {systems})")]
    SystemNotFound {
        /// The BMC address.
        bmc: String,
        /// The system asked for, or `any` when none was named.
        wanted: String,
        /// The system URIs the BMC listed, comma-separated (may be empty).
        systems: String,
    },
    /// The TLS client could not be configured for this BMC.
    #[error("tls setup for bmc {bmc} failed: {detail}")]
    Tls {
        /// The BMC address.
        bmc: String,
        /// What was wrong (never a secret).
        detail: String,
    },
    /// The BMC reported a power state other than the one the operation needed.
    #[error("bmc {bmc} still reports power {state} after {operation}")]
    NotVerified {
        /// The BMC address.
        bmc: String,
        /// The operation, e.g. `power off`.
        operation: String,
        /// The last state the BMC reported.
        state: String,
    },
}

impl BmcError {
    /// Whether retrying the same call may succeed (connect errors, timeouts, 5xx).
    pub fn is_transient(&self) -> bool {
        match self {
            Self::Connect { .. } | Self::Transport { .. } | Self::Timeout { .. } => true,
            Self::HttpStatus { status, .. } => *status >= 500,
            _ => false,
        }
    }

    /// The class of this failure as a check of the BMC reports it. A refused login whose
    /// message speaks of a locked or disabled account is [`CheckFailure::AccountLocked`]
    /// (Redfish services say so in the error body; IPMI cannot tell it from a wrong
    /// password); a connection that failed in its TLS handshake is [`CheckFailure::Tls`].
    pub fn check_failure(&self) -> CheckFailure {
        match self {
            Self::Authentication { detail, .. } => {
                let lower = detail.to_ascii_lowercase();
                if lower.contains("lock") || lower.contains("disabled") {
                    CheckFailure::AccountLocked
                } else {
                    CheckFailure::CredentialsRefused
                }
            }
            Self::Privilege { .. } => CheckFailure::InsufficientPrivilege,
            Self::Tls { .. } => CheckFailure::Tls,
            Self::Connect { source, .. } | Self::Transport { source, .. }
                if is_tls_failure(source.as_ref()) =>
            {
                CheckFailure::Tls
            }
            Self::Connect { .. }
            | Self::Transport { .. }
            | Self::Timeout { .. }
            | Self::Deadline { .. } => CheckFailure::Unreachable,
            Self::HttpStatus { .. }
            | Self::Decode { .. }
            | Self::Protocol { .. }
            | Self::Unsupported { .. }
            | Self::AmbiguousSystem { .. }
            | Self::SystemNotFound { .. }
            | Self::NotVerified { .. } => CheckFailure::UnexpectedAnswer,
        }
    }
}

/// Whether a transport error's chain holds a TLS failure (a rustls error: an unknown issuer,
/// a name or fingerprint mismatch, a handshake alert).
fn is_tls_failure(error: &(dyn std::error::Error + 'static)) -> bool {
    let mut next = Some(error);
    while let Some(e) = next {
        if e.downcast_ref::<rustls::Error>().is_some() {
            return true;
        }
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && io
                .get_ref()
                .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
        {
            return true;
        }
        next = e.source();
    }
    false
}
