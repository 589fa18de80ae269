//! `[controller.limits]`: how the agent API bounds what one peer may hold or send — time to
//! finish a TLS handshake, to send a request's headers and its body, how long a connection may
//! sit idle, how many connections, handshakes and long-polls may be open, and how many
//! requests per second one host may post. Defaults suit thousands of agents; every value is
//! checked when the inventory is read.

use std::time::Duration;

use metalguard_api::duration::go_duration;
use serde::Deserialize;

/// Default time a client has to complete its TLS handshake.
pub const DEFAULT_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Default time a client has to send a request's headers (also the longest wait for the
/// first request on a connection).
pub const DEFAULT_HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time a client has to send a request's body.
pub const DEFAULT_BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time a connection may stay without a request before it is closed. (hyper's header
/// timer also runs while a kept-alive connection waits for its next request, so a connection
/// waiting longer than `header_read_timeout` is closed too: the shorter of the two wins.)
pub const DEFAULT_IDLE_TIMEOUT: Duration = Duration::from_secs(10);
/// Default number of connections served at once (handshaking or established).
pub const DEFAULT_MAX_CONNECTIONS: usize = 4096;
/// Default number of TLS handshakes in each of their two stages (waiting for the complete
/// ClientHello; the rest); when a stage is full, its oldest gives way.
pub const DEFAULT_MAX_HANDSHAKES: usize = 256;
/// Default number of established connections of one host (one certificate).
pub const DEFAULT_MAX_CONNECTIONS_PER_HOST: usize = 16;
/// Default number of open long-polls of one host (an agent keeps one).
pub const DEFAULT_MAX_LONG_POLLS_PER_HOST: usize = 4;
/// Default sustained rate of reports, results and holds of one host, per second.
pub const DEFAULT_REQUESTS_PER_SECOND: u32 = 2;
/// Default burst of reports, results and holds of one host.
pub const DEFAULT_REQUEST_BURST: u32 = 20;

/// The agent API's limits.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApiLimits {
    /// Time to complete the TLS handshake.
    #[serde(default = "handshake_timeout", with = "go_duration")]
    pub handshake_timeout: Duration,
    /// Time to send a request's headers, and to start the first request of a connection.
    #[serde(default = "header_read_timeout", with = "go_duration")]
    pub header_read_timeout: Duration,
    /// Time to send a request's body (answered 408).
    #[serde(default = "body_read_timeout", with = "go_duration")]
    pub body_read_timeout: Duration,
    /// A connection without a request in flight for this long is closed (one waiting longer
    /// than `header_read_timeout` for its next request is closed too).
    #[serde(default = "idle_timeout", with = "go_duration")]
    pub idle_timeout: Duration,
    /// Connections served at once; beyond it a new connection is closed at once.
    #[serde(default = "max_connections")]
    pub max_connections: usize,
    /// TLS handshakes in each stage (waiting for the ClientHello; the rest); a newcomer to a
    /// full stage evicts its oldest.
    #[serde(default = "max_handshakes")]
    pub max_handshakes: usize,
    /// Established connections of one host; a further one is closed after its handshake.
    #[serde(default = "max_connections_per_host")]
    pub max_connections_per_host: usize,
    /// Long-polls of one host open at once; a further one is answered 429.
    #[serde(default = "max_long_polls_per_host")]
    pub max_long_polls_per_host: usize,
    /// Sustained reports, results and holds per second of one host (token bucket).
    #[serde(default = "requests_per_second")]
    pub requests_per_second: u32,
    /// Burst of reports, results and holds of one host; beyond it 429 with `Retry-After`.
    #[serde(default = "request_burst")]
    pub request_burst: u32,
}

impl Default for ApiLimits {
    fn default() -> Self {
        Self {
            handshake_timeout: DEFAULT_HANDSHAKE_TIMEOUT,
            header_read_timeout: DEFAULT_HEADER_READ_TIMEOUT,
            body_read_timeout: DEFAULT_BODY_READ_TIMEOUT,
            idle_timeout: DEFAULT_IDLE_TIMEOUT,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_handshakes: DEFAULT_MAX_HANDSHAKES,
            max_connections_per_host: DEFAULT_MAX_CONNECTIONS_PER_HOST,
            max_long_polls_per_host: DEFAULT_MAX_LONG_POLLS_PER_HOST,
            requests_per_second: DEFAULT_REQUESTS_PER_SECOND,
            request_burst: DEFAULT_REQUEST_BURST,
        }
    }
}

fn handshake_timeout() -> Duration {
    DEFAULT_HANDSHAKE_TIMEOUT
}
fn header_read_timeout() -> Duration {
    DEFAULT_HEADER_READ_TIMEOUT
}
fn body_read_timeout() -> Duration {
    DEFAULT_BODY_READ_TIMEOUT
}
fn idle_timeout() -> Duration {
    DEFAULT_IDLE_TIMEOUT
}
fn max_connections() -> usize {
    DEFAULT_MAX_CONNECTIONS
}
fn max_handshakes() -> usize {
    DEFAULT_MAX_HANDSHAKES
}
fn max_connections_per_host() -> usize {
    DEFAULT_MAX_CONNECTIONS_PER_HOST
}
fn max_long_polls_per_host() -> usize {
    DEFAULT_MAX_LONG_POLLS_PER_HOST
}
fn requests_per_second() -> u32 {
    DEFAULT_REQUESTS_PER_SECOND
}
fn request_burst() -> u32 {
    DEFAULT_REQUEST_BURST
}

/// The longest a limit's timeout may be: a minute (past it, an idle peer holds a descriptor
/// for no reason; the idle timeout may be up to an hour).
const MAX_TIMEOUT: Duration = Duration::from_secs(60);
/// The longest idle timeout.
const MAX_IDLE: Duration = Duration::from_secs(3600);
/// The most connections: more than any kernel's default open-file limit.
const MAX_CONNECTIONS: usize = 1 << 20;

impl ApiLimits {
    /// The rules, each problem naming its key under `controller.limits`.
    pub fn check(&self) -> Result<(), String> {
        let key = |k: &str| format!("controller.limits.{k}");
        for (name, value, max) in [
            ("handshake_timeout", self.handshake_timeout, MAX_TIMEOUT),
            ("header_read_timeout", self.header_read_timeout, MAX_TIMEOUT),
            ("body_read_timeout", self.body_read_timeout, MAX_TIMEOUT),
            ("idle_timeout", self.idle_timeout, MAX_IDLE),
        ] {
            if value.is_zero() || value > max {
                return Err(format!(
                    "{} is {:?}; it must be greater than zero and at most {max:?}",
                    key(name),
                    value
                ));
            }
        }
        for (name, value, min, max) in [
            ("max_connections", self.max_connections, 8, MAX_CONNECTIONS),
            (
                "max_handshakes",
                self.max_handshakes,
                1,
                self.max_connections,
            ),
            // A report and a long-poll at least.
            (
                "max_connections_per_host",
                self.max_connections_per_host,
                2,
                self.max_connections,
            ),
            (
                "max_long_polls_per_host",
                self.max_long_polls_per_host,
                1,
                self.max_connections_per_host,
            ),
        ] {
            if value < min || value > max {
                return Err(format!(
                    "{} is {value}; it must be from {min} to {max}",
                    key(name)
                ));
            }
        }
        if self.requests_per_second == 0 || self.requests_per_second > 1000 {
            return Err(format!(
                "{} is {}; it must be from 1 to 1000",
                key("requests_per_second"),
                self.requests_per_second
            ));
        }
        if self.request_burst == 0 || self.request_burst > 10_000 {
            return Err(format!(
                "{} is {}; it must be from 1 to 10000",
                key("request_burst"),
                self.request_burst
            ));
        }
        Ok(())
    }
}
