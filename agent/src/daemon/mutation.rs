//! A test-only switch that turns one of the agent's safety checks off, so the soak's checker
//! can be shown to find what the check prevents (issue 24's mutation check).
//!
//! `METALGUARD_TEST_MUTATE=skip-term-check` (or `skip-quorum-check`, or both, comma
//! separated) is honoured only by debug builds (`cfg!(debug_assertions)`: the test suite's
//! binaries); a release build, and so every package, ignores it. A honoured switch is logged
//! at error level on every use.

/// The environment variable naming the checks to skip.
pub const VARIABLE: &str = "METALGUARD_TEST_MUTATE";

/// Whether this (debug) build was told to skip `check`.
pub fn skips(check: &str) -> bool {
    if !cfg!(debug_assertions) {
        return false;
    }
    let skipped = std::env::var(VARIABLE).is_ok_and(|v| v.split(',').any(|c| c.trim() == check));
    if skipped {
        tracing::error!(
            check,
            "MUTATION: a safety check is switched off ({VARIABLE}; test builds only)"
        );
    }
    skipped
}
