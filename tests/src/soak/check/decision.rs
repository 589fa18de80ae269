//! The decision behind a power-off: the latest fence of the host an agent executed shortly
//! before it, and the intent a controller persisted for that fence's operation.
//!
//! Entries of one millisecond from different sources have no known order, so "the latest"
//! is a set: every fence of the host in the latest millisecond that has one, and for each
//! the intents of its op in the latest millisecond at or before its execution. The rules
//! judge the set as a whole, which keeps the verdict independent of how a batch was
//! interleaved.

use std::time::Duration;

use super::timeline::{Decided, FenceExecuted, PowerChange, Timeline};
use super::{format_time, millis, seconds};

/// What the history shows of the decision behind one power-off.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Behind<'a, 'h> {
    /// The intents behind the latest fences of the host, in (time, op, controller) order:
    /// never empty.
    Decided(Vec<&'a Decided<'h>>),
    /// No fence of the host was executed in the window before the power-off.
    NoFence { window: Duration },
    /// The latest fences of the host were executed, but no intent of their ops was
    /// persisted at or before (the first of them, by op).
    NoIntent(&'a FenceExecuted<'h>),
}

impl Behind<'_, '_> {
    /// Why the decision could not be found (`None` when it was).
    pub fn missing(&self) -> Option<String> {
        match self {
            Behind::Decided(_) => None,
            Behind::NoFence { window } => Some(format!(
                "no fence of it executed in the {} before it",
                seconds(*window)
            )),
            Behind::NoIntent(fence) => Some(format!(
                "no intent of op {} persisted before {} executed it at {}",
                fence.op,
                fence.agent,
                format_time(fence.t)
            )),
        }
    }
}

/// The decision behind `off`: the latest fences of its host executed at or before it and at
/// most `window` before it, and the latest intents of their ops at or before each
/// execution.
pub(super) fn find_decision<'a, 'h>(
    index: &'a Timeline<'h>,
    off: &PowerChange<'_>,
    window: Duration,
) -> Behind<'a, 'h> {
    let fences = latest_fences_of(index, off, millis(window));
    let mut decided: Vec<&Decided<'h>> = fences
        .iter()
        .flat_map(|fence| latest_intents_of(index, fence))
        .collect();
    decided.sort_by_key(|d| (d.t, d.op, d.controller));
    decided.dedup();
    if !decided.is_empty() {
        return Behind::Decided(decided);
    }
    match fences.into_iter().min_by_key(|f| (f.op, f.agent)) {
        Some(first) => Behind::NoIntent(first),
        None => Behind::NoFence { window },
    }
}

/// The fences of `off`'s host in the latest millisecond at or before it, at most `window_ms`
/// before it.
fn latest_fences_of<'a, 'h>(
    index: &'a Timeline<'h>,
    off: &PowerChange<'_>,
    window_ms: u64,
) -> Vec<&'a FenceExecuted<'h>> {
    let upto = index.fences.partition_point(|f| f.t <= off.t);
    let from = off.t.saturating_sub(window_ms);
    let mut of_host = index.fences[..upto]
        .iter()
        .rev()
        .take_while(|f| f.t >= from)
        .filter(|f| f.target == off.host);
    let Some(latest) = of_host.next() else {
        return Vec::new();
    };
    let mut fences = vec![latest];
    fences.extend(of_host.take_while(|f| f.t == latest.t));
    fences
}

/// The intents of `fence`'s op in the latest millisecond at or before its execution.
fn latest_intents_of<'a, 'h>(
    index: &'a Timeline<'h>,
    fence: &FenceExecuted<'_>,
) -> &'a [Decided<'h>] {
    let Some(intents) = index.intents.get(fence.op) else {
        return &[];
    };
    let upto = intents.partition_point(|d| d.t <= fence.t);
    let Some(latest) = intents[..upto].last() else {
        return &[];
    };
    let from = intents[..upto].partition_point(|d| d.t < latest.t);
    &intents[from..upto]
}
