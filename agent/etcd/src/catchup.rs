//! Learner catch-up tracking: a pure function of observations over time.
//!
//! Feed [`CatchUp::observe`] one [`Sample`] per observation with the time it was taken; it
//! returns the learner's progress, whether it is promotable and whether it has stalled. No
//! clock is read here: the caller passes `now`.

use crate::view::ClusterView;
use serde::Serialize;
use std::time::{Duration, Instant};

/// Default time without progress after which a learner counts as stalled.
pub const DEFAULT_STALL_AFTER: Duration = Duration::from_secs(10);

/// etcd promotes a learner whose match index is at least 90% of the leader's; we require the
/// same of the applied index, which trails the match index, so our verdict is never early.
const PROMOTABLE_PERCENT: u64 = 90;

/// One observation of a learner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Sample {
    /// The learner's applied index, or `None` when the learner did not answer.
    pub learner_applied: Option<u64>,
    /// The leader's raft index, or `None` when no leader answered.
    pub leader_index: Option<u64>,
}

impl Sample {
    /// Reads the sample for learner `id` out of a view.
    pub fn from_view(view: &ClusterView, id: u64) -> Self {
        Self {
            learner_applied: view
                .member(id)
                .and_then(|m| m.status())
                .map(|s| s.raft_applied_index),
            leader_index: view.leader().and_then(|m| m.status()).map(|s| s.raft_index),
        }
    }
}

/// The verdict after one observation.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Verdict {
    /// Applied index over the leader's raft index, 0.0-1.0 (0 when unknown).
    pub progress: f64,
    /// How many entries the learner is behind the leader, when both answered.
    pub lag: Option<u64>,
    /// The learner is close enough to the leader for etcd to accept the promotion.
    pub promotable: bool,
    /// No progress for at least the stall time while not caught up.
    pub stalled: bool,
    /// Time since the last progress.
    pub since_progress: Duration,
}

/// Tracks one learner's catch-up across observations.
#[derive(Debug, Clone)]
pub struct CatchUp {
    stall_after: Duration,
    best_applied: Option<u64>,
    last_progress: Option<Instant>,
}

impl CatchUp {
    /// A tracker that calls the learner stalled after `stall_after` without progress.
    pub fn new(stall_after: Duration) -> Self {
        Self {
            stall_after,
            best_applied: None,
            last_progress: None,
        }
    }

    /// Records one observation taken at `now` and returns the verdict.
    ///
    /// Progress is a higher applied index than ever seen, or a learner that answered and is
    /// fully caught up (an idle cluster does not stall a caught-up learner). A learner that
    /// does not answer makes no progress.
    pub fn observe(&mut self, now: Instant, sample: Sample) -> Verdict {
        let start = *self.last_progress.get_or_insert(now);
        let caught_up =
            matches!((sample.learner_applied, sample.leader_index), (Some(a), Some(l)) if a >= l);
        if let Some(applied) = sample.learner_applied
            && (self.best_applied.is_none_or(|best| applied > best) || caught_up)
        {
            self.best_applied = Some(self.best_applied.map_or(applied, |b| b.max(applied)));
            self.last_progress = Some(now);
        }
        let since_progress = now.saturating_duration_since(self.last_progress.unwrap_or(start));
        let (progress, lag, promotable) = match (sample.learner_applied, sample.leader_index) {
            (Some(applied), Some(leader)) if leader > 0 => {
                #[allow(clippy::cast_precision_loss)]
                let progress = (applied as f64 / leader as f64).min(1.0);
                let promotable =
                    applied.saturating_mul(100) >= leader.saturating_mul(PROMOTABLE_PERCENT);
                (progress, Some(leader.saturating_sub(applied)), promotable)
            }
            _ => (0.0, None, false),
        };
        Verdict {
            progress,
            lag,
            promotable,
            stalled: !caught_up && since_progress >= self.stall_after,
            since_progress,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(applied: Option<u64>, leader: u64) -> Sample {
        Sample {
            learner_applied: applied,
            leader_index: Some(leader),
        }
    }

    #[test]
    fn progress_and_promotable_follow_the_leader_index() {
        let t0 = Instant::now();
        let mut c = CatchUp::new(Duration::from_secs(5));
        let v = c.observe(t0, sample(Some(100), 1000));
        assert!(!v.promotable && !v.stalled);
        assert_eq!(v.lag, Some(900));
        let v = c.observe(t0 + Duration::from_secs(1), sample(Some(899), 1000));
        assert!(!v.promotable);
        let v = c.observe(t0 + Duration::from_secs(2), sample(Some(900), 1000));
        assert!(v.promotable);
        assert!((v.progress - 0.9).abs() < 1e-9);
    }

    #[test]
    fn a_frozen_learner_stalls_after_the_configured_time() {
        let t0 = Instant::now();
        let mut c = CatchUp::new(Duration::from_secs(5));
        c.observe(t0, sample(Some(10), 1000));
        assert!(
            !c.observe(t0 + Duration::from_secs(4), sample(None, 1010))
                .stalled
        );
        let v = c.observe(t0 + Duration::from_secs(5), sample(None, 1020));
        assert!(v.stalled);
        assert_eq!(v.since_progress, Duration::from_secs(5));
        // Progress resets the clock.
        assert!(
            !c.observe(t0 + Duration::from_secs(6), sample(Some(11), 1020))
                .stalled
        );
    }

    #[test]
    fn an_answering_learner_without_new_entries_stalls_too() {
        let t0 = Instant::now();
        let mut c = CatchUp::new(Duration::from_secs(5));
        c.observe(t0, sample(Some(10), 1000));
        assert!(
            c.observe(t0 + Duration::from_secs(6), sample(Some(10), 1000))
                .stalled
        );
    }

    #[test]
    fn a_caught_up_learner_on_an_idle_cluster_never_stalls() {
        let t0 = Instant::now();
        let mut c = CatchUp::new(Duration::from_secs(5));
        for s in 0..20 {
            let v = c.observe(t0 + Duration::from_secs(s), sample(Some(1000), 1000));
            assert!(!v.stalled && v.promotable);
        }
    }

    #[test]
    fn no_leader_means_not_promotable() {
        let mut c = CatchUp::new(Duration::from_secs(5));
        let v = c.observe(
            Instant::now(),
            Sample {
                learner_applied: Some(5),
                leader_index: None,
            },
        );
        assert!(!v.promotable);
        assert_eq!(v.lag, None);
    }
}
