//! metalguard's own preDrain hooks as annotations of a `GuardedHost`: the spec's
//! `lifecycleHooks` belong to whoever wrote them, so the controller places and releases its
//! hook (`metalguard.io/etcd-quorum`) as the annotation `pre-drain.hook.metalguard.io/etcd-quorum`,
//! owned by its field manager. An annotation key is `prefix/name` with one slash and a name
//! of at most 63 characters (`([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]`), so the hook's own
//! `metalguard.io/` owner prefix is what the annotation's prefix stands for. Deleting the
//! annotation is the administrator's escape hatch (as deleting the key is in standalone mode).

/// The prefix of metalguard's hook annotations.
pub const ANNOTATION_PREFIX: &str = "pre-drain.hook.metalguard.io/";
/// The owner prefix of metalguard's hook names.
pub const HOOK_PREFIX: &str = "metalguard.io/";

/// Whether `name` is the name part of a Kubernetes qualified name (annotation or label key).
fn is_key_name(name: &str) -> bool {
    let bytes = name.as_bytes();
    let edge = |b: &u8| b.is_ascii_alphanumeric();
    !bytes.is_empty()
        && bytes.len() <= 63
        && bytes.first().is_some_and(edge)
        && bytes.last().is_some_and(edge)
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// The annotation key that stands for `hook`: `None` for a hook that is not metalguard's or
/// whose name no annotation key can carry.
pub fn annotation_for(hook: &str) -> Option<String> {
    let name = hook.strip_prefix(HOOK_PREFIX)?;
    is_key_name(name).then(|| format!("{ANNOTATION_PREFIX}{name}"))
}

/// The hook an annotation key stands for, if it is one of metalguard's hook annotations.
pub fn hook_for(key: &str) -> Option<String> {
    let name = key.strip_prefix(ANNOTATION_PREFIX)?;
    is_key_name(name).then(|| format!("{HOOK_PREFIX}{name}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_quorum_hook_round_trips_through_a_valid_annotation_key() {
        let hook = metalguard_api::snapshot::QUORUM_HOOK;
        let key = annotation_for(hook).unwrap();
        assert_eq!(key, "pre-drain.hook.metalguard.io/etcd-quorum");
        // One slash: what the API server requires of an annotation key.
        assert_eq!(key.matches('/').count(), 1);
        assert_eq!(hook_for(&key).as_deref(), Some(hook));
    }

    #[test]
    fn foreign_and_unrepresentable_hooks_have_no_annotation() {
        assert_eq!(annotation_for("MigrateImportantApp"), None);
        assert_eq!(annotation_for("example.com/drain"), None);
        assert_eq!(annotation_for("metalguard.io/a/b"), None);
        assert_eq!(
            annotation_for(&format!("metalguard.io/{}", "x".repeat(64))),
            None
        );
        assert_eq!(hook_for("example.com/etcd-quorum"), None);
        assert_eq!(hook_for("pre-drain.hook.metalguard.io/-bad"), None);
    }
}
