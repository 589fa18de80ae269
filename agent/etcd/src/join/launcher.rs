//! Starting the local etcd: as a supervised child process (`exec`), as a systemd unit fed
//! by an EnvironmentFile (`systemd`), by whoever runs the host from an environment file the
//! agent writes (`env-file`, see [`EnvFileLauncher`] for that contract), or by the kubelet from
//! a static Pod manifest in kubeadm's layout (`static-pod`, see [`StaticPodLauncher`]). The
//! first three pass the configuration as etcd's own `ETCD_*` environment variables, rendered
//! once by [`EtcdLaunch::env`]; the static Pod passes the same settings as flags.

mod env_file;
mod exec;
mod local;
pub mod static_pod;

pub use env_file::{DEFAULT_START_TIMEOUT, EnvFileLauncher};
pub use exec::ExecLauncher;
pub use static_pod::StaticPodLauncher;

use crate::client::ClientSettings;
use crate::join::state::write_atomically_with_mode;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::Command;

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
            Self::Exec(l) => l.start(launch).await,
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
