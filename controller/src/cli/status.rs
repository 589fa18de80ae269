//! `status`: the store's view rendered for people.

use std::fmt::Write as _;

use metalguard_api::duration::Timestamp;

use crate::backend::State;
use crate::inventory::Inventory;
use crate::standalone::etcd::EtcdAlarm;

/// What `status` says about etcd's alarms: the list, or why it could not be read.
pub type Alarms = Result<Vec<EtcdAlarm>, String>;

/// What the planner would decide now over the stored state (a dry run: nothing is written).
/// Hosts count as known since the oldest stored report, or now.
pub fn explain(inventory: &Inventory, state: &State, now: Timestamp) -> metalguard_api::plan::Plan {
    let known_since = state
        .reports
        .values()
        .map(|r| r.received_at)
        .min()
        .unwrap_or(now);
    let snapshot = crate::control::snapshot::build(inventory, state, known_since, now);
    metalguard_core::plan(&snapshot, &inventory.policy, now)
}

/// What the planner decides about a pending fence request of `host`, in one line: the
/// remediation it starts, or the refusal with its reason; for a refusal, also what `--force`
/// would change (it skips policy gates, never the quorum guard).
pub fn fence_verdict(inventory: &Inventory, state: &State, host: &str, now: Timestamp) -> String {
    use metalguard_api::plan::ActionKind;
    let decide = |state: &State| -> Result<String, String> {
        let plan = explain(inventory, state, now);
        if let Some(a) = plan.actions.iter().find(|a| {
            matches!(&a.kind, ActionKind::StartRemediation { remediation } if remediation.target == host)
        }) {
            return Ok(a.reason.clone());
        }
        plan.refusals
            .iter()
            .find(|r| r.subject == host)
            .map_or_else(
                || Err("no decision about it yet (is a remediation of it running?)".to_owned()),
                |r| Err(r.reason.clone()),
            )
    };
    match decide(state) {
        Ok(reason) => format!("verdict: proceeds — {reason}"),
        Err(reason) => {
            let mut line = format!("verdict: refused — {reason}");
            if let Some(req) = state
                .fence_requests
                .get(host)
                // A drill skips no gate: forcing is no answer to its refusal.
                .filter(|r| r.force_reason.is_none() && !r.drill)
            {
                let mut forced = state.clone();
                let mut req = req.clone();
                req.force_reason = Some("(what if)".to_owned());
                forced.fence_requests.insert(host.to_owned(), req);
                let _ = match decide(&forced) {
                    Ok(_) => write!(line, "; with --force and a reason it would proceed"),
                    Err(why) => write!(line, "; even with --force it would be refused: {why}"),
                };
            }
            line
        }
    }
}

/// The same view as [`render`] plus the dry-run plan, as one JSON document for scripts (the
/// local lab reads it): `leader`, `now`, `etcd_alarms` (a list, or `{"error": ...}`),
/// `agents`, `remediations`, `operations`, `fence_requests`, `hooks`, `holds` (`active` and
/// `released`, see [`crate::cli::holds::to_json`]), `retirements`, `notes`, `plan`,
/// `fencing` (per host with a BMC, [`crate::control::fencing::to_json`]).
pub fn render_json(
    inventory: &Inventory,
    state: &State,
    alarms: &Alarms,
    now: Timestamp,
) -> serde_json::Value {
    let plan = explain(inventory, state, now);
    let fencing = crate::control::fencing::to_json(&crate::control::fencing::readiness(
        inventory,
        state,
        &plan.fence_executors,
    ));
    serde_json::json!({
        "etcd_alarms": match alarms {
            Ok(list) => serde_json::json!(list),
            Err(error) => serde_json::json!({ "error": error }),
        },
        "leader": state.leader,
        "now": now,
        "agents": state.reports,
        "remediations": state.remediations.values().collect::<Vec<_>>(),
        "operations": state.operations.values().collect::<Vec<_>>(),
        "fence_requests": state.fence_requests,
        "hooks": state.hooks,
        "holds": crate::cli::holds::to_json(state),
        "rejected_records": state.rejected,
        "withheld_operations": withheld(inventory, state)
            .into_iter()
            .map(|(id, why)| serde_json::json!({ "operation": id, "reason": why }))
            .collect::<Vec<_>>(),
        "stale_seals": state.stale_seals.iter().map(|s| s.key.clone()).collect::<Vec<_>>(),
        "retirements": retirements(inventory, state, now),
        "notes": state.notes,
        "plan": plan,
        "fencing": fencing,
    })
}

/// In-flight operations that are never offered, with the reason.
fn withheld(inventory: &Inventory, state: &State) -> Vec<(String, String)> {
    state
        .operations
        .values()
        .filter(|op| op.in_flight())
        .filter_map(|op| {
            Some((
                op.id.to_string(),
                crate::control::executor::withheld(inventory, state, op)?,
            ))
        })
        .collect()
}

/// Records the controller does not believe (their seal does not hold) and operations it never
/// offers, each with why and what to do; nothing when there is none.
pub fn render_rejected(inventory: &Inventory, state: &State) -> String {
    let mut out = String::new();
    if !state.rejected.is_empty() {
        let _ = writeln!(
            out,
            "REJECTED records (not written by a controller holding the hmac key, or changed since: never acted on; find out who wrote them, then delete them):"
        );
        for r in &state.rejected {
            let _ = writeln!(out, "  {} ({}): {}", r.key, r.kind, r.reason);
        }
    }
    let withheld = withheld(inventory, state);
    if !withheld.is_empty() {
        let _ = writeln!(out, "operations never offered:");
        for (id, why) in withheld {
            let _ = writeln!(out, "  {id}: {why}");
        }
    }
    if !state.stale_seals.is_empty() {
        let _ = writeln!(
            out,
            "records sealed with an older hmac key: {} (the leader seals them again; remove the old key once this line is gone)",
            state.stale_seals.len()
        );
    }
    out
}

/// The leader, the holds in force, each agent's last report, remediations and operations.
pub fn render(inventory: &Inventory, state: &State, now: Timestamp) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "leader: {}", state.leader.as_deref().unwrap_or("none"));
    out.push_str(&crate::cli::holds::render(state, now));
    let _ = writeln!(out, "agents:");
    for (host, stored) in &state.reports {
        let age = now.since(stored.received_at);
        let _ = writeln!(
            out,
            "  {host}: agent {} report #{} {:.1}s ago, {} conditions",
            stored.report.agent_version,
            stored.report.sequence,
            age.as_secs_f64(),
            stored.report.conditions.len()
        );
        for c in &stored.report.conditions {
            let _ = writeln!(out, "    {} = {:?} ({})", c.type_, c.status, c.reason);
            if metalguard_api::protocol::is_adverse(&c.type_, c.status) && !c.message.is_empty() {
                let _ = writeln!(out, "      {}", c.message);
            }
        }
    }
    let _ = writeln!(out, "remediations:");
    for r in state.remediations.values() {
        let _ = writeln!(
            out,
            "  {} target {} phase {}: {}",
            r.id,
            r.target,
            r.phase.name(),
            r.cause
        );
    }
    let _ = writeln!(out, "operations:");
    for op in state.operations.values() {
        let result = op.result.as_ref().map_or_else(
            || match crate::control::executor::withheld(inventory, state, op) {
                Some(why) => format!("in flight, NOT OFFERED: {why}"),
                None => "in flight".to_owned(),
            },
            |r| match r.promoted_by {
                Some(by) => format!("{}, promoted by {}", r.outcome.name(), by.name()),
                None => r.outcome.name().to_owned(),
            },
        );
        let _ = write!(out, "  {} via {}: {:?} {result}", op.id, op.agent, op.kind);
        if let Some(by) = &op.executed_by {
            let _ = write!(out, ", executed by {by}");
        }
        if let Some(who) = &op.requested_by {
            let _ = write!(out, "; asked: {who}");
        }
        let _ = writeln!(out);
    }
    out
}

/// etcd's active alarms, one line each with what to do; nothing when there is none.
pub fn render_alarms(alarms: &Alarms) -> String {
    let mut out = String::new();
    match alarms {
        Ok(list) if list.is_empty() => {}
        Ok(list) => {
            let _ = writeln!(out, "etcd alarms:");
            for a in list {
                let member = if a.member.is_empty() {
                    format!("{:x}", a.member_id)
                } else {
                    format!("{:x} ({})", a.member_id, a.member)
                };
                let what = if a.alarm == "NOSPACE" {
                    "etcd refuses writes (this store's too: agents' reports and remediation \
                     intents cannot be recorded) but still serves reads and keeps quorum; \
                     fencing would not cure it: compact, defragment every member, then \
                     `etcdctl alarm disarm` (docs/runbooks.md, \"etcd NOSPACE alarm\")"
                } else {
                    "see etcd's documentation for this alarm before changing anything"
                };
                let _ = writeln!(out, "  {} raised by member {member}: {what}", a.alarm);
            }
        }
        Err(error) => {
            let _ = writeln!(out, "etcd alarms: not read: {error}");
        }
    }
    out
}

/// Each retirement with its progress line (for [`render_json`]).
fn retirements(inventory: &Inventory, state: &State, now: Timestamp) -> serde_json::Value {
    state
        .retirements
        .iter()
        .map(|(host, r)| {
            (
                host.clone(),
                serde_json::json!({
                    "request": r,
                    "progress": crate::control::notes::retirement_progress(inventory, state, host, r, now),
                }),
            )
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// The leader's notes (inventory generation, what it needs from people, what waits) and each
/// retirement with its progress.
pub fn render_progress(inventory: &Inventory, state: &State, now: Timestamp) -> String {
    let mut out = String::new();
    if let Some(notes) = &state.notes {
        let _ = write!(
            out,
            "inventory: generation {} (as loaded by {})",
            notes.inventory_generation, notes.identity
        );
        match &notes.inventory_error {
            Some(error) => {
                let _ = writeln!(
                    out,
                    "; its latest change is REJECTED, the previous one is in use:"
                );
                for line in error.lines() {
                    let _ = writeln!(out, "  {line}");
                }
            }
            None => {
                let _ = writeln!(out);
            }
        }
        if !notes.needs.is_empty() {
            let _ = writeln!(out, "needs a person:");
            for need in &notes.needs {
                let _ = writeln!(out, "  {need}");
            }
        }
        if !notes.waiting.is_empty() {
            let _ = writeln!(out, "waiting:");
            for wait in &notes.waiting {
                let _ = writeln!(out, "  {wait}");
            }
        }
    }
    if !state.retirements.is_empty() {
        let _ = writeln!(out, "retirements:");
    }
    for (host, r) in &state.retirements {
        let by = r
            .requested_by
            .as_deref()
            .map_or_else(String::new, |who| format!(" by {who}"));
        let _ = writeln!(
            out,
            "  {host}: retired {:.1}s ago{by} ({}): {}",
            now.since(r.requested_at).as_secs_f64(),
            r.reason,
            crate::control::notes::retirement_progress(inventory, state, host, r, now)
        );
    }
    out
}

/// What `status` says when the store cannot be read, before the per-endpoint lines
/// (`crate::cli::etcd_report`) and the error itself: when the members that answered see no leader,
/// why metalguard then fences nothing; otherwise that it waits for its store.
pub fn store_unavailable(no_quorum: bool) -> &'static str {
    if no_quorum {
        "cannot read the controller's store: etcd has no quorum. metalguard acts only through \
         its store: while etcd has no quorum it persists no intent and so fences nothing \
         (fencing cannot restore quorum; a person must recover etcd, see docs/runbooks.md)\n"
    } else {
        "cannot read the controller's store: metalguard acts only through its store and does \
         nothing until it can reach it; each endpoint's answer is below, the error at the end \
         (docs/runbooks.md, \"metalguard cannot reach etcd\")\n"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alarms_name_the_member_and_say_what_to_do() {
        assert_eq!(render_alarms(&Ok(vec![])), "");
        let text = render_alarms(&Ok(vec![
            EtcdAlarm {
                member_id: 0xab,
                member: "cp-2".into(),
                alarm: "NOSPACE".into(),
            },
            EtcdAlarm {
                member_id: 0xcd,
                member: String::new(),
                alarm: "CORRUPT".into(),
            },
        ]));
        assert!(
            text.starts_with("etcd alarms:\n  NOSPACE raised by member ab (cp-2): "),
            "{text}"
        );
        assert!(text.contains("etcdctl alarm disarm"), "{text}");
        assert!(text.contains("  CORRUPT raised by member cd: "), "{text}");
        assert_eq!(
            render_alarms(&Err("no endpoint answered".into())),
            "etcd alarms: not read: no endpoint answered\n"
        );
    }
}
