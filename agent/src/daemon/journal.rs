//! The operation journal: what makes command execution at-most-once per operation id, and
//! results survive restarts of the agent and of the controller.
//!
//! Layout under `<state dir>/operations/`: `<op>.started` is created (exclusively) before a
//! command runs; `<op>.result.json` is written atomically when it finishes and stays until the
//! controller acknowledges it, then becomes `<op>.acked.json`. A `started` file without a
//! result means the agent died mid-command: the command is never run again, and a failed result
//! saying so is reported instead, because re-sending a power action blind is exactly what
//! metalguard must never do.

use std::path::{Path, PathBuf};

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::OperationId;
use metalguard_api::protocol::{CommandResult, Outcome, TimelineDirection, TimelineEntry};

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
    dir: PathBuf,
}

impl Journal {
    /// Opens (creating) the journal under `state_dir`.
    pub fn open(state_dir: &Path) -> std::io::Result<Self> {
        let dir = state_dir.join("operations");
        std::fs::create_dir_all(&dir)?;
        Ok(Self { dir })
    }

    fn file(&self, op: &OperationId, suffix: &str) -> PathBuf {
        self.dir.join(format!("{}.{suffix}", file_stem(op)))
    }

    /// Claims `op` for execution, or tells why it must not run again.
    pub fn claim(&self, op: &OperationId) -> std::io::Result<Claim> {
        for suffix in ["result.json", "acked.json"] {
            let path = self.file(op, suffix);
            if let Ok(text) = std::fs::read_to_string(&path) {
                let result: CommandResult = serde_json::from_str(&text).map_err(|e| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{}: {e}", path.display()),
                    )
                })?;
                return Ok(Claim::Finished(Box::new(result)));
            }
        }
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(self.file(op, "started"))
        {
            Ok(file) => {
                file.sync_all()?;
                Ok(Claim::New)
            }
            Err(err) if err.kind() == std::io::ErrorKind::AlreadyExists => Ok(Claim::Interrupted),
            Err(err) => Err(err),
        }
    }

    /// Records the result of a claimed operation (atomically: write, fsync, rename).
    pub fn finish(&self, result: &CommandResult) -> std::io::Result<()> {
        let path = self.file(&result.operation_id, "result.json");
        let tmp = path.with_extension("tmp");
        let text = serde_json::to_vec_pretty(result).map_err(std::io::Error::other)?;
        std::fs::write(&tmp, text)?;
        std::fs::File::open(&tmp)?.sync_all()?;
        std::fs::rename(&tmp, &path)
    }

    /// Results the controller has not acknowledged yet, oldest first.
    pub fn pending(&self) -> std::io::Result<Vec<CommandResult>> {
        let mut results = Vec::new();
        for entry in std::fs::read_dir(&self.dir)? {
            let path = entry?.path();
            if path.to_string_lossy().ends_with(".result.json")
                && let Ok(text) = std::fs::read_to_string(&path)
                && let Ok(result) = serde_json::from_str::<CommandResult>(&text)
            {
                results.push(result);
            }
        }
        results.sort_by_key(|r| r.finished_at);
        Ok(results)
    }

    /// Marks a result as delivered.
    pub fn acknowledge(&self, op: &OperationId) -> std::io::Result<()> {
        let from = self.file(op, "result.json");
        if from.exists() {
            std::fs::rename(from, self.file(op, "acked.json"))?;
        }
        Ok(())
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
}
