//! This host's etcd join settings, shared by `metalguard-agent etcd join` (command-line
//! arguments) and the daemon's join go-ahead (`[etcd.join]` in `agent.toml`): both describe
//! the join as a [`JoinSetup`], which builds the library's [`JoinConfig`] and [`Launcher`].

use std::path::{Path, PathBuf};
use std::time::Duration;

use metalguard_etcd::ClientSettings;
use metalguard_etcd::join::JoinConfig;
use metalguard_etcd::join::launcher::static_pod::manifest::PodSettings;
use metalguard_etcd::join::launcher::{
    EnvFileLauncher, ExecLauncher, Launcher, StaticPodLauncher, SystemdLauncher,
};
use metalguard_etcd::ops;

use crate::config::{
    DEFAULT_ETCD_BINARY, DEFAULT_ETCD_UNIT, DEFAULT_JOIN_START_TIMEOUT,
    DEFAULT_STATIC_POD_MANIFEST, DEFAULT_STATIC_POD_PKI_DIR, DEFAULT_SYSTEMD_ENV_FILE, EtcdConfig,
};

/// How the local etcd is run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LauncherKind {
    /// The agent runs etcd as a child process and restarts it when it exits.
    Exec,
    /// The agent writes an EnvironmentFile and runs `systemctl start UNIT`.
    Systemd,
    /// The agent writes an environment file; the host's supervisor starts etcd from it while
    /// the file exists and stops it when the file is removed.
    EnvFile,
    /// The agent writes etcd's static Pod manifest in kubeadm's layout; the kubelet runs it.
    StaticPod,
}

impl LauncherKind {
    /// The name as `launcher = "…"` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Self::Exec => "exec",
            Self::Systemd => "systemd",
            Self::EnvFile => "env-file",
            Self::StaticPod => "static-pod",
        }
    }
}

/// The launcher with its settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LauncherChoice {
    /// A supervised child process.
    Exec {
        /// The etcd binary.
        binary: PathBuf,
    },
    /// A systemd unit reading an EnvironmentFile.
    Systemd {
        /// The unit.
        unit: String,
        /// The EnvironmentFile the unit reads.
        env_file: PathBuf,
    },
    /// An environment file for the host's supervisor.
    EnvFile {
        /// The file.
        env_file: PathBuf,
        /// Run after writing the file (argv, no shell); empty for none.
        start_command: Vec<String>,
        /// Deadline of the start command and of the member answering.
        start_timeout: Duration,
    },
    /// A static Pod manifest for the kubelet.
    StaticPod {
        /// The manifest.
        manifest: PathBuf,
        /// An existing member's manifest to take the image and further flags from.
        template: Option<PathBuf>,
        /// Image and certificate directory.
        pod: PodSettings,
        /// Replace a manifest the agent did not write.
        overwrite_foreign: bool,
        /// Deadline of the member answering.
        start_timeout: Duration,
    },
}

impl LauncherChoice {
    /// Which kind of launcher this is.
    pub fn kind(&self) -> LauncherKind {
        match self {
            Self::Exec { .. } => LauncherKind::Exec,
            Self::Systemd { .. } => LauncherKind::Systemd,
            Self::EnvFile { .. } => LauncherKind::EnvFile,
            Self::StaticPod { .. } => LauncherKind::StaticPod,
        }
    }
}

/// Everything this host needs to join etcd as a learner: the library's join configuration
/// and how etcd is run.
#[derive(Debug, Clone)]
pub struct JoinSetup {
    /// The join configuration (with the client settings to reach the cluster).
    pub config: JoinConfig,
    /// How etcd is run.
    pub launcher: LauncherChoice,
}

impl JoinSetup {
    /// The setup `[etcd.join]` describes (after validation), reaching the cluster with
    /// `client`, or `None` without that table. The daemon never promotes by itself: the
    /// controller does.
    pub fn from_config(etcd: &EtcdConfig, client: ClientSettings) -> Option<Self> {
        let join = etcd.join.as_ref()?;
        let launcher = match join.launcher {
            LauncherKind::Exec => LauncherChoice::Exec {
                binary: join
                    .etcd_binary
                    .clone()
                    .unwrap_or_else(|| DEFAULT_ETCD_BINARY.into()),
            },
            LauncherKind::Systemd => LauncherChoice::Systemd {
                unit: join
                    .unit
                    .clone()
                    .unwrap_or_else(|| DEFAULT_ETCD_UNIT.to_owned()),
                env_file: join
                    .env_file
                    .clone()
                    .unwrap_or_else(|| DEFAULT_SYSTEMD_ENV_FILE.into()),
            },
            LauncherKind::EnvFile => LauncherChoice::EnvFile {
                env_file: join.env_file.clone()?,
                start_command: join.start_command.clone().unwrap_or_default(),
                start_timeout: join.start_timeout.unwrap_or(DEFAULT_JOIN_START_TIMEOUT),
            },
            LauncherKind::StaticPod => LauncherChoice::StaticPod {
                manifest: join
                    .manifest
                    .clone()
                    .unwrap_or_else(|| DEFAULT_STATIC_POD_MANIFEST.into()),
                template: join.template.clone(),
                pod: PodSettings {
                    image: join.image.clone(),
                    pki_dir: join
                        .pki_dir
                        .clone()
                        .unwrap_or_else(|| DEFAULT_STATIC_POD_PKI_DIR.into()),
                },
                overwrite_foreign: join.overwrite_foreign_manifest.unwrap_or(false),
                start_timeout: join.start_timeout.unwrap_or(DEFAULT_JOIN_START_TIMEOUT),
            },
        };
        let config = JoinConfig {
            client,
            name: join.name.clone(),
            peer_url: join.peer_url.clone(),
            client_url: join.client_url.clone(),
            listen_peer_url: join.listen_peer_url.clone(),
            listen_client_url: join.listen_client_url.clone(),
            data_dir: join.data_dir.clone().or_else(|| etcd.data_dir.clone())?,
            state_file: join.state_file.clone(),
            extra_env: join
                .env
                .iter()
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect(),
            bootstrap_desired_voters: None,
            poll_interval: join.poll_interval,
            stall_after: join.stall_after,
            promote_retry: ops::DEFAULT_PROMOTE_RETRY,
        };
        Some(Self { config, launcher })
    }

    /// The launcher. The exec launcher keeps its child's PID in `<data dir>.etcd.pid`.
    pub fn launcher(&self) -> Launcher {
        match &self.launcher {
            LauncherChoice::Exec { binary } => Launcher::Exec(ExecLauncher::new(
                binary.clone(),
                sibling(&self.config.data_dir, "etcd.pid"),
                None,
            )),
            LauncherChoice::Systemd { unit, env_file } => Launcher::Systemd(SystemdLauncher {
                unit: unit.clone(),
                env_file: env_file.clone(),
                systemctl: PathBuf::from("systemctl"),
            }),
            LauncherChoice::EnvFile {
                env_file,
                start_command,
                start_timeout,
            } => Launcher::EnvFile(EnvFileLauncher::new(
                env_file.clone(),
                start_command.clone(),
                *start_timeout,
            )),
            LauncherChoice::StaticPod {
                manifest,
                template,
                pod,
                overwrite_foreign,
                start_timeout,
            } => Launcher::StaticPod(StaticPodLauncher::new(
                manifest.clone(),
                template.clone(),
                pod.clone(),
                *overwrite_foreign,
                *start_timeout,
            )),
        }
    }
}

/// `<data dir>.<suffix>`, next to the data directory.
pub fn sibling(data_dir: &Path, suffix: &str) -> PathBuf {
    let mut name = data_dir
        .file_name()
        .map(std::ffi::OsStr::to_os_string)
        .unwrap_or_default();
    name.push(".");
    name.push(suffix);
    data_dir.with_file_name(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn etcd(launcher: &str) -> EtcdConfig {
        let text = format!(
            "endpoints = [\"https://10.0.0.1:2379\"]\ndata_dir = \"/var/lib/etcd\"\n\
             [join]\nname = \"cp-3\"\npeer_url = \"https://10.0.0.3:2380\"\n\
             client_url = \"https://10.0.0.3:2379\"\n{launcher}\n\
             [join.env]\nETCD_CERT_FILE = \"/etc/etcd/server.crt\"\n"
        );
        toml::from_str(&text).unwrap()
    }

    #[test]
    fn the_join_table_becomes_the_library_config_and_launcher() {
        let client = ClientSettings::new(vec!["https://10.0.0.1:2379".into()]);
        let setup = JoinSetup::from_config(&etcd("launcher = \"exec\""), client.clone()).unwrap();
        assert_eq!(setup.config.name, "cp-3");
        assert_eq!(setup.config.client, client);
        assert_eq!(setup.config.data_dir, PathBuf::from("/var/lib/etcd"));
        assert_eq!(
            setup.config.extra_env,
            vec![(
                "ETCD_CERT_FILE".to_owned(),
                "/etc/etcd/server.crt".to_owned()
            )]
        );
        assert_eq!(setup.config.bootstrap_desired_voters, None);
        assert_eq!(
            setup.launcher,
            LauncherChoice::Exec {
                binary: DEFAULT_ETCD_BINARY.into()
            }
        );
        assert_eq!(setup.launcher().kind(), "exec");
        let setup = JoinSetup::from_config(
            &etcd("launcher = \"env-file\"\nenv_file = \"/run/etcd.env\""),
            client,
        )
        .unwrap();
        assert_eq!(
            setup.launcher,
            LauncherChoice::EnvFile {
                env_file: "/run/etcd.env".into(),
                start_command: vec![],
                start_timeout: DEFAULT_JOIN_START_TIMEOUT,
            }
        );
        assert_eq!(setup.launcher().kind(), "env-file");
        let setup = JoinSetup::from_config(
            &etcd("launcher = \"static-pod\"\nimage = \"registry.k8s.io/etcd:3.6.5-0\"\nstate_file = \"/var/lib/metalguard/etcd-join.json\""),
            ClientSettings::new(vec![]),
        )
        .unwrap();
        assert_eq!(
            setup.launcher,
            LauncherChoice::StaticPod {
                manifest: "/etc/kubernetes/manifests/etcd.yaml".into(),
                template: None,
                pod: PodSettings {
                    image: Some("registry.k8s.io/etcd:3.6.5-0".into()),
                    pki_dir: "/etc/kubernetes/pki/etcd".into(),
                },
                overwrite_foreign: false,
                start_timeout: DEFAULT_JOIN_START_TIMEOUT,
            }
        );
        assert_eq!(
            setup.config.state_path(),
            PathBuf::from("/var/lib/metalguard/etcd-join.json")
        );
        assert_eq!(setup.launcher().kind(), "static-pod");
    }

    #[test]
    fn siblings_sit_next_to_the_data_dir() {
        assert_eq!(
            sibling(Path::new("/var/lib/etcd"), "etcd.pid"),
            PathBuf::from("/var/lib/etcd.etcd.pid")
        );
    }
}
