//! Rule no-recovery: a host a fault afflicted is healthy again within the bound, or a
//! remediation hands it to a person.

use super::timeline::{FaultSpan, NEEDS_PERSON, Timeline};
use super::{Notes, Params, Rule, Violation, format_time, millis};

/// For each fault that afflicts its host, started at `s`: the host must be healthy at some
/// moment from the fault's end to `s + recovery_bound`, or a remediation of it must reach
/// `needs-person` within `[s, s + recovery_bound]`. The violation is dated at the bound.
///
/// A fault that never ended gives no moment of its own: only a change to healthy after its
/// start counts (the health carried in from before the fault says nothing). A fault the
/// history stops watching before the bound, with neither outcome yet, is noted in `notes`.
pub(super) fn find_missing_recoveries(
    index: &Timeline<'_>,
    params: &Params,
    notes: &mut Notes,
) -> Vec<Violation> {
    let bound = millis(params.recovery_bound);
    let mut violations = Vec::new();
    for fault in index.faults.iter().filter(|f| f.kind.afflicts_host()) {
        let deadline = fault.start.saturating_add(bound);
        if was_healthy_again(index, fault, deadline) || was_handed_to_person(index, fault, deadline)
        {
            continue;
        }
        if index.last_t.is_none_or(|last| last < deadline) {
            notes.push((
                fault.start,
                format!(
                    "{}: the history ends before {}, the bound {} s after it began, and the \
                     host has not recovered yet",
                    describe(fault),
                    format_time(deadline),
                    params.recovery_bound.as_secs()
                ),
            ));
            continue;
        }
        violations.push(Violation {
            rule: Rule::NoRecovery,
            t: deadline,
            message: format!(
                "{}: {} was not healthy from the fault's end to {} ({} s after it began) and no \
                 remediation of it reached {NEEDS_PERSON}",
                describe(fault),
                fault.target,
                format_time(deadline),
                params.recovery_bound.as_secs()
            ),
        });
    }
    violations
}

/// Whether the host was healthy at some moment in `[end, deadline]`, from its health changes
/// (hosts start healthy).
fn was_healthy_again(index: &Timeline<'_>, fault: &FaultSpan<'_>, deadline: u64) -> bool {
    let changes = index
        .health
        .get(fault.target)
        .map_or(&[][..], Vec::as_slice);
    let from = fault.end.unwrap_or(fault.start);
    if from > deadline {
        return false;
    }
    let healthy_at_end = fault.end.is_some()
        && changes
            .iter()
            .take_while(|(t, _)| *t <= from)
            .last()
            .is_none_or(|(_, healthy)| *healthy);
    healthy_at_end
        || changes
            .iter()
            .any(|(t, healthy)| *healthy && from < *t && *t <= deadline)
}

/// Whether a remediation of the host reached `needs-person` in `[start, deadline]`.
fn was_handed_to_person(index: &Timeline<'_>, fault: &FaultSpan<'_>, deadline: u64) -> bool {
    index
        .needs_person
        .get(fault.target)
        .is_some_and(|times| times.iter().any(|t| fault.start <= *t && *t <= deadline))
}

fn describe(fault: &FaultSpan<'_>) -> String {
    let end = fault.end.map_or_else(
        || "never ended".to_string(),
        |e| format!("ended {}", format_time(e)),
    );
    format!(
        "fault {} ({} on {}, began {}, {end})",
        fault.id,
        fault.kind.name(),
        fault.target,
        format_time(fault.start)
    )
}
