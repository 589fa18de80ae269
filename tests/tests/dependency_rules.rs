//! The workspace's dependency rules hold on the real `cargo metadata` graph.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use metalguard_e2e::deps;

#[test]
fn pure_crates_and_agent_crates_respect_their_dependency_rules() {
    let graph = deps::load_workspace().expect("cargo metadata");
    let violations = graph.violations();
    assert!(
        violations.is_empty(),
        "forbidden dependencies:\n{}",
        violations.join("\n")
    );
}
