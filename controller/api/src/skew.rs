//! The version skew policy between agents and controllers, and how each side reads what a
//! peer of another version sends (issue 26, item 5; `docs/design-controller.md`, "Mixed
//! versions").
//!
//! Every request an agent makes and every answer a controller gives carries its release in
//! the [`VERSION_HEADER`]. A peer that sends none is the release that predates the exchange
//! ([`UNVERSIONED`], 0.1.0). The policy ([`judge`]): peers of the same major version whose
//! minor versions are at most [`MAX_MINOR_SKEW`] apart work together, in both directions.
//!
//! Within the policy, what a *newer* peer sends is read with its unknown object fields left
//! out ([`Tolerance::NewerPeer`], [`decode`]): a field an older side does not know cannot
//! change what it does. A field whose loss would weaken safety is never merely tolerated: it
//! is negotiated (the query flags of [`crate::protocol`]) and sent only to a peer that asked
//! for it. What a peer of the same or an older version sends is read strictly, as before:
//! an unknown field there is a bug or an attacker, refused (422). Unknown *values* (a new
//! enum variant) are never tolerated; the policy forbids a newer peer from sending one to an
//! older one.
//!
//! Outside the policy, no authority crosses: a controller gives an agent outside it no
//! command and takes no result from it, and an agent executes no command from a controller
//! outside it. Reports still flow (read strictly), so that no host is fenced for running an
//! unsupported version: it is named in logs and metrics instead.
//!
//! Pure: no I/O, no clock.

use std::fmt;

use serde::de::DeserializeOwned;
use serde_json::Value;

/// The header that carries the sender's release (`MAJOR.MINOR.PATCH`), on every agent
/// request and every controller answer.
pub const VERSION_HEADER: &str = "metalguard-version";

/// The release a peer is taken for when it sends no [`VERSION_HEADER`]: the first release,
/// which predates the exchange.
pub const UNVERSIONED: Version = Version::new(0, 1, 0);

/// How many minor versions apart an agent and a controller of the same major version may be.
pub const MAX_MINOR_SKEW: u64 = 1;

/// How many unknown fields a newer peer's message may carry before it is refused anyway: a
/// release adds a handful, not hundreds.
pub const MAX_IGNORED_FIELDS: usize = 32;

/// This build's release, read from cargo's version parts when it is compiled.
const OURS: Version = Version::new(
    decimal(env!("CARGO_PKG_VERSION_MAJOR")),
    decimal(env!("CARGO_PKG_VERSION_MINOR")),
    decimal(env!("CARGO_PKG_VERSION_PATCH")),
);

/// A decimal number at compile time (a version part cargo gives).
#[allow(clippy::panic)] // evaluated while compiling: a bad version fails the build, never a run
const fn decimal(text: &str) -> u64 {
    match u64::from_str_radix(text, 10) {
        Ok(number) => number,
        Err(_) => panic!("a version part is not a decimal number"),
    }
}

/// A release number. A pre-release or build suffix (`0.2.0-dev`) is kept out of the
/// comparison.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version {
    /// Major version.
    pub major: u64,
    /// Minor version.
    pub minor: u64,
    /// Patch version.
    pub patch: u64,
}

impl Version {
    /// The version `major.minor.patch`.
    #[must_use]
    pub const fn new(major: u64, minor: u64, patch: u64) -> Self {
        Self {
            major,
            minor,
            patch,
        }
    }

    /// This build's release: the workspace version every crate shares.
    #[must_use]
    pub const fn ours() -> Self {
        OURS
    }

    /// Parses `MAJOR.MINOR.PATCH`, with an optional `-pre` or `+build` suffix.
    ///
    /// # Errors
    /// A version that is not three decimal numbers, or longer than 64 bytes.
    pub fn parse(text: &str) -> Result<Self, SkewError> {
        let bad = || SkewError::Malformed(text.chars().take(64).collect());
        if text.len() > 64 {
            return Err(bad());
        }
        let core = text.split(['-', '+']).next().unwrap_or_default();
        let mut parts = core.split('.');
        let mut number = || -> Result<u64, SkewError> {
            let part = parts.next().ok_or_else(bad)?;
            if part.is_empty() || part.len() > 9 || !part.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            part.parse().map_err(|_| bad())
        };
        let version = Self::new(number()?, number()?, number()?);
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(version)
    }
}

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{}.{}", self.major, self.minor, self.patch)
    }
}

/// The header this build sends on every request or answer: ([`VERSION_HEADER`], its release).
#[must_use]
pub fn our_header() -> (&'static str, String) {
    (VERSION_HEADER, Version::ours().to_string())
}

/// Where a peer stands relative to us, within the policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skew {
    /// The same major and minor version.
    Same,
    /// The peer is older (one minor version at most).
    PeerOlder,
    /// The peer is newer (one minor version at most).
    PeerNewer,
}

impl Skew {
    /// How to read what the peer sends: only a newer peer's unknown fields are left out.
    #[must_use]
    pub fn tolerance(self) -> Tolerance {
        match self {
            Skew::PeerNewer => Tolerance::NewerPeer,
            Skew::Same | Skew::PeerOlder => Tolerance::Strict,
        }
    }
}

/// How a message is read ([`decode`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tolerance {
    /// Every field must be known.
    Strict,
    /// Unknown object fields are left out and named ([`Decoded::ignored`]); unknown values
    /// and malformed known fields are still refused.
    NewerPeer,
}

/// Why a peer's version or message is refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SkewError {
    /// The version header is not a version.
    #[error("version {0:?} is not MAJOR.MINOR.PATCH")]
    Malformed(String),
    /// The peer is outside the policy.
    #[error(
        "{peer_role} {peer} is outside the supported skew of {our_role} {ours} (the same major \
         version, at most {MAX_MINOR_SKEW} minor version apart): upgrade one side \
         (docs/runbooks.md, \"Upgrading\")"
    )]
    Unsupported {
        /// What the peer is ("agent" or "controller").
        peer_role: &'static str,
        /// The peer's version.
        peer: Version,
        /// What we are.
        our_role: &'static str,
        /// Our version.
        ours: Version,
    },
}

/// Judges a peer's version header against ours: `None` is the release before the exchange
/// ([`UNVERSIONED`]). `peer_role` and `our_role` name the sides in the error.
///
/// # Errors
/// [`SkewError::Malformed`] for a header that is not a version, [`SkewError::Unsupported`]
/// outside the policy.
pub fn judge(
    ours: Version,
    our_role: &'static str,
    peer: Option<&str>,
    peer_role: &'static str,
) -> Result<(Version, Skew), SkewError> {
    let peer = peer.map_or(Ok(UNVERSIONED), Version::parse)?;
    let unsupported = || SkewError::Unsupported {
        peer_role,
        peer,
        our_role,
        ours,
    };
    if peer.major != ours.major || peer.minor.abs_diff(ours.minor) > MAX_MINOR_SKEW {
        return Err(unsupported());
    }
    let skew = match peer.minor.cmp(&ours.minor) {
        std::cmp::Ordering::Equal => Skew::Same,
        std::cmp::Ordering::Less => Skew::PeerOlder,
        std::cmp::Ordering::Greater => Skew::PeerNewer,
    };
    Ok((peer, skew))
}

/// A message read with [`decode`], and the unknown fields a newer peer's carried.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decoded<T> {
    /// The message.
    pub value: T,
    /// The paths of the fields left out (`commands.0.kind.new_field`), empty when read
    /// strictly.
    pub ignored: Vec<String>,
}

/// Why a message could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct DecodeError {
    /// What is wrong, with the path where it is.
    pub message: String,
    /// The bytes are not JSON at all (a syntax error or a cut-off body), as opposed to JSON
    /// that is not the message (HTTP 400 against 422).
    pub malformed: bool,
}

impl DecodeError {
    fn data(message: String) -> Self {
        Self {
            message,
            malformed: false,
        }
    }

    fn json(error: &serde_json::Error) -> Self {
        Self {
            message: format!("invalid JSON: {error}"),
            malformed: !error.is_data(),
        }
    }
}

/// Reads a JSON message whose types refuse unknown fields (`deny_unknown_fields`). Strictly,
/// that is all; for a newer peer ([`Tolerance::NewerPeer`]) each unknown field the types
/// refuse is removed and the message read again, up to [`MAX_IGNORED_FIELDS`] of them. Any
/// other error (a known field of the wrong type, an unknown enum value, a missing field) is
/// refused, naming its path.
///
/// # Errors
/// [`DecodeError`] naming the path and what is wrong.
pub fn decode<T: DeserializeOwned>(
    bytes: &[u8],
    tolerance: Tolerance,
) -> Result<Decoded<T>, DecodeError> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let error = match serde_path_to_error::deserialize::<_, T>(&mut deserializer) {
        Ok(value) => {
            deserializer.end().map_err(|e| DecodeError::json(&e))?;
            return Ok(Decoded {
                value,
                ignored: Vec::new(),
            });
        }
        Err(error) => error,
    };
    if tolerance == Tolerance::Strict || unknown_field(error.inner()).is_none() {
        return Err(described(&error));
    }
    let mut tree: Value = serde_json::from_slice(bytes).map_err(|e| DecodeError::json(&e))?;
    let mut ignored = Vec::new();
    loop {
        match serde_path_to_error::deserialize::<_, T>(&tree) {
            Ok(value) => return Ok(Decoded { value, ignored }),
            Err(error) => {
                let Some(field) = unknown_field(error.inner()) else {
                    return Err(described(&error));
                };
                if ignored.len() >= MAX_IGNORED_FIELDS {
                    return Err(DecodeError::data(format!(
                        "more than {MAX_IGNORED_FIELDS} unknown fields (the last at {})",
                        error.path()
                    )));
                }
                if !remove_field(&mut tree, error.path(), &field) {
                    return Err(described(&error));
                }
                ignored.push(joined(error.path(), &field));
            }
        }
    }
}

/// The field a serde "unknown field" error names (its message is serde's own and stable:
/// ``unknown field `name`, expected …``).
fn unknown_field(error: &serde_json::Error) -> Option<String> {
    let text = error.to_string();
    let rest = text.strip_prefix("unknown field `")?;
    let end = rest.find('`')?;
    Some(rest[..end].to_owned())
}

/// The error's message with its path, when it has one.
fn described(error: &serde_path_to_error::Error<serde_json::Error>) -> DecodeError {
    let path = error.path().to_string();
    let mut decoded = DecodeError::json(error.inner());
    decoded.message = if path == "." || path.is_empty() {
        error.inner().to_string()
    } else {
        format!("{path}: {}", error.inner())
    };
    decoded
}

/// `path.field`, unless the path already ends at the field.
fn joined(path: &serde_path_to_error::Path, field: &str) -> String {
    let ends_at_field = matches!(
        path.iter().next_back(),
        Some(serde_path_to_error::Segment::Map { key }) if key == field
    );
    let path = path.to_string();
    if ends_at_field {
        path
    } else if path == "." || path.is_empty() {
        field.to_owned()
    } else {
        format!("{path}.{field}")
    }
}

/// Removes `field` from the object `path` leads to, or from the object holding the last
/// segment when the path ends at the field itself. The path of a field inside an internally
/// tagged enum ends at the enum's object (serde buffers it before reading the variant).
fn remove_field(tree: &mut Value, path: &serde_path_to_error::Path, field: &str) -> bool {
    use serde_path_to_error::Segment;
    let escape = |key: &str| key.replace('~', "~0").replace('/', "~1");
    let segments: Vec<&Segment> = path.iter().collect();
    // The path ends at the field itself: its parent holds it.
    let parents = match segments.last() {
        Some(Segment::Map { key }) if key == field => &segments[..segments.len() - 1],
        _ => &segments[..],
    };
    let mut pointer = String::new();
    for segment in parents {
        match segment {
            Segment::Map { key } => pointer = format!("{pointer}/{}", escape(key)),
            Segment::Seq { index } => pointer = format!("{pointer}/{index}"),
            // An externally tagged variant is a key of its own; a tagged one is not.
            Segment::Enum { variant } => {
                let with = format!("{pointer}/{}", escape(variant));
                if tree.pointer(&with).is_some() {
                    pointer = with;
                }
            }
            Segment::Unknown => return false,
        }
    }
    tree.pointer_mut(&pointer)
        .and_then(Value::as_object_mut)
        .is_some_and(|object| object.remove(field).is_some())
}

#[cfg(test)]
mod tests {
    use std::fmt::Write as _;

    use super::*;
    use crate::protocol::{AgentReport, CommandBatch, ReportAck};

    #[test]
    fn the_workspace_version_parses_and_suffixes_are_kept_out() {
        let ours = Version::ours();
        assert_eq!(
            ours.to_string(),
            env!("CARGO_PKG_VERSION").split('-').next().unwrap()
        );
        assert_eq!(Version::parse("0.2.0-dev").unwrap(), Version::new(0, 2, 0));
        assert_eq!(
            Version::parse("1.10.3+abc").unwrap(),
            Version::new(1, 10, 3)
        );
        for bad in [
            "",
            "1",
            "1.2",
            "1.2.3.4",
            "a.b.c",
            "1..3",
            "-1.2.3",
            "01234567890.1.1",
            &"9".repeat(80),
        ] {
            assert!(
                matches!(Version::parse(bad), Err(SkewError::Malformed(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn peers_one_minor_apart_work_together_in_both_directions_and_no_further() {
        let ours = Version::new(0, 2, 0);
        let judge = |peer: Option<&str>| judge(ours, "controller", peer, "agent");
        assert_eq!(judge(Some("0.2.7")).unwrap().1, Skew::Same);
        assert_eq!(judge(Some("0.1.0")).unwrap().1, Skew::PeerOlder);
        assert_eq!(judge(Some("0.3.1")).unwrap().1, Skew::PeerNewer);
        // No header: the first release, which predates the exchange.
        assert_eq!(judge(None).unwrap(), (UNVERSIONED, Skew::PeerOlder));
        for far in ["0.4.0", "1.2.0", "0.0.9"] {
            let error = judge(Some(far)).unwrap_err().to_string();
            assert!(error.contains(&format!("agent {far}")), "{error}");
            assert!(error.contains("controller 0.2.0"), "{error}");
        }
        assert!(matches!(judge(Some("x")), Err(SkewError::Malformed(_))));
        // 0.3 judges 0.1 (no header) outside: two minors apart.
        assert!(super::judge(Version::new(0, 3, 0), "agent", None, "controller").is_err());
    }

    const REPORT: &str = r#"{"host":"a","agent_version":"0.3.0","sequence":1,"sent_at":5"#;

    #[test]
    fn a_newer_peers_unknown_fields_are_left_out_and_named_anything_else_is_refused() {
        let with_new = format!(
            r#"{REPORT},"coming_soon":{{"x":1}},"conditions":[{{"type":"DiskOk","status":"True","reason":"Ok","last_transition":5,"later":true}}]}}"#
        );
        // Strict: refused, naming the field.
        let error = decode::<AgentReport>(with_new.as_bytes(), Tolerance::Strict).unwrap_err();
        assert!(
            error.message.contains("unknown field `coming_soon`"),
            "{error}"
        );
        // From a newer peer: both left out, each named by its path.
        let decoded = decode::<AgentReport>(with_new.as_bytes(), Tolerance::NewerPeer).unwrap();
        assert_eq!(decoded.value.host, "a");
        assert_eq!(decoded.value.conditions.len(), 1);
        assert_eq!(decoded.ignored, ["coming_soon", "conditions[0].later"]);
        // A known field of the wrong type is refused even from a newer peer.
        let wrong = format!(
            r#"{REPORT},"coming_soon":1,"conditions":[{{"type":"DiskOk","status":"Maybe","reason":"Ok","last_transition":5}}]}}"#
        );
        let error = decode::<AgentReport>(wrong.as_bytes(), Tolerance::NewerPeer).unwrap_err();
        assert!(error.message.contains("conditions[0].status"), "{error}");
        // Trailing bytes and bad JSON are refused either way.
        assert!(
            decode::<AgentReport>(format!("{REPORT}}} x").as_bytes(), Tolerance::NewerPeer)
                .is_err()
        );
        assert!(decode::<AgentReport>(b"{", Tolerance::NewerPeer).is_err());
    }

    #[test]
    fn a_newer_controllers_command_fields_inside_the_tagged_kind_are_left_out() {
        let batch = r#"{"commands":[{"operation_id":"op-1","issued_at":5,"term":3,"later":1,
            "kind":{"type":"fence","target":"cp-2","action":"off","bmc_address":"ipmi://10.0.0.2",
            "credentials":{"username":"u","password":"p"},"new_in_0_3":"x"}}]}"#;
        assert!(decode::<CommandBatch>(batch.as_bytes(), Tolerance::Strict).is_err());
        let decoded = decode::<CommandBatch>(batch.as_bytes(), Tolerance::NewerPeer).unwrap();
        assert_eq!(decoded.value.commands.len(), 1);
        assert_eq!(decoded.value.commands[0].term, 3);
        assert_eq!(decoded.ignored.len(), 2, "{:?}", decoded.ignored);
        // A command kind the agent does not know is refused: a new value is never tolerated.
        let unknown = r#"{"commands":[{"operation_id":"op-1","issued_at":5,"kind":{"type":"reboot-everything"}}]}"#;
        assert!(decode::<CommandBatch>(unknown.as_bytes(), Tolerance::NewerPeer).is_err());
    }

    #[test]
    fn too_many_unknown_fields_are_refused_even_from_a_newer_peer() {
        let fields = |n: usize| -> String {
            (0..n).fold(String::new(), |mut out, i| {
                let _ = write!(out, r#","f{i}":1"#);
                out
            })
        };
        let many = fields(MAX_IGNORED_FIELDS + 1);
        let ack = format!(r#"{{"sequence":1,"received_at":5{many}}}"#);
        let error = decode::<ReportAck>(ack.as_bytes(), Tolerance::NewerPeer).unwrap_err();
        assert!(error.message.contains("more than"), "{error}");
        let few = fields(3);
        let ack = format!(r#"{{"sequence":1,"received_at":5{few}}}"#);
        assert_eq!(
            decode::<ReportAck>(ack.as_bytes(), Tolerance::NewerPeer)
                .unwrap()
                .ignored
                .len(),
            3
        );
    }
}
