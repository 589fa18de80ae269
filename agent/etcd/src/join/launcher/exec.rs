//! The `exec` launcher: etcd as a child process of the agent, restarted when it exits.
//!
//! The child outlives an agent that dies or is restarted (a crash, a package upgrade,
//! `systemctl restart` with `KillMode=process`), on purpose: restarting a voter is a needless
//! disruption of the cluster. The next agent reads the pid file and *adopts* that etcd when it
//! is the one this configuration launches — the same binary with no arguments, run by the same
//! user, with exactly this configuration's `ETCD_*` environment (which names the data
//! directory) — and supervises it from `/proc` instead of starting another. Anything else that
//! holds the pid file's PID or this data directory is stopped first, so exactly one etcd runs
//! for the data directory.

use super::{EtcdLaunch, LaunchError};
use crate::join::state::write_atomically;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::process::Command;

/// Wait before restarting an etcd that exited.
const RESTART_BACKOFF: Duration = Duration::from_millis(500);
/// How often an adopted etcd (not our child: no `wait`) is checked for having exited.
const ADOPTED_POLL: Duration = Duration::from_millis(200);
/// How long a stopped etcd gets to exit after SIGTERM before SIGKILL.
const TERM_GRACE: Duration = Duration::from_secs(5);
/// How long to wait for the kernel to reap a killed etcd (and release its ports).
const KILL_WAIT: Duration = Duration::from_secs(2);

/// Runs etcd as a child process and restarts it when it exits, until stopped.
///
/// The running etcd's PID is written to `pid_file`; see the module documentation for how an
/// etcd left by an earlier agent is adopted or replaced.
#[derive(Debug)]
pub struct ExecLauncher {
    binary: PathBuf,
    pid_file: PathBuf,
    log_file: Option<PathBuf>,
    pub(super) data_dir: Option<PathBuf>,
    supervisor: Option<Supervisor>,
}

#[derive(Debug)]
struct Supervisor {
    stop: Arc<AtomicBool>,
    wake: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

/// The etcd a supervisor watches: its own child, or one adopted from an earlier agent.
#[derive(Debug)]
enum Running {
    Child(tokio::process::Child),
    Adopted(Process),
}

/// A process that is not our child, identified by PID and start time (so that a reused PID
/// is never mistaken for it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Process {
    pid: i32,
    start_time: u64,
}

impl Process {
    /// The process with `pid` as it is now, unless it is gone or a zombie.
    fn find(pid: i32) -> Option<Self> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The command name (field 2) is in parentheses and may hold spaces: fields after
        // the last ')' are the fixed ones, state first.
        let rest = stat.get(stat.rfind(')')? + 1..)?;
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields
            .first()
            .is_none_or(|state| *state == "Z" || *state == "X")
        {
            return None;
        }
        // starttime is field 22 of the line, the 20th after the state.
        let start_time = fields.get(19)?.parse().ok()?;
        Some(Self { pid, start_time })
    }

    fn alive(self) -> bool {
        Self::find(self.pid) == Some(self)
    }

    fn signal(self, signal: nix::sys::signal::Signal) {
        if self.alive() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(self.pid), signal);
        }
    }

    async fn wait_exit(self, within: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + within;
        while self.alive() {
            if tokio::time::Instant::now() >= deadline {
                return false;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        true
    }

    /// SIGTERM (etcd shuts down cleanly and hands over its leadership), then SIGKILL.
    async fn terminate(self) {
        self.signal(nix::sys::signal::Signal::SIGTERM);
        if !self.wait_exit(TERM_GRACE).await {
            self.signal(nix::sys::signal::Signal::SIGKILL);
            self.wait_exit(KILL_WAIT).await;
        }
    }
}

impl Running {
    fn pid(&self) -> Option<u32> {
        match self {
            Self::Child(child) => child.id(),
            Self::Adopted(p) => u32::try_from(p.pid).ok(),
        }
    }

    async fn exited(&mut self) {
        match self {
            Self::Child(child) => {
                let status = child.wait().await;
                tracing::warn!(status = ?status.ok(), "etcd child exited");
            }
            Self::Adopted(p) => {
                while p.alive() {
                    tokio::time::sleep(ADOPTED_POLL).await;
                }
                tracing::warn!(pid = p.pid, "adopted etcd exited");
            }
        }
    }

    async fn terminate(&mut self) {
        match self {
            Self::Child(child) => {
                if let Some(p) = child
                    .id()
                    .and_then(|pid| i32::try_from(pid).ok())
                    .and_then(Process::find)
                {
                    p.signal(nix::sys::signal::Signal::SIGTERM);
                    if tokio::time::timeout(TERM_GRACE, child.wait()).await.is_ok() {
                        return;
                    }
                }
                let _ = child.kill().await;
            }
            Self::Adopted(p) => p.terminate().await,
        }
    }
}

impl ExecLauncher {
    /// A launcher for `binary`, recording the running etcd's PID in `pid_file` and appending
    /// its output to `log_file` (or inheriting the agent's stderr).
    pub fn new(binary: PathBuf, pid_file: PathBuf, log_file: Option<PathBuf>) -> Self {
        Self {
            binary,
            pid_file,
            log_file,
            data_dir: None,
            supervisor: None,
        }
    }

    /// The PID of the running etcd, read from the pid file.
    pub fn pid(&self) -> Option<i32> {
        read_pid(&self.pid_file)
    }

    /// Starts etcd with `launch`, or adopts the one an earlier agent left running with the
    /// same configuration (idempotent: an etcd this launcher supervises keeps running).
    pub(super) async fn start(&mut self, launch: &EtcdLaunch) -> Result<(), LaunchError> {
        if self
            .supervisor
            .as_ref()
            .is_some_and(|s| !s.task.is_finished())
        {
            return Ok(());
        }
        self.data_dir = Some(launch.data_dir.clone());
        let running = match self.adopt_or_clear(launch).await {
            Some(process) => {
                tracing::info!(
                    pid = process.pid,
                    name = launch.name,
                    "etcd left running by an earlier agent adopted, not restarted"
                );
                Running::Adopted(process)
            }
            None => Running::Child(spawn(&self.binary, launch, self.log_file.as_deref())?),
        };
        record_pid(&self.pid_file, running.pid())?;
        self.supervisor = Some(self.supervise(running, launch));
        Ok(())
    }

    /// The etcd that the pid file names or that uses this data directory, if it is the one
    /// `launch` describes; every other one found is stopped, with the reason logged.
    async fn adopt_or_clear(&self, launch: &EtcdLaunch) -> Option<Process> {
        let mut adopted = None;
        for process in self.candidates(Some(&launch.data_dir)) {
            match (adopted, why_not_ours(process.pid, &self.binary, launch)) {
                (None, None) => adopted = Some(process),
                (_, why) => {
                    tracing::info!(
                        pid = process.pid,
                        reason = why.as_deref().unwrap_or("a second etcd for this data dir"),
                        "stopping etcd left by an earlier agent"
                    );
                    process.terminate().await;
                }
            }
        }
        adopted
    }

    /// Live etcd processes this launcher may have to answer for: the pid file's, then any
    /// other whose environment names the data directory (an agent killed between spawning
    /// etcd and writing the pid file leaves one the pid file does not name).
    fn candidates(&self, data_dir: Option<&Path>) -> Vec<Process> {
        let mut pids: Vec<i32> = read_pid(&self.pid_file)
            .filter(|&pid| is_etcd(pid))
            .into_iter()
            .collect();
        if let Some(dir) = data_dir {
            for pid in etcd_pids_using(dir) {
                if !pids.contains(&pid) {
                    pids.push(pid);
                }
            }
        }
        pids.into_iter().filter_map(Process::find).collect()
    }

    fn supervise(&self, mut running: Running, launch: &EtcdLaunch) -> Supervisor {
        let stop = Arc::new(AtomicBool::new(false));
        let wake = Arc::new(tokio::sync::Notify::new());
        let (binary, launch, log, pid_file) = (
            self.binary.clone(),
            launch.clone(),
            self.log_file.clone(),
            self.pid_file.clone(),
        );
        let (task_stop, task_wake) = (stop.clone(), wake.clone());
        let task = tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = running.exited() => {}
                    () = task_wake.notified() => {}
                }
                if task_stop.load(Ordering::SeqCst) {
                    running.terminate().await;
                    let _ = std::fs::remove_file(&pid_file);
                    return;
                }
                tokio::time::sleep(RESTART_BACKOFF).await;
                if task_stop.load(Ordering::SeqCst) {
                    return;
                }
                match spawn(&binary, &launch, log.as_deref()) {
                    Ok(child) => {
                        running = Running::Child(child);
                        if let Err(err) = record_pid(&pid_file, running.pid()) {
                            tracing::warn!(error = %err, "etcd pid file not updated");
                        }
                        tracing::info!(pid = running.pid(), "etcd restarted");
                    }
                    Err(err) => tracing::warn!(error = %err, "etcd restart failed"),
                }
            }
        });
        Supervisor { stop, wake, task }
    }

    /// Stops the supervised etcd (SIGTERM, then SIGKILL after 5 s) and the supervisor, and
    /// any etcd an earlier agent left for this data directory.
    pub async fn stop(&mut self) {
        if let Some(s) = self.supervisor.take() {
            s.stop.store(true, Ordering::SeqCst);
            s.wake.notify_one();
            let _ = s.task.await;
        }
        for process in self.candidates(self.data_dir.as_deref()) {
            tracing::info!(pid = process.pid, "stopping etcd left by an earlier agent");
            process.terminate().await;
        }
        let _ = std::fs::remove_file(&self.pid_file);
    }

    /// Forgets the running etcd without stopping it, as an agent killed with SIGKILL would.
    /// Only for tests of the resume path.
    #[doc(hidden)]
    pub fn abandon(&mut self) {
        if let Some(s) = self.supervisor.take() {
            s.task.abort();
        }
    }
}

/// Why the process `pid` is not the etcd that `binary` with `launch` runs, or `None` when it
/// is: the command line is the binary alone, it runs as this agent's user, and its `ETCD_*`
/// environment is exactly `launch`'s (a changed configuration needs a restart to apply).
fn why_not_ours(pid: i32, binary: &Path, launch: &EtcdLaunch) -> Option<String> {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return Some("its command line cannot be read".into());
    };
    let args: Vec<&[u8]> = cmdline
        .split(|b| *b == 0)
        .filter(|a| !a.is_empty())
        .collect();
    if args != [binary.as_os_str().as_encoded_bytes()] {
        return Some(format!(
            "its command line is not {} alone",
            binary.display()
        ));
    }
    let owner = |path: &str| std::fs::metadata(path).map(|m| m.uid()).ok();
    if owner(&format!("/proc/{pid}")).is_none()
        || owner(&format!("/proc/{pid}")) != owner("/proc/self")
    {
        return Some("it runs as another user".into());
    }
    let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return Some("its environment cannot be read".into());
    };
    let mut theirs: Vec<&[u8]> = environ
        .split(|b| *b == 0)
        .filter(|var| var.starts_with(b"ETCD_"))
        .collect();
    let ours_owned: Vec<String> = launch
        .env()
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    let mut ours: Vec<&[u8]> = ours_owned.iter().map(String::as_bytes).collect();
    theirs.sort_unstable();
    ours.sort_unstable();
    (theirs != ours).then(|| "its ETCD_* configuration differs from this one".into())
}

fn spawn(
    binary: &Path,
    launch: &EtcdLaunch,
    log: Option<&Path>,
) -> Result<tokio::process::Child, LaunchError> {
    let spawn_err = |source| LaunchError::Spawn {
        binary: binary.to_owned(),
        source,
    };
    let mut command = Command::new(binary);
    command
        .env_clear()
        .envs(launch.env())
        .stdin(std::process::Stdio::null());
    if let Some(path) = std::env::var_os("PATH") {
        command.env("PATH", path);
    }
    if let Some(log) = log {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(spawn_err)?;
        let err = file.try_clone().map_err(spawn_err)?;
        command.stdout(file).stderr(err);
    }
    // The child outlives a killed agent on purpose: the next agent adopts it by PID.
    command.kill_on_drop(false);
    let child = command.spawn().map_err(spawn_err)?;
    tracing::info!(pid = child.id(), name = launch.name, "etcd child started");
    Ok(child)
}

fn record_pid(pid_file: &Path, pid: Option<u32>) -> Result<(), LaunchError> {
    let content = pid.map(|p| p.to_string()).unwrap_or_default();
    write_atomically(pid_file, content.as_bytes()).map_err(|source| LaunchError::PidFile {
        path: pid_file.to_owned(),
        source,
    })
}

fn read_pid(pid_file: &Path) -> Option<i32> {
    std::fs::read_to_string(pid_file).ok()?.trim().parse().ok()
}

fn is_etcd(pid: i32) -> bool {
    std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| {
        c.split(|b| *b == 0)
            .next()
            .is_some_and(|arg0| arg0.ends_with(b"etcd"))
    })
}

/// The etcd processes whose environment names `data_dir` as `ETCD_DATA_DIR`.
fn etcd_pids_using(data_dir: &Path) -> Vec<i32> {
    let want = format!("ETCD_DATA_DIR={}", data_dir.display()).into_bytes();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<i32>().ok())
        .filter(|&pid| pid != i32::try_from(std::process::id()).unwrap_or(0) && is_etcd(pid))
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/environ"))
                .is_ok_and(|env| env.split(|b| *b == 0).any(|var| var == want.as_slice()))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(data_dir: &Path) -> EtcdLaunch {
        EtcdLaunch {
            name: "cp-9".into(),
            data_dir: data_dir.to_owned(),
            peer_url: "http://127.0.0.1:1".into(),
            client_url: "http://127.0.0.1:2".into(),
            listen_peer_url: None,
            listen_client_url: None,
            initial_cluster: "cp-9=http://127.0.0.1:1".into(),
            extra_env: vec![],
        }
    }

    #[test]
    fn a_process_is_found_by_pid_and_start_time() {
        let me = Process::find(i32::try_from(std::process::id()).unwrap()).unwrap();
        assert!(me.alive());
        let reused = Process {
            start_time: me.start_time + 1,
            ..me
        };
        assert!(!reused.alive(), "a reused PID is another process");
    }

    #[test]
    fn a_process_with_another_configuration_is_not_ours() {
        let dir = tempfile::tempdir().unwrap();
        let me = i32::try_from(std::process::id()).unwrap();
        let why = why_not_ours(me, &dir.path().join("etcd"), &launch(dir.path())).unwrap();
        assert!(why.contains("command line"), "{why}");
    }
}
