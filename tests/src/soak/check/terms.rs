//! Rule older-term-executed: an agent executes only commands of the highest term it has seen.

use std::collections::BTreeMap;

use super::{Rule, Violation};
use crate::soak::history::{Entry, Event};

/// Per agent, in history order (one agent's entries come from one log, so their order holds
/// even within a millisecond): the highest term shown so far by its `TermSeen`,
/// `CommandExecuted` and `CommandRefused.seen`; an executed command of a lower term is a
/// violation (term 0 is below every term above 0).
pub(super) fn find_older_terms_executed(ordered: &[&Entry]) -> Vec<Violation> {
    let mut highest: BTreeMap<&str, u64> = BTreeMap::new();
    let mut violations = Vec::new();
    for entry in ordered {
        match &entry.event {
            Event::TermSeen { agent, term } => raise(&mut highest, agent, *term),
            Event::CommandRefused { agent, seen, .. } => raise(&mut highest, agent, *seen),
            Event::CommandExecuted {
                agent,
                op,
                command,
                term,
                target,
                action,
            } => {
                let seen = highest.get(agent.as_str()).copied().unwrap_or(0);
                if *term < seen {
                    violations.push(Violation {
                        rule: Rule::OlderTermExecuted,
                        t: entry.t,
                        message: format!(
                            "agent {agent} executed op {op} ({}) of term {term} after it had \
                             seen term {seen}",
                            describe(command, target.as_deref(), action.as_deref())
                        ),
                    });
                }
                raise(&mut highest, agent, *term);
            }
            _ => {}
        }
    }
    violations
}

fn raise<'h>(highest: &mut BTreeMap<&'h str, u64>, agent: &'h str, term: u64) {
    let seen = highest.entry(agent).or_insert(term);
    *seen = (*seen).max(term);
}

/// `fence cp-3 off`, or just the command's kind when it has no target.
fn describe(command: &str, target: Option<&str>, action: Option<&str>) -> String {
    [Some(command), target, action]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(" ")
}
