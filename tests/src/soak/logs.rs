//! Reading the agents' and controllers' logs into history events.
//!
//! Data flow: a [`Tail`] per log file hands over whole new lines → [`parse_line`] reads the
//! timestamp `tracing`'s formatter writes first (RFC 3339, UTC) and the message's `key=value`
//! fields → an [`Event`] of the soak's history, stamped with the line's own time (Unix
//! milliseconds), so that what an agent did and what a BMC recorded are ordered by when they
//! happened, not by when the recorder read them.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom};
use std::path::PathBuf;

use super::history::Event;
pub use crate::lab::strip_ansi;

/// Follows one log file: each call returns the whole lines written since the last.
#[derive(Debug)]
pub struct Tail {
    path: PathBuf,
    offset: u64,
}

impl Tail {
    /// Follows `path` from its start (it may not exist yet).
    pub fn new(path: PathBuf) -> Self {
        Self { path, offset: 0 }
    }

    /// The whole lines written since the last call; a file that shrank is read again from
    /// its start (a restarted process truncated it).
    pub fn new_lines(&mut self) -> Vec<String> {
        let Ok(mut file) = std::fs::File::open(&self.path) else {
            return Vec::new();
        };
        let len = file.metadata().map_or(0, |m| m.len());
        if len < self.offset {
            self.offset = 0;
        }
        if file.seek(SeekFrom::Start(self.offset)).is_err() {
            return Vec::new();
        }
        let mut bytes = Vec::new();
        if file.read_to_end(&mut bytes).is_err() {
            return Vec::new();
        }
        let Some(end) = bytes.iter().rposition(|&b| b == b'\n') else {
            return Vec::new();
        };
        self.offset += (end + 1) as u64;
        String::from_utf8_lossy(&bytes[..end])
            .lines()
            .map(strip_ansi)
            .collect()
    }
}

/// Who wrote a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Writer {
    /// The agent of a host.
    Agent(String),
    /// A controller replica (`ctl-1`).
    Controller(String),
}

/// The event a log line records, with the line's time (Unix milliseconds), or `None` for a
/// line the history does not need.
pub fn parse_line(writer: &Writer, line: &str) -> Option<(u64, Event)> {
    let at = line_time(line)?;
    let fields = fields(line);
    let num = |k: &str| fields.get(k).and_then(|v| v.parse::<u64>().ok());
    let text = |k: &str| fields.get(k).cloned();
    let event = match writer {
        Writer::Agent(agent) => {
            if line.contains("executing command") {
                let target = text("target").filter(|t| t != "-");
                let action = text("action").filter(|a| a != "-");
                Event::CommandExecuted {
                    agent: agent.clone(),
                    op: text("operation")?,
                    command: text("kind")?,
                    term: num("term")?,
                    target,
                    action,
                }
            } else if line.contains("command of an older leadership refused") {
                Event::CommandRefused {
                    agent: agent.clone(),
                    op: text("operation")?,
                    term: num("offered")?,
                    seen: num("seen")?,
                }
            } else if line.contains("a newer leadership term seen") {
                Event::TermSeen {
                    agent: agent.clone(),
                    term: num("to")?,
                }
            } else if line.contains("command rejected")
                && line.contains("would leave fewer healthy voters than quorum")
            {
                let reason = rest(line, "reason=")?;
                let target = reason
                    .strip_prefix("powering off ")
                    .and_then(|r| r.split_whitespace().next())
                    .unwrap_or_default()
                    .to_owned();
                Event::PowerCutRefused {
                    agent: agent.clone(),
                    target,
                    reason,
                }
            } else {
                return None;
            }
        }
        Writer::Controller(controller) => {
            if line.contains("leading in a new term") {
                Event::Leader {
                    controller: controller.clone(),
                    term: num("term")?,
                }
            } else if line.contains("intent persisted") {
                Event::Intent {
                    controller: controller.clone(),
                    op: text("operation")?,
                    reason: rest(line, " reason=").unwrap_or_default(),
                }
            } else {
                return None;
            }
        }
    };
    Some((at, event))
}

/// Everything after `key` (a field written with `%`, unquoted, that ends the line).
fn rest(line: &str, key: &str) -> Option<String> {
    line.find(key)
        .map(|at| line[at + key.len()..].trim().to_owned())
}

/// The `key=value` fields of a `tracing` line; a quoted value is unquoted and unescaped.
pub fn fields(line: &str) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let bytes: Vec<char> = line.chars().collect();
    let mut i = 0;
    while i < bytes.len() {
        // A key starts after a space and runs over [A-Za-z0-9_.] up to '='.
        let start = i;
        while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == '_') {
            i += 1;
        }
        let key_ok = i > start
            && i < bytes.len()
            && bytes[i] == '='
            && (start == 0 || bytes[start - 1] == ' ');
        if !key_ok {
            i = if i == start { i + 1 } else { i };
            continue;
        }
        let key: String = bytes[start..i].iter().collect();
        i += 1;
        let mut value = String::new();
        if i < bytes.len() && bytes[i] == '"' {
            i += 1;
            while i < bytes.len() && bytes[i] != '"' {
                if bytes[i] == '\\' && i + 1 < bytes.len() {
                    i += 1;
                }
                value.push(bytes[i]);
                i += 1;
            }
            i += 1;
        } else {
            while i < bytes.len() && bytes[i] != ' ' {
                value.push(bytes[i]);
                i += 1;
            }
        }
        out.insert(key, value);
    }
    out
}

/// The time at the start of a `tracing` line (`2026-11-27T12:00:00.123456Z`), in Unix
/// milliseconds.
pub fn line_time(line: &str) -> Option<u64> {
    let stamp = line.split_whitespace().next()?;
    let stamp = stamp.strip_suffix('Z')?;
    let (date, time) = stamp.split_once('T')?;
    let mut d = date.split('-').map(|p| p.parse::<i64>().ok());
    let (y, m, day) = (d.next()??, d.next()??, d.next()??);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|p| p.parse::<i64>().ok());
    let (hh, mm, ss) = (t.next()??, t.next()??, t.next()??);
    let millis: i64 = format!("{frac:0<3}")[..3].parse().ok()?;
    let days = days_from_civil(y, m, day);
    let secs = days * 86_400 + hh * 3600 + mm * 60 + ss;
    u64::try_from(secs * 1000 + millis).ok()
}

/// Days since 1970-01-01 of a proleptic Gregorian date (Howard Hinnant's algorithm).
fn days_from_civil(y: i64, m: i64, d: i64) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tracing_timestamp_reads_as_unix_milliseconds() {
        assert_eq!(line_time("1970-01-01T00:00:01.5Z  INFO x"), Some(1500));
        assert_eq!(
            line_time("2026-11-27T12:22:40.123456Z  INFO executing command"),
            Some(1_795_782_160_123)
        );
        assert_eq!(line_time("not a time"), None);
    }

    #[test]
    fn an_executed_fence_names_its_term_target_and_action() {
        let line = "2026-11-27T12:22:40.123456Z  INFO executing command operation=fence/cp-2/3 kind=\"fence\" term=4 target=\"cp-2\" action=\"off\"";
        let (_, event) = parse_line(&Writer::Agent("cp-1".into()), line).expect("parsed");
        assert_eq!(
            event,
            Event::CommandExecuted {
                agent: "cp-1".into(),
                op: "fence/cp-2/3".into(),
                command: "fence".into(),
                term: 4,
                target: Some("cp-2".into()),
                action: Some("off".into()),
            }
        );
    }

    #[test]
    fn refusals_terms_and_leaderships_are_read_and_other_lines_are_not() {
        let agent = Writer::Agent("cp-3".into());
        let refused = "2026-11-27T12:22:40.1Z  WARN command of an older leadership refused operation=x kind=\"fence\" offered=2 seen=5";
        assert!(matches!(
            parse_line(&agent, refused),
            Some((
                _,
                Event::CommandRefused {
                    term: 2,
                    seen: 5,
                    ..
                }
            ))
        ));
        let seen = "2026-11-27T12:22:40.1Z  INFO a newer leadership term seen from=2 to=5";
        assert!(matches!(
            parse_line(&agent, seen),
            Some((_, Event::TermSeen { term: 5, .. }))
        ));
        let cut = "2026-11-27T12:22:40.1Z  WARN command rejected reason=powering off cp-2 would leave fewer healthy voters than quorum: 1 of 3";
        assert!(matches!(
            parse_line(&agent, cut),
            Some((_, Event::PowerCutRefused { target, .. })) if target == "cp-2"
        ));
        let ctl = Writer::Controller("ctl-2".into());
        let lead = "\u{1b}[2m2026-11-27T12:22:40.1Z\u{1b}[0m  INFO leading in a new term: commands published before it are withdrawn term=7 before=6";
        assert!(matches!(
            parse_line(&ctl, &strip_ansi(lead)),
            Some((_, Event::Leader { term: 7, .. }))
        ));
        assert_eq!(
            parse_line(&agent, "2026-11-27T12:22:40.1Z  INFO report sent"),
            None
        );
    }
}
