//! Sealed records: every record a controller writes under its etcd prefix carries an
//! HMAC-SHA256 made with a key that only controllers hold, so a record put there by anyone
//! else (etcd write access is not enough) is never acted on.
//!
//! A stored record is an envelope `{"record": …, "seal": {"token", "key", "mac"}}`. The MAC
//! covers a domain tag, the record's key under the prefix (a sealed record moved to another
//! key fails), the writer's fencing token (the leader key's create revision while it wrote;
//! 0 for an administrator's request) and a canonical encoding of the record (object members
//! in byte order of their names, no whitespace), so it is checked over what is stored, not
//! over a re-encoding by this version of the types.
//!
//! Keys live in one file on the controller hosts (mode 0600): one key per line in hex, the
//! first signs and every one verifies, so keys rotate without a moment where a controller
//! cannot read what another wrote (docs/threat-model.md, "Rotating the HMAC key").

use std::fmt::Write as _;
use std::fs;
use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};

use hmac::{Hmac, Mac as _};
use serde::{Deserialize, Serialize};
use sha2::{Digest as _, Sha256};

/// The file name of the key file in the TLS directory (the inventory's default).
pub const KEY_FILE: &str = "hmac.key";
/// Bytes of one key.
const KEY_BYTES: usize = 32;
/// Hex digits of a key id (the start of the key's SHA-256).
const KEY_ID_HEX: usize = 16;
/// Separates the fields of the MAC input and names its version.
const DOMAIN: &str = "metalguard-record-v1";

/// Why a key file could not be used.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file could not be read, written or created.
    #[error("hmac key file {path} could not be {action}")]
    Io {
        /// The file.
        path: PathBuf,
        /// "read", "written", "created".
        action: &'static str,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// Group or others may access the file, or a stranger owns it (the rule is
    /// `metalguard_fs`'s).
    #[error("hmac key file {path} is refused")]
    Mode {
        /// The file.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: metalguard_fs::FileError,
    },
    /// A line is not a key (the line number only: never its text).
    #[error("hmac key file {path} line {line} is not a key of 64 hex digits")]
    BadLine {
        /// The file.
        path: PathBuf,
        /// One-based line number.
        line: usize,
    },
    /// The file holds no key.
    #[error("hmac key file {path} holds no key")]
    Empty {
        /// The file.
        path: PathBuf,
    },
    /// A key id named on the command line is not in the file.
    #[error("hmac key file {path} has no key with id {id}")]
    UnknownId {
        /// The file.
        path: PathBuf,
        /// The id asked for.
        id: String,
    },
    /// The operating system's random source failed.
    #[error("random bytes for a new hmac key could not be read")]
    Random(#[source] std::io::Error),
}

/// One key with its id. `Debug` prints the id only.
#[derive(Clone, PartialEq, Eq)]
struct Key {
    id: String,
    secret: [u8; KEY_BYTES],
}

impl std::fmt::Debug for Key {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Key({})", self.id)
    }
}

impl Key {
    fn new(secret: [u8; KEY_BYTES]) -> Self {
        let digest = Sha256::digest(secret);
        let id = hex(&digest)[..KEY_ID_HEX].to_owned();
        Self { id, secret }
    }

    fn mac(&self, input: &[u8]) -> Hmac<Sha256> {
        // HMAC takes keys of any length: this cannot fail.
        let mut mac = <Hmac<Sha256>>::new_from_slice(&self.secret)
            .unwrap_or_else(|_| unreachable_key_length());
        mac.update(input);
        mac
    }
}

#[allow(clippy::panic)] // HMAC accepts every key length; this is never reached.
pub(crate) fn unreachable_key_length() -> Hmac<Sha256> {
    panic!("hmac rejected a key length")
}

/// The keys of a key file: the first signs, every one verifies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Keys {
    keys: Vec<Key>,
}

/// The seal of one stored record.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Seal {
    /// The writer's fencing token: the leader key's create revision while it led (0 for a
    /// request written by the command line).
    pub token: i64,
    /// The id of the key that made the MAC.
    pub key: String,
    /// HMAC-SHA256, hex.
    pub mac: String,
}

/// A record as stored: the record and its seal.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Envelope {
    /// The record (JSON).
    pub record: serde_json::Value,
    /// Who may have written it.
    pub seal: Seal,
}

/// Why a stored record is not believed. The message never holds the record or a key.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Rejection {
    /// The value is not a sealed envelope (for example a record written with etcdctl).
    #[error("it carries no seal: not written by a metalguard controller")]
    Unsealed,
    /// Sealed with a key this controller does not have.
    #[error("it is sealed with key {0}, which is not in this controller's hmac key file")]
    UnknownKey(String),
    /// The MAC does not match: the record, its key or its token were changed after sealing.
    #[error(
        "its seal does not match: changed after a controller wrote it, or moved from another key"
    )]
    BadMac,
    /// The seal names a leadership that began after the record was written, or that has not
    /// begun yet.
    #[error(
        "its seal names leadership {token}, which did not hold when it was written (revision {written}, current leadership {current})"
    )]
    WrongLeadership {
        /// The token in the seal.
        token: i64,
        /// The record's modification revision.
        written: i64,
        /// The current leader key's create revision (0 when nobody leads).
        current: i64,
    },
}

impl Keys {
    /// Reads a key file, refusing one that group or others may access.
    pub fn load(path: &Path) -> Result<Self, KeyFileError> {
        let read = |source| KeyFileError::Io {
            path: path.to_owned(),
            action: "read",
            source,
        };
        match metalguard_fs::check_path(
            path,
            metalguard_fs::Access::Secret,
            &metalguard_fs::Owners::service(),
        ) {
            Ok(_) => {}
            Err(metalguard_fs::FileError::Examine { source, .. }) => return Err(read(source)),
            Err(source) => {
                return Err(KeyFileError::Mode {
                    path: path.to_owned(),
                    source,
                });
            }
        }
        let text = fs::read_to_string(path).map_err(read)?;
        Self::parse(path, &text)
    }

    fn parse(path: &Path, text: &str) -> Result<Self, KeyFileError> {
        let mut keys = Vec::new();
        for (index, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            let secret = unhex(line)
                .and_then(|bytes| <[u8; KEY_BYTES]>::try_from(bytes).ok())
                .ok_or_else(|| KeyFileError::BadLine {
                    path: path.to_owned(),
                    line: index + 1,
                })?;
            keys.push(Key::new(secret));
        }
        if keys.is_empty() {
            return Err(KeyFileError::Empty {
                path: path.to_owned(),
            });
        }
        Ok(Self { keys })
    }

    /// The id of the signing key.
    pub fn signing_id(&self) -> &str {
        &self.keys[0].id
    }

    /// The ids of every key, the signing key first.
    pub fn ids(&self) -> Vec<&str> {
        self.keys.iter().map(|k| k.id.as_str()).collect()
    }

    /// Seals `record`, stored under `key` (relative to the prefix) by a writer holding
    /// `token`.
    pub fn seal(&self, key: &str, token: i64, record: serde_json::Value) -> Envelope {
        let signer = &self.keys[0];
        let mac = signer.mac(&mac_input(key, token, &record));
        Envelope {
            seal: Seal {
                token,
                key: signer.id.clone(),
                mac: hex(&mac.finalize().into_bytes()),
            },
            record,
        }
    }

    /// Opens the value stored under `key`: the record if its seal holds. `written` is the
    /// value's modification revision; `leading` the current leader key's create revision
    /// (`None` when nobody leads). Returns the id of the key that verified it too.
    pub fn open(
        &self,
        key: &str,
        value: &[u8],
        written: i64,
        leading: Option<i64>,
    ) -> Result<(serde_json::Value, String), Rejection> {
        let envelope: Envelope = serde_json::from_slice(value).map_err(|_| Rejection::Unsealed)?;
        let Envelope { record, seal } = envelope;
        let signer = self
            .keys
            .iter()
            .find(|k| k.id == seal.key)
            .ok_or_else(|| Rejection::UnknownKey(seal.key.clone()))?;
        let expected = unhex(&seal.mac).ok_or(Rejection::BadMac)?;
        signer
            .mac(&mac_input(key, seal.token, &record))
            .verify_slice(&expected)
            .map_err(|_| Rejection::BadMac)?;
        // A leader's writes happen after it won (its token is the revision it won at), and
        // no leadership can be newer than the current one.
        let current = leading.unwrap_or(0);
        if seal.token > written || leading.is_some_and(|l| seal.token > l) {
            return Err(Rejection::WrongLeadership {
                token: seal.token,
                written,
                current,
            });
        }
        Ok((record, seal.key))
    }
}

/// A key file, re-read when its modification time or length changes, so a rotation step
/// copied to a controller host applies without a restart. A change that cannot be read
/// leaves the keys in force and is logged once.
#[derive(Debug)]
pub struct KeyFile {
    path: PathBuf,
    stamp: Option<(std::time::SystemTime, u64)>,
    keys: Keys,
}

impl KeyFile {
    /// Reads the key file at `path` (an error when it cannot be used).
    pub fn open(path: &Path) -> Result<Self, KeyFileError> {
        let keys = Keys::load(path)?;
        Ok(Self {
            path: path.to_owned(),
            stamp: file_stamp(path),
            keys,
        })
    }

    /// The keys in force, re-read first if the file changed.
    pub fn current(&mut self) -> &Keys {
        let stamp = file_stamp(&self.path);
        if stamp != self.stamp {
            self.stamp = stamp;
            match Keys::load(&self.path) {
                Ok(keys) => {
                    if keys != self.keys {
                        tracing::info!(path = %self.path.display(), signing = keys.signing_id(), keys = ?keys.ids(), "hmac key file reloaded");
                    }
                    self.keys = keys;
                }
                Err(error) => {
                    tracing::error!(error = %error, "hmac key file changed but cannot be used; the keys in force stay");
                }
            }
        }
        &self.keys
    }
}

fn file_stamp(path: &Path) -> Option<(std::time::SystemTime, u64)> {
    let meta = fs::metadata(path).ok()?;
    Some((meta.modified().ok()?, meta.len()))
}

/// Creates a key file with one new key (mode 0600; an existing file is never replaced).
/// Returns the key's id.
pub fn create_file(path: &Path) -> Result<String, KeyFileError> {
    let key = Key::new(random_key()?);
    let text = format!("{}{}\n", header(), hex(&key.secret));
    let io = |action, source| KeyFileError::Io {
        path: path.to_owned(),
        action,
        source,
    };
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| io("created", e))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| io("written", e))?;
    Ok(key.id)
}

/// What a rotation step does to a key file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Rotation {
    /// Append a new key that verifies but does not sign yet.
    Add,
    /// Make the key with this id the signing key (moves it first).
    Promote(String),
    /// Drop the key with this id (it must not be the signing key's only copy).
    Remove(String),
}

/// Applies one rotation step to the key file at `path` (rewritten through a rename, mode
/// 0600). Returns the id of the key added, promoted or removed.
pub fn rotate(path: &Path, step: &Rotation) -> Result<String, KeyFileError> {
    let mut keys = Keys::load(path)?;
    let position = |id: &str, keys: &Keys| {
        keys.keys
            .iter()
            .position(|k| k.id == id)
            .ok_or_else(|| KeyFileError::UnknownId {
                path: path.to_owned(),
                id: id.to_owned(),
            })
    };
    let id = match step {
        Rotation::Add => {
            let key = Key::new(random_key()?);
            let id = key.id.clone();
            keys.keys.push(key);
            id
        }
        Rotation::Promote(id) => {
            let at = position(id, &keys)?;
            let key = keys.keys.remove(at);
            keys.keys.insert(0, key);
            id.clone()
        }
        Rotation::Remove(id) => {
            let at = position(id, &keys)?;
            keys.keys.remove(at);
            if keys.keys.is_empty() {
                return Err(KeyFileError::Empty {
                    path: path.to_owned(),
                });
            }
            id.clone()
        }
    };
    let mut text = header();
    for key in &keys.keys {
        let _ = writeln!(text, "{}", hex(&key.secret));
    }
    let tmp = path.with_extension("tmp");
    let io = |action, source| KeyFileError::Io {
        path: tmp.clone(),
        action,
        source,
    };
    let _ = fs::remove_file(&tmp);
    let mut file = fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .map_err(|e| io("created", e))?;
    file.write_all(text.as_bytes())
        .and_then(|()| file.sync_all())
        .map_err(|e| io("written", e))?;
    fs::rename(&tmp, path).map_err(|e| io("written", e))?;
    Ok(id)
}

fn header() -> String {
    "# metalguard controller HMAC keys (metalguard-controller certs hmac-key): the first line\n\
     # signs, every line verifies. Keep this file on controller hosts only, mode 0600.\n"
        .to_owned()
}

/// The OS error behind a failed read of random bytes.
pub fn random_error(error: getrandom::Error) -> std::io::Error {
    error.raw_os_error().map_or_else(
        || std::io::Error::other("the random source failed"),
        std::io::Error::from_raw_os_error,
    )
}

fn random_key() -> Result<[u8; KEY_BYTES], KeyFileError> {
    let mut secret = [0u8; KEY_BYTES];
    getrandom::fill(&mut secret).map_err(|e| KeyFileError::Random(random_error(e)))?;
    Ok(secret)
}

/// What the MAC covers.
fn mac_input(key: &str, token: i64, record: &serde_json::Value) -> Vec<u8> {
    let mut input = format!("{DOMAIN}\n{key}\n{token}\n");
    canonical(record, &mut input);
    input.into_bytes()
}

/// JSON with object members in byte order of their names and no whitespace, whatever order
/// the value holds them in.
fn canonical(value: &serde_json::Value, out: &mut String) {
    use serde_json::Value;
    match value {
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
            out.push('{');
            for (i, (name, member)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                out.push_str(&Value::String(name.clone()).to_string());
                out.push(':');
                canonical(member, out);
            }
            out.push('}');
        }
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                canonical(item, out);
            }
            out.push(']');
        }
        scalar => out.push_str(&scalar.to_string()),
    }
}

/// Lowercase hex.
pub fn hex(bytes: &[u8]) -> String {
    bytes.iter().fold(String::new(), |mut s, b| {
        let _ = write!(s, "{b:02x}");
        s
    })
}

/// Bytes of a hex string (colons allowed between bytes), `None` if it is not hex.
pub fn unhex(text: &str) -> Option<Vec<u8>> {
    let digits: String = text.chars().filter(|c| *c != ':').collect();
    if digits.is_empty() || !digits.len().is_multiple_of(2) {
        return None;
    }
    (0..digits.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(digits.get(i..i + 2)?, 16).ok())
        .collect()
}

#[cfg(test)]
#[path = "seal_tests.rs"]
mod tests;
