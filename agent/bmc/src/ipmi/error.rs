//! Errors of the IPMI client. Messages name the BMC and the user, never the password.

use std::time::Duration;

use thiserror::Error;

use super::wire::DecodeError;

/// What went wrong talking IPMI to a BMC.
#[derive(Debug, Error)]
pub enum IpmiError {
    /// The configuration cannot work (name or password too long, no suite allowed).
    #[error("invalid ipmi configuration for bmc {bmc}: {reason}")]
    Config {
        /// The BMC address.
        bmc: String,
        /// What is wrong.
        reason: &'static str,
    },
    /// The BMC host name did not resolve.
    #[error("cannot resolve ipmi bmc address {bmc}")]
    Resolve {
        /// The BMC address.
        bmc: String,
        /// The resolver error.
        #[source]
        source: std::io::Error,
    },
    /// A socket operation failed.
    #[error("udp socket error talking to bmc {bmc}")]
    Io {
        /// The BMC address.
        bmc: String,
        /// The socket error.
        #[source]
        source: std::io::Error,
    },
    /// ICMP port unreachable: nothing listens on the BMC's IPMI port.
    #[error("bmc {bmc} refused ipmi (icmp port unreachable): nothing listens on that udp port")]
    Unreachable {
        /// The BMC address.
        bmc: String,
    },
    /// No answer after every retransmission.
    #[error("bmc {bmc} did not answer {step} after {attempts} attempts over {elapsed:?}")]
    Timeout {
        /// The BMC address.
        bmc: String,
        /// The request that went unanswered.
        step: &'static str,
        /// How many times it was sent.
        attempts: u32,
        /// Time spent.
        elapsed: Duration,
    },
    /// The BMC does not speak IPMI v2.0 / RMCP+.
    #[error("bmc {bmc} does not support ipmi v2.0 (rmcp+)")]
    NotIpmiV2 {
        /// The BMC address.
        bmc: String,
    },
    /// The BMC offers none of the cipher suites we may use.
    #[error("bmc {bmc} offers cipher suites {offered:?}, none of the allowed {allowed:?}")]
    NoCommonCipherSuite {
        /// The BMC address.
        bmc: String,
        /// Suite IDs the BMC listed.
        offered: Vec<u8>,
        /// Suite IDs we may use.
        allowed: Vec<u8>,
    },
    /// Wrong user name or password (RAKP2 refused or its auth code did not match).
    #[error("authentication failed for user {user} at bmc {bmc}")]
    AuthenticationFailed {
        /// The BMC address.
        bmc: String,
        /// The user name.
        user: String,
    },
    /// The user may not have the privilege level this client needs.
    #[error("bmc {bmc} refused {what} for user {user}: {meaning}")]
    PrivilegeRefused {
        /// The BMC address.
        bmc: String,
        /// The user name.
        user: String,
        /// What was refused: `privilege ADMINISTRATOR`, `chassis control (power down)`.
        what: String,
        /// The BMC's reason.
        meaning: &'static str,
    },
    /// The session could not be established for another RMCP+ status.
    #[error("bmc {bmc} refused the session at {step} with rmcp+ status {status:#04x} ({meaning})")]
    SessionRefused {
        /// The BMC address.
        bmc: String,
        /// Open Session, RAKP2 or RAKP4.
        step: &'static str,
        /// The RMCP+ status code.
        status: u8,
        /// Its meaning.
        meaning: &'static str,
    },
    /// The BMC's RAKP4 did not prove it derived the same session key.
    #[error("bmc {bmc} sent a rakp4 integrity check that does not match")]
    Rakp4Mismatch {
        /// The BMC address.
        bmc: String,
    },
    /// A command failed with a completion code.
    #[error("{command} on bmc {bmc} failed with completion code {code:#04x} ({meaning})")]
    Completion {
        /// The BMC address.
        bmc: String,
        /// The command.
        command: &'static str,
        /// The completion code.
        code: u8,
        /// Its meaning.
        meaning: &'static str,
    },
    /// The BMC sent an answer we could not decode.
    #[error("malformed {step} answer from bmc {bmc}")]
    Malformed {
        /// The BMC address.
        bmc: String,
        /// What we were waiting for.
        step: &'static str,
        /// Why it did not decode.
        #[source]
        source: DecodeError,
    },
    /// The OS random number generator failed.
    #[error("no randomness available for the ipmi session with bmc {bmc}")]
    Random {
        /// The BMC address.
        bmc: String,
    },
}
