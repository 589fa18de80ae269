//! What this controller heard of its agents, apart from the reports its loop has handled: when
//! each host's latest report was accepted by the agent API, and when this process could not
//! have heard anyone (its runtime stalled). An agent is judged silent on this, not only on the
//! reports the loop got to.
//!
//! Why: the loop handles reports one at a time between plan rounds, and a round that loads the
//! store and persists its decisions can run several times in a row; under load the reports
//! accepted meanwhile wait in the inbox. A round that judged silence from the handled reports
//! alone took a healthy agent whose reports were waiting for silent (the long soaks,
//! docs/benchmarks.md: 13 healthy hosts fenced). And a controller whose own process did not run
//! for a while (CPU starvation, a pause too short to lose the lease) heard nothing meanwhile:
//! that time is not the agents' silence. Both only ever make an agent look *less* silent, by
//! time this controller could not have heard it; a hung host is still found, one stall later.
//!
//! The etcd views the quorum guard counts are not touched: a view is as old as its report.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use metalguard_api::duration::Timestamp;

/// Deaf spans kept: enough for any heartbeat timeout at the watch's resolution.
const MAX_SPANS: usize = 256;

/// The runtime is looked at this often.
pub const STALL_TICK: Duration = Duration::from_millis(100);
/// A look this much later than asked is a stall: the process did not run.
pub const STALL_AFTER: Duration = Duration::from_secs(1);

/// Accepted reports and deaf spans (see the module).
#[derive(Debug, Default, Clone)]
pub struct Hearing {
    /// Per host, when the agent API last accepted its report.
    accepted: HashMap<String, Timestamp>,
    /// Spans in which this process could not hear, oldest first, not overlapping.
    deaf: VecDeque<(Timestamp, Timestamp)>,
}

impl Hearing {
    /// Records that `host`'s report was accepted at `at`.
    pub fn accepted(&mut self, host: &str, at: Timestamp) {
        match self.accepted.get_mut(host) {
            Some(last) => *last = (*last).max(at),
            None => {
                self.accepted.insert(host.to_owned(), at);
            }
        }
    }

    /// Records that this process could not hear from `from` to `to`.
    pub fn deaf(&mut self, from: Timestamp, to: Timestamp) {
        if to <= from {
            return;
        }
        // Spans come in time order (one watch); a late one is merged where it belongs.
        let at = self.deaf.partition_point(|&(start, _)| start <= from);
        self.deaf.insert(at, (from, to));
        let mut merged: VecDeque<(Timestamp, Timestamp)> = VecDeque::with_capacity(self.deaf.len());
        for span in self.deaf.drain(..) {
            match merged.back_mut() {
                Some(last) if span.0 <= last.1 => last.1 = last.1.max(span.1),
                _ => merged.push_back(span),
            }
        }
        self.deaf = merged;
        while self.deaf.len() > MAX_SPANS {
            self.deaf.pop_front();
        }
    }

    /// Whether the agent API accepted a report of `host` later than `handled` (the receive
    /// time of the report a round plans from): a newer one is still on its way to the loop.
    pub fn newer_than(&self, host: &str, handled: Timestamp) -> bool {
        self.accepted.get(host).is_some_and(|&at| at > handled)
    }

    /// The last time `host` was heard as far as silence goes: the later of `handled` (its
    /// latest handled report, or when this leadership began) and the report last accepted,
    /// moved forward by the deaf time after it, never past `now`.
    pub fn last_heard(&self, host: &str, handled: Timestamp, now: Timestamp) -> Timestamp {
        let heard = self
            .accepted
            .get(host)
            .map_or(handled, |&accepted| accepted.max(handled));
        let deaf_ms: u64 = self
            .deaf
            .iter()
            .map(|&(from, to)| {
                let (from, to) = (from.max(heard), to.min(now));
                to.as_millis().saturating_sub(from.as_millis())
            })
            .sum();
        Timestamp(heard.as_millis().saturating_add(deaf_ms)).min(now)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_accepted_report_counts_before_the_loop_handles_it() {
        let mut hearing = Hearing::default();
        assert_eq!(
            hearing.last_heard("cp-1", Timestamp(1_000), Timestamp(9_000)),
            Timestamp(1_000)
        );
        hearing.accepted("cp-1", Timestamp(7_000));
        hearing.accepted("cp-1", Timestamp(6_000));
        assert_eq!(
            hearing.last_heard("cp-1", Timestamp(1_000), Timestamp(9_000)),
            Timestamp(7_000)
        );
        // Another host's report is not this one's.
        assert_eq!(
            hearing.last_heard("cp-2", Timestamp(1_000), Timestamp(9_000)),
            Timestamp(1_000)
        );
        // A handled report newer than the accepted one wins.
        assert_eq!(
            hearing.last_heard("cp-1", Timestamp(8_000), Timestamp(9_000)),
            Timestamp(8_000)
        );
    }

    #[test]
    fn deaf_time_after_the_last_report_is_not_silence_and_earlier_deaf_time_does_not_count() {
        let mut hearing = Hearing::default();
        hearing.deaf(Timestamp(500), Timestamp(900)); // before the report: no credit
        hearing.deaf(Timestamp(2_000), Timestamp(4_000));
        hearing.deaf(Timestamp(3_500), Timestamp(5_000)); // overlapping: merged
        hearing.deaf(Timestamp(8_000), Timestamp(20_000)); // still under way at `now`
        // Heard at 1 s; 3 s deaf (2-5 s) and 1 s deaf (8-9 s) up to now (9 s): 1 + 4 = 5 s.
        assert_eq!(
            hearing.last_heard("cp-1", Timestamp(1_000), Timestamp(9_000)),
            Timestamp(5_000)
        );
        // Heard in the middle of a deaf span: only the rest of it counts.
        assert_eq!(
            hearing.last_heard("cp-1", Timestamp(4_500), Timestamp(9_000)),
            Timestamp(6_000)
        );
        // Never later than now.
        hearing.deaf(Timestamp(0), Timestamp(30_000));
        assert_eq!(
            hearing.last_heard("cp-1", Timestamp(1_000), Timestamp(9_000)),
            Timestamp(9_000)
        );
    }

    #[test]
    fn spans_are_bounded() {
        let mut hearing = Hearing::default();
        for i in 0..1_000u64 {
            hearing.deaf(Timestamp(i * 10), Timestamp(i * 10 + 5));
        }
        assert_eq!(hearing.deaf.len(), MAX_SPANS);
        // An empty or backwards span is ignored.
        hearing.deaf(Timestamp(50_000), Timestamp(50_000));
        assert_eq!(hearing.deaf.len(), MAX_SPANS);
    }

    #[test]
    fn a_hung_host_is_still_found_one_stall_later() {
        // Heard at 0, a 2 s stall at 3 s, a 5 s timeout: the host is silent from 7 s on
        // instead of 5 s.
        let mut hearing = Hearing::default();
        hearing.deaf(Timestamp(3_000), Timestamp(5_000));
        let timeout = Duration::from_secs(5);
        let silent = |now: u64| {
            Timestamp(now).since(hearing.last_heard("cp-1", Timestamp(0), Timestamp(now))) > timeout
        };
        assert!(!silent(5_001));
        assert!(!silent(7_000));
        assert!(silent(7_001));
    }
}
