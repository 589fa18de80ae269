//! The operation journal: what makes command execution at-most-once per operation id, and
//! results survive restarts of the agent and of the controller.
//!
//! Layout under `<state dir>/operations/`: `<op>.started` is created (exclusively) before a
//! command runs; `<op>.result.json` is written atomically when it finishes and stays until the
//! controller acknowledges it, then becomes `<op>.acked.json`. A `started` file without a
//! result means the agent died mid-command: the command is never run again, and a failed result
//! saying so is reported instead, because re-sending a power action blind is exactly what
//! metalguard must never do.
//!
//! The state directory is the agent user's; another user who could write there could plant a
//! `<op>.acked.json` (a power-off reported as succeeded that never reached a BMC) or a symlink
//! (a file of root's overwritten). So the journal opens the state directory and `operations/`
//! without following symlinks and refuses them when they are symlinks, writable by group or
//! others, or owned by anyone but root or the agent's user (the agent does not start); every
//! file is opened relative to that directory with `O_NOFOLLOW`; and a file not owned by the
//! agent's user is ignored as if absent, logged once and counted
//! (`metalguard_agent_journal_files_ignored`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::OperationId;
use metalguard_api::protocol::{CommandResult, Outcome, TimelineDirection, TimelineEntry};
use metalguard_fs::{FileError, Owners, SecureDir};
use prometheus_client::metrics::gauge::Gauge;

/// The journal's directory under the state directory.
const OPERATIONS_DIR: &str = "operations";
/// Mode of the state directory when the journal creates it, and of `operations/`.
const DIR_MODE: u32 = 0o750;
/// Mode of the journal's files.
const FILE_MODE: u32 = 0o600;

/// What the journal knows of an operation id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Claim {
    /// Never seen: the caller now owns it and must run it, then [`Journal::finish`].
    New,
    /// Already finished; here is its result (to report again if asked).
    Finished(Box<CommandResult>),
    /// Started by an earlier agent process that died before finishing; outcome unknown.
    Interrupted,
}

/// The journal directory.
#[derive(Debug, Clone)]
pub struct Journal {
    dir: Arc<SecureDir>,
    me: u32,
    /// Files ignored because this agent did not write them: name -> why.
    ignored: Arc<Mutex<BTreeMap<String, String>>>,
    ignored_gauge: Gauge,
}

fn to_io(err: FileError) -> std::io::Error {
    std::io::Error::other(err)
}

impl Journal {
    /// Opens (creating) the journal under `state_dir`; refuses a state directory or journal
    /// directory that is a symlink, writable by group or others, or owned by anyone but root
    /// or this process's user.
    pub fn open(state_dir: &Path) -> std::io::Result<Self> {
        let owners = Owners::root_and_me();
        let state = SecureDir::open_or_create(state_dir, DIR_MODE, &owners).map_err(to_io)?;
        let dir = state
            .create_child(OPERATIONS_DIR, DIR_MODE, &owners)
            .map_err(to_io)?;
        Ok(Self {
            dir: Arc::new(dir),
            me: nix::unistd::geteuid().as_raw(),
            ignored: Arc::default(),
            ignored_gauge: Gauge::default(),
        })
    }

    /// The journal's directory (the leadership term is kept there too).
    pub fn dir(&self) -> Arc<SecureDir> {
        Arc::clone(&self.dir)
    }

    /// Counts the ignored files in `gauge` (the agent's metrics).
    #[must_use]
    pub fn counting_ignored_in(mut self, gauge: Gauge) -> Self {
        self.ignored_gauge = gauge;
        self
    }

    /// The files ignored so far (not written by this agent's user), each with why.
    #[cfg(test)]
    pub fn ignored(&self) -> Vec<(String, String)> {
        self.ignored
            .lock()
            .map(|m| m.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
            .unwrap_or_default()
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn name(op: &OperationId, suffix: &str) -> String {
        format!("{}.{suffix}", file_stem(op))
    }

    /// Records that `name` is ignored, logging it the first time.
    fn ignore(&self, name: &str, why: String) {
        let Ok(mut ignored) = self.ignored.lock() else {
            return;
        };
        if !ignored.contains_key(name) {
            tracing::error!(file = %self.path(name).display(), problem = %why, "operation journal file ignored: this agent did not write it");
            ignored.insert(name.to_owned(), why);
            self.ignored_gauge
                .set(i64::try_from(ignored.len()).unwrap_or(i64::MAX));
        }
    }

    /// Reads `name` if it exists and this agent's user wrote it.
    fn read_own(&self, name: &str) -> Option<Vec<u8>> {
        match self.dir.read(name) {
            Ok(None) => None,
            Ok(Some(file)) if file.uid != self.me => {
                self.ignore(
                    name,
                    format!(
                        "owned by uid {}, not by this agent's user (uid {})",
                        file.uid, self.me
                    ),
                );
                None
            }
            Ok(Some(file)) => Some(file.bytes),
            Err(err) => {
                self.ignore(name, err.to_string());
                None
            }
        }
    }

    /// Claims `op` for execution, or tells why it must not run again.
    pub fn claim(&self, op: &OperationId) -> std::io::Result<Claim> {
        for suffix in ["result.json", "acked.json"] {
            let name = Self::name(op, suffix);
            if let Some(bytes) = self.read_own(&name) {
                let result: CommandResult = serde_json::from_slice(&bytes).map_err(|e| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{}: {e}", self.path(&name).display()),
                    )
                })?;
                return Ok(Claim::Finished(Box::new(result)));
            }
        }
        let started = Self::name(op, "started");
        match self.dir.create_new(&started, FILE_MODE) {
            Ok(file) => {
                file.sync_all()?;
                self.dir.sync().map_err(to_io)?;
                Ok(Claim::New)
            }
            Err(FileError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::AlreadyExists =>
            {
                // Whoever made it, the command is not run: the safe direction. A file this
                // agent did not write is still reported.
                let _ = self.read_own(&started);
                Ok(Claim::Interrupted)
            }
            Err(err) => Err(to_io(err)),
        }
    }

    /// Records the result of a claimed operation (atomically: a new temporary file, fsync,
    /// rename, fsync of the directory).
    pub fn finish(&self, result: &CommandResult) -> std::io::Result<()> {
        let name = Self::name(&result.operation_id, "result.json");
        let text = serde_json::to_vec_pretty(result).map_err(std::io::Error::other)?;
        self.dir
            .write_atomic(&name, &text, FILE_MODE, None)
            .map_err(to_io)
    }

    /// Results the controller has not acknowledged yet, oldest first.
    pub fn pending(&self) -> std::io::Result<Vec<CommandResult>> {
        let mut results = Vec::new();
        for name in self.dir.names().map_err(to_io)? {
            if name.ends_with(".result.json")
                && let Some(bytes) = self.read_own(&name)
                && let Ok(result) = serde_json::from_slice::<CommandResult>(&bytes)
            {
                results.push(result);
            }
        }
        results.sort_by_key(|r| r.finished_at);
        Ok(results)
    }

    /// Marks a result as delivered.
    pub fn acknowledge(&self, op: &OperationId) -> std::io::Result<()> {
        self.dir
            .rename(
                &Self::name(op, "result.json"),
                &Self::name(op, "acked.json"),
            )
            .map(|_| ())
            .map_err(to_io)
    }
}

/// The result reported for an operation an earlier agent process started and never finished.
pub fn interrupted_result(op: &OperationId, now: Timestamp) -> CommandResult {
    let what = "the agent restarted while executing this command; it was not run again \
                (at most once), so its effect is unknown: verify the power state before acting";
    CommandResult {
        operation_id: op.clone(),
        outcome: Outcome::Failed,
        started_at: now,
        finished_at: now,
        timeline: vec![TimelineEntry {
            elapsed_ms: 0,
            direction: TimelineDirection::Note,
            what: what.to_owned(),
        }],
        error: Some(what.to_owned()),
        promoted_by: None,
        term: 0,
    }
}

/// A file name for an operation id: safe characters kept, anything else hex-escaped.
fn file_stem(op: &OperationId) -> String {
    use std::fmt::Write as _;
    let mut stem = String::with_capacity(op.0.len());
    for byte in op.0.bytes() {
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
    use super::*;

    fn result(op: &str, at: u64) -> CommandResult {
        CommandResult {
            operation_id: OperationId(op.into()),
            outcome: Outcome::Succeeded,
            started_at: Timestamp(at),
            finished_at: Timestamp(at + 1),
            timeline: Vec::new(),
            error: None,
            promoted_by: None,
            term: 0,
        }
    }

    #[test]
    fn an_operation_runs_at_most_once_across_restarts() {
        let dir = tempfile::tempdir().unwrap();
        let op = OperationId("fence/cp-1/attempt-1".into());
        let journal = Journal::open(dir.path()).unwrap();
        assert_eq!(journal.claim(&op).unwrap(), Claim::New);
        // A second claim before the result (e.g. the agent died and restarted) never runs it.
        let reopened = Journal::open(dir.path()).unwrap();
        assert_eq!(reopened.claim(&op).unwrap(), Claim::Interrupted);
        reopened.finish(&result(&op.0, 10)).unwrap();
        match reopened.claim(&op).unwrap() {
            Claim::Finished(r) => assert_eq!(r.operation_id, op),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn results_stay_pending_until_acknowledged() {
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path()).unwrap();
        for (op, at) in [("b", 20), ("a", 10)] {
            journal.claim(&OperationId(op.into())).unwrap();
            journal.finish(&result(op, at)).unwrap();
        }
        let pending: Vec<String> = journal
            .pending()
            .unwrap()
            .into_iter()
            .map(|r| r.operation_id.0)
            .collect();
        assert_eq!(pending, vec!["a", "b"]);
        journal.acknowledge(&OperationId("a".into())).unwrap();
        let again = Journal::open(dir.path()).unwrap();
        assert_eq!(again.pending().unwrap().len(), 1);
        assert!(matches!(
            again.claim(&OperationId("a".into())).unwrap(),
            Claim::Finished(_)
        ));
    }

    #[test]
    fn operation_ids_become_safe_file_names() {
        assert_eq!(
            file_stem(&OperationId("fence/cp-1:2".into())),
            "fence%2fcp-1%3a2"
        );
        assert_eq!(file_stem(&OperationId("../x".into())), "%2e%2e%2fx");
    }

    fn is_root() -> bool {
        nix::unistd::geteuid().is_root()
    }

    /// Another user's file under `dir`.
    fn plant(dir: &Path, name: &str, text: &str) {
        let path = dir.join("operations").join(name);
        std::fs::write(&path, text).unwrap();
        std::os::unix::fs::chown(&path, Some(4242), Some(4242)).unwrap();
    }

    #[test]
    fn a_planted_acked_result_is_ignored_and_reported_not_believed() {
        if !is_root() {
            eprintln!("skipped: planting another user's file needs root");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let journal = Journal::open(dir.path()).unwrap();
        let op = OperationId("remediation/cp-1/1/power-off".into());
        let fake = serde_json::to_string(&result(&op.0, 10)).unwrap();
        plant(dir.path(), &format!("{}.acked.json", file_stem(&op)), &fake);
        plant(
            dir.path(),
            &format!("{}.result.json", file_stem(&OperationId("x".into()))),
            &fake.replace("remediation/cp-1/1/power-off", "x"),
        );
        // Before: Claim::Finished(succeeded) and the power-off reported done, no BMC request.
        assert_eq!(journal.claim(&op).unwrap(), Claim::New, "the command runs");
        assert!(
            journal.pending().unwrap().is_empty(),
            "a planted result is not sent"
        );
        let ignored = journal.ignored(); // ignored-check
        assert_eq!(ignored.len(), 2, "{ignored:?}"); // ignored-check
        assert!(ignored[0].1.contains("owned by uid 4242"), "{ignored:?}"); // ignored-check
    }

    #[test]
    fn a_planted_symlink_does_not_make_the_agent_overwrite_its_target() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "root's file").unwrap();
        let journal = Journal::open(dir.path()).unwrap();
        let op = OperationId("remediation/cp-1/1/power-off".into());
        let ops = dir.path().join("operations");
        // The temporary names the journal used to write through (`<op>.result.tmp`).
        for name in ["result.tmp", "result.json.tmp"] {
            std::os::unix::fs::symlink(&victim, ops.join(format!("{}.{name}", file_stem(&op))))
                .unwrap();
        }
        assert_eq!(journal.claim(&op).unwrap(), Claim::New);
        journal.finish(&result(&op.0, 10)).unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "root's file");
        let written = ops.join(format!("{}.result.json", file_stem(&op)));
        assert!(std::fs::symlink_metadata(&written).unwrap().is_file());
        // A result that is a symlink is not read through either: the command runs.
        let second = OperationId("remediation/cp-1/2/power-off".into());
        let link = ops.join(format!("{}.result.json", file_stem(&second)));
        std::os::unix::fs::symlink(&written, &link).unwrap();
        assert_eq!(journal.claim(&second).unwrap(), Claim::New);
        assert!(std::fs::symlink_metadata(&link).unwrap().is_symlink());
    }

    #[test]
    fn a_state_directory_writable_by_others_or_a_symlink_is_refused_at_open() {
        use std::os::unix::fs::PermissionsExt as _;
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir(&state).unwrap();
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o777)).unwrap();
        let err = Journal::open(&state).unwrap_err();
        assert!(err.to_string().contains("has mode 0777"), "{err}");
        let link = dir.path().join("link");
        std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o750)).unwrap();
        std::os::unix::fs::symlink(&state, &link).unwrap();
        let err = Journal::open(&link).unwrap_err();
        assert!(err.to_string().contains("is a symbolic link"), "{err}");
        std::fs::create_dir(state.join("operations")).unwrap();
        std::fs::set_permissions(
            state.join("operations"),
            std::fs::Permissions::from_mode(0o773),
        )
        .unwrap();
        let err = Journal::open(&state).unwrap_err();
        assert!(
            err.to_string().contains("operations has mode 0773"),
            "{err}"
        );
    }
}
