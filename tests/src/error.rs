//! Errors of the harness.

use std::path::PathBuf;
use std::time::Duration;

/// Why the harness could not provide a component.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    /// A program the harness needs is not installed; the hint says how to install it.
    #[error("required program {program} not found ({hint})")]
    MissingProgram {
        /// Program name.
        program: String,
        /// How to get it.
        hint: String,
    },
    /// A filesystem or process operation failed.
    #[error("{context}")]
    Io {
        /// What the harness was doing.
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A component did not reach the expected state in time.
    #[error("timed out after {after:?} waiting for {what}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long the harness waited.
        after: Duration,
    },
    /// A helper command (etcdctl, curl, ...) failed.
    #[error("{command} failed: {detail}")]
    Command {
        /// The command, without secrets.
        command: String,
        /// Exit status and stderr.
        detail: String,
    },
    /// A process exited while it should have been running; the log tail is attached.
    #[error("{name} exited unexpectedly (log {log}):\n{tail}")]
    Exited {
        /// Process name.
        name: String,
        /// Its log file.
        log: PathBuf,
        /// The last lines of its log.
        tail: String,
    },
    /// The Kubernetes API server answered a request with an error status.
    #[error("{what}: the API server answered {status}: {message}")]
    Api {
        /// The request (method and path).
        what: String,
        /// The HTTP status.
        status: u16,
        /// The `message` of the server's `Status`, or the body.
        message: String,
    },
    /// Anything else, with a precise message.
    #[error("{0}")]
    Other(String),
}

impl HarnessError {
    /// The HTTP status of an [`HarnessError::Api`] error.
    pub fn api_status(&self) -> Option<u16> {
        match self {
            Self::Api { status, .. } => Some(*status),
            _ => None,
        }
    }

    /// Wraps an I/O error with what the harness was doing.
    pub fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let context = context.into();
        move |source| Self::Io { context, source }
    }
}
