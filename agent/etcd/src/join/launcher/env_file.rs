//! The `env-file` launcher: the agent writes etcd's environment to a file and whoever runs
//! the host starts etcd from it.
//!
//! # The contract with the host's supervisor
//!
//! The supervisor is whatever runs processes on the host: an init system (an OpenRC or runit
//! service that sources the file, a systemd path unit), a container entrypoint, or the
//! project's local lab, which watches for the file and starts etcd from it as that host's
//! process. Between the agent and the supervisor the file is the only signal:
//!
//! - **File present = etcd should run with exactly these variables.** The file holds one
//!   `ETCD_*="value"` line per variable in systemd EnvironmentFile syntax
//!   ([`render_environment_file`]: `\`, `"` and `$` escaped with `\`, `#` lines are comments),
//!   always with `ETCD_INITIAL_CLUSTER_STATE="existing"`. It is written atomically (temporary
//!   file, fsync, rename) with mode 0644, so a reader sees either no file or a whole one. It
//!   holds no secrets (TLS variables name files, never their contents).
//! - **File changed = restart etcd with the new variables.** The agent rewrites the file only
//!   when its content changes, so an unchanged join leaves a running etcd alone.
//! - **File absent = etcd must not run.** The agent removes the file when this host's member
//!   was removed from the cluster, then waits until the local client port no longer accepts
//!   connections, and only then wipes the data directory. The supervisor must stop etcd when
//!   the file disappears.
//!
//! After writing the file the agent runs `start_command` if one is configured (an argv, no
//! shell, bounded by the start timeout; a non-zero exit fails the start with the tail of the
//! command's stderr), then considers etcd started once the member answers a status call on its
//! advertised client URL within the start timeout.

use super::local::LocalMember;
use super::{EtcdLaunch, LaunchError, render_environment_file};
use crate::client::ClientSettings;
use crate::join::state::write_atomically_with_mode;
use std::path::PathBuf;
use std::time::{Duration, Instant};
use tokio::process::Command;

/// Default time for the start command to finish and for the member to answer (or, when
/// stopping, to stop answering).
pub const DEFAULT_START_TIMEOUT: Duration = Duration::from_secs(120);
/// Permissions of the environment file: readable by the supervisor, whoever runs it.
const ENV_FILE_MODE: u32 = 0o644;
/// How much of the start command's stderr an error carries.
const STDERR_TAIL_BYTES: usize = 1024;

/// Writes etcd's environment to a file for the host's supervisor; see the module docs for the
/// contract.
#[derive(Debug, Clone)]
pub struct EnvFileLauncher {
    /// The environment file.
    pub env_file: PathBuf,
    /// Run after the file is written (program and arguments, no shell); empty for none.
    pub start_command: Vec<String>,
    /// Deadline of the start command, and of the member answering (or going away).
    pub start_timeout: Duration,
    /// How to reach the local member; set by the join flow or the last start.
    local: LocalMember,
}

impl EnvFileLauncher {
    /// A launcher writing `env_file`, then running `start_command` (if not empty).
    pub fn new(env_file: PathBuf, start_command: Vec<String>, start_timeout: Duration) -> Self {
        Self {
            env_file,
            start_command,
            start_timeout,
            local: LocalMember::default(),
        }
    }

    /// How to reach the local member: its advertised client URL and the client settings (TLS)
    /// to call it with.
    pub fn set_local_member(&mut self, client_url: &str, settings: &ClientSettings) {
        self.local.set(client_url, settings);
    }

    /// Writes the file (unless it already holds this content), runs the start command and
    /// waits until the local member answers.
    pub async fn start(&mut self, launch: &EtcdLaunch) -> Result<(), LaunchError> {
        self.local.set_url(&launch.client_url);
        let content = render_environment_file(&launch.env());
        let current = std::fs::read_to_string(&self.env_file).ok();
        if current.as_deref() == Some(content.as_str()) {
            tracing::debug!(path = %self.env_file.display(), "etcd environment file unchanged");
        } else {
            write_atomically_with_mode(&self.env_file, content.as_bytes(), ENV_FILE_MODE).map_err(
                |source| LaunchError::EnvFile {
                    path: self.env_file.clone(),
                    source,
                },
            )?;
            tracing::info!(path = %self.env_file.display(), "etcd environment file written");
        }
        let started = Instant::now();
        self.run_start_command().await?;
        let left = self.start_timeout.saturating_sub(started.elapsed());
        if self
            .local
            .wait_until_answering(&launch.client_url, left)
            .await
        {
            return Ok(());
        }
        Err(LaunchError::NotAnswering {
            client_url: launch.client_url.clone(),
            env_file: self.env_file.clone(),
            timeout: self.start_timeout,
        })
    }

    /// Removes the file (the supervisor then stops etcd) and waits until the local client
    /// port no longer accepts connections.
    pub async fn stop(&mut self) -> Result<(), LaunchError> {
        match std::fs::remove_file(&self.env_file) {
            Ok(()) => {
                tracing::info!(path = %self.env_file.display(), "etcd environment file removed");
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(source) => {
                return Err(LaunchError::EnvFile {
                    path: self.env_file.clone(),
                    source,
                });
            }
        }
        if self.local.wait_until_gone(self.start_timeout).await {
            return Ok(());
        }
        Err(LaunchError::StillRunning {
            client_url: self.local.url().unwrap_or_default().to_owned(),
            env_file: self.env_file.clone(),
            timeout: self.start_timeout,
        })
    }

    async fn run_start_command(&self) -> Result<(), LaunchError> {
        let Some((program, args)) = self.start_command.split_first() else {
            return Ok(());
        };
        let fail = |detail: String| LaunchError::StartCommand {
            program: program.clone(),
            detail,
        };
        let mut command = Command::new(program);
        command
            .args(args)
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .kill_on_drop(true);
        let output = match tokio::time::timeout(self.start_timeout, command.output()).await {
            Ok(Ok(output)) => output,
            Ok(Err(e)) => return Err(fail(format!("could not be run: {e}"))),
            Err(_) => {
                return Err(fail(format!(
                    "did not finish within {:?}",
                    self.start_timeout
                )));
            }
        };
        if output.status.success() {
            tracing::info!(program = %program, "etcd start command succeeded");
            return Ok(());
        }
        let tail = stderr_tail(&output.stderr);
        Err(fail(if tail.is_empty() {
            output.status.to_string()
        } else {
            format!("{}: {tail}", output.status)
        }))
    }
}

/// The last [`STDERR_TAIL_BYTES`] of a command's stderr, trimmed, on one line.
fn stderr_tail(stderr: &[u8]) -> String {
    let start = stderr.len().saturating_sub(STDERR_TAIL_BYTES);
    String::from_utf8_lossy(&stderr[start..])
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join(" | ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn launch(client_url: &str) -> EtcdLaunch {
        EtcdLaunch {
            name: "cp-4".into(),
            data_dir: "/var/lib/etcd".into(),
            peer_url: "http://127.0.0.1:1".into(),
            client_url: client_url.into(),
            listen_peer_url: None,
            listen_client_url: None,
            initial_cluster: "cp-4=http://127.0.0.1:1".into(),
            extra_env: vec![],
        }
    }

    #[tokio::test]
    async fn a_failing_start_command_fails_the_start_with_its_stderr() {
        let dir = tempfile::tempdir().unwrap();
        let mut launcher = EnvFileLauncher::new(
            dir.path().join("etcd.env"),
            vec![
                "/bin/sh".into(),
                "-c".into(),
                "echo starting >&2; echo 'unit etcd not found' >&2; exit 3".into(),
            ],
            Duration::from_secs(10),
        );
        let err = launcher
            .start(&launch("http://127.0.0.1:1"))
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(
            text.starts_with("etcd start command /bin/sh failed"),
            "{text}"
        );
        assert!(text.contains("unit etcd not found"), "{text}");
        assert!(text.contains("exit status: 3"), "{text}");
        // The file was written first, with the public mode.
        let mode = std::fs::metadata(dir.path().join("etcd.env"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o644);
    }

    #[tokio::test]
    async fn a_start_command_that_hangs_is_cut_off() {
        let dir = tempfile::tempdir().unwrap();
        let mut launcher = EnvFileLauncher::new(
            dir.path().join("etcd.env"),
            vec!["/bin/sleep".into(), "30".into()],
            Duration::from_millis(300),
        );
        let err = launcher
            .start(&launch("http://127.0.0.1:1"))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("did not finish within"), "{err}");
    }

    #[tokio::test]
    async fn without_an_answering_member_the_start_times_out_naming_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut launcher = EnvFileLauncher::new(
            dir.path().join("etcd.env"),
            vec![],
            Duration::from_millis(500),
        );
        let err = launcher
            .start(&launch(&format!("http://127.0.0.1:{port}")))
            .await
            .unwrap_err();
        let text = err.to_string();
        assert!(text.contains("did not answer"), "{text}");
        assert!(text.contains("etcd.env"), "{text}");
        // Stopping removes the file; nothing listens, so it returns at once.
        launcher.stop().await.unwrap();
        assert!(!dir.path().join("etcd.env").exists());
    }

    #[tokio::test]
    async fn stop_waits_for_the_port_to_close() {
        let dir = tempfile::tempdir().unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let mut launcher = EnvFileLauncher::new(
            dir.path().join("etcd.env"),
            vec![],
            Duration::from_millis(400),
        );
        launcher.set_local_member(&url, &ClientSettings::new(vec![url.clone()]));
        std::fs::write(dir.path().join("etcd.env"), "x").unwrap();
        let err = launcher.stop().await.unwrap_err();
        assert!(err.to_string().contains("still answers"), "{err}");
        assert!(!dir.path().join("etcd.env").exists());
        drop(listener);
        launcher.stop().await.unwrap();
    }

    #[test]
    fn the_stderr_tail_keeps_the_end_on_one_line() {
        let long = format!("{}\nlast words\n", "x".repeat(5000));
        let tail = stderr_tail(long.as_bytes());
        assert!(tail.ends_with("last words"), "{tail}");
        assert!(tail.len() <= STDERR_TAIL_BYTES + 3);
    }
}
