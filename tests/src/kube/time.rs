//! UTC timestamps in the two forms the Kubernetes API takes: `Time` (RFC 3339, seconds) for
//! Node conditions and `MicroTime` (microseconds) for Lease renewals. No date crate needed.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// Days since 1970-01-01 → (year, month, day), proleptic Gregorian (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = u32::try_from(doy - (153 * mp + 2) / 5 + 1).unwrap_or(1);
    let m = u32::try_from(if mp < 10 { mp + 3 } else { mp - 9 }).unwrap_or(1);
    (if m <= 2 { y + 1 } else { y }, m, d)
}

fn parts(at: SystemTime) -> (String, u32) {
    let since = at.duration_since(UNIX_EPOCH).unwrap_or(Duration::ZERO);
    let secs = i64::try_from(since.as_secs()).unwrap_or(i64::MAX);
    let (days, rest) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, mo, d) = civil_from_days(days);
    (
        format!(
            "{y:04}-{mo:02}-{d:02}T{:02}:{:02}:{:02}",
            rest / 3600,
            rest % 3600 / 60,
            rest % 60
        ),
        since.subsec_micros(),
    )
}

/// `at` as a Kubernetes `Time`: `2026-11-25T13:37:00Z`.
pub fn rfc3339(at: SystemTime) -> String {
    format!("{}Z", parts(at).0)
}

/// `at` as a Kubernetes `MicroTime`: `2026-11-25T13:37:00.123456Z`.
pub fn rfc3339_micros(at: SystemTime) -> String {
    let (text, micros) = parts(at);
    format!("{text}.{micros:06}Z")
}

/// Parses the `Time`/`MicroTime` forms above (what the API server returns) back.
pub fn parse_rfc3339(text: &str) -> Option<SystemTime> {
    let text = text.strip_suffix('Z')?;
    let (date, time) = text.split_once('T')?;
    let mut date = date.split('-').map(str::parse::<i64>);
    let (y, m, d) = (date.next()?.ok()?, date.next()?.ok()?, date.next()?.ok()?);
    let (time, fraction) = time.split_once('.').unwrap_or((time, ""));
    let mut time = time.split(':').map(str::parse::<u64>);
    let (hh, mm, ss) = (time.next()?.ok()?, time.next()?.ok()?, time.next()?.ok()?);
    // days_from_civil (the inverse of civil_from_days).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if m > 2 { m - 3 } else { m + 9 };
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = u64::try_from(era * 146_097 + doe - 719_468).ok()?;
    let nanos = if fraction.is_empty() {
        0
    } else {
        let digits: String = fraction
            .chars()
            .chain("000000000".chars())
            .take(9)
            .collect();
        digits.parse::<u32>().ok()?
    };
    Some(UNIX_EPOCH + Duration::new(days * 86_400 + hh * 3600 + mm * 60 + ss, nanos))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants_format_and_parse_back() {
        let at = UNIX_EPOCH + Duration::new(1_795_873_020, 123_456_000);
        assert_eq!(rfc3339(at), "2026-11-28T13:37:00Z");
        assert_eq!(rfc3339_micros(at), "2026-11-28T13:37:00.123456Z");
        assert_eq!(parse_rfc3339("2026-11-28T13:37:00.123456Z"), Some(at));
        assert_eq!(rfc3339(UNIX_EPOCH), "1970-01-01T00:00:00Z");
        assert_eq!(
            parse_rfc3339("2000-02-29T23:59:59Z")
                .map(rfc3339)
                .as_deref(),
            Some("2000-02-29T23:59:59Z")
        );
        assert_eq!(parse_rfc3339("yesterday"), None);
    }
}
