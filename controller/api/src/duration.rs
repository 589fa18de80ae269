//! Time as data: a [`Timestamp`] newtype (milliseconds since the Unix epoch) and Go-style
//! duration strings (`"300s"`, `"10m"`, `"1h30m"`, `"0"`) as used by `MachineHealthCheck` specs.
//!
//! Decisions never read a clock: `now` is always an input.

use std::fmt;
use std::fmt::Write as _;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A point in time, in milliseconds since the Unix epoch.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize, Default,
)]
#[serde(transparent)]
pub struct Timestamp(pub u64);

impl Timestamp {
    /// The timestamp `d` after this one (saturating at the end of time).
    #[must_use]
    pub fn after(self, d: Duration) -> Timestamp {
        let ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
        Timestamp(self.0.saturating_add(ms))
    }

    /// How long ago `earlier` was, seen from this timestamp (zero if `earlier` is later).
    #[must_use]
    pub fn since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }

    /// Milliseconds since the Unix epoch.
    #[must_use]
    pub fn as_millis(self) -> u64 {
        self.0
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "t={}ms", self.0)
    }
}

/// A Go-style duration string could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// The string is empty.
    #[error("duration is empty")]
    Empty,
    /// A number is missing before a unit or is not a number.
    #[error("duration {0:?} has a malformed number")]
    BadNumber(String),
    /// A unit is missing or unknown (known: ms, s, m, h).
    #[error("duration {0:?} has a missing or unknown unit (use ms, s, m or h)")]
    BadUnit(String),
    /// The value does not fit.
    #[error("duration {0:?} is too large")]
    Overflow(String),
}

/// Parses a Go-style duration: a sequence of `<integer><unit>` with units `ms`, `s`, `m`, `h`,
/// or a bare `"0"`.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let s = text.trim();
    if s.is_empty() {
        return Err(DurationError::Empty);
    }
    if s == "0" {
        return Ok(Duration::ZERO);
    }
    let mut total: u64 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(DurationError::BadNumber(text.to_owned()));
        }
        let value: u64 = rest[..digits]
            .parse()
            .map_err(|_| DurationError::Overflow(text.to_owned()))?;
        rest = &rest[digits..];
        let unit_len = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let factor_ms: u64 = match &rest[..unit_len] {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            _ => return Err(DurationError::BadUnit(text.to_owned())),
        };
        rest = &rest[unit_len..];
        let part = value
            .checked_mul(factor_ms)
            .ok_or_else(|| DurationError::Overflow(text.to_owned()))?;
        total = total
            .checked_add(part)
            .ok_or_else(|| DurationError::Overflow(text.to_owned()))?;
    }
    Ok(Duration::from_millis(total))
}

/// Formats a duration the way [`parse_duration`] reads it back (`"1h30m"`, `"300ms"`, `"0"`).
#[must_use]
pub fn format_duration(d: Duration) -> String {
    let mut ms = u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    if ms == 0 {
        return "0".to_owned();
    }
    let mut out = String::new();
    for (unit, factor) in [("h", 3_600_000u64), ("m", 60_000), ("s", 1_000), ("ms", 1)] {
        if ms >= factor {
            let _ = write!(out, "{}{unit}", ms / factor);
            ms %= factor;
        }
    }
    out
}

/// Serde helper: a [`Duration`] as a Go-style string (`#[serde(with = "go_duration")]`).
pub mod go_duration {
    use super::{Duration, format_duration, parse_duration};
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes the duration as a Go-style string.
    pub fn serialize<S: Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&format_duration(*d))
    }

    /// Reads a Go-style duration string.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Duration, D::Error> {
        let text = String::deserialize(d)?;
        parse_duration(&text).map_err(serde::de::Error::custom)
    }
}

/// Serde helper: an optional [`Duration`] as a Go-style string or null.
pub mod go_duration_opt {
    use super::{Duration, format_duration, parse_duration};
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes the duration as a Go-style string, or null.
    #[allow(clippy::ref_option)]
    pub fn serialize<S: Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
        match d {
            Some(d) => s.serialize_some(&format_duration(*d)),
            None => s.serialize_none(),
        }
    }

    /// Reads an optional Go-style duration string.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Duration>, D::Error> {
        let text = Option::<String>::deserialize(d)?;
        text.map(|t| parse_duration(&t).map_err(serde::de::Error::custom))
            .transpose()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_durations() {
        assert_eq!(parse_duration("300s"), Ok(Duration::from_secs(300)));
        assert_eq!(parse_duration("10m"), Ok(Duration::from_secs(600)));
        assert_eq!(parse_duration("1h30m"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("0"), Ok(Duration::ZERO));
        assert!(matches!(parse_duration(""), Err(DurationError::Empty)));
        assert!(matches!(
            parse_duration("10"),
            Err(DurationError::BadUnit(_))
        ));
        assert!(matches!(
            parse_duration("5d"),
            Err(DurationError::BadUnit(_))
        ));
        assert!(matches!(
            parse_duration("m"),
            Err(DurationError::BadNumber(_))
        ));
    }

    #[test]
    fn format_round_trips() {
        for ms in [0u64, 1, 999, 1000, 61_000, 3_600_000, 5_400_250] {
            let d = Duration::from_millis(ms);
            assert_eq!(parse_duration(&format_duration(d)), Ok(d));
        }
        assert_eq!(format_duration(Duration::from_secs(5400)), "1h30m");
    }

    #[test]
    fn timestamps_do_arithmetic_without_overflow() {
        let t = Timestamp(1_000);
        assert_eq!(t.after(Duration::from_secs(1)), Timestamp(2_000));
        assert_eq!(Timestamp(500).since(t), Duration::ZERO);
        assert_eq!(
            Timestamp(u64::MAX).after(Duration::from_secs(1)),
            Timestamp(u64::MAX)
        );
    }
}
