//! The agent's test-only switches (`metalguard_api::mutation`): `skip-term-check` and
//! `skip-quorum-check` turn one of its safety checks off. Debug builds only; a honoured
//! switch is logged at error level on every use.

/// Whether this (debug) build was told to skip `check`.
pub fn skips(check: &str) -> bool {
    let skipped = metalguard_api::mutation::switched(check);
    if skipped {
        tracing::error!(
            check,
            "MUTATION: a safety check is switched off ({}; test builds only)",
            metalguard_api::mutation::VARIABLE
        );
    }
    skipped
}
