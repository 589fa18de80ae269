//! Break-glass holds kept on this host, under `<state dir>/holds/`.
//!
//! `metalguard-agent fence --direct` (usually run as root) records a hold here before it
//! touches a BMC; the daemon (an unprivileged user, the owner of the state directory) carries
//! every hold in its reports, refuses controller power commands for a held target, and deletes
//! a hold when the controller answers that a person released it.
//!
//! One JSON file per hold (`<id with / escaped>.json`), written atomically. The CLI usually
//! runs as root in a directory the daemon's user owns, so nothing here is done through a path
//! that user could redirect (`metalguard_fs::SecureDir`): the state directory is opened
//! without following a symlink and refused when it is a symlink or writable by group or
//! others; `holds` is opened relative to it, likewise, and refused when it is owned by anyone
//! but root or the state directory's owner; the hold is written to a temporary file with a
//! random name created exclusively, given mode 0640 and the state directory's owner and group
//! on its descriptor, fsynced, renamed into place, and the directory fsynced. The directory is
//! mode 0750, owned like the state directory, so the daemon can read and delete what root
//! wrote. A state directory that does not exist yet is created (root-owned); systemd's
//! `StateDirectory=` hands it and everything below it to the daemon's user when the daemon
//! starts.

use std::path::{Path, PathBuf};

use metalguard_api::snapshot::Hold;
use metalguard_fs::{FileError, Owners, SecureDir};

/// The directory under the state directory.
pub const HOLDS_DIR: &str = "holds";
/// Mode of the holds directory: the owner writes, its group reads.
const DIR_MODE: u32 = 0o750;
/// Mode of a hold file.
const FILE_MODE: u32 = 0o640;

/// What went wrong with the local hold records.
#[derive(Debug, thiserror::Error)]
pub enum HoldStoreError {
    /// The directory could not be created, opened or listed, or is refused.
    #[error("hold directory {dir} could not be prepared")]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: FileError,
    },
    /// A hold could not be written durably.
    #[error("hold file {path} could not be written")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: FileError,
    },
    /// A hold file could not be read or removed.
    #[error("hold file {path} could not be read or removed")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: FileError,
    },
    /// A hold file does not hold a hold.
    #[error("hold file {path} is not a valid hold")]
    Decode {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
}

/// The holds of this host.
#[derive(Debug, Clone)]
pub struct HoldStore {
    state_dir: PathBuf,
    dir: PathBuf,
}

/// A hold written to disk.
#[derive(Debug)]
pub struct Recorded {
    /// The file.
    pub path: PathBuf,
    /// Set when the file could not be given to the state directory's owner (the daemon may
    /// then be unable to read it): what to do about it.
    pub ownership_warning: Option<String>,
}

impl HoldStore {
    /// The holds under `state_dir`.
    pub fn new(state_dir: &Path) -> Self {
        Self {
            state_dir: state_dir.to_path_buf(),
            dir: state_dir.join(HOLDS_DIR),
        }
    }

    /// The holds directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    fn file_name(id: &str) -> String {
        format!("{}.json", file_stem(id))
    }

    /// Writes `hold` durably (see the module documentation).
    pub fn record(&self, hold: &Hold) -> Result<Recorded, HoldStoreError> {
        let dir_error = |source| HoldStoreError::Dir {
            dir: self.dir.clone(),
            source,
        };
        // The state directory may belong to anyone (the daemon's user), not be a symlink nor
        // writable by group or others; `holds` belongs to root or that owner.
        let state = SecureDir::open_or_create(&self.state_dir, DIR_MODE, &Owners::Anyone)
            .map_err(dir_error)?;
        let (uid, gid) = state.owner();
        let mut dir = state
            .create_child(HOLDS_DIR, DIR_MODE, &Owners::root_and(uid))
            .map_err(dir_error)?;
        dir.set_mode(DIR_MODE).map_err(dir_error)?;
        let me = (
            nix::unistd::geteuid().as_raw(),
            nix::unistd::getegid().as_raw(),
        );
        let may_give = me.0 == 0;
        let mut warning = None;
        if dir.owner() != (uid, gid) {
            if may_give {
                dir.set_owner(uid, gid).map_err(dir_error)?;
            } else {
                warning = Some(self.ownership_warning(dir.path(), uid, gid));
            }
        }
        let name = Self::file_name(&hold.id);
        let path = self.dir.join(&name);
        let write_error = |source| HoldStoreError::Write {
            path: path.clone(),
            source,
        };
        let text = serde_json::to_vec_pretty(hold).map_err(|e| {
            write_error(FileError::Io {
                path: path.clone(),
                action: "encoding",
                source: std::io::Error::other(e),
            })
        })?;
        let give = ((uid, gid) != me && may_give).then_some((uid, gid));
        if (uid, gid) != me && !may_give {
            warning = warning.or_else(|| Some(self.ownership_warning(&path, uid, gid)));
        }
        dir.write_atomic(&name, &text, FILE_MODE, give)
            .map_err(write_error)?;
        Ok(Recorded {
            path,
            ownership_warning: warning,
        })
    }

    /// What to do about a file this process (not root) could not give to the state
    /// directory's owner.
    fn ownership_warning(&self, path: &Path, uid: u32, gid: u32) -> String {
        format!(
            "{} could not be given to uid {uid} gid {gid} (the owner of {}, the agent daemon's user): only root may; run this command as root, or chown it by hand",
            path.display(),
            self.state_dir.display()
        )
    }

    /// The holds directory, opened as [`HoldStore::record`] opens it; `None` when there is none.
    fn open_dir(&self) -> Result<Option<SecureDir>, HoldStoreError> {
        let dir_error = |source| HoldStoreError::Dir {
            dir: self.dir.clone(),
            source,
        };
        let missing = |err: &FileError| matches!(err, FileError::Examine { source, .. } if source.kind() == std::io::ErrorKind::NotFound);
        let state = match SecureDir::open(&self.state_dir, &Owners::Anyone) {
            Ok(state) => state,
            Err(err) if missing(&err) => return Ok(None),
            Err(err) => return Err(dir_error(err)),
        };
        let owners = Owners::root_and(state.owner().0);
        match state.child(HOLDS_DIR, &owners) {
            Ok(dir) => Ok(Some(dir)),
            Err(err) if missing(&err) => Ok(None),
            Err(err) => Err(dir_error(err)),
        }
    }

    /// Every hold on record, oldest first. A missing directory means none. A file that does
    /// not decode is reported in the second list (and left alone).
    pub fn list(&self) -> Result<(Vec<Hold>, Vec<HoldStoreError>), HoldStoreError> {
        let Some(dir) = self.open_dir()? else {
            return Ok((Vec::new(), Vec::new()));
        };
        let names = dir.names().map_err(|source| HoldStoreError::Dir {
            dir: self.dir.clone(),
            source,
        })?;
        let mut holds = Vec::new();
        let mut broken = Vec::new();
        for name in names.into_iter().filter(|n| is_hold_file(n)) {
            let path = self.dir.join(&name);
            match dir.read(&name) {
                Ok(Some(file)) => match serde_json::from_slice::<Hold>(&file.bytes) {
                    Ok(hold) => holds.push(hold),
                    Err(source) => broken.push(HoldStoreError::Decode { path, source }),
                },
                Ok(None) => {}
                Err(source) => broken.push(HoldStoreError::Read { path, source }),
            }
        }
        holds.sort_by(|a, b| (a.since, &a.id).cmp(&(b.since, &b.id)));
        Ok((holds, broken))
    }

    /// The newest hold of `target`, if it is held here.
    pub fn held(&self, target: &str) -> Result<Option<Hold>, HoldStoreError> {
        Ok(self
            .list()?
            .0
            .into_iter()
            .rev()
            .find(|h| h.target == target))
    }

    /// Deletes the record of hold `id`; false when there was none.
    pub fn remove(&self, id: &str) -> Result<bool, HoldStoreError> {
        let Some(dir) = self.open_dir()? else {
            return Ok(false);
        };
        let name = Self::file_name(id);
        dir.remove(&name).map_err(|source| HoldStoreError::Read {
            path: self.dir.join(&name),
            source,
        })
    }
}

/// A hold's file: `*.json`, not a temporary file (those start with a dot).
fn is_hold_file(name: &str) -> bool {
    Path::new(name).extension().is_some_and(|e| e == "json") && !name.starts_with('.')
}

/// A file name for a hold id: safe characters kept, anything else hex-escaped (`/` too).
fn file_stem(id: &str) -> String {
    use std::fmt::Write as _;
    let mut stem = String::with_capacity(id.len());
    for byte in id.bytes() {
        if byte.is_ascii_alphanumeric() || byte == b'-' || byte == b'_' {
            stem.push(char::from(byte));
        } else {
            let _ = write!(stem, "%{byte:02x}");
        }
    }
    stem
}

#[cfg(test)]
mod tests {
    use std::fs;
    use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};

    use metalguard_api::duration::Timestamp;

    use super::*;

    fn hold(id: &str, target: &str, since: u64) -> Hold {
        Hold {
            id: id.into(),
            target: target.into(),
            since: Timestamp(since),
            by: "root on cp-2".into(),
            reason: "r".into(),
            action: "off".into(),
        }
    }

    #[test]
    fn holds_are_written_readable_and_removed() {
        let state = tempfile::tempdir().unwrap();
        let store = HoldStore::new(&state.path().join("state"));
        assert!(store.list().unwrap().0.is_empty(), "no directory: no hold");
        let recorded = store.record(&hold("cp-2/20", "cp-1", 20)).unwrap();
        assert!(
            recorded.ownership_warning.is_none(),
            "same user: nothing to change"
        );
        assert_eq!(recorded.path.file_name().unwrap(), "cp-2%2f20.json");
        store.record(&hold("cp-2/10", "cp-1", 10)).unwrap();
        store.record(&hold("cp-2/30", "cp-3", 30)).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(store.dir()), DIR_MODE);
        assert_eq!(mode(&recorded.path), FILE_MODE);
        // A stale temporary file and a broken file do not hide the others.
        fs::write(store.dir().join("x.json.tmp"), "{").unwrap();
        fs::write(store.dir().join("broken.json"), "{").unwrap();
        let (holds, broken) = store.list().unwrap();
        let ids: Vec<&str> = holds.iter().map(|h| h.id.as_str()).collect();
        assert_eq!(ids, ["cp-2/10", "cp-2/20", "cp-2/30"]);
        assert_eq!(broken.len(), 1);
        assert!(broken[0].to_string().contains("broken.json"));
        assert_eq!(
            store.held("cp-1").unwrap().unwrap().id,
            "cp-2/20",
            "the newest"
        );
        assert!(store.held("cp-4").unwrap().is_none());
        assert!(store.remove("cp-2/20").unwrap());
        assert!(!store.remove("cp-2/20").unwrap());
        assert_eq!(store.held("cp-1").unwrap().unwrap().id, "cp-2/10");
    }

    #[test]
    fn root_gives_the_hold_to_the_owner_of_the_state_directory() {
        let state = tempfile::tempdir().unwrap();
        let dir = state.path().join("state");
        fs::create_dir(&dir).unwrap();
        let me = fs::metadata(&dir).unwrap();
        let store = HoldStore::new(&dir);
        if me.uid() != 0 {
            // Not root: nobody else can own our state directory; the hold is ours already.
            let recorded = store.record(&hold("cp-2/1", "cp-1", 1)).unwrap();
            assert!(recorded.ownership_warning.is_none());
            assert_eq!(fs::metadata(&recorded.path).unwrap().uid(), me.uid());
            return;
        }
        // As root (the CLI under sudo) with the daemon's user owning the state directory.
        let daemon = DAEMON;
        std::os::unix::fs::chown(&dir, Some(daemon.0), Some(daemon.1)).unwrap();
        let recorded = store.record(&hold("cp-2/1", "cp-1", 1)).unwrap();
        assert!(recorded.ownership_warning.is_none(), "{recorded:?}");
        for path in [store.dir(), recorded.path.as_path()] {
            let meta = fs::metadata(path).unwrap();
            assert_eq!((meta.uid(), meta.gid()), daemon, "{}", path.display());
        }
    }

    #[test]
    fn an_unwritable_directory_is_an_error_naming_it() {
        let state = tempfile::tempdir().unwrap();
        let file = state.path().join("not-a-dir");
        fs::write(&file, "").unwrap();
        let err = HoldStore::new(&file)
            .record(&hold("a/1", "b", 1))
            .unwrap_err();
        assert!(err.to_string().contains("not-a-dir/holds"), "{err}");
    }

    /// The daemon's user (nobody) owns the state directory, as systemd's `StateDirectory=`
    /// makes it; root runs `fence --direct`.
    const DAEMON: (u32, u32) = (65_534, 65_534);

    fn daemon_state_dir(root: &Path) -> PathBuf {
        let dir = root.join("state");
        fs::create_dir(&dir).unwrap();
        std::os::unix::fs::chown(&dir, Some(DAEMON.0), Some(DAEMON.1)).unwrap();
        dir
    }

    fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    #[test]
    fn a_holds_symlink_planted_by_the_daemons_user_is_refused_and_its_target_untouched() {
        if !is_root() {
            eprintln!("skipped: the attack needs root (the CLI's user) and another owner");
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let state = daemon_state_dir(root.path());
        // The service user's move: `holds` -> a root-owned directory (say /etc).
        let etc = root.path().join("etc");
        fs::create_dir(&etc).unwrap();
        fs::set_permissions(&etc, fs::Permissions::from_mode(0o755)).unwrap();
        fs::write(etc.join("passwd"), "root:x:0:0").unwrap();
        std::os::unix::fs::symlink(&etc, state.join(HOLDS_DIR)).unwrap();
        let before = fs::metadata(&etc).unwrap();

        let err = HoldStore::new(&state)
            .record(&hold("cp-2/1", "cp-1", 1))
            .unwrap_err();
        let chain = format!("{err}: {}", std::error::Error::source(&err).unwrap());
        assert!(
            chain.contains("holds is a symbolic link; it must be a real directory"),
            "{chain}"
        );
        let after = fs::metadata(&etc).unwrap();
        assert_eq!(
            (after.uid(), after.gid()),
            (0, 0),
            "not given to the daemon"
        );
        assert_eq!(after.mode(), before.mode(), "mode unchanged");
        let mut names: Vec<_> = fs::read_dir(&etc)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        names.sort();
        assert_eq!(names, ["passwd"], "nothing written into the target");
        assert_eq!(fs::metadata(etc.join("passwd")).unwrap().uid(), 0);
        // The daemon's listing refuses it too (a hold there cannot be believed).
        assert!(HoldStore::new(&state).list().is_err());
    }

    #[test]
    fn a_state_directory_that_is_a_symlink_or_writable_by_others_is_refused() {
        let root = tempfile::tempdir().unwrap();
        let real = root.path().join("real");
        fs::create_dir(&real).unwrap();
        let link = root.path().join("state");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let err = HoldStore::new(&link)
            .record(&hold("cp-2/1", "cp-1", 1))
            .unwrap_err();
        let cause = std::error::Error::source(&err).unwrap().to_string();
        assert!(cause.contains("state is a symbolic link"), "{cause}");
        assert!(fs::read_dir(&real).unwrap().next().is_none());

        fs::set_permissions(&real, fs::Permissions::from_mode(0o777)).unwrap();
        let err = HoldStore::new(&real)
            .record(&hold("cp-2/1", "cp-1", 1))
            .unwrap_err();
        let cause = std::error::Error::source(&err).unwrap().to_string();
        assert!(cause.contains("has mode 0777"), "{cause}");
    }

    #[test]
    fn a_holds_directory_owned_by_a_stranger_is_refused() {
        if !is_root() {
            eprintln!("skipped: needs root to make a directory another user owns");
            return;
        }
        let root = tempfile::tempdir().unwrap();
        let state = daemon_state_dir(root.path());
        let holds = state.join(HOLDS_DIR);
        fs::create_dir(&holds).unwrap();
        std::os::unix::fs::chown(&holds, Some(4242), Some(4242)).unwrap();
        let err = HoldStore::new(&state)
            .record(&hold("cp-2/1", "cp-1", 1))
            .unwrap_err();
        let cause = std::error::Error::source(&err).unwrap().to_string();
        assert!(
            cause.contains("is owned by uid 4242, not by root or uid 65534"),
            "{cause}"
        );
        assert!(fs::read_dir(&holds).unwrap().next().is_none());
    }
}
