//! Test-only switches that make one part of metalguard wrong on purpose, so the soak's
//! checker can be shown to find what a safety check prevents (issue 24's mutation check).
//!
//! `METALGUARD_TEST_MUTATE` names them, comma separated: the agent's `skip-term-check` and
//! `skip-quorum-check` turn one of its checks off; the controller's `withdraw-inherited`
//! makes a new leadership call off the power-offs an older one persisted (docs/design-soak.md,
//! "The mutation check"). Only debug builds honour it (`cfg!(debug_assertions)`: the test
//! suite's binaries); a release build, and so every package, ignores it. Callers log every
//! use at error level.

/// The environment variable naming the switches.
pub const VARIABLE: &str = "METALGUARD_TEST_MUTATE";

/// Whether this (debug) build was told to switch on `name`.
pub fn switched(name: &str) -> bool {
    cfg!(debug_assertions)
        && std::env::var(VARIABLE).is_ok_and(|v| v.split(',').any(|c| c.trim() == name))
}
