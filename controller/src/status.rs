//! `status`: the store's view rendered for people.

use std::fmt::Write as _;

use metalguard_api::duration::Timestamp;

use crate::backend::State;
use crate::inventory::Inventory;

/// The leader, each agent's last report, remediations and operations.
pub fn render(state: &State, now: Timestamp) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "leader: {}", state.leader.as_deref().unwrap_or("none"));
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
        }
    }
    let _ = writeln!(out, "remediations:");
    for r in state.remediations.values() {
        let _ = writeln!(
            out,
            "  {} target {} phase {}",
            r.id,
            r.target,
            r.phase.name()
        );
    }
    let _ = writeln!(out, "operations:");
    for op in state.operations.values() {
        let result = op
            .result
            .as_ref()
            .map_or("in flight".to_owned(), |r| r.outcome.name().to_owned());
        let _ = writeln!(out, "  {} via {}: {:?} {result}", op.id, op.agent, op.kind);
    }
    out
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
            crate::notes::retirement_progress(inventory, state, host, r, now)
        );
    }
    out
}
