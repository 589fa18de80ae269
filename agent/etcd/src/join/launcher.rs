//! Starting the local etcd: as a supervised child process (`exec`), as a systemd unit fed
//! by an EnvironmentFile (`systemd`), by whoever runs the host from an environment file the
//! agent writes (`env-file`, see [`EnvFileLauncher`] for that contract), or by the kubelet from
//! a static Pod manifest in kubeadm's layout (`static-pod`, see [`StaticPodLauncher`]). The
//! first three pass the configuration as etcd's own `ETCD_*` environment variables, rendered
//! once by [`EtcdLaunch::env`]; the static Pod passes the same settings as flags.

mod env_file;
mod local;
pub mod static_pod;

pub use env_file::{DEFAULT_START_TIMEOUT, EnvFileLauncher};
pub use static_pod::StaticPodLauncher;

use crate::client::ClientSettings;
use crate::join::state::{write_atomically, write_atomically_with_mode};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;
use tokio::process::Command;

/// Wait before restarting an etcd child that exited.
const RESTART_BACKOFF: Duration = Duration::from_millis(500);
/// Deadline of `systemctl start`.
const SYSTEMCTL_TIMEOUT: Duration = Duration::from_secs(90);

/// The local etcd's configuration for joining an existing cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdLaunch {
    /// Member name.
    pub name: String,
    /// Data directory.
    pub data_dir: PathBuf,
    /// Advertised peer URL (the one added to the cluster).
    pub peer_url: String,
    /// Advertised client URL.
    pub client_url: String,
    /// Peer listen URL (defaults to the peer URL).
    pub listen_peer_url: Option<String>,
    /// Client listen URL (defaults to the client URL).
    pub listen_client_url: Option<String>,
    /// `--initial-cluster`, built by the join flow.
    pub initial_cluster: String,
    /// Further `ETCD_*` variables (TLS files, tuning), passed through unchanged.
    pub extra_env: Vec<(String, String)>,
}

impl EtcdLaunch {
    /// The `ETCD_*` environment for this configuration, always with
    /// `ETCD_INITIAL_CLUSTER_STATE=existing`.
    pub fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            ("ETCD_NAME".to_owned(), self.name.clone()),
            (
                "ETCD_DATA_DIR".to_owned(),
                self.data_dir.display().to_string(),
            ),
            (
                "ETCD_INITIAL_ADVERTISE_PEER_URLS".to_owned(),
                self.peer_url.clone(),
            ),
            (
                "ETCD_LISTEN_PEER_URLS".to_owned(),
                self.listen_peer_url
                    .clone()
                    .unwrap_or_else(|| self.peer_url.clone()),
            ),
            (
                "ETCD_ADVERTISE_CLIENT_URLS".to_owned(),
                self.client_url.clone(),
            ),
            (
                "ETCD_LISTEN_CLIENT_URLS".to_owned(),
                self.listen_client_url
                    .clone()
                    .unwrap_or_else(|| self.client_url.clone()),
            ),
            (
                "ETCD_INITIAL_CLUSTER".to_owned(),
                self.initial_cluster.clone(),
            ),
            (
                "ETCD_INITIAL_CLUSTER_STATE".to_owned(),
                "existing".to_owned(),
            ),
        ];
        env.extend(self.extra_env.iter().cloned());
        env
    }
}

/// Renders a systemd EnvironmentFile: one `KEY="value"` line each, with `\`, `"` and `$`
/// escaped so systemd reads the value back unchanged.
pub fn render_environment_file(env: &[(String, String)]) -> String {
    let mut out = String::from("# written by metalguard-agent etcd join; do not edit\n");
    for (key, value) in env {
        let escaped = value
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('$', "\\$");
        let _ = writeln!(out, "{key}=\"{escaped}\"");
    }
    out
}

/// Errors of the launchers.
#[derive(Debug, thiserror::Error)]
pub enum LaunchError {
    /// etcd could not be spawned.
    #[error("starting etcd binary {binary} failed")]
    Spawn {
        /// The binary.
        binary: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The EnvironmentFile could not be written.
    #[error("writing etcd environment file {path} failed")]
    EnvFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// `systemctl` failed or did not finish.
    #[error("systemctl {action} {unit} failed: {detail}")]
    Systemctl {
        /// start or stop.
        action: &'static str,
        /// The unit.
        unit: String,
        /// Exit status or timeout.
        detail: String,
    },
    /// The env-file launcher's start command failed or did not finish.
    #[error("etcd start command {program} failed: {detail}")]
    StartCommand {
        /// The program.
        program: String,
        /// Exit status and the tail of its stderr, or why it did not run.
        detail: String,
    },
    /// The local member did not answer after its environment file was written.
    #[error(
        "local etcd did not answer on {client_url} within {timeout:?} after {env_file} was written: is the host's supervisor starting etcd from that file?"
    )]
    NotAnswering {
        /// The member's advertised client URL.
        client_url: String,
        /// The environment file.
        env_file: PathBuf,
        /// How long we waited.
        timeout: Duration,
    },
    /// The local member kept answering after its environment file was removed.
    #[error(
        "local etcd still answers on {client_url} {timeout:?} after {env_file} was removed: the host's supervisor must stop etcd when that file disappears"
    )]
    StillRunning {
        /// The member's advertised client URL.
        client_url: String,
        /// The environment file.
        env_file: PathBuf,
        /// How long we waited.
        timeout: Duration,
    },
    /// The static Pod manifest could not be read, written or moved aside.
    #[error("{action} etcd static pod manifest {path} failed")]
    ManifestFile {
        /// reading, writing, moving aside.
        action: &'static str,
        /// The manifest.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The template manifest could not be read.
    #[error("reading etcd static pod template {path} failed")]
    TemplateFile {
        /// The template.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The template manifest is not an etcd static Pod with an image.
    #[error("etcd static pod template {path} cannot be used")]
    Template {
        /// The template.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: static_pod::manifest::ManifestError,
    },
    /// The manifest could not be rendered.
    #[error("etcd static pod manifest could not be rendered")]
    Render(#[source] static_pod::manifest::ManifestError),
    /// A manifest the agent did not write, for another member, is in the way.
    #[error(
        "etcd static pod manifest {path} was not written by metalguard-agent and does not run this member ({detail}): it is left alone; move it away, or set overwrite_foreign_manifest"
    )]
    ForeignManifest {
        /// The manifest.
        path: PathBuf,
        /// What it is.
        detail: String,
    },
    /// The local member did not answer after its manifest was put in place.
    #[error(
        "local etcd did not answer on {client_url} within {timeout:?} after {manifest} was put in place: is the kubelet running static pods from that directory?"
    )]
    PodNotAnswering {
        /// The member's advertised client URL.
        client_url: String,
        /// The manifest.
        manifest: PathBuf,
        /// How long we waited.
        timeout: Duration,
    },
    /// The local member kept answering after its manifest was moved aside.
    #[error(
        "local etcd still answers on {client_url} {timeout:?} after {manifest} was moved aside: the kubelet must stop a static pod whose manifest is gone"
    )]
    PodStillRunning {
        /// The member's advertised client URL.
        client_url: String,
        /// The manifest.
        manifest: PathBuf,
        /// How long we waited.
        timeout: Duration,
    },
    /// The pid file could not be written.
    #[error("writing etcd pid file {path} failed")]
    PidFile {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
}

/// How the local etcd is run.
#[derive(Debug)]
pub enum Launcher {
    /// As a child process the agent supervises.
    Exec(ExecLauncher),
    /// As a systemd unit reading an EnvironmentFile.
    Systemd(SystemdLauncher),
    /// By the host's supervisor, from an environment file the agent writes.
    EnvFile(EnvFileLauncher),
    /// By the kubelet, from a static Pod manifest the agent writes.
    StaticPod(StaticPodLauncher),
}

impl Launcher {
    /// Starts etcd with `launch` (idempotent: an etcd already started by us keeps running).
    pub async fn start(&mut self, launch: &EtcdLaunch) -> Result<(), LaunchError> {
        match self {
            Self::Exec(l) => l.start(launch),
            Self::Systemd(l) => l.start(launch).await,
            Self::EnvFile(l) => l.start(launch).await,
            Self::StaticPod(l) => l.start(launch).await,
        }
    }

    /// Checks what can be checked before a learner is added, so that no learner is added that
    /// this host cannot start (the static Pod launcher: template, image, a foreign manifest in
    /// the way).
    pub fn preflight(&self) -> Result<(), LaunchError> {
        match self {
            Self::StaticPod(l) => l.preflight(),
            Self::Exec(_) | Self::Systemd(_) | Self::EnvFile(_) => Ok(()),
        }
    }

    /// Tells the launcher how to reach the local member (and which peer URL is its identity),
    /// for launchers that wait for it to answer (or to go away) instead of starting it
    /// themselves.
    pub fn set_local_member(
        &mut self,
        client_url: &str,
        peer_url: &str,
        settings: &ClientSettings,
    ) {
        match self {
            Self::EnvFile(l) => l.set_local_member(client_url, settings),
            Self::StaticPod(l) => l.set_local_member(client_url, peer_url, settings),
            Self::Exec(_) | Self::Systemd(_) => {}
        }
    }

    /// A short name of the launcher, for logs and timelines.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Exec(_) => "exec",
            Self::Systemd(_) => "systemd",
            Self::EnvFile(_) => "env-file",
            Self::StaticPod(_) => "static-pod",
        }
    }

    /// Tells the launcher which data directory its etcd uses, so that an etcd left by an
    /// earlier agent can be found even when the pid file does not name it.
    pub fn set_data_dir(&mut self, data_dir: &Path) {
        if let Self::Exec(l) = self {
            l.data_dir = Some(data_dir.to_owned());
        }
    }

    /// Stops etcd (before wiping its data directory).
    pub async fn stop(&mut self) -> Result<(), LaunchError> {
        match self {
            Self::Exec(l) => {
                l.stop().await;
                Ok(())
            }
            Self::Systemd(l) => l.stop().await,
            Self::EnvFile(l) => l.stop().await,
            Self::StaticPod(l) => l.stop().await,
        }
    }
}

/// Runs etcd as a child process and restarts it when it exits, until stopped.
///
/// The child's PID is written to `pid_file`. An agent that died (SIGKILL) leaves its child
/// running; the next agent finds the PID there and stops that orphan before starting its own,
/// so exactly one etcd runs for the data directory.
#[derive(Debug)]
pub struct ExecLauncher {
    binary: PathBuf,
    pid_file: PathBuf,
    log_file: Option<PathBuf>,
    data_dir: Option<PathBuf>,
    supervisor: Option<Supervisor>,
}

#[derive(Debug)]
struct Supervisor {
    stop: Arc<AtomicBool>,
    wake: Arc<tokio::sync::Notify>,
    task: tokio::task::JoinHandle<()>,
}

impl ExecLauncher {
    /// A launcher for `binary`, recording the child's PID in `pid_file` and appending its
    /// output to `log_file` (or inheriting the agent's stderr).
    pub fn new(binary: PathBuf, pid_file: PathBuf, log_file: Option<PathBuf>) -> Self {
        Self {
            binary,
            pid_file,
            log_file,
            data_dir: None,
            supervisor: None,
        }
    }

    /// The PID of the running child, read from the pid file.
    pub fn pid(&self) -> Option<i32> {
        read_pid(&self.pid_file)
    }

    fn start(&mut self, launch: &EtcdLaunch) -> Result<(), LaunchError> {
        if self
            .supervisor
            .as_ref()
            .is_some_and(|s| !s.task.is_finished())
        {
            return Ok(());
        }
        stop_orphan(&self.pid_file, Some(&launch.data_dir));
        self.data_dir = Some(launch.data_dir.clone());
        let mut child = spawn(&self.binary, launch, self.log_file.as_deref())?;
        record_pid(&self.pid_file, child.id())?;
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
                    status = child.wait() => {
                        tracing::warn!(status = ?status.ok(), "etcd child exited");
                    }
                    () = task_wake.notified() => {}
                }
                if task_stop.load(Ordering::SeqCst) {
                    terminate(&mut child).await;
                    let _ = std::fs::remove_file(&pid_file);
                    return;
                }
                tokio::time::sleep(RESTART_BACKOFF).await;
                if task_stop.load(Ordering::SeqCst) {
                    return;
                }
                match spawn(&binary, &launch, log.as_deref()) {
                    Ok(new) => {
                        child = new;
                        if let Err(err) = record_pid(&pid_file, child.id()) {
                            tracing::warn!(error = %err, "etcd pid file not updated");
                        }
                        tracing::info!(pid = child.id(), "etcd child restarted");
                    }
                    Err(err) => tracing::warn!(error = %err, "etcd child restart failed"),
                }
            }
        });
        self.supervisor = Some(Supervisor { stop, wake, task });
        Ok(())
    }

    /// Stops the supervised child (SIGTERM, then SIGKILL after 5 s) and the supervisor.
    pub async fn stop(&mut self) {
        if let Some(s) = self.supervisor.take() {
            s.stop.store(true, Ordering::SeqCst);
            s.wake.notify_one();
            let _ = s.task.await;
        }
        stop_orphan(&self.pid_file, self.data_dir.as_deref());
    }

    /// Forgets the child without stopping it, as an agent killed with SIGKILL would.
    /// Only for tests of the resume path.
    #[doc(hidden)]
    pub fn abandon(&mut self) {
        if let Some(s) = self.supervisor.take() {
            s.task.abort();
        }
    }
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

async fn terminate(child: &mut tokio::process::Child) {
    if let Some(pid) = child.id().and_then(|p| i32::try_from(p).ok()) {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGTERM,
        );
        if tokio::time::timeout(Duration::from_secs(5), child.wait())
            .await
            .is_ok()
        {
            return;
        }
    }
    let _ = child.kill().await;
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

/// Stops an etcd left running by an earlier agent, if the pid file names a live etcd.
fn stop_orphan(pid_file: &Path, data_dir: Option<&Path>) {
    let mut pids: Vec<i32> = read_pid(pid_file)
        .filter(|&pid| is_etcd(pid))
        .into_iter()
        .collect();
    // An agent killed between spawning etcd and writing the pid file leaves an etcd the pid
    // file does not name: find it by its data directory in its environment.
    if let Some(dir) = data_dir {
        for pid in etcd_pids_using(dir) {
            if !pids.contains(&pid) {
                pids.push(pid);
            }
        }
    }
    for pid in pids {
        let pid = nix::unistd::Pid::from_raw(pid);
        tracing::info!(pid = pid.as_raw(), "stopping etcd left by an earlier agent");
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
        // Wait for the kernel to release its ports (the orphan is not our child: poll /proc).
        for _ in 0..100 {
            let alive = std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw()))
                .is_ok_and(|s| s.split_whitespace().nth(2).is_none_or(|state| state != "Z"));
            if !alive {
                break;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    let _ = std::fs::remove_file(pid_file);
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

/// Runs etcd as a systemd unit whose `EnvironmentFile=` is written here.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SystemdLauncher {
    /// The unit, e.g. `etcd.service`.
    pub unit: String,
    /// The EnvironmentFile the unit reads.
    pub env_file: PathBuf,
    /// The systemctl binary.
    pub systemctl: PathBuf,
}

impl SystemdLauncher {
    /// Writes the EnvironmentFile (mode 0600: it may name key files).
    pub fn write_env_file(&self, launch: &EtcdLaunch) -> Result<(), LaunchError> {
        write_atomically_with_mode(
            &self.env_file,
            render_environment_file(&launch.env()).as_bytes(),
            0o600,
        )
        .map_err(|source| LaunchError::EnvFile {
            path: self.env_file.clone(),
            source,
        })
    }

    async fn start(&self, launch: &EtcdLaunch) -> Result<(), LaunchError> {
        self.write_env_file(launch)?;
        self.systemctl("start").await
    }

    async fn stop(&self) -> Result<(), LaunchError> {
        self.systemctl("stop").await
    }

    async fn systemctl(&self, action: &'static str) -> Result<(), LaunchError> {
        let fail = |detail: String| LaunchError::Systemctl {
            action,
            unit: self.unit.clone(),
            detail,
        };
        let mut command = Command::new(&self.systemctl);
        command.arg(action).arg(&self.unit).kill_on_drop(true);
        match tokio::time::timeout(SYSTEMCTL_TIMEOUT, command.status()).await {
            Ok(Ok(status)) if status.success() => Ok(()),
            Ok(Ok(status)) => Err(fail(status.to_string())),
            Ok(Err(e)) => Err(fail(e.to_string())),
            Err(_) => Err(fail(format!("no answer within {SYSTEMCTL_TIMEOUT:?}"))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch() -> EtcdLaunch {
        EtcdLaunch {
            name: "cp-4".into(),
            data_dir: "/var/lib/etcd".into(),
            peer_url: "https://10.0.0.4:2380".into(),
            client_url: "https://10.0.0.4:2379".into(),
            listen_peer_url: None,
            listen_client_url: Some("https://0.0.0.0:2379".into()),
            initial_cluster: "cp-1=https://10.0.0.1:2380,cp-4=https://10.0.0.4:2380".into(),
            extra_env: vec![(
                "ETCD_CERT_FILE".into(),
                "/etc/etcd/\"odd\" $name.pem".into(),
            )],
        }
    }

    #[test]
    fn environment_file_lists_the_join_configuration() {
        let text = render_environment_file(&launch().env());
        let expected = "# written by metalguard-agent etcd join; do not edit\n\
            ETCD_NAME=\"cp-4\"\n\
            ETCD_DATA_DIR=\"/var/lib/etcd\"\n\
            ETCD_INITIAL_ADVERTISE_PEER_URLS=\"https://10.0.0.4:2380\"\n\
            ETCD_LISTEN_PEER_URLS=\"https://10.0.0.4:2380\"\n\
            ETCD_ADVERTISE_CLIENT_URLS=\"https://10.0.0.4:2379\"\n\
            ETCD_LISTEN_CLIENT_URLS=\"https://0.0.0.0:2379\"\n\
            ETCD_INITIAL_CLUSTER=\"cp-1=https://10.0.0.1:2380,cp-4=https://10.0.0.4:2380\"\n\
            ETCD_INITIAL_CLUSTER_STATE=\"existing\"\n\
            ETCD_CERT_FILE=\"/etc/etcd/\\\"odd\\\" \\$name.pem\"\n";
        assert_eq!(text, expected);
    }

    #[tokio::test]
    async fn systemd_launcher_writes_a_private_env_file_and_runs_systemctl() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        // A fake systemctl that records its arguments: systemd is not PID 1 here.
        let fake = dir.path().join("systemctl");
        let record = dir.path().join("calls");
        std::fs::write(
            &fake,
            format!("#!/bin/sh\necho \"$@\" >> {}\n", record.display()),
        )
        .unwrap();
        std::fs::set_permissions(&fake, std::fs::Permissions::from_mode(0o755)).unwrap();
        let mut launcher = Launcher::Systemd(SystemdLauncher {
            unit: "etcd-member.service".into(),
            env_file: dir.path().join("etc/etcd.env"),
            systemctl: fake,
        });
        launcher.start(&launch()).await.unwrap();
        let env = std::fs::read_to_string(dir.path().join("etc/etcd.env")).unwrap();
        assert!(env.contains("ETCD_INITIAL_CLUSTER_STATE=\"existing\"\n"));
        let mode = std::fs::metadata(dir.path().join("etc/etcd.env"))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        launcher.stop().await.unwrap();
        assert_eq!(
            std::fs::read_to_string(record).unwrap(),
            "start etcd-member.service\nstop etcd-member.service\n"
        );
    }

    #[tokio::test]
    async fn failing_systemctl_is_reported() {
        let dir = tempfile::tempdir().unwrap();
        let launcher = SystemdLauncher {
            unit: "etcd.service".into(),
            env_file: dir.path().join("etcd.env"),
            systemctl: "/bin/false".into(),
        };
        let err = launcher.start(&launch()).await.unwrap_err();
        assert!(
            err.to_string()
                .starts_with("systemctl start etcd.service failed"),
            "{err}"
        );
    }
}
