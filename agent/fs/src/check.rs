//! Owner and mode checks of files and directories that carry fencing authority.
//!
//! One judgement ([`judge`]) over a file's owner and mode, used by every check: on a path
//! ([`check_path`], following symlinks as Kubernetes Secret and ConfigMap volumes need) and on an
//! open descriptor ([`crate::SecureDir`]).

use std::os::unix::fs::{MetadataExt as _, PermissionsExt as _};
use std::path::{Path, PathBuf};

/// Mode bits that let group or others write.
const GROUP_OR_OTHERS_WRITE: u32 = 0o022;
/// Mode bits that let group or others read, write or search.
const GROUP_OR_OTHERS_ANY: u32 = 0o077;
/// Mode bits that let group write or search, or others do anything (a Secret volume's 0440 passes).
const GROUP_WRITE_OR_OTHERS_ANY: u32 = 0o037;
/// The permission bits of a mode.
const PERMISSION_BITS: u32 = 0o7777;
/// root's uid.
const ROOT: u32 = 0;
/// The system user the packages create for the agent and the controller (`systemd/*.sysusers`).
pub const SERVICE_USER: &str = "metalguard";

/// What a file may allow besides its owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// It carries authority (an inventory, a configuration, a deny list, a directory of those):
    /// nobody but its owner may write it; anyone may read it.
    Authority,
    /// A secret (a private key, a password): nobody but its owner may read or write it
    /// (0600, 0400).
    Secret,
    /// A secret in a Kubernetes Secret volume read through the pod's `fsGroup`: the group may
    /// read it, not write it; others nothing (0440).
    GroupReadableSecret,
}

impl Access {
    fn forbidden(self) -> u32 {
        match self {
            Self::Authority => GROUP_OR_OTHERS_WRITE,
            Self::Secret => GROUP_OR_OTHERS_ANY,
            Self::GroupReadableSecret => GROUP_WRITE_OR_OTHERS_ANY,
        }
    }

    fn rule(self) -> &'static str {
        match self {
            Self::Authority => {
                "it carries fencing authority and must not be writable by group or others; run chmod go-w on it"
            }
            Self::Secret => "it is readable by group or others; run chmod 600 on it",
            Self::GroupReadableSecret => {
                "it must not be writable by group nor accessible by others; run chmod 440 on it"
            }
        }
    }
}

/// Who may own a file that carries authority.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Owners {
    /// These users (root and the service user, usually).
    Users(Vec<u32>),
    /// Anyone: the file was named by the person running the command (a break-glass fence's
    /// credentials), so its owner proves nothing either way.
    Anyone,
}

impl Owners {
    /// root and the user this process runs as (its effective uid): the service user of a
    /// daemon, or root for a command run through sudo.
    pub fn root_and_me() -> Self {
        Self::root_and(nix::unistd::geteuid().as_raw())
    }

    /// Who may own what a metalguard service trusts: root and this process's user; when this
    /// process is root (an operator's `check-config`), also the packages' service user
    /// [`SERVICE_USER`] when it exists, who owns what the service itself runs with.
    pub fn service() -> Self {
        let me = nix::unistd::geteuid();
        if !me.is_root() {
            return Self::root_and(me.as_raw());
        }
        match nix::unistd::User::from_name(SERVICE_USER) {
            Ok(Some(user)) => Self::root_and(user.uid.as_raw()),
            _ => Self::root_and(ROOT),
        }
    }

    /// root and `uid`.
    pub fn root_and(uid: u32) -> Self {
        let mut uids = vec![ROOT, uid];
        uids.dedup();
        Self::Users(uids)
    }

    /// Whether `uid` may own it.
    pub fn allow(&self, uid: u32) -> bool {
        match self {
            Self::Users(uids) => uids.contains(&uid),
            Self::Anyone => true,
        }
    }

    fn describe(&self) -> String {
        match self {
            Self::Users(uids) => uids
                .iter()
                .map(|uid| {
                    if *uid == ROOT {
                        "root".to_owned()
                    } else {
                        format!("uid {uid}")
                    }
                })
                .collect::<Vec<_>>()
                .join(" or "),
            Self::Anyone => "anyone".to_owned(),
        }
    }
}

/// A file or directory that must not be trusted, and why.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The file could not be examined (missing, unreadable).
    #[error("{path} could not be examined")]
    Examine {
        /// The file.
        path: PathBuf,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Its mode lets others than its owner do what `access` forbids.
    #[error("{path} has mode {mode:04o}: {rule}")]
    Mode {
        /// The file.
        path: PathBuf,
        /// Its permission bits.
        mode: u32,
        /// What the mode must not allow, and what to run.
        rule: &'static str,
    },
    /// Owned by a user who may not give it authority.
    #[error(
        "{path} is owned by uid {uid}, not by {allowed}; whoever owns it controls what it says: chown it"
    )]
    Owner {
        /// The file.
        path: PathBuf,
        /// Its owner.
        uid: u32,
        /// Who may own it.
        allowed: String,
    },
    /// A symbolic link where a real directory or file must be (it could point anywhere).
    #[error("{path} is a symbolic link; it must be a real {what}")]
    Symlink {
        /// The link.
        path: PathBuf,
        /// "directory" or "file".
        what: &'static str,
    },
    /// Not of the kind expected.
    #[error("{path} is not a {what}")]
    Kind {
        /// The path.
        path: PathBuf,
        /// "directory" or "file".
        what: &'static str,
    },
    /// An operation on a file under a checked directory failed.
    #[error("{action} of {path} failed")]
    Io {
        /// The file.
        path: PathBuf,
        /// What was being done.
        action: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
}

/// Judges a file's owner and mode (the one rule every check applies).
pub fn judge(
    path: &Path,
    uid: u32,
    mode: u32,
    access: Access,
    owners: &Owners,
) -> Result<(), FileError> {
    let mode = mode & PERMISSION_BITS;
    if mode & access.forbidden() != 0 {
        return Err(FileError::Mode {
            path: path.to_owned(),
            mode,
            rule: access.rule(),
        });
    }
    if !owners.allow(uid) {
        return Err(FileError::Owner {
            path: path.to_owned(),
            uid,
            allowed: owners.describe(),
        });
    }
    Ok(())
}

/// Checks the file or directory at `path` (following symlinks: a Secret volume's files are
/// links) against `access` and `owners`; returns its metadata.
pub fn check_path(
    path: &Path,
    access: Access,
    owners: &Owners,
) -> Result<std::fs::Metadata, FileError> {
    let meta = std::fs::metadata(path).map_err(|source| FileError::Examine {
        path: path.to_owned(),
        source,
    })?;
    judge(path, meta.uid(), meta.permissions().mode(), access, owners)?;
    Ok(meta)
}

/// Checks the directory at `path` and every entry directly in it (`agent.d/`, a `tls_dir`, a
/// `credentials_dir`): the directory against [`Access::Authority`] (whoever may write it may
/// put or swap files), the entries against `entries`.
pub fn check_dir_and_entries(path: &Path, entries: Access, owners: &Owners) -> Vec<FileError> {
    let mut problems = Vec::new();
    match check_path(path, Access::Authority, owners) {
        Ok(meta) if !meta.is_dir() => {
            problems.push(FileError::Kind {
                path: path.to_owned(),
                what: "directory",
            });
            return problems;
        }
        Ok(_) => {}
        Err(err) => {
            problems.push(err);
            return problems;
        }
    }
    let list = match std::fs::read_dir(path) {
        Ok(list) => list,
        Err(source) => {
            problems.push(FileError::Examine {
                path: path.to_owned(),
                source,
            });
            return problems;
        }
    };
    let mut names: Vec<PathBuf> = list.filter_map(Result::ok).map(|e| e.path()).collect();
    names.sort();
    for entry in names {
        if let Err(err) = check_path(&entry, entries, owners) {
            problems.push(err);
        }
    }
    problems
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_access_refuses_what_it_names() {
        let path = Path::new("/etc/metalguard/inventory.toml");
        let me = Owners::root_and(998);
        let ok = |mode, access| judge(path, 998, mode, access, &me).is_ok();
        assert!(ok(0o644, Access::Authority));
        assert!(ok(0o755, Access::Authority));
        assert!(!ok(0o664, Access::Authority));
        assert!(!ok(0o646, Access::Authority));
        assert!(ok(0o600, Access::Secret));
        assert!(ok(0o400, Access::Secret));
        assert!(!ok(0o640, Access::Secret));
        assert!(!ok(0o604, Access::Secret));
        assert!(ok(0o440, Access::GroupReadableSecret));
        assert!(!ok(0o460, Access::GroupReadableSecret));
        assert!(!ok(0o444, Access::GroupReadableSecret));
        let err = judge(path, 998, 0o100_664, Access::Authority, &me).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/etc/metalguard/inventory.toml has mode 0664: it carries fencing authority and must not be writable by group or others; run chmod go-w on it"
        );
    }

    #[test]
    fn only_root_and_the_named_user_may_own_it() {
        let path = Path::new("/x");
        let me = Owners::root_and(998);
        assert!(judge(path, 0, 0o644, Access::Authority, &me).is_ok());
        assert!(judge(path, 998, 0o644, Access::Authority, &me).is_ok());
        let err = judge(path, 1000, 0o644, Access::Authority, &me).unwrap_err();
        assert_eq!(
            err.to_string(),
            "/x is owned by uid 1000, not by root or uid 998; whoever owns it controls what it says: chown it"
        );
        assert!(judge(path, 1000, 0o600, Access::Secret, &Owners::Anyone).is_ok());
        assert_eq!(Owners::root_and(0), Owners::Users(vec![0]));
    }

    #[test]
    fn a_directory_and_its_entries_are_checked() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let set = |p: &Path, mode| {
            std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
        };
        std::fs::write(dir.path().join("a.toml"), "").unwrap();
        std::fs::write(dir.path().join("b.toml"), "").unwrap();
        set(&dir.path().join("a.toml"), 0o644);
        set(&dir.path().join("b.toml"), 0o666);
        set(dir.path(), 0o755);
        let me = Owners::root_and_me();
        let problems = check_dir_and_entries(dir.path(), Access::Authority, &me);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].to_string().contains("b.toml has mode 0666"));
        set(dir.path(), 0o777);
        let problems = check_dir_and_entries(dir.path(), Access::Authority, &me);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].to_string().contains("has mode 0777"));
    }
}
