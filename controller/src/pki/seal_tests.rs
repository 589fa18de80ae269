//! Unit tests of [`super`] (seal.rs).

use serde_json::json;
use std::os::unix::fs::PermissionsExt as _;

use super::*;

fn keys(dir: &Path) -> Keys {
    let path = dir.join(KEY_FILE);
    create_file(&path).unwrap();
    Keys::load(&path).unwrap()
}

fn stored(envelope: &Envelope) -> Vec<u8> {
    serde_json::to_vec(envelope).unwrap()
}

fn operation() -> serde_json::Value {
    json!({"id": "op-1", "agent": "cp-2", "kind": {"type": "fence", "target": "cp-1", "action": "off"}, "created_at": 5})
}

#[test]
fn a_sealed_record_opens_where_it_was_written_and_nowhere_else() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys(dir.path());
    let sealed = stored(&keys.seal("operations/op-1", 7, operation()));
    let (record, by) = keys.open("operations/op-1", &sealed, 9, Some(7)).unwrap();
    assert_eq!((record, by.as_str()), (operation(), keys.signing_id()));
    // Moved to another key, it fails.
    assert_eq!(
        keys.open("operations/op-2", &sealed, 9, Some(7)),
        Err(Rejection::BadMac)
    );
    // Another controller's key file does not open it.
    let other = tempfile::tempdir().unwrap();
    let stranger = super::tests::keys(other.path());
    assert!(matches!(
        stranger.open("operations/op-1", &sealed, 9, Some(7)),
        Err(Rejection::UnknownKey(_))
    ));
}

#[test]
fn a_hand_written_or_altered_record_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys(dir.path());
    let plain = serde_json::to_vec(&operation()).unwrap();
    assert_eq!(
        keys.open("operations/op-1", &plain, 9, None),
        Err(Rejection::Unsealed)
    );
    for (field, value) in [
        ("agent", json!("mallory")),
        (
            "kind",
            json!({"type": "fence", "target": "cp-3", "action": "off"}),
        ),
        ("created_at", json!(6)),
    ] {
        let mut envelope = keys.seal("operations/op-1", 7, operation());
        envelope.record[field] = value;
        assert_eq!(
            keys.open("operations/op-1", &stored(&envelope), 9, Some(7)),
            Err(Rejection::BadMac),
            "{field} changed"
        );
    }
    let mut envelope = keys.seal("operations/op-1", 7, operation());
    envelope.seal.token = 8;
    assert_eq!(
        keys.open("operations/op-1", &stored(&envelope), 9, Some(8)),
        Err(Rejection::BadMac),
        "the token is covered"
    );
}

#[test]
fn the_seal_holds_whatever_order_the_members_are_stored_in() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys(dir.path());
    let envelope = keys.seal("operations/op-1", 7, operation());
    let text = format!(
        r#"{{"seal":{},"record":{{"created_at":5,"kind":{{"action":"off","target":"cp-1","type":"fence"}},"agent":"cp-2","id":"op-1"}}}}"#,
        serde_json::to_string(&envelope.seal).unwrap()
    );
    assert!(
        keys.open("operations/op-1", text.as_bytes(), 9, Some(7))
            .is_ok()
    );
}

#[test]
fn a_seal_naming_a_leadership_that_did_not_hold_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let keys = keys(dir.path());
    let sealed = stored(&keys.seal("operations/op-1", 20, operation()));
    // Written at revision 9, before leadership 20 began.
    assert!(matches!(
        keys.open("operations/op-1", &sealed, 9, Some(20)),
        Err(Rejection::WrongLeadership { token: 20, .. })
    ));
    // A leadership newer than the current one.
    assert!(matches!(
        keys.open("operations/op-1", &sealed, 30, Some(12)),
        Err(Rejection::WrongLeadership { token: 20, .. })
    ));
    // An earlier leadership's record opens under a later one (failover mid-remediation).
    assert!(keys.open("operations/op-1", &sealed, 30, Some(25)).is_ok());
    assert!(keys.open("operations/op-1", &sealed, 30, None).is_ok());
}

#[test]
fn keys_rotate_without_a_moment_where_a_record_cannot_be_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(KEY_FILE);
    let first = create_file(&path).unwrap();
    let old = Keys::load(&path).unwrap();
    let before = stored(&old.seal("notes", 3, json!({"a": 1})));
    let added = rotate(&path, &Rotation::Add).unwrap();
    let both = Keys::load(&path).unwrap();
    assert_eq!(both.ids(), [first.as_str(), added.as_str()]);
    assert_eq!(both.signing_id(), first, "an added key does not sign yet");
    rotate(&path, &Rotation::Promote(added.clone())).unwrap();
    let promoted = Keys::load(&path).unwrap();
    assert_eq!(promoted.signing_id(), added);
    assert!(promoted.open("notes", &before, 5, None).is_ok());
    let after = stored(&promoted.seal("notes", 3, json!({"a": 1})));
    assert!(
        old.open("notes", &after, 5, None).is_err(),
        "a controller without the new key cannot read it: add before promoting"
    );
    assert!(both.open("notes", &after, 5, None).is_ok());
    rotate(&path, &Rotation::Remove(first.clone())).unwrap();
    let last = Keys::load(&path).unwrap();
    assert_eq!(last.ids(), [added.as_str()]);
    assert!(matches!(
        last.open("notes", &before, 5, None),
        Err(Rejection::UnknownKey(id)) if id == first
    ));
    assert!(matches!(
        rotate(&path, &Rotation::Remove(added)),
        Err(KeyFileError::Empty { .. })
    ));
    let mode = fs::metadata(&path).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
}

#[test]
fn a_key_file_others_may_read_is_refused_and_its_text_never_echoed() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join(KEY_FILE);
    create_file(&path).unwrap();
    assert!(create_file(&path).is_err(), "never replaced");
    fs::set_permissions(&path, fs::Permissions::from_mode(0o640)).unwrap();
    let err = crate::error::chain(&Keys::load(&path).unwrap_err());
    assert!(err.contains("640") && err.contains(KEY_FILE), "{err}");
    fs::write(&path, "# c\nnot-a-key-secret\n").unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o600)).unwrap();
    let err = Keys::load(&path).unwrap_err().to_string();
    assert!(
        err.contains("line 2") && !err.contains("not-a-key-secret"),
        "{err}"
    );
    let debug = format!("{:?}", keys(tempfile::tempdir().unwrap().path()));
    assert!(debug.starts_with("Keys { keys: [Key("), "{debug}");
}
