//! The power record every BMC emulator of the harness keeps: the current state in `power`
//! (`1`/`0`) and each transition appended to `power.log` as `<unix ms> <event> <value>`.
//! `ipmi_sim` writes it from its chassis-control script, `pyghmi` from its handler and the
//! Redfish emulator from a hook on its fake driver; tests and the local lab read it.

use std::path::Path;

use crate::tls::write_file;
use crate::{HarnessError, Result};

/// One recorded power transition.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PowerEvent {
    /// When it happened, Unix milliseconds.
    pub at_ms: u64,
    /// What was asked: `power`, `reset`, `shutdown`, `cycle`.
    pub kind: String,
    /// The value (`0`/`1`).
    pub value: String,
}

impl PowerEvent {
    /// Whether this event switched the power off.
    pub fn is_off(&self) -> bool {
        matches!(self.kind.as_str(), "power" | "cycle") && self.value == "0"
            || self.kind == "shutdown"
    }

    /// Whether this event switched the power on.
    pub fn is_on(&self) -> bool {
        self.kind == "power" && self.value == "1"
    }
}

/// Creates the record in `dir` with the power state at start and an empty log.
pub fn init(dir: &Path, initially_on: bool) -> Result<()> {
    write_file(
        &dir.join("power"),
        if initially_on { b"1" } else { b"0" },
        0o644,
    )?;
    write_file(&dir.join("power.log"), b"", 0o644)
}

/// Whether the record in `dir` says the host is powered on.
pub fn is_on(dir: &Path) -> Result<bool> {
    let text = std::fs::read_to_string(dir.join("power"))
        .map_err(HarnessError::io("reading the simulated power state"))?;
    Ok(text.trim() == "1")
}

/// Every transition recorded in `dir` so far.
pub fn log(dir: &Path) -> Result<Vec<PowerEvent>> {
    let text = std::fs::read_to_string(dir.join("power.log"))
        .map_err(HarnessError::io("reading the simulated power log"))?;
    Ok(text
        .lines()
        .filter_map(|line| {
            let mut parts = line.split_whitespace();
            Some(PowerEvent {
                at_ms: parts.next()?.parse().ok()?,
                kind: parts.next()?.to_owned(),
                value: parts.next().unwrap_or("").to_owned(),
            })
        })
        .collect())
}
