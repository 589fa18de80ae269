//! `status`: the store's view rendered for people.

use std::fmt::Write as _;

use metalguard_api::duration::Timestamp;

use crate::backend::State;

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
