//! Hysteresis of a probe's verdict: a pure state machine over probe results.
//!
//! The first result sets the verdict at once (there is no history to smooth, and an operator
//! wants to know the state at start); after that the verdict flips to unhealthy only after
//! `failure_threshold` consecutive failures and back to healthy only after
//! `success_threshold` consecutive successes.

/// The verdict state of one probe.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hysteresis {
    verdict: Option<bool>,
    consecutive_successes: u32,
    consecutive_failures: u32,
    failure_threshold: u32,
    success_threshold: u32,
}

impl Hysteresis {
    /// A probe with no result yet.
    pub fn new(failure_threshold: u32, success_threshold: u32) -> Self {
        Self {
            verdict: None,
            consecutive_successes: 0,
            consecutive_failures: 0,
            failure_threshold: failure_threshold.max(1),
            success_threshold: success_threshold.max(1),
        }
    }

    /// The current verdict: `None` before the first result.
    pub fn verdict(&self) -> Option<bool> {
        self.verdict
    }

    /// Consecutive failures so far.
    pub fn consecutive_failures(&self) -> u32 {
        self.consecutive_failures
    }

    /// Forgets the verdict: the check could not tell either way. Returns whether a verdict
    /// was known (so the state changed); the next result sets the verdict at once.
    pub fn forget(&mut self) -> bool {
        self.consecutive_successes = 0;
        self.consecutive_failures = 0;
        self.verdict.take().is_some()
    }

    /// Records one result; returns the new verdict when it changed.
    pub fn observe(&mut self, ok: bool) -> Option<bool> {
        if ok {
            self.consecutive_successes = self.consecutive_successes.saturating_add(1);
            self.consecutive_failures = 0;
        } else {
            self.consecutive_failures = self.consecutive_failures.saturating_add(1);
            self.consecutive_successes = 0;
        }
        let next = match self.verdict {
            None => ok,
            Some(true) if !ok && self.consecutive_failures >= self.failure_threshold => false,
            Some(false) if ok && self.consecutive_successes >= self.success_threshold => true,
            Some(current) => current,
        };
        let changed = self.verdict != Some(next);
        self.verdict = Some(next);
        changed.then_some(next)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_result_sets_the_verdict_then_thresholds_apply() {
        let mut h = Hysteresis::new(3, 2);
        assert_eq!(h.observe(true), Some(true));
        assert_eq!(h.observe(false), None);
        assert_eq!(h.observe(false), None);
        assert_eq!(h.observe(true), None, "a success resets the failure count");
        assert_eq!(h.observe(false), None);
        assert_eq!(h.observe(false), None);
        assert_eq!(h.observe(false), Some(false));
        assert_eq!(h.observe(true), None);
        assert_eq!(h.observe(true), Some(true));
    }

    #[test]
    fn forgetting_makes_the_verdict_unknown_until_the_next_result() {
        let mut h = Hysteresis::new(3, 2);
        assert!(!h.forget(), "nothing known yet");
        assert_eq!(h.observe(false), Some(false));
        assert!(h.forget());
        assert_eq!(h.verdict(), None);
        assert!(!h.forget());
        assert_eq!(
            h.observe(true),
            Some(true),
            "set at once, like a first result"
        );
    }

    #[test]
    fn a_failing_start_is_reported_at_once() {
        let mut h = Hysteresis::new(3, 1);
        assert_eq!(h.verdict(), None);
        assert_eq!(h.observe(false), Some(false));
        assert_eq!(h.consecutive_failures(), 1);
    }
}
