//! Child processes that die with their handle.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::{HarnessError, Result};

/// A running child process whose stdout and stderr go to a log file. Dropping it kills it
/// (SIGKILL, then reaps it), so nothing outlives its test.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Option<Child>,
    log: PathBuf,
}

impl Proc {
    /// Spawns `command` with stdin closed and output appended to `log`.
    pub fn spawn(name: impl Into<String>, mut command: Command, log: &Path) -> Result<Self> {
        let name = name.into();
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .map_err(HarnessError::io(format!(
                "opening log {} of {name}",
                log.display()
            )))?;
        let err = out.try_clone().map_err(HarnessError::io(format!(
            "duplicating log handle of {name}"
        )))?;
        let child = command
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .spawn()
            .map_err(HarnessError::io(format!("starting {name}")))?;
        Ok(Self {
            name,
            child: Some(child),
            log: log.to_path_buf(),
        })
    }

    /// The process id, if it has not been killed.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// The process name used in messages.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The log file.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// Sends `signal` to the process.
    pub fn signal(&self, signal: Signal) -> Result<()> {
        let pid = self
            .pid()
            .ok_or_else(|| HarnessError::Other(format!("{} is not running", self.name)))?;
        let pid = i32::try_from(pid).map_err(|_| HarnessError::Other(format!("pid {pid}")))?;
        kill(Pid::from_raw(pid), signal).map_err(|errno| HarnessError::Io {
            context: format!("sending {signal} to {}", self.name),
            source: std::io::Error::from(errno),
        })
    }

    /// Freezes the process (SIGSTOP): it keeps its sockets open and answers nothing. Returns
    /// once every thread has stopped: the signal is delivered asynchronously, and a busy
    /// machine let a just-frozen etcd answer one more `/health` (seen on 2 shared cores).
    pub fn freeze(&self) -> Result<()> {
        self.signal(Signal::SIGSTOP)?;
        let Some(pid) = self.pid() else {
            return Ok(());
        };
        let deadline = Instant::now() + STOP_WAIT;
        while !all_threads_stopped(pid) {
            if Instant::now() >= deadline {
                return Err(HarnessError::Other(format!(
                    "{} did not stop within {STOP_WAIT:?} of SIGSTOP",
                    self.name
                )));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
        Ok(())
    }

    /// Thaws a frozen process (SIGCONT).
    pub fn thaw(&self) -> Result<()> {
        self.signal(Signal::SIGCONT)
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        self.child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }

    /// How the process ended, once it has (reaped here); `None` while it runs or after
    /// [`Proc::kill`].
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child
            .as_mut()
            .and_then(|c| c.try_wait().ok().flatten())
    }

    /// Fails with the log tail if the process has exited.
    pub fn ensure_running(&mut self) -> Result<()> {
        if self.is_running() {
            Ok(())
        } else {
            Err(HarnessError::Exited {
                name: self.name.clone(),
                log: self.log.clone(),
                tail: self.log_tail(20),
            })
        }
    }

    /// Kills the process (SIGKILL, which also ends a frozen process) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Asks the process to stop (SIGTERM) and waits up to `grace`, then kills it.
    pub fn terminate(&mut self, grace: Duration) {
        if self.signal(Signal::SIGTERM).is_ok() {
            let deadline = Instant::now() + grace;
            while Instant::now() < deadline {
                if !self.is_running() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        self.kill();
    }

    /// The last `lines` lines of the log, for error messages.
    pub fn log_tail(&self, lines: usize) -> String {
        tail_of(&self.log, lines)
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of a file (reads at most its last 64 KiB).
pub fn tail_of(path: &Path, lines: usize) -> String {
    let Ok(mut file) = File::open(path) else {
        return String::new();
    };
    let len = file.metadata().map_or(0, |m| m.len());
    let _ = file.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut text = String::new();
    let _ = file.read_to_string(&mut text);
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Runs `command` to completion with `input` on stdin, returning stdout; fails with stderr.
/// `display` names the command in errors (never include secrets in it).
pub fn run_capture(mut command: Command, input: Option<&[u8]>, display: &str) -> Result<String> {
    use std::io::Write;
    let mut child = command
        .stdin(if input.is_some() {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(HarnessError::io(format!("starting {display}")))?;
    if let (Some(bytes), Some(mut stdin)) = (input, child.stdin.take()) {
        stdin
            .write_all(bytes)
            .map_err(HarnessError::io(format!("writing stdin of {display}")))?;
    }
    let output = child
        .wait_with_output()
        .map_err(HarnessError::io(format!("waiting for {display}")))?;
    if output.status.success() {
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    } else {
        Err(HarnessError::Command {
            command: display.to_owned(),
            detail: format!(
                "{}: {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            ),
        })
    }
}

/// Polls `check` every 50 ms until it returns `Ok(true)` or `timeout` passes.
pub fn wait_until(
    what: &str,
    timeout: Duration,
    mut check: impl FnMut() -> Result<bool>,
) -> Result<()> {
    let deadline = Instant::now() + timeout;
    loop {
        if check()? {
            return Ok(());
        }
        if Instant::now() >= deadline {
            return Err(HarnessError::Timeout {
                what: what.to_owned(),
                after: timeout,
            });
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// How long [`Proc::freeze`] waits for every thread to stop.
const STOP_WAIT: Duration = Duration::from_secs(2);

/// Whether every thread of `pid` is stopped (or the process is gone): the state field of
/// `/proc/PID/task/TID/stat` is `T` (or `t`, `Z`, `X`).
fn all_threads_stopped(pid: u32) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return true;
    };
    tasks.flatten().all(|task| {
        std::fs::read_to_string(task.path().join("stat")).map_or(true, |stat| {
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.trim_start().chars().next())
                .is_none_or(|state| matches!(state, 'T' | 't' | 'Z' | 'X'))
        })
    })
}
