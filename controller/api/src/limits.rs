//! How much an agent may send in one request: bytes per body, entries per list and bytes per
//! string. The controller refuses a body over its size (413) and a report, result or hold
//! beyond these bounds (422, the message naming the field); the agent fits what it sends within
//! them first ([`fit_report`], [`fit_result`]), so a healthy agent is never refused. Without them
//! one agent certificate filled the guarded etcd to NOSPACE in seconds with 2 MB reports.
//!
//! Pure: no I/O.

use crate::identity::SystemIdentity;
use crate::protocol::{AgentReport, CommandResult};
use crate::snapshot::Hold;
use crate::text::truncate_to;

/// Largest report body, in bytes.
pub const MAX_REPORT_BYTES: usize = 64 * 1024;
/// Largest result body (a result carries the command's timeline), in bytes.
pub const MAX_RESULT_BYTES: usize = 256 * 1024;
/// Largest hold body, in bytes.
pub const MAX_HOLD_BYTES: usize = 16 * 1024;

/// A host, member or condition name.
pub const MAX_NAME: usize = 253;
/// A version, boot id, reason, alarm name or serial number.
pub const MAX_SHORT: usize = 128;
// A serial number the identity keeps always fits.
const _: () = assert!(crate::identity::MAX_SERIAL_NUMBER <= MAX_SHORT);
/// A message, an error, a hold's reason.
pub const MAX_TEXT: usize = 1024;
/// A URL, an operation or hold id.
pub const MAX_URL: usize = 512;
/// Conditions in a report.
pub const MAX_CONDITIONS: usize = 64;
/// Members in a report's etcd view.
pub const MAX_MEMBERS: usize = 32;
/// Peer or client URLs of one member; alarms of one member.
pub const MAX_PER_MEMBER: usize = 8;
/// BMC reachability entries in a report (one per other inventory host with a BMC).
pub const MAX_REACHABILITY: usize = 512;
/// Unacknowledged result ids in a report.
pub const MAX_UNACKNOWLEDGED: usize = 256;
/// Holds in a report.
pub const MAX_HOLDS: usize = 32;
/// Timeline entries in a result.
pub const MAX_TIMELINE: usize = 256;
/// Text of one timeline entry; the error of a result.
pub const MAX_RESULT_TEXT: usize = 8 * 1024;

/// What exceeds a bound. The message names the field, never its content.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitError {
    /// A list has too many entries.
    #[error("{field} has {count} entries; at most {max} are accepted")]
    TooMany {
        /// The field, e.g. `conditions`.
        field: String,
        /// How many there were.
        count: usize,
        /// The bound.
        max: usize,
    },
    /// A string holds a control character (a screen-clear sequence, a forged log line).
    #[error("{field} contains a control character; it would reach terminals and logs as it is")]
    Control {
        /// The field, e.g. `reason`.
        field: String,
    },
    /// A string is too long.
    #[error("{field} is {len} bytes long; at most {max} are accepted")]
    TooLong {
        /// The field, e.g. `conditions[3].message`.
        field: String,
        /// Its length in bytes.
        len: usize,
        /// The bound.
        max: usize,
    },
}

fn count(field: &str, count: usize, max: usize) -> Result<(), LimitError> {
    if count > max {
        return Err(LimitError::TooMany {
            field: field.to_owned(),
            count,
            max,
        });
    }
    Ok(())
}

fn len(field: impl FnOnce() -> String, text: &str, max: usize) -> Result<(), LimitError> {
    if text.len() > max {
        return Err(LimitError::TooLong {
            field: field(),
            len: text.len(),
            max,
        });
    }
    Ok(())
}

/// Whether `report` is within every bound.
pub fn check_report(report: &AgentReport) -> Result<(), LimitError> {
    len(|| "host".into(), &report.host, MAX_NAME)?;
    len(|| "agent_version".into(), &report.agent_version, MAX_SHORT)?;
    len(|| "boot_id".into(), &report.boot_id, MAX_SHORT)?;
    count("conditions", report.conditions.len(), MAX_CONDITIONS)?;
    for (i, c) in report.conditions.iter().enumerate() {
        len(|| format!("conditions[{i}].type"), &c.type_, MAX_NAME)?;
        len(|| format!("conditions[{i}].reason"), &c.reason, MAX_SHORT)?;
        len(|| format!("conditions[{i}].message"), &c.message, MAX_TEXT)?;
    }
    if let Some(etcd) = &report.etcd {
        count("etcd.members", etcd.members.len(), MAX_MEMBERS)?;
        for (i, m) in etcd.members.iter().enumerate() {
            len(|| format!("etcd.members[{i}].name"), &m.name, MAX_NAME)?;
            for (key, urls) in [("peer_urls", &m.peer_urls), ("client_urls", &m.client_urls)] {
                count(
                    &format!("etcd.members[{i}].{key}"),
                    urls.len(),
                    MAX_PER_MEMBER,
                )?;
                for (j, u) in urls.iter().enumerate() {
                    len(|| format!("etcd.members[{i}].{key}[{j}]"), u, MAX_URL)?;
                }
            }
            count(
                &format!("etcd.members[{i}].alarms"),
                m.alarms.len(),
                MAX_PER_MEMBER,
            )?;
            for (j, a) in m.alarms.iter().enumerate() {
                len(|| format!("etcd.members[{i}].alarms[{j}]"), a, MAX_SHORT)?;
            }
            if let Some(error) = &m.error {
                len(|| format!("etcd.members[{i}].error"), error, MAX_TEXT)?;
            }
        }
    }
    count(
        "bmc_reachability",
        report.bmc_reachability.len(),
        MAX_REACHABILITY,
    )?;
    for (i, r) in report.bmc_reachability.iter().enumerate() {
        len(|| format!("bmc_reachability[{i}].host"), &r.host, MAX_NAME)?;
        if let Some(error) = &r.error {
            len(|| format!("bmc_reachability[{i}].error"), error, MAX_TEXT)?;
        }
        if let Some(check) = &r.check {
            let at = format!("bmc_reachability[{i}].check.");
            len(|| format!("{at}detail"), &check.detail, MAX_TEXT)?;
            if let Some(state) = &check.power_state {
                len(|| format!("{at}power_state"), state, MAX_SHORT)?;
            }
            if let Some(id) = &check.credentials_id {
                len(|| format!("{at}credentials_id"), id, MAX_SHORT)?;
            }
            if let Some(id) = &check.request {
                len(|| format!("{at}request"), id, MAX_SHORT)?;
            }
            if let Some(identity) = &check.identity {
                check_identity(&format!("{at}identity."), identity)?;
            }
        }
    }
    count(
        "unacknowledged_results",
        report.unacknowledged_results.len(),
        MAX_UNACKNOWLEDGED,
    )?;
    for (i, id) in report.unacknowledged_results.iter().enumerate() {
        len(|| format!("unacknowledged_results[{i}]"), &id.0, MAX_URL)?;
    }
    count("holds", report.holds.len(), MAX_HOLDS)?;
    for (i, hold) in report.holds.iter().enumerate() {
        check_hold_fields(&format!("holds[{i}]."), hold)?;
    }
    if let Some(identity) = &report.host_identity {
        check_identity("host_identity.", identity)?;
    }
    Ok(())
}

fn check_identity(prefix: &str, identity: &SystemIdentity) -> Result<(), LimitError> {
    if let Some(serial) = &identity.serial_number {
        len(|| format!("{prefix}serial_number"), serial, MAX_SHORT)?;
    }
    for (field, why) in [
        ("uuid_absent", &identity.uuid_absent),
        ("serial_number_absent", &identity.serial_number_absent),
    ] {
        if let Some(why) = why {
            len(|| format!("{prefix}{field}"), why, MAX_TEXT)?;
        }
    }
    Ok(())
}

/// Whether a posted hold is within every bound.
pub fn check_hold(hold: &Hold) -> Result<(), LimitError> {
    check_hold_fields("", hold)?;
    // A posted hold is refused whole. A hold in a report is not (the report carries the
    // host's health); its fields are escaped wherever they are printed.
    for (field, value) in [
        ("id", &hold.id),
        ("target", &hold.target),
        ("by", &hold.by),
        ("reason", &hold.reason),
        ("action", &hold.action),
    ] {
        if crate::text::has_control(value) {
            return Err(LimitError::Control {
                field: field.to_owned(),
            });
        }
    }
    Ok(())
}

fn check_hold_fields(prefix: &str, hold: &Hold) -> Result<(), LimitError> {
    len(|| format!("{prefix}id"), &hold.id, MAX_URL)?;
    len(|| format!("{prefix}target"), &hold.target, MAX_NAME)?;
    len(|| format!("{prefix}by"), &hold.by, MAX_SHORT * 2)?;
    len(|| format!("{prefix}reason"), &hold.reason, MAX_TEXT)?;
    len(|| format!("{prefix}action"), &hold.action, MAX_SHORT)
}

/// Whether a command result is within every bound.
pub fn check_result(result: &CommandResult) -> Result<(), LimitError> {
    len(|| "operation_id".into(), &result.operation_id.0, MAX_URL)?;
    count("timeline", result.timeline.len(), MAX_TIMELINE)?;
    for (i, entry) in result.timeline.iter().enumerate() {
        len(
            || format!("timeline[{i}].what"),
            &entry.what,
            MAX_RESULT_TEXT,
        )?;
    }
    if let Some(error) = &result.error {
        len(|| "error".into(), error, MAX_RESULT_TEXT)?;
    }
    Ok(())
}

/// How large `value` is as JSON.
fn json_len<T: serde::Serialize>(value: &T) -> usize {
    serde_json::to_vec(value).map_or(usize::MAX, |bytes| bytes.len())
}

/// Cuts `report` to the bounds [`check_report`] applies, then, while its JSON is over
/// [`MAX_REPORT_BYTES`], shortens the free texts, drops the reachability errors and finally
/// reachability entries. Returns whether anything was cut (the agent says so in its log).
/// Names, statuses and ids are never shortened: a cut id would be another id.
pub fn fit_report(report: &mut AgentReport) -> bool {
    let before = report.clone();
    truncate_to(&mut report.agent_version, MAX_SHORT);
    truncate_to(&mut report.boot_id, MAX_SHORT);
    report.conditions.truncate(MAX_CONDITIONS);
    for c in &mut report.conditions {
        truncate_to(&mut c.reason, MAX_SHORT);
        truncate_to(&mut c.message, MAX_TEXT);
    }
    if let Some(etcd) = &mut report.etcd {
        etcd.members.truncate(MAX_MEMBERS);
        for m in &mut etcd.members {
            m.peer_urls.truncate(MAX_PER_MEMBER);
            m.client_urls.truncate(MAX_PER_MEMBER);
            m.alarms.truncate(MAX_PER_MEMBER);
            for a in &mut m.alarms {
                truncate_to(a, MAX_SHORT);
            }
            if let Some(error) = &mut m.error {
                truncate_to(error, MAX_TEXT);
            }
        }
    }
    report.bmc_reachability.truncate(MAX_REACHABILITY);
    for r in &mut report.bmc_reachability {
        if let Some(error) = &mut r.error {
            truncate_to(error, MAX_TEXT);
        }
        if let Some(check) = &mut r.check {
            truncate_to(&mut check.detail, MAX_TEXT);
            if let Some(state) = &mut check.power_state {
                truncate_to(state, MAX_SHORT);
            }
            if let Some(id) = &mut check.credentials_id {
                truncate_to(id, MAX_SHORT);
            }
            if let Some(id) = &mut check.request {
                truncate_to(id, MAX_SHORT);
            }
            if let Some(identity) = &mut check.identity {
                fit_identity(identity);
            }
        }
    }
    report.unacknowledged_results.truncate(MAX_UNACKNOWLEDGED);
    report.holds.truncate(MAX_HOLDS);
    for hold in &mut report.holds {
        truncate_to(&mut hold.by, MAX_SHORT * 2);
        truncate_to(&mut hold.reason, MAX_TEXT);
    }
    if let Some(identity) = &mut report.host_identity {
        fit_identity(identity);
    }
    if json_len(report) > MAX_REPORT_BYTES {
        for c in &mut report.conditions {
            truncate_to(&mut c.message, MAX_SHORT);
        }
        for m in report.etcd.iter_mut().flat_map(|e| e.members.iter_mut()) {
            if let Some(error) = &mut m.error {
                truncate_to(error, MAX_SHORT);
            }
        }
        for r in &mut report.bmc_reachability {
            if let Some(error) = &mut r.error {
                truncate_to(error, MAX_SHORT);
            }
        }
    }
    if json_len(report) > MAX_REPORT_BYTES {
        for r in &mut report.bmc_reachability {
            r.error = None;
            if let Some(check) = &mut r.check {
                check.detail.clear();
            }
        }
    }
    while json_len(report) > MAX_REPORT_BYTES && !report.bmc_reachability.is_empty() {
        let keep = report.bmc_reachability.len() / 2;
        report.bmc_reachability.truncate(keep);
    }
    *report != before
}

/// Cuts `identity` to the bounds [`check_identity`] applies. A cut serial number would be
/// another one: it becomes absent instead, saying why.
fn fit_identity(identity: &mut crate::identity::SystemIdentity) {
    if identity
        .serial_number
        .as_ref()
        .is_some_and(|serial| serial.len() > MAX_SHORT)
    {
        identity.set_serial_number(Err(format!(
            "longer than the {MAX_SHORT} bytes the protocol accepts"
        )));
    }
    for why in [
        &mut identity.uuid_absent,
        &mut identity.serial_number_absent,
    ]
    .into_iter()
    .flatten()
    {
        truncate_to(why, MAX_TEXT);
    }
}

/// Cuts `result` to the bounds [`check_result`] applies and, while its JSON is over
/// [`MAX_RESULT_BYTES`], drops timeline entries from the middle (the first and the latest
/// say the most) with a note of how many. Returns whether anything was cut.
pub fn fit_result(result: &mut CommandResult) -> bool {
    let before = result.clone();
    if let Some(error) = &mut result.error {
        truncate_to(error, MAX_RESULT_TEXT);
    }
    for entry in &mut result.timeline {
        truncate_to(&mut entry.what, MAX_RESULT_TEXT);
    }
    // Room for the note that says how many entries were left out.
    let target = MAX_RESULT_BYTES - 256;
    let mut left_out = 0;
    loop {
        let n = result.timeline.len();
        let too_many = n > MAX_TIMELINE - 1;
        if n <= 2 || !(too_many || json_len(result) > target) {
            break;
        }
        let drop = if too_many {
            n - (MAX_TIMELINE - 1)
        } else {
            (n / 8).max(1)
        };
        let at = (n - drop) / 2;
        result.timeline.drain(at..at + drop);
        left_out += drop;
    }
    if left_out > 0 {
        let at = result.timeline.len() / 2;
        let elapsed_ms = result.timeline.get(at).map_or(0, |e| e.elapsed_ms);
        result.timeline.insert(
            at,
            crate::protocol::TimelineEntry {
                elapsed_ms,
                direction: crate::protocol::TimelineDirection::Note,
                what: format!("… {left_out} timeline entries left out"),
            },
        );
    }
    *result != before
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::duration::Timestamp;
    use crate::plan::OperationId;
    use crate::protocol::{
        BmcReachability, Condition, EtcdMemberView, EtcdView, Outcome, TimelineDirection,
        TimelineEntry,
    };
    use crate::snapshot::ConditionStatus;

    #[test]
    fn a_posted_hold_with_a_control_character_is_refused_naming_the_field() {
        let hold = |by: &str, reason: &str| Hold {
            id: "cp-2/1".into(),
            target: "cp-1".into(),
            since: Timestamp(1),
            by: by.into(),
            reason: reason.into(),
            action: "off".into(),
        };
        assert!(check_hold(&hold("alice on cp-2", "disk noise")).is_ok());
        let err = check_hold(&hold("alice\u{1b}[2J", "x")).unwrap_err();
        assert_eq!(
            err.to_string(),
            "by contains a control character; it would reach terminals and logs as it is"
        );
        let err = check_hold(&hold("alice", "x\n2026-01-01 ERROR forged")).unwrap_err();
        assert!(err.to_string().starts_with("reason contains"), "{err}");
    }

    fn report() -> AgentReport {
        serde_json::from_str(r#"{"host":"cp-1","agent_version":"0.1.0","sequence":1,"sent_at":5}"#)
            .unwrap()
    }

    fn condition(i: usize, message: String) -> Condition {
        Condition {
            type_: format!("Probe{i}"),
            status: ConditionStatus::True,
            reason: "Ok".into(),
            message,
            last_transition: Timestamp(1),
        }
    }

    #[test]
    fn a_report_beyond_a_bound_is_refused_naming_the_field() {
        assert_eq!(check_report(&report()), Ok(()));
        let mut r = report();
        r.conditions = (0..65).map(|i| condition(i, String::new())).collect();
        assert!(
            check_report(&r)
                .unwrap_err()
                .to_string()
                .starts_with("conditions has 65")
        );
        let mut r = report();
        r.conditions = vec![condition(0, "m".repeat(MAX_TEXT + 1))];
        assert_eq!(
            check_report(&r).unwrap_err().to_string(),
            "conditions[0].message is 1025 bytes long; at most 1024 are accepted"
        );
        let mut r = report();
        r.etcd = Some(EtcdView {
            members: vec![EtcdMemberView {
                id: 1,
                name: "cp-1".into(),
                peer_urls: vec!["u".repeat(MAX_URL + 1)],
                client_urls: Vec::new(),
                learner: false,
                healthy: true,
                alarms: Vec::new(),
                raft_applied_index: None,
                error: None,
            }],
            ..EtcdView::default()
        });
        assert!(
            check_report(&r)
                .unwrap_err()
                .to_string()
                .starts_with("etcd.members[0].peer_urls[0]")
        );
        let mut r = report();
        r.unacknowledged_results = vec![OperationId("x".into()); MAX_UNACKNOWLEDGED + 1];
        assert!(check_report(&r).is_err());
    }

    #[test]
    fn a_host_identity_beyond_a_bound_is_refused_and_fitted_without_cutting_the_serial() {
        let mut r = report();
        let mut identity = SystemIdentity::default();
        identity.set_serial_number(Ok("SN-1"));
        identity.set_uuid(Err("u".repeat(MAX_TEXT + 1)));
        r.host_identity = Some(identity);
        assert_eq!(
            check_report(&r).unwrap_err().to_string(),
            "host_identity.uuid_absent is 1025 bytes long; at most 1024 are accepted"
        );
        // A serial number only a hand-made identity can hold: absent after fitting, not cut.
        r.host_identity.as_mut().unwrap().serial_number = Some("9".repeat(MAX_SHORT + 1));
        assert!(
            check_report(&r)
                .unwrap_err()
                .to_string()
                .starts_with("host_identity.serial_number is 129 bytes")
        );
        assert!(fit_report(&mut r));
        assert_eq!(check_report(&r), Ok(()));
        let identity = r.host_identity.unwrap();
        assert_eq!(identity.serial_number, None);
        assert!(
            identity
                .serial_number_absent
                .unwrap()
                .starts_with("longer than")
        );
    }

    #[test]
    fn a_bmc_check_beyond_a_bound_is_refused_and_fitted() {
        let mut r = report();
        let mut seen = SystemIdentity::default();
        seen.set_serial_number(Ok(&"9".repeat(MAX_SHORT + 1)));
        r.bmc_reachability = vec![BmcReachability {
            host: "cp-2".into(),
            reachable: true,
            checked_at: Timestamp(1),
            error: None,
            check: Some(crate::protocol::BmcCheck {
                failure: None,
                power_state: Some("on".into()),
                identity: Some(seen),
                detail: "d".repeat(MAX_TEXT + 1),
                credentials_id: Some("c".repeat(MAX_SHORT + 1)),
                request: None,
            }),
        }];
        assert_eq!(
            check_report(&r).unwrap_err().to_string(),
            "bmc_reachability[0].check.detail is 1025 bytes long; at most 1024 are accepted"
        );
        assert!(fit_report(&mut r));
        assert_eq!(check_report(&r), Ok(()));
        let check = r.bmc_reachability[0].check.as_ref().unwrap();
        assert_eq!(check.detail.len(), MAX_TEXT);
        assert_eq!(check.identity.as_ref().unwrap().serial_number, None);
        assert_eq!(check.credentials_id.as_ref().unwrap().len(), MAX_SHORT);
        r.bmc_reachability[0].check.as_mut().unwrap().detail = "d".into();
        r.bmc_reachability[0].check.as_mut().unwrap().credentials_id =
            Some("c".repeat(MAX_SHORT + 1));
        assert_eq!(
            check_report(&r).unwrap_err().to_string(),
            "bmc_reachability[0].check.credentials_id is 129 bytes long; at most 128 are accepted"
        );
    }

    #[test]
    fn a_fitted_report_passes_the_check_and_the_size_limit() {
        let mut r = report();
        r.conditions = (0..100).map(|i| condition(i, "m".repeat(5_000))).collect();
        r.bmc_reachability = (0..2_000)
            .map(|i| BmcReachability {
                host: format!("host-{i}"),
                reachable: false,
                checked_at: Timestamp(1),
                error: Some("e".repeat(2_000)),
                check: None,
            })
            .collect();
        assert!(fit_report(&mut r));
        assert_eq!(check_report(&r), Ok(()));
        assert!(json_len(&r) <= MAX_REPORT_BYTES, "{}", json_len(&r));
        assert_eq!(r.conditions.len(), MAX_CONDITIONS, "conditions are kept");
        assert!(!r.bmc_reachability.is_empty());
        let mut small = report();
        assert!(!fit_report(&mut small), "a small report is left alone");
    }

    #[test]
    fn a_fitted_result_keeps_its_first_and_latest_entries_and_says_how_many_went() {
        let entry = |i: u64| TimelineEntry {
            elapsed_ms: i,
            direction: TimelineDirection::Seen,
            what: format!("poll {i} {}", "x".repeat(2_000)),
        };
        let mut result = CommandResult {
            operation_id: OperationId("rem/1/power-off".into()),
            outcome: Outcome::Failed,
            started_at: Timestamp(1),
            finished_at: Timestamp(2),
            timeline: (0..1_000).map(entry).collect(),
            error: Some("e".repeat(100_000)),
            promoted_by: None,
            term: 0,
        };
        assert!(check_result(&result).is_err());
        assert!(fit_result(&mut result));
        assert_eq!(check_result(&result), Ok(()));
        assert!(
            json_len(&result) <= MAX_RESULT_BYTES,
            "{}",
            json_len(&result)
        );
        assert!(result.timeline[0].what.starts_with("poll 0 "));
        assert!(
            result
                .timeline
                .last()
                .unwrap()
                .what
                .starts_with("poll 999 ")
        );
        let note = result
            .timeline
            .iter()
            .find(|e| e.direction == TimelineDirection::Note)
            .unwrap();
        let left_out: usize = note
            .what
            .split_whitespace()
            .nth(1)
            .unwrap()
            .parse()
            .unwrap();
        assert_eq!(left_out + result.timeline.len() - 1, 1_000);
    }
}
