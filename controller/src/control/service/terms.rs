//! Leadership terms in the loop: the term of the leadership under way, and what happens when
//! an agent has seen a newer one.
//!
//! The backend names the term with every won campaign ([`Leadership::Leader`]); a new term
//! withdraws the commands published before it (the hub) and is logged and gauged. An agent
//! that has seen a newer term says so in its reports (`seen_term`) and in the term of its
//! results. That means another leadership began after this one: but an agent's word alone
//! never deposes a leader (one agent's certificate could then keep the controllers from
//! acting), so the loop asks the store again at once, at most once a second, and the
//! campaign decides.
//!
//! [`Leadership::Leader`]: crate::backend::Leadership::Leader

use std::time::Duration;

use super::Controller;
use crate::backend::Backend;

/// The shortest interval between two campaigns asked for by agents' newer terms.
const RECHECK_INTERVAL: Duration = Duration::from_secs(1);

impl<B: Backend> Controller<B> {
    /// Records the term of the leadership just (re)confirmed.
    pub(super) fn note_term(&mut self, term: u64) {
        let before = self.hub.term();
        if before != term {
            tracing::info!(
                term,
                before,
                "leading in a new term: commands published before it are withdrawn"
            );
        }
        self.hub.set_term(term);
        self.metrics
            .leader_term
            .set(i64::try_from(term).unwrap_or(i64::MAX));
    }

    /// `host`'s agent has seen term `seen`: when it is newer than ours while we lead, ask the
    /// store again now (rate-limited); the campaign deposes us if another leadership began.
    pub(super) async fn recheck_term(&mut self, seen: u64, host: &str) {
        let term = self.hub.term();
        if !self.hub.is_leader() || seen <= term {
            return;
        }
        let now = tokio::time::Instant::now();
        if self
            .term_rechecked
            .is_some_and(|at| now.duration_since(at) < RECHECK_INTERVAL)
        {
            return;
        }
        self.term_rechecked = Some(now);
        tracing::warn!(%host, seen, term, "an agent has seen a newer leadership term than this controller's: asking the store whether this controller still leads");
        self.campaign().await;
    }
}
