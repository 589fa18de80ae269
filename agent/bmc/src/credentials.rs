//! BMC credentials from a file or a directory, never from arguments.
//!
//! `PATH` is either a directory holding files `username` and `password` (the shape of a mounted
//! Kubernetes Secret) or a file of `username=…` and `password=…` lines. A password file that is
//! readable by group or others is refused. The password is zeroized when dropped and never
//! printed by `Debug`.

use std::fmt;
use std::fs;
use std::path::{Path, PathBuf};

use metalguard_fs::{Access, FileError, Owners};
use zeroize::{Zeroize, Zeroizing};

/// Why credentials could not be loaded. Never contains file contents.
#[derive(Debug, thiserror::Error)]
pub enum CredentialsError {
    /// The path could not be read.
    #[error("cannot read bmc credentials at {path}")]
    Read {
        /// The path.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The secret file is accessible by group or others (the rule is `metalguard_fs`'s).
    #[error("bmc credentials at {path} are refused")]
    LoosePermissions {
        /// The path.
        path: PathBuf,
        /// What is wrong with it (its mode).
        #[source]
        source: FileError,
    },
    /// A required entry is missing or empty.
    #[error("bmc credentials at {path} have no {field}")]
    Missing {
        /// The path.
        path: PathBuf,
        /// `username` or `password`.
        field: &'static str,
    },
    /// The file is not valid UTF-8.
    #[error("bmc credentials at {path} are not utf-8 text")]
    NotText {
        /// The path.
        path: PathBuf,
    },
}

/// A BMC user name and password.
#[derive(Clone)]
pub struct Credentials {
    username: String,
    password: Zeroizing<String>,
}

impl fmt::Debug for Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .finish()
    }
}

impl Credentials {
    /// Credentials from values already in memory (tests, Kubernetes Secrets read by the caller).
    pub fn new(username: impl Into<String>, password: impl Into<String>) -> Self {
        Self {
            username: username.into(),
            password: Zeroizing::new(password.into()),
        }
    }

    /// The user name.
    pub fn username(&self) -> &str {
        &self.username
    }

    /// The password. Callers must not log, format or copy it beyond the request that needs it.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// Loads credentials from a directory (`username`, `password` files) or a `key=value` file.
    pub fn load(path: &Path) -> Result<Self, CredentialsError> {
        let metadata = fs::metadata(path).map_err(|source| CredentialsError::Read {
            path: path.to_owned(),
            source,
        })?;
        if metadata.is_dir() {
            let username = read_secret(&path.join("username"), false)?;
            let password = read_secret(&path.join("password"), true)?;
            let username = first_line(&username).to_owned();
            let password = Zeroizing::new(first_line(&password).to_owned());
            Self::checked(path, username, password)
        } else {
            let text = read_secret(path, true)?;
            let mut username = String::new();
            let mut password = Zeroizing::new(String::new());
            for line in text.lines() {
                let line = line.trim_start();
                if let Some(value) = line.strip_prefix("username=") {
                    value.trim_end().clone_into(&mut username);
                } else if let Some(value) = line.strip_prefix("password=") {
                    password.zeroize();
                    value
                        .trim_end_matches(['\r', '\n'])
                        .clone_into(&mut password);
                }
            }
            Self::checked(path, username, password)
        }
    }

    fn checked(
        path: &Path,
        username: String,
        password: Zeroizing<String>,
    ) -> Result<Self, CredentialsError> {
        if username.is_empty() {
            return Err(CredentialsError::Missing {
                path: path.to_owned(),
                field: "username",
            });
        }
        if password.is_empty() {
            return Err(CredentialsError::Missing {
                path: path.to_owned(),
                field: "password",
            });
        }
        Ok(Self { username, password })
    }
}

/// The first line without its line ending (Secrets written with `echo` end in a newline).
fn first_line(text: &str) -> &str {
    text.split(['\n'])
        .next()
        .unwrap_or("")
        .trim_end_matches('\r')
}

fn read_secret(path: &Path, secret: bool) -> Result<Zeroizing<String>, CredentialsError> {
    let read_error = |source| CredentialsError::Read {
        path: path.to_owned(),
        source,
    };
    // The check follows symlinks, as Kubernetes Secret volumes use them. The credentials are
    // named by whoever runs the command (a break-glass fence, a fence agent), so their owner
    // proves nothing; the controller's `credentials_dir` is checked for its owner too.
    if secret {
        metalguard_fs::check_path(path, Access::Secret, &Owners::Anyone).map_err(|source| {
            match source {
                FileError::Examine { source, .. } => read_error(source),
                source => CredentialsError::LoosePermissions {
                    path: path.to_owned(),
                    source,
                },
            }
        })?;
    }
    let bytes = Zeroizing::new(fs::read(path).map_err(read_error)?);
    match std::str::from_utf8(&bytes) {
        Ok(text) => Ok(Zeroizing::new(text.to_owned())),
        Err(_) => Err(CredentialsError::NotText {
            path: path.to_owned(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::{Credentials, CredentialsError, FileError};
    use std::fs;
    use std::os::unix::fs::PermissionsExt;
    use std::path::Path;

    fn write(path: &Path, text: &str, mode: u32) {
        fs::write(path, text).unwrap();
        fs::set_permissions(path, fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn directory_like_a_secret_volume() {
        let dir = tempfile::tempdir().unwrap();
        write(&dir.path().join("username"), "admin\n", 0o644);
        write(&dir.path().join("password"), "s3cr=t pass\n", 0o600);
        let creds = Credentials::load(dir.path()).unwrap();
        assert_eq!(creds.username(), "admin");
        assert_eq!(creds.password(), "s3cr=t pass");
        let debug = format!("{creds:?}");
        assert!(!debug.contains("s3cr"), "{debug}");
        assert!(debug.contains("<redacted>"));
    }

    #[test]
    fn key_value_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bmc");
        write(&file, "# bmc\nusername=root\npassword= p=w \n", 0o400);
        let creds = Credentials::load(&file).unwrap();
        assert_eq!(creds.username(), "root");
        assert_eq!(creds.password(), " p=w ");
    }

    #[test]
    fn loose_modes_are_refused_without_reading() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bmc");
        for mode in [0o644, 0o640, 0o604, 0o660] {
            write(&file, "username=root\npassword=hunter2\n", mode);
            let err = Credentials::load(&file).unwrap_err();
            assert!(
                matches!(err, CredentialsError::LoosePermissions { source: FileError::Mode { mode: m, .. }, .. } if m == mode),
                "{mode:o}: {err:?}"
            );
            let text = format!("{err}: {}", std::error::Error::source(&err).unwrap());
            assert!(text.contains(&format!("{mode:04o}")), "{text}");
            assert!(!text.contains("hunter2"));
        }
        write(&dir.path().join("username"), "admin", 0o644);
        write(&dir.path().join("password"), "hunter2", 0o644);
        assert!(matches!(
            Credentials::load(dir.path()),
            Err(CredentialsError::LoosePermissions { .. })
        ));
    }

    #[test]
    fn missing_fields_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("bmc");
        write(&file, "username=root\n", 0o600);
        let err = Credentials::load(&file).unwrap_err();
        assert!(matches!(
            err,
            CredentialsError::Missing {
                field: "password",
                ..
            }
        ));
        let err = Credentials::load(&dir.path().join("absent")).unwrap_err();
        assert!(
            err.to_string()
                .starts_with("cannot read bmc credentials at ")
        );
    }
}
