//! Leadership terms: the highest term this agent has seen, kept across its restarts, and the
//! refusal of commands from an older leadership.
//!
//! Every leadership of the controller has a term that only grows (standalone: the leader
//! key's create revision in etcd; Kubernetes: a counter the leader increments on the Lease
//! when it begins). Commands carry the term of the leadership that offers them and the
//! controller's answers carry its term. A controller whose leadership lapsed (paused, cut
//! off) may still answer a long-poll with what it planned before; once this agent has seen
//! a newer term it refuses that command and says why, and its reports carry the newer term
//! so that the stale controller stops acting at once.
//!
//! The term is persisted in the journal's directory (`<state dir>/operations/term`, written
//! through its directory descriptor like every journal file) before a command of a newer
//! term runs, so an agent restart does not forget it. A term file this agent's user did not
//! write is not believed.

use std::sync::{Arc, Mutex};

use metalguard_fs::SecureDir;

/// The file in the journal's directory.
pub const TERM_FILE: &str = "term";
/// Its mode.
const FILE_MODE: u32 = 0o600;

/// Why a command was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error(
    "command of leadership term {offered} refused: this agent has seen term {seen}, a newer leadership; the controller that sent it no longer leads"
)]
pub struct OlderTerm {
    /// The command's term.
    pub offered: u64,
    /// The highest term this agent has seen.
    pub seen: u64,
}

/// The highest term seen, shared by the agent's loops.
#[derive(Debug, Clone)]
pub struct Terms {
    dir: Arc<SecureDir>,
    highest: Arc<Mutex<u64>>,
}

impl Terms {
    /// Loads the term kept in `dir` (the journal's directory; none yet: 0). A file that does
    /// not hold a term is an error: starting from 0 would accept an older leadership's
    /// commands again. One another user wrote is ignored (logged): it is not this agent's.
    pub fn load(dir: Arc<SecureDir>) -> std::io::Result<Self> {
        let path = dir.path().join(TERM_FILE);
        let me = nix::unistd::geteuid().as_raw();
        let highest = match dir.read(TERM_FILE).map_err(std::io::Error::other)? {
            None => 0,
            Some(file) if file.uid != me => {
                tracing::error!(file = %path.display(), owner = file.uid, "leadership term file ignored: this agent's user did not write it");
                0
            }
            Some(file) => String::from_utf8_lossy(&file.bytes)
                .trim()
                .parse::<u64>()
                .map_err(|e| {
                    std::io::Error::new(
                        std::io::ErrorKind::InvalidData,
                        format!("{}: not a term: {e}", path.display()),
                    )
                })?,
        };
        Ok(Self {
            dir,
            highest: Arc::new(Mutex::new(highest)),
        })
    }

    /// The highest term seen.
    pub fn highest(&self) -> u64 {
        *self.lock()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, u64> {
        self.highest
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Takes note of `term` (from an answer or a command): a newer one is persisted first.
    /// 0 means "no term" (a controller that predates terms) and changes nothing.
    pub fn observe(&self, term: u64) -> std::io::Result<()> {
        let mut highest = self.lock();
        if term > *highest {
            self.dir
                .write_atomic(TERM_FILE, term.to_string().as_bytes(), FILE_MODE, None)
                .map_err(std::io::Error::other)?;
            tracing::info!(from = *highest, to = term, "a newer leadership term seen");
            *highest = term;
        }
        Ok(())
    }

    /// Admits a command of `term`: refused when it is older than the highest term seen;
    /// otherwise the term is noted (persisted when newer) before the command may run.
    /// A command without a term (0, from a controller that predates terms) is admitted only
    /// while no term was ever seen.
    pub fn admit(&self, term: u64) -> Result<(), Admission> {
        let seen = self.highest();
        if term < seen {
            return Err(Admission::Older(OlderTerm {
                offered: term,
                seen,
            }));
        }
        self.observe(term).map_err(Admission::Unrecorded)
    }
}

/// Why a command may not run.
#[derive(Debug, thiserror::Error)]
pub enum Admission {
    /// It comes from an older leadership.
    #[error(transparent)]
    Older(OlderTerm),
    /// Its newer term could not be persisted: running it would let a restart forget the term.
    #[error("the newer leadership term could not be recorded")]
    Unrecorded(#[source] std::io::Error),
}

#[cfg(test)]
mod tests {
    use super::*;

    fn open(dir: &std::path::Path) -> Arc<SecureDir> {
        Arc::new(SecureDir::open(dir, &metalguard_fs::Owners::root_and_me()).unwrap())
    }

    #[test]
    fn older_terms_are_refused_and_the_highest_survives_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let terms = Terms::load(open(dir.path())).unwrap();
        assert_eq!(terms.highest(), 0);
        terms.admit(0).unwrap();
        terms.admit(7).unwrap();
        terms.admit(7).unwrap();
        let err = terms.admit(6).unwrap_err();
        assert!(
            matches!(
                err,
                Admission::Older(OlderTerm {
                    offered: 6,
                    seen: 7
                })
            ),
            "{err}"
        );
        assert!(err.to_string().contains("term 6 refused"), "{err}");
        assert!(matches!(terms.admit(0), Err(Admission::Older(_))));
        terms.observe(9).unwrap();
        terms.observe(8).unwrap();
        let again = Terms::load(open(dir.path())).unwrap();
        assert_eq!(again.highest(), 9, "kept across a restart");
        assert!(again.admit(8).is_err());
    }

    #[test]
    fn a_corrupt_term_file_is_an_error_not_a_reset() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join(TERM_FILE), "seven").unwrap();
        let err = Terms::load(open(dir.path())).unwrap_err();
        assert!(err.to_string().contains("not a term"), "{err}");
    }
}
