//! Break-glass holds kept on this host, under `<state dir>/holds/`.
//!
//! `metalguard-agent fence --direct` (usually run as root) records a hold here before it
//! touches a BMC; the daemon (an unprivileged user, the owner of the state directory) carries
//! every hold in its reports, refuses controller power commands for a held target, and deletes
//! a hold when the controller answers that a person released it.
//!
//! One JSON file per hold (`<id with / escaped>.json`), written atomically: a temporary file
//! is written and fsynced, given the state directory's owner and group, renamed into place,
//! and the directory is fsynced. The directory is mode 0750 and each file 0640, owned like
//! the state directory, so the daemon can read and delete what root wrote. A state directory
//! that does not exist yet is created (root-owned); systemd's `StateDirectory=` hands it and
//! everything below it to the daemon's user when the daemon starts.

use std::fs::{self, File, OpenOptions};
use std::io::Write as _;
use std::os::unix::fs::{
    DirBuilderExt as _, MetadataExt as _, OpenOptionsExt as _, PermissionsExt as _,
};
use std::path::{Path, PathBuf};

use metalguard_api::snapshot::Hold;

/// The directory under the state directory.
pub const HOLDS_DIR: &str = "holds";
/// Mode of the holds directory: the owner writes, its group reads.
const DIR_MODE: u32 = 0o750;
/// Mode of a hold file.
const FILE_MODE: u32 = 0o640;

/// What went wrong with the local hold records.
#[derive(Debug, thiserror::Error)]
pub enum HoldStoreError {
    /// The directory could not be created or listed.
    #[error("hold directory {dir} could not be prepared")]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A hold could not be written durably.
    #[error("hold file {path} could not be written")]
    Write {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// A hold file could not be read or removed.
    #[error("hold file {path} could not be read or removed")]
    Read {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
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

    fn file(&self, id: &str) -> PathBuf {
        self.dir.join(format!("{}.json", file_stem(id)))
    }

    /// Writes `hold` durably (see the module documentation).
    pub fn record(&self, hold: &Hold) -> Result<Recorded, HoldStoreError> {
        let dir_error = |source| HoldStoreError::Dir {
            dir: self.dir.clone(),
            source,
        };
        if !self.state_dir.exists() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(DIR_MODE)
                .create(&self.state_dir)
                .map_err(dir_error)?;
        }
        if !self.dir.exists() {
            fs::DirBuilder::new()
                .mode(DIR_MODE)
                .create(&self.dir)
                .map_err(dir_error)?;
        }
        fs::set_permissions(&self.dir, fs::Permissions::from_mode(DIR_MODE)).map_err(dir_error)?;
        let mut warning = self.adopt_owner(&self.dir);
        let path = self.file(&hold.id);
        let tmp = path.with_extension("json.tmp");
        let write_error = |source| HoldStoreError::Write {
            path: path.clone(),
            source,
        };
        let text =
            serde_json::to_vec_pretty(hold).map_err(|e| write_error(std::io::Error::other(e)))?;
        let mut file = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(FILE_MODE)
            .open(&tmp)
            .map_err(write_error)?;
        file.write_all(&text).map_err(write_error)?;
        file.set_permissions(fs::Permissions::from_mode(FILE_MODE))
            .map_err(write_error)?;
        file.sync_all().map_err(write_error)?;
        drop(file);
        warning = warning.or_else(|| self.adopt_owner(&tmp));
        fs::rename(&tmp, &path).map_err(write_error)?;
        File::open(&self.dir)
            .and_then(|d| d.sync_all())
            .map_err(write_error)?;
        Ok(Recorded {
            path,
            ownership_warning: warning,
        })
    }

    /// Gives `path` the state directory's owner and group when they differ (they do when
    /// root runs the CLI and the daemon runs as its own user). A failure is returned as a
    /// warning: the hold is on disk, the controller may have it, but the daemon may not read it.
    fn adopt_owner(&self, path: &Path) -> Option<String> {
        let owner = fs::metadata(&self.state_dir).ok()?;
        let current = fs::metadata(path).ok()?;
        if (current.uid(), current.gid()) == (owner.uid(), owner.gid()) {
            return None;
        }
        std::os::unix::fs::chown(path, Some(owner.uid()), Some(owner.gid()))
            .err()
            .map(|e| {
                format!(
                    "{} could not be given to uid {} gid {} (the owner of {}, the agent daemon's user): {e}; run this command as root, or chown it by hand",
                    path.display(),
                    owner.uid(),
                    owner.gid(),
                    self.state_dir.display()
                )
            })
    }

    /// Every hold on record, oldest first. A missing directory means none. A file that does
    /// not decode is reported in the second list (and left alone).
    pub fn list(&self) -> Result<(Vec<Hold>, Vec<HoldStoreError>), HoldStoreError> {
        let entries = match fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok((Vec::new(), Vec::new()));
            }
            Err(source) => {
                return Err(HoldStoreError::Dir {
                    dir: self.dir.clone(),
                    source,
                });
            }
        };
        let mut holds = Vec::new();
        let mut broken = Vec::new();
        for entry in entries.filter_map(Result::ok) {
            let path = entry.path();
            if path.extension().is_none_or(|e| e != "json") {
                continue;
            }
            match fs::read(&path) {
                Ok(bytes) => match serde_json::from_slice::<Hold>(&bytes) {
                    Ok(hold) => holds.push(hold),
                    Err(source) => broken.push(HoldStoreError::Decode { path, source }),
                },
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
        let path = self.file(id);
        match fs::remove_file(&path) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
            Err(source) => Err(HoldStoreError::Read { path, source }),
        }
    }
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
        let daemon = (65_534, 65_534);
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
}
