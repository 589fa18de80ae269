//! A record of what was sent to a BMC and what it answered, with elapsed times.
//!
//! Entries never hold secrets: callers record methods, paths, status codes and states only.

use std::fmt;
use std::time::Duration;

use serde::Serialize;
use tokio::time::Instant;

/// Which way an entry went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// A request metalguard sent.
    Sent,
    /// An answer (or its absence) metalguard saw.
    Seen,
    /// A decision metalguard took (a retry, a wait, a verdict).
    Note,
}

/// One step of an operation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TimelineEntry {
    /// Time since the timeline started.
    #[serde(rename = "elapsed_ms", serialize_with = "serialize_millis")]
    pub elapsed: Duration,
    /// Which way the entry went.
    pub direction: Direction,
    /// What was sent or seen, e.g. `POST /redfish/v1/Systems/1/Actions/ComputerSystem.Reset ForceOff`.
    pub what: String,
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde's serialize_with signature
fn serialize_millis<S: serde::Serializer>(d: &Duration, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64() * 1000.0)
}

/// Most entries a timeline keeps (a verification loop with a long timeout polls for long;
/// the timeline travels in the command's result to the controller and its store).
pub const MAX_ENTRIES: usize = 200;
/// Entries kept from the start when a timeline is full (the rest are the latest).
const KEEP_FIRST: usize = 50;
/// Longest text of one entry, in characters.
pub const MAX_ENTRY_CHARS: usize = 512;

/// The ordered steps of one operation against one BMC.
#[derive(Debug, Clone)]
pub struct Timeline {
    start: Instant,
    entries: Vec<TimelineEntry>,
    /// Entries dropped once the timeline was full.
    left_out: usize,
}

impl Default for Timeline {
    fn default() -> Self {
        Self::new()
    }
}

impl Timeline {
    /// Starts an empty timeline now.
    pub fn new() -> Self {
        Self {
            start: Instant::now(),
            entries: Vec::new(),
            left_out: 0,
        }
    }

    /// Records a request that was sent.
    pub fn sent(&mut self, what: impl Into<String>) {
        self.push(Direction::Sent, what.into());
    }

    /// Records an answer that was seen.
    pub fn seen(&mut self, what: impl Into<String>) {
        self.push(Direction::Seen, what.into());
    }

    /// Records a decision.
    pub fn note(&mut self, what: impl Into<String>) {
        self.push(Direction::Note, what.into());
    }

    fn push(&mut self, direction: Direction, what: String) {
        self.append(TimelineEntry {
            elapsed: self.start.elapsed(),
            direction,
            what,
        });
    }

    /// Records an entry that happened at `at` (for clients that collect events first, like
    /// the IPMI session, and hand them over after the call).
    pub fn record_at(&mut self, at: Instant, direction: Direction, what: impl Into<String>) {
        self.append(TimelineEntry {
            elapsed: at.saturating_duration_since(self.start),
            direction,
            what: what.into(),
        });
    }

    /// Appends an entry, its text escaped and cut; past [`MAX_ENTRIES`] the oldest entries
    /// after the first [`KEEP_FIRST`] give way to the new ones, counted in one note.
    fn append(&mut self, mut entry: TimelineEntry) {
        if entry.what.len() > MAX_ENTRY_CHARS || entry.what.chars().any(char::is_control) {
            entry.what = metalguard_api::text::excerpt(&entry.what, MAX_ENTRY_CHARS);
        }
        if self.entries.len() >= MAX_ENTRIES {
            if self.left_out > 0 {
                self.entries.remove(KEEP_FIRST + 1);
            }
            self.left_out += 1;
            let marker = &mut self.entries[KEEP_FIRST];
            marker.direction = Direction::Note;
            marker.what = format!("… {} entries left out", self.left_out);
        }
        self.entries.push(entry);
    }

    /// The entries, oldest first.
    pub fn entries(&self) -> &[TimelineEntry] {
        &self.entries
    }

    /// Time since the timeline started.
    pub fn elapsed(&self) -> Duration {
        self.start.elapsed()
    }
}

impl fmt::Display for Timeline {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for entry in &self.entries {
            let arrow = match entry.direction {
                Direction::Sent => "->",
                Direction::Seen => "<-",
                Direction::Note => "..",
            };
            writeln!(
                f,
                "{:>9.1} ms {arrow} {}",
                entry.elapsed.as_secs_f64() * 1000.0,
                entry.what
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::{Direction, MAX_ENTRIES, MAX_ENTRY_CHARS, Timeline};
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn entries_carry_elapsed_time_in_order() {
        let mut timeline = Timeline::new();
        timeline.sent("GET /redfish/v1");
        tokio::time::sleep(Duration::from_millis(40)).await;
        timeline.seen("200");
        let entries = timeline.entries();
        assert_eq!(entries.len(), 2);
        assert_eq!(entries[0].direction, Direction::Sent);
        assert_eq!(entries[1].elapsed, Duration::from_millis(40));
        assert!(timeline.to_string().contains("<- 200"));
    }

    #[test]
    fn a_long_run_keeps_the_start_and_the_latest_and_counts_the_rest() {
        let mut timeline = Timeline::new();
        for i in 0..10_000 {
            timeline.seen(format!("poll {i}"));
        }
        let entries = timeline.entries();
        assert!(entries.len() <= MAX_ENTRIES + 1, "{}", entries.len());
        assert_eq!(entries[0].what, "poll 0");
        assert_eq!(entries[49].what, "poll 49");
        assert_eq!(entries[50].direction, Direction::Note);
        assert!(
            entries[50].what.contains("entries left out"),
            "{}",
            entries[50].what
        );
        assert_eq!(entries.last().unwrap().what, "poll 9999");
        let left_out: usize = entries[50]
            .what
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(left_out + entries.len() - 1, 10_000);
        timeline.note("\u{1b}[2J".repeat(10_000));
        let last = &timeline.entries().last().unwrap().what;
        assert!(last.chars().count() < MAX_ENTRY_CHARS + 32 && !last.contains('\u{1b}'));
    }
}
