//! The lab's narration: one line per event with the time since the scenario started, the
//! actor, what happened and why.

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{Duration, Instant};

/// One line of a timeline.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Time since the timeline started.
    pub at: Duration,
    /// Who did it: `lab`, `controller`, `agent cp-2`, `bmc cp-1`, `etcd`.
    pub actor: String,
    /// What happened.
    pub what: String,
    /// Why (empty when the actor gave no reason).
    pub why: String,
}

/// A scenario's timeline. Printed as it grows when `live`.
#[derive(Debug)]
pub struct Timeline {
    started: Instant,
    entries: Vec<Entry>,
    live: bool,
}

impl Timeline {
    /// A timeline starting now.
    pub fn new(live: bool) -> Self {
        Self {
            started: Instant::now(),
            entries: Vec::new(),
            live,
        }
    }

    /// Restarts the clock and forgets the entries.
    pub fn restart(&mut self) {
        self.started = Instant::now();
        self.entries.clear();
    }

    /// When the timeline started.
    pub fn started(&self) -> Instant {
        self.started
    }

    /// Adds an entry stamped now.
    pub fn add(&mut self, actor: &str, what: impl Into<String>, why: impl Into<String>) {
        self.add_at(self.started.elapsed(), actor, what, why);
    }

    /// Adds an entry with an explicit time since start (events read from a component's own
    /// clock, such as a BMC's power log).
    pub fn add_at(
        &mut self,
        at: Duration,
        actor: &str,
        what: impl Into<String>,
        why: impl Into<String>,
    ) {
        let entry = Entry {
            at,
            actor: actor.to_owned(),
            what: what.into(),
            why: why.into(),
        };
        if self.live {
            let mut out = std::io::stdout().lock();
            let _ = writeln!(out, "{}", format_entry(&entry));
            let _ = out.flush();
        }
        self.entries.push(entry);
    }

    /// Every entry so far.
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    /// The first entry whose actor and text contain both needles, if any.
    pub fn find(&self, actor: &str, what: &str) -> Option<&Entry> {
        self.entries
            .iter()
            .find(|e| e.actor.contains(actor) && e.what.contains(what))
    }

    /// The whole timeline as text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for e in &self.entries {
            let _ = writeln!(out, "{}", format_entry(e));
        }
        out
    }
}

/// `  12.3s  controller      what — why`
pub fn format_entry(e: &Entry) -> String {
    let mut line = format!("{:>7.1}s  {:<16} {}", e.at.as_secs_f64(), e.actor, e.what);
    if !e.why.is_empty() {
        let _ = write!(line, " — {}", e.why);
    }
    line
}
