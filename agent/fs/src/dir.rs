//! A directory opened once and then used only through its descriptor, following no symlink.
//!
//! A process running as root (`metalguard-agent fence --direct`) or as the agent's user writes
//! into directories another user may control (the state directory belongs to the agent's
//! user). Every path-based call there follows a symlink that user planted. So: the directory
//! is opened with `O_NOFOLLOW | O_DIRECTORY` and its owner and mode checked on the descriptor;
//! every file below is opened relative to that descriptor with `O_NOFOLLOW`; temporary files
//! are created with `O_EXCL` under a random name; owner and mode are set on descriptors
//! (`fchown`, `fchmod`); renames are `renameat` within the directory, which is then fsynced.

use std::fs::File;
use std::io::{Read as _, Write as _};
use std::os::fd::{AsFd as _, OwnedFd};
use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

use nix::errno::Errno;
use nix::fcntl::{OFlag, openat, renameat};
use nix::sys::stat::{Mode, mkdirat};
use nix::unistd::{UnlinkatFlags, unlinkat};

use crate::check::{Access, FileError, Owners, judge};

/// Random bytes in a temporary file's name.
const TEMP_NAME_BYTES: usize = 8;
/// The largest file [`SecureDir::read`] reads (the records kept here are a few KiB).
pub const MAX_READ_BYTES: u64 = 1 << 20;

/// A directory checked once and then used through its descriptor.
#[derive(Debug)]
pub struct SecureDir {
    fd: OwnedFd,
    path: PathBuf,
    uid: u32,
    gid: u32,
}

/// A file read from a [`SecureDir`].
#[derive(Debug)]
pub struct ReadFile {
    /// Its contents.
    pub bytes: Vec<u8>,
    /// Its owner.
    pub uid: u32,
}

fn no_follow_dir() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

fn io(path: &Path, action: &'static str) -> impl FnOnce(Errno) -> FileError {
    let path = path.to_owned();
    move |errno| FileError::Io {
        path,
        action,
        source: std::io::Error::from(errno),
    }
}

impl SecureDir {
    /// Opens the directory `path` without following a symlink at its last component, and
    /// refuses it when it is a symlink, not a directory, owned by a user `owners` does not
    /// allow, or writable by group or others.
    pub fn open(path: &Path, owners: &Owners) -> Result<Self, FileError> {
        let fd = match openat(nix::fcntl::AT_FDCWD, path, no_follow_dir(), Mode::empty()) {
            Ok(fd) => fd,
            Err(errno) => return Err(refusal(path, errno, "directory")),
        };
        Self::checked(fd, path.to_owned(), owners)
    }

    /// Like [`SecureDir::open`], creating the directory (and its missing parents) with `mode`
    /// first when it does not exist.
    pub fn open_or_create(path: &Path, mode: u32, owners: &Owners) -> Result<Self, FileError> {
        if std::fs::symlink_metadata(path).is_err() {
            use std::os::unix::fs::DirBuilderExt as _;
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(mode)
                .create(path)
                .map_err(|source| FileError::Io {
                    path: path.to_owned(),
                    action: "creation",
                    source,
                })?;
        }
        Self::open(path, owners)
    }

    /// The existing directory `name` in this one, refused like [`SecureDir::open`] refuses
    /// (a missing one is [`FileError::Examine`] with `NotFound`).
    pub fn child(&self, name: &str, owners: &Owners) -> Result<Self, FileError> {
        let path = self.path.join(name);
        let fd = openat(self.fd.as_fd(), name, no_follow_dir(), Mode::empty())
            .map_err(|errno| refusal(&path, errno, "directory"))?;
        Self::checked(fd, path, owners)
    }

    /// The directory `name` in this one, created with `mode` when missing, refused like
    /// [`SecureDir::open`] refuses.
    pub fn create_child(&self, name: &str, mode: u32, owners: &Owners) -> Result<Self, FileError> {
        match mkdirat(self.fd.as_fd(), name, Mode::from_bits_truncate(mode)) {
            Ok(()) | Err(Errno::EEXIST) => {}
            Err(errno) => return Err(io(&self.path.join(name), "creation")(errno)),
        }
        self.child(name, owners)
    }

    fn checked(fd: OwnedFd, path: PathBuf, owners: &Owners) -> Result<Self, FileError> {
        let meta = File::from(fd.try_clone().map_err(|source| FileError::Examine {
            path: path.clone(),
            source,
        })?)
        .metadata()
        .map_err(|source| FileError::Examine {
            path: path.clone(),
            source,
        })?;
        judge(
            &path,
            meta.uid(),
            meta.permissions().mode(),
            Access::Authority,
            owners,
        )?;
        Ok(Self {
            fd,
            path,
            uid: meta.uid(),
            gid: meta.gid(),
        })
    }

    /// The directory's path (for messages).
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The directory's owner and group when it was opened.
    pub fn owner(&self) -> (u32, u32) {
        (self.uid, self.gid)
    }

    /// Sets the directory's mode (on its descriptor).
    pub fn set_mode(&self, mode: u32) -> Result<(), FileError> {
        nix::sys::stat::fchmod(self.fd.as_fd(), Mode::from_bits_truncate(mode))
            .map_err(io(&self.path, "chmod"))
    }

    /// Gives the directory to `uid`:`gid` (on its descriptor).
    pub fn set_owner(&mut self, uid: u32, gid: u32) -> Result<(), FileError> {
        std::os::unix::fs::fchown(&self.fd, Some(uid), Some(gid)).map_err(|source| {
            FileError::Io {
                path: self.path.clone(),
                action: "chown",
                source,
            }
        })?;
        (self.uid, self.gid) = (uid, gid);
        Ok(())
    }

    /// Opens `name` for writing, which must not exist (`O_EXCL`, no symlink followed).
    pub fn create_new(&self, name: &str, mode: u32) -> Result<File, FileError> {
        let flags =
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        openat(self.fd.as_fd(), name, flags, Mode::from_bits_truncate(mode))
            .map(File::from)
            .map_err(io(&self.path.join(name), "exclusive creation"))
    }

    /// Writes `bytes` to `name` atomically: a temporary file with a random name, created
    /// exclusively, written, given `mode` and (when set) `owner`, fsynced, renamed over `name`,
    /// then the directory fsynced. A symlink at `name` is replaced, never followed.
    pub fn write_atomic(
        &self,
        name: &str,
        bytes: &[u8],
        mode: u32,
        owner: Option<(u32, u32)>,
    ) -> Result<(), FileError> {
        let target = self.path.join(name);
        let tmp = temp_name(name).map_err(|source| FileError::Io {
            path: target.clone(),
            action: "temporary name",
            source,
        })?;
        let mut file = self.create_new(&tmp, mode)?;
        let written = (|| {
            file.write_all(bytes)?;
            file.set_permissions(std::fs::Permissions::from_mode(mode))?;
            if let Some((uid, gid)) = owner {
                std::os::unix::fs::fchown(&file, Some(uid), Some(gid))?;
            }
            file.sync_all()
        })();
        drop(file);
        if let Err(source) = written {
            let _ = unlinkat(self.fd.as_fd(), tmp.as_str(), UnlinkatFlags::NoRemoveDir);
            return Err(FileError::Io {
                path: target,
                action: "write",
                source,
            });
        }
        if let Err(errno) = renameat(self.fd.as_fd(), tmp.as_str(), self.fd.as_fd(), name) {
            let _ = unlinkat(self.fd.as_fd(), tmp.as_str(), UnlinkatFlags::NoRemoveDir);
            return Err(io(&target, "rename")(errno));
        }
        self.sync()
    }

    /// Reads `name` without following a symlink; `None` when it does not exist. A symlink, a
    /// directory or a file larger than [`MAX_READ_BYTES`] is an error.
    pub fn read(&self, name: &str) -> Result<Option<ReadFile>, FileError> {
        let path = self.path.join(name);
        let flags = OFlag::O_RDONLY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC | OFlag::O_NONBLOCK;
        let mut file = match openat(self.fd.as_fd(), name, flags, Mode::empty()) {
            Ok(fd) => File::from(fd),
            Err(Errno::ENOENT) => return Ok(None),
            Err(errno) => return Err(refusal(&path, errno, "file")),
        };
        let examine = |source| FileError::Examine {
            path: path.clone(),
            source,
        };
        let meta = file.metadata().map_err(examine)?;
        if !meta.is_file() {
            return Err(FileError::Kind { path, what: "file" });
        }
        let mut bytes = Vec::new();
        (&mut file)
            .take(MAX_READ_BYTES)
            .read_to_end(&mut bytes)
            .map_err(examine)?;
        Ok(Some(ReadFile {
            bytes,
            uid: meta.uid(),
        }))
    }

    /// The names in the directory (not `.` and `..`), sorted; names that are not UTF-8 are
    /// left out (nothing here writes them).
    pub fn names(&self) -> Result<Vec<String>, FileError> {
        let fd = openat(self.fd.as_fd(), ".", no_follow_dir(), Mode::empty())
            .map_err(io(&self.path, "listing"))?;
        let mut dir = nix::dir::Dir::from_fd(fd).map_err(io(&self.path, "listing"))?;
        let mut names = Vec::new();
        for entry in dir.iter() {
            let entry = entry.map_err(io(&self.path, "listing"))?;
            if let Ok(name) = entry.file_name().to_str()
                && name != "."
                && name != ".."
            {
                names.push(name.to_owned());
            }
        }
        names.sort();
        Ok(names)
    }

    /// Removes the file `name` (a symlink is removed, not followed); false when there was none.
    pub fn remove(&self, name: &str) -> Result<bool, FileError> {
        match unlinkat(self.fd.as_fd(), name, UnlinkatFlags::NoRemoveDir) {
            Ok(()) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(errno) => Err(io(&self.path.join(name), "removal")(errno)),
        }
    }

    /// Renames `from` to `to` within the directory; false when `from` did not exist.
    pub fn rename(&self, from: &str, to: &str) -> Result<bool, FileError> {
        match renameat(self.fd.as_fd(), from, self.fd.as_fd(), to) {
            Ok(()) => self.sync().map(|()| true),
            Err(Errno::ENOENT) => Ok(false),
            Err(errno) => Err(io(&self.path.join(from), "rename")(errno)),
        }
    }

    /// Fsyncs the directory.
    pub fn sync(&self) -> Result<(), FileError> {
        nix::unistd::fsync(self.fd.as_fd()).map_err(io(&self.path, "fsync"))
    }
}

/// What a failed no-follow open means: a symlink (`ELOOP`, or `ENOTDIR` with `O_DIRECTORY`,
/// told apart by an `lstat` that only chooses the message: the open failed either way), not
/// the kind expected, or another error.
fn refusal(path: &Path, errno: Errno, what: &'static str) -> FileError {
    let is_link = || std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_symlink());
    match errno {
        Errno::ELOOP => FileError::Symlink {
            path: path.to_owned(),
            what,
        },
        Errno::ENOTDIR if is_link() => FileError::Symlink {
            path: path.to_owned(),
            what,
        },
        Errno::ENOTDIR if what == "directory" => FileError::Kind {
            path: path.to_owned(),
            what,
        },
        _ => FileError::Examine {
            path: path.to_owned(),
            source: std::io::Error::from(errno),
        },
    }
}

/// `.<name>.<random hex>.tmp`: a name nobody can guess ahead of time.
fn temp_name(name: &str) -> std::io::Result<String> {
    use std::fmt::Write as _;
    let mut random = [0u8; TEMP_NAME_BYTES];
    getrandom::fill(&mut random).map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut tmp = format!(".{name}.");
    for byte in random {
        let _ = write!(tmp, "{byte:02x}");
    }
    tmp.push_str(".tmp");
    Ok(tmp)
}

#[cfg(test)]
#[path = "dir_tests.rs"]
mod tests;
