//! Break-glass holds for people: `release` (the CLI's checks and message) and what `status`
//! says about each hold.
//!
//! A hold comes from `metalguard-agent fence --direct` on some host: that agent posts it and
//! carries it in its reports; the leader records it (`holds/ID` in the store) and the core
//! leaves the held host alone. `metalguard-controller release HOST` marks every hold of HOST
//! released (the record stays, so the id is never honoured again); the leader tells the
//! agent in the next report's answer, and the agent deletes its local record.

use std::fmt::Write as _;

use metalguard_api::duration::Timestamp;
use metalguard_api::text::escaped;

use crate::backend::{HoldRelease, State, StoredHold};

/// Why a release was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ReleaseError {
    /// Nothing to release.
    #[error("host {0} has no hold: nothing to release (status lists the holds in force)")]
    NotHeld(String),
    /// Nothing to release, and the name is not an inventory host either.
    #[error("host {0} is not in the inventory and has no hold")]
    UnknownHost(String),
}

/// The person running this command: `SUDO_USER` (who ran sudo), else `USER`, else the uid.
pub fn invoking_user() -> String {
    let named = |key: &str| std::env::var(key).ok().filter(|v| !v.is_empty());
    named("SUDO_USER")
        .or_else(|| named("USER"))
        .unwrap_or_else(|| {
            use std::os::unix::fs::MetadataExt as _;
            std::fs::metadata("/proc/self").map_or_else(
                |_| "unknown user".to_owned(),
                |m| format!("uid {}", m.uid()),
            )
        })
}

/// The release `by` (with `(cli)`, as retirements record it) at `at`.
pub fn release_by(who: &str, reason: &str, at: Timestamp) -> HoldRelease {
    HoldRelease {
        at,
        by: format!("{who} (cli)"),
        reason: reason.to_owned(),
    }
}

/// Checks that `host` has a hold in force, before anything is written.
pub fn check_releasable(
    state: &State,
    host: &str,
    in_inventory: bool,
) -> Result<Vec<StoredHold>, ReleaseError> {
    let active = state.active_holds_of(host);
    match (active.is_empty(), in_inventory) {
        (false, _) => Ok(active),
        (true, true) => Err(ReleaseError::NotHeld(host.to_owned())),
        (true, false) => Err(ReleaseError::UnknownHost(host.to_owned())),
    }
}

/// The command that hands `host` back.
pub fn release_command(host: &str) -> String {
    format!("metalguard-controller release {host} --reason TEXT")
}

/// One line about a hold in force: who, when, why, what, via which agent, how to release.
pub fn describe(record: &StoredHold, recorded: bool, now: Timestamp) -> String {
    let hold = &record.hold;
    let mut line = format!(
        "{}: HELD since {:.1}s ago by {} (break-glass power {}: {}); via agent {}, hold {}",
        hold.target,
        now.since(hold.since).as_secs_f64(),
        escaped(&hold.by),
        escaped(&hold.action),
        escaped(&hold.reason),
        record.reported_by,
        escaped(&hold.id),
    );
    if !recorded {
        line.push_str(" (reported, not stored yet)");
    }
    let _ = write!(
        line,
        "; metalguard leaves it alone until released: {}",
        release_command(&hold.target)
    );
    line
}

/// The `holds:` section of `status` (nothing when no host is held).
pub fn render(state: &State, now: Timestamp) -> String {
    let mut out = String::new();
    let mut active: Vec<(StoredHold, bool)> = state
        .hold_records
        .values()
        .filter(|r| r.is_active())
        .map(|r| (r.clone(), true))
        .collect();
    active.extend(state.unrecorded_holds().into_iter().map(|r| (r, false)));
    if active.is_empty() {
        return out;
    }
    active.sort_by(|(a, _), (b, _)| {
        (&a.hold.target, a.hold.since).cmp(&(&b.hold.target, b.hold.since))
    });
    let _ = writeln!(out, "holds:");
    for (record, recorded) in &active {
        let _ = writeln!(out, "  {}", describe(record, *recorded, now));
    }
    out
}

/// The holds for `status --json`: every hold in force (`recorded` false while only a report
/// carries it) with its release command, and the released ones with their release.
pub fn to_json(state: &State) -> serde_json::Value {
    let entry = |record: &StoredHold, recorded: bool| {
        serde_json::json!({
            "id": record.hold.id,
            "target": record.hold.target,
            "since": record.hold.since,
            "by": record.hold.by,
            "reason": record.hold.reason,
            "action": record.hold.action,
            "reported_by": record.reported_by,
            "recorded": recorded,
            "released": record.released,
            "release_command": release_command(&record.hold.target),
        })
    };
    let mut active: Vec<serde_json::Value> = state
        .hold_records
        .values()
        .filter(|r| r.is_active())
        .map(|r| entry(r, true))
        .collect();
    active.extend(state.unrecorded_holds().iter().map(|r| entry(r, false)));
    let released: Vec<serde_json::Value> = state
        .hold_records
        .values()
        .filter(|r| !r.is_active())
        .map(|r| entry(r, true))
        .collect();
    serde_json::json!({ "active": active, "released": released })
}

/// What `release` prints for each hold it released.
pub fn released_line(record: &StoredHold) -> String {
    let hold = &record.hold;
    format!(
        "released hold {} of {} (power {} by {}: {}); the controller handles {} like any other host again: if it is off and silent it is remediated (powered on)",
        escaped(&hold.id),
        hold.target,
        escaped(&hold.action),
        escaped(&hold.by),
        escaped(&hold.reason),
        hold.target
    )
}

#[cfg(test)]
mod tests {
    use metalguard_api::snapshot::Hold;

    use super::*;

    fn hold(id: &str, target: &str, since: u64) -> Hold {
        Hold {
            id: id.into(),
            target: target.into(),
            since: Timestamp(since),
            by: "alice on cp-2".into(),
            reason: "disk resets".into(),
            action: "off".into(),
        }
    }

    fn record(hold: Hold) -> StoredHold {
        StoredHold {
            reported_by: hold.id.split('/').next().unwrap_or_default().to_owned(),
            hold,
            recorded_at: Timestamp(1),
            released: None,
        }
    }

    #[test]
    fn status_names_who_when_why_the_agent_and_the_release_command() {
        let mut state = State::default();
        let r = record(hold("cp-2/1000", "cp-1", 1_000));
        state.hold_records.insert(r.hold.id.clone(), r);
        let text = render(&state, Timestamp(3_500));
        assert_eq!(
            text,
            "holds:\n  cp-1: HELD since 2.5s ago by alice on cp-2 (break-glass power off: disk resets); \
             via agent cp-2, hold cp-2/1000; metalguard leaves it alone until released: \
             metalguard-controller release cp-1 --reason TEXT\n"
        );
        let json = to_json(&state);
        assert_eq!(json["active"][0]["reported_by"], "cp-2");
        assert_eq!(json["active"][0]["recorded"], true);
        assert!(json["released"].as_array().unwrap().is_empty());
        assert_eq!(render(&State::default(), Timestamp(1)), "");
    }

    #[test]
    fn control_characters_in_a_hold_reach_no_terminal_raw() {
        // A hold reported by an agent (a report is not refused for it) with a screen-clear
        // sequence and a forged log line in its fields.
        let mut state = State::default();
        let mut r = record(hold("cp-2/1000", "cp-1", 1_000));
        r.hold.by = "mallory\u{1b}[2J".into();
        r.hold.reason = "x\nERROR forged line".into();
        state.hold_records.insert(r.hold.id.clone(), r.clone());
        for text in [render(&state, Timestamp(3_500)), released_line(&r)] {
            assert!(!text.contains('\u{1b}'), "{text:?}");
            assert!(!text.contains("\nERROR"), "a forged line: {text:?}");
            assert!(
                text.contains("mallory\\u{1b}[2J") && text.contains("x\\nERROR"),
                "{text}"
            );
        }
    }

    #[test]
    fn a_host_without_a_hold_is_not_released() {
        let mut state = State::default();
        assert_eq!(
            check_releasable(&state, "cp-1", true),
            Err(ReleaseError::NotHeld("cp-1".into()))
        );
        assert_eq!(
            check_releasable(&state, "cp-9", false)
                .unwrap_err()
                .to_string(),
            "host cp-9 is not in the inventory and has no hold"
        );
        let mut r = record(hold("cp-2/1000", "cp-1", 1_000));
        r.released = Some(release_by("bob", "fixed", Timestamp(2_000)));
        state.hold_records.insert(r.hold.id.clone(), r);
        assert!(
            check_releasable(&state, "cp-1", true).is_err(),
            "a released hold is not in force"
        );
        let mut stored = crate::testkit::stored_report("cp-3", 3_000, None);
        stored.report.holds = vec![hold("cp-3/2500", "cp-1", 2_500)];
        state.reports.insert("cp-3".into(), stored);
        let active = check_releasable(&state, "cp-1", true).unwrap();
        assert_eq!(active.len(), 1, "only reported so far: still released");
        assert_eq!(active[0].reported_by, "cp-3");
    }
}
