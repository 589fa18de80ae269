use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

use super::*;

fn mode(path: &Path) -> u32 {
    std::fs::symlink_metadata(path)
        .unwrap()
        .permissions()
        .mode()
        & 0o7777
}

#[test]
fn a_file_is_written_atomically_with_its_mode_and_read_back() {
    let root = tempfile::tempdir().unwrap();
    let dir = SecureDir::open(root.path(), &Owners::root_and_me()).unwrap();
    dir.write_atomic("a.json", b"one", 0o640, None).unwrap();
    dir.write_atomic("a.json", b"two", 0o640, None).unwrap();
    let read = dir.read("a.json").unwrap().unwrap();
    assert_eq!(read.bytes, b"two");
    assert_eq!(mode(&root.path().join("a.json")), 0o640);
    assert_eq!(dir.names().unwrap(), ["a.json"], "no temporary file left");
    assert!(dir.read("missing").unwrap().is_none());
    assert!(dir.rename("a.json", "b.json").unwrap());
    assert!(!dir.rename("a.json", "b.json").unwrap());
    assert!(dir.remove("b.json").unwrap());
    assert!(!dir.remove("b.json").unwrap());
}

#[test]
fn a_symlinked_directory_is_refused_naming_it() {
    let root = tempfile::tempdir().unwrap();
    let target = root.path().join("target");
    std::fs::create_dir(&target).unwrap();
    let link = root.path().join("link");
    std::os::unix::fs::symlink(&target, &link).unwrap();
    let err = SecureDir::open(&link, &Owners::root_and_me()).unwrap_err();
    assert_eq!(
        err.to_string(),
        format!(
            "{} is a symbolic link; it must be a real directory",
            link.display()
        )
    );
    let parent = SecureDir::open(root.path(), &Owners::root_and_me()).unwrap();
    let err = parent
        .create_child("link", 0o750, &Owners::root_and_me())
        .unwrap_err();
    assert!(matches!(err, FileError::Symlink { .. }), "{err}");
}

#[test]
fn a_directory_writable_by_others_or_owned_by_a_stranger_is_refused() {
    let root = tempfile::tempdir().unwrap();
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let err = SecureDir::open(root.path(), &Owners::root_and_me()).unwrap_err();
    assert!(err.to_string().contains("has mode 0777"), "{err}");
    std::fs::set_permissions(root.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let me = std::fs::metadata(root.path()).unwrap().uid();
    let stranger = Owners::Users(vec![me + 1]);
    let err = SecureDir::open(root.path(), &stranger).unwrap_err();
    assert!(
        matches!(err, FileError::Owner { uid, .. } if uid == me),
        "{err}"
    );
}

#[test]
fn a_planted_symlink_is_neither_read_nor_written_through() {
    let root = tempfile::tempdir().unwrap();
    let victim = root.path().join("victim");
    std::fs::write(&victim, "untouched").unwrap();
    let dir_path = root.path().join("dir");
    std::fs::create_dir(&dir_path).unwrap();
    std::os::unix::fs::symlink(&victim, dir_path.join("a.json")).unwrap();
    let dir = SecureDir::open(&dir_path, &Owners::root_and_me()).unwrap();
    let err = dir.read("a.json").unwrap_err();
    assert!(matches!(err, FileError::Symlink { .. }), "{err}");
    let err = dir.create_new("a.json", 0o600).unwrap_err();
    assert!(err.to_string().contains("a.json"), "{err}");
    // An atomic write replaces the link itself.
    dir.write_atomic("a.json", b"new", 0o600, None).unwrap();
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
    assert!(
        std::fs::symlink_metadata(dir_path.join("a.json"))
            .unwrap()
            .is_file()
    );
    // Removal removes the link, not its target.
    std::os::unix::fs::symlink(&victim, dir_path.join("b.json")).unwrap();
    assert!(dir.remove("b.json").unwrap());
    assert!(victim.exists());
}
