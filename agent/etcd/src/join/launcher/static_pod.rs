//! The `static-pod` launcher: the agent writes etcd's static Pod manifest in kubeadm's layout
//! and the kubelet runs it.
//!
//! # The contract with the kubelet
//!
//! - **Manifest present = etcd runs as that Pod.** The join flow starts the launcher only once
//!   the learner is a member, so the manifest is never written before the add. It is rendered
//!   by [`manifest::render`] (kubeadm's Pod, `--initial-cluster-state=existing`, the learner's
//!   URLs, kubeadm's certificate files in `pki_dir`, image and further flags from a template
//!   or the settings), marked with the annotation `metalguard.io/written-by:
//!   metalguard-agent`, and written atomically with mode 0600 (as kubeadm writes it) through a
//!   hidden temporary file, because the kubelet runs every file of its directory whose name
//!   does not start with a dot.
//! - **Changed = the kubelet restarts etcd.** The manifest is rewritten only when its content
//!   changes, so a resumed join leaves a running etcd alone.
//! - **Absent = etcd must not run.** When this host's member was removed, the manifest is
//!   moved aside (to `metalguard-moved-aside/etcd.yaml.<unix ms>` next to the manifest
//!   directory, outside it), the launcher waits until the local client port no longer accepts
//!   connections, and only then may the join flow wipe the data directory.
//!
//! # A manifest the agent did not write
//!
//! It is never overwritten without [`StaticPodLauncher::overwrite_foreign`]. If it runs this
//! host's member (its `--initial-advertise-peer-urls` holds the join's peer URL: the manifest
//! `kubeadm join --control-plane` wrote for the learner it added), the agent leaves it in place
//! and waits for that member like for its own: kubeadm and metalguard join the same member.
//! Any other foreign manifest fails the start, and the stop (so a data directory another etcd
//! may use is never wiped). With `overwrite_foreign`, a foreign manifest is moved aside first.
//!
//! After writing (or finding) the manifest the launcher considers etcd started once the member
//! answers a status call on its advertised client URL within `start_timeout`.

pub mod manifest;

use super::local::LocalMember;
use super::{EtcdLaunch, LaunchError};
use crate::client::ClientSettings;
use crate::join::state::write_atomically_hidden;
use manifest::{ExistingManifest, PodSettings};
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// kubeadm's etcd manifest.
pub const DEFAULT_MANIFEST: &str = "/etc/kubernetes/manifests/etcd.yaml";
/// kubeadm's etcd certificate directory.
pub const DEFAULT_PKI_DIR: &str = "/etc/kubernetes/pki/etcd";
/// Where moved-aside manifests go, next to the manifest directory.
pub const MOVED_ASIDE_DIR: &str = "metalguard-moved-aside";
/// Permissions of the manifest (kubeadm writes its manifests 0600).
const MANIFEST_MODE: u32 = 0o600;

/// Writes etcd's static Pod manifest for the kubelet; see the module docs for the contract.
#[derive(Debug, Clone)]
pub struct StaticPodLauncher {
    /// The manifest (`/etc/kubernetes/manifests/etcd.yaml`).
    pub manifest: PathBuf,
    /// An existing member's manifest to take the image and further flags from.
    pub template: Option<PathBuf>,
    /// Image and certificate directory.
    pub pod: PodSettings,
    /// Replace a manifest the agent did not write (moved aside first).
    pub overwrite_foreign: bool,
    /// Deadline of the member answering after the manifest is in place (or going away).
    pub start_timeout: Duration,
    local: LocalMember,
    peer_url: Option<String>,
}

/// What the launcher found at the manifest's path.
enum Found {
    Nothing,
    Same,
    Ours,
    ThisMember,
    Foreign(String),
}

impl StaticPodLauncher {
    /// A launcher writing `manifest` from `pod` (and `template`, if any).
    pub fn new(
        manifest: PathBuf,
        template: Option<PathBuf>,
        pod: PodSettings,
        overwrite_foreign: bool,
        start_timeout: Duration,
    ) -> Self {
        Self {
            manifest,
            template,
            pod,
            overwrite_foreign,
            start_timeout,
            local: LocalMember::default(),
            peer_url: None,
        }
    }

    /// How to reach the local member and which peer URL identifies it.
    pub fn set_local_member(
        &mut self,
        client_url: &str,
        peer_url: &str,
        settings: &ClientSettings,
    ) {
        self.local.set(client_url, settings);
        self.peer_url = Some(peer_url.to_owned());
    }

    /// The manifest this join would write, as text.
    pub fn render(&self, launch: &EtcdLaunch) -> Result<String, LaunchError> {
        let template = match &self.template {
            Some(path) => Some(read_template(path)?),
            None => None,
        };
        manifest::render(launch, &self.pod, template.as_ref()).map_err(LaunchError::Render)
    }

    /// Checks, before a learner is added, that it could be started: the template reads, an
    /// image is known, and no foreign manifest for another member is in the way (unless
    /// overwriting is set). A learner added but never started blocks every other learner.
    pub fn preflight(&self) -> Result<(), LaunchError> {
        match &self.template {
            Some(path) => {
                read_template(path)?;
            }
            None if self.pod.image.is_none() => {
                return Err(LaunchError::Render(manifest::ManifestError::NoImage));
            }
            None => {}
        }
        match self.find(None)? {
            Found::Foreign(detail) if !self.overwrite_foreign => {
                Err(LaunchError::ForeignManifest {
                    path: self.manifest.clone(),
                    detail,
                })
            }
            _ => Ok(()),
        }
    }

    /// Writes the manifest unless it already holds this content or runs this member, then
    /// waits until the member answers.
    pub async fn start(&mut self, launch: &EtcdLaunch) -> Result<(), LaunchError> {
        self.local.set_url(&launch.client_url);
        self.peer_url = Some(launch.peer_url.clone());
        let content = self.render(launch)?;
        match self.find(Some(&content))? {
            Found::Same => {
                tracing::debug!(path = %self.manifest.display(), "etcd static pod manifest unchanged");
            }
            Found::ThisMember => tracing::info!(
                path = %self.manifest.display(),
                peer_url = launch.peer_url,
                "etcd static pod manifest not written by metalguard runs this member (kubeadm's learner join?): left as it is"
            ),
            Found::Nothing | Found::Ours => self.write(&content)?,
            Found::Foreign(detail) if self.overwrite_foreign => {
                let to = self.move_aside()?;
                tracing::warn!(path = %self.manifest.display(), moved_to = %to.display(), detail, "etcd static pod manifest not written by metalguard moved aside (overwrite_foreign_manifest)");
                self.write(&content)?;
            }
            Found::Foreign(detail) => {
                return Err(LaunchError::ForeignManifest {
                    path: self.manifest.clone(),
                    detail,
                });
            }
        }
        if self
            .local
            .wait_until_answering(&launch.client_url, self.start_timeout)
            .await
        {
            return Ok(());
        }
        Err(LaunchError::PodNotAnswering {
            client_url: launch.client_url.clone(),
            manifest: self.manifest.clone(),
            timeout: self.start_timeout,
        })
    }

    /// Moves this member's manifest aside (the kubelet then stops etcd) and waits until the
    /// local client port no longer accepts connections. A foreign manifest that runs another
    /// member is refused: the data directory must not be wiped under it.
    pub async fn stop(&mut self) -> Result<(), LaunchError> {
        match self.find(None)? {
            Found::Nothing => {}
            Found::Foreign(detail) => {
                return Err(LaunchError::ForeignManifest {
                    path: self.manifest.clone(),
                    detail,
                });
            }
            Found::Same | Found::Ours | Found::ThisMember => {
                let to = self.move_aside()?;
                tracing::info!(path = %self.manifest.display(), moved_to = %to.display(), "etcd static pod manifest moved aside");
            }
        }
        if self.local.wait_until_gone(self.start_timeout).await {
            return Ok(());
        }
        Err(LaunchError::PodStillRunning {
            client_url: self.local.url().unwrap_or_default().to_owned(),
            manifest: self.manifest.clone(),
            timeout: self.start_timeout,
        })
    }

    fn find(&self, content: Option<&str>) -> Result<Found, LaunchError> {
        let text = match std::fs::read_to_string(&self.manifest) {
            Ok(text) => text,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Found::Nothing),
            Err(source) => return Err(self.io_err("reading", source)),
        };
        if content == Some(text.as_str()) {
            return Ok(Found::Same);
        }
        let existing = match ExistingManifest::parse(&text) {
            Ok(m) => m,
            Err(e) => return Ok(Found::Foreign(format!("it is {e}"))),
        };
        if existing.written_by_agent {
            return Ok(Found::Ours);
        }
        let peer_url = self.peer_url.as_deref().unwrap_or_default();
        if existing.runs_member(peer_url) {
            return Ok(Found::ThisMember);
        }
        Ok(Found::Foreign(format!(
            "it runs member {} with peer urls {}, this member's is {peer_url}",
            existing.flag("name").unwrap_or("(unnamed)"),
            existing.peer_urls().join(",")
        )))
    }

    fn write(&self, content: &str) -> Result<(), LaunchError> {
        write_atomically_hidden(&self.manifest, content.as_bytes(), MANIFEST_MODE)
            .map_err(|source| self.io_err("writing", source))?;
        tracing::info!(path = %self.manifest.display(), "etcd static pod manifest written");
        Ok(())
    }

    /// Renames the manifest to `<moved-aside dir>/<name>.<unix ms>`; returns the new path.
    fn move_aside(&self) -> Result<PathBuf, LaunchError> {
        let dir = moved_aside_dir(&self.manifest);
        std::fs::create_dir_all(&dir).map_err(|source| self.io_err("moving aside", source))?;
        let ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        let mut name = self.manifest.file_name().unwrap_or_default().to_owned();
        name.push(format!(".{ms}"));
        let to = dir.join(name);
        std::fs::rename(&self.manifest, &to)
            .and_then(|()| {
                let parent = self.manifest.parent().unwrap_or(Path::new("."));
                std::fs::File::open(parent)?.sync_all()
            })
            .map_err(|source| self.io_err("moving aside", source))?;
        Ok(to)
    }

    fn io_err(&self, action: &'static str, source: std::io::Error) -> LaunchError {
        LaunchError::ManifestFile {
            action,
            path: self.manifest.clone(),
            source,
        }
    }
}

/// The directory moved-aside manifests go to: [`MOVED_ASIDE_DIR`] next to the manifest's
/// directory (`/etc/kubernetes/metalguard-moved-aside` for kubeadm's), never inside it.
pub fn moved_aside_dir(manifest: &Path) -> PathBuf {
    let dir = manifest.parent().unwrap_or(Path::new("."));
    dir.parent().unwrap_or(dir).join(MOVED_ASIDE_DIR)
}

fn read_template(path: &Path) -> Result<manifest::Template, LaunchError> {
    let text = std::fs::read_to_string(path).map_err(|source| LaunchError::TemplateFile {
        path: path.to_owned(),
        source,
    })?;
    ExistingManifest::parse(&text)
        .and_then(|m| m.template())
        .map_err(|source| LaunchError::Template {
            path: path.to_owned(),
            source,
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn launch(client_url: &str) -> EtcdLaunch {
        EtcdLaunch {
            name: "cp-4".into(),
            data_dir: "/var/lib/etcd".into(),
            peer_url: "https://127.0.0.1:1".into(),
            client_url: client_url.into(),
            listen_peer_url: None,
            listen_client_url: None,
            initial_cluster: "cp-4=https://127.0.0.1:1".into(),
            extra_env: vec![],
        }
    }

    fn launcher(dir: &Path, timeout: Duration) -> StaticPodLauncher {
        StaticPodLauncher::new(
            dir.join("manifests/etcd.yaml"),
            None,
            PodSettings {
                image: Some("registry.k8s.io/etcd:3.6.5-0".into()),
                pki_dir: "/etc/kubernetes/pki/etcd".into(),
            },
            false,
            timeout,
        )
    }

    fn closed_port_url() -> String {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        format!("https://127.0.0.1:{port}")
    }

    #[tokio::test]
    async fn without_a_kubelet_the_start_times_out_naming_the_manifest_and_stop_moves_it_aside() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let mut l = launcher(dir.path(), Duration::from_millis(300));
        let err = l.start(&launch(&closed_port_url())).await.unwrap_err();
        assert!(err.to_string().contains("is the kubelet running"), "{err}");
        let path = dir.path().join("manifests/etcd.yaml");
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let names: Vec<_> = std::fs::read_dir(dir.path().join("manifests"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["etcd.yaml"], "no temporary file left behind");
        l.stop().await.unwrap();
        assert!(!path.exists());
        let aside: Vec<_> = std::fs::read_dir(dir.path().join(MOVED_ASIDE_DIR))
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        assert!(
            aside.len() == 1 && aside[0].starts_with("etcd.yaml."),
            "{aside:?}"
        );
    }

    #[tokio::test]
    async fn a_foreign_manifest_is_kept_unless_overwriting_is_set() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manifests/etcd.yaml");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let other = "kind: Pod\nspec:\n  containers:\n  - name: etcd\n    image: x\n    command: [etcd, --name=cp-1, --initial-advertise-peer-urls=https://10.0.0.1:2380]\n";
        std::fs::write(&path, other).unwrap();
        let mut l = launcher(dir.path(), Duration::from_millis(300));
        let err = l.start(&launch(&closed_port_url())).await.unwrap_err();
        let text = err.to_string();
        assert!(
            text.contains("was not written by metalguard-agent"),
            "{text}"
        );
        assert!(text.contains("member cp-1"), "{text}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), other);
        // Nor is it moved away by a stop: another etcd may use the data dir.
        assert!(l.stop().await.is_err());
        assert_eq!(std::fs::read_to_string(&path).unwrap(), other);

        // A file that is no manifest at all is foreign too.
        std::fs::write(&path, "not: [yaml").unwrap();
        assert!(l.start(&launch(&closed_port_url())).await.is_err());

        l.overwrite_foreign = true;
        l.preflight().unwrap();
        std::fs::write(&path, other).unwrap();
        let err = l.start(&launch(&closed_port_url())).await.unwrap_err();
        assert!(err.to_string().contains("did not answer"), "{err}");
        let written = std::fs::read_to_string(&path).unwrap();
        assert!(
            written.contains("metalguard.io/written-by: metalguard-agent"),
            "{written}"
        );
        let aside = std::fs::read_dir(dir.path().join(MOVED_ASIDE_DIR))
            .unwrap()
            .next()
            .unwrap()
            .unwrap()
            .path();
        assert_eq!(std::fs::read_to_string(aside).unwrap(), other);
    }

    #[tokio::test]
    async fn a_foreign_manifest_that_runs_this_member_is_left_in_place() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("manifests/etcd.yaml");
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let kubeadms = "kind: Pod\nspec:\n  containers:\n  - name: etcd\n    image: x\n    command: [etcd, --name=cp-4, --initial-advertise-peer-urls=https://127.0.0.1:1]\n";
        std::fs::write(&path, kubeadms).unwrap();
        let mut l = launcher(dir.path(), Duration::from_millis(300));
        let err = l.start(&launch(&closed_port_url())).await.unwrap_err();
        assert!(err.to_string().contains("did not answer"), "{err}");
        assert_eq!(std::fs::read_to_string(&path).unwrap(), kubeadms);
        // It runs this member: a removal moves it aside.
        l.stop().await.unwrap();
        assert!(!path.exists());
    }

    #[test]
    fn a_broken_template_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let mut l = launcher(dir.path(), Duration::from_millis(300));
        l.template = Some(dir.path().join("missing.yaml"));
        let err = l.render(&launch("https://127.0.0.1:1")).unwrap_err();
        assert!(err.to_string().contains("missing.yaml"), "{err}");
        std::fs::write(dir.path().join("t.yaml"), "kind: Service\n").unwrap();
        l.template = Some(dir.path().join("t.yaml"));
        let err = l.render(&launch("https://127.0.0.1:1")).unwrap_err();
        assert!(err.to_string().contains("t.yaml"), "{err}");
        assert!(l.preflight().is_err());
        l.template = None;
        l.preflight().unwrap();
        l.pod.image = None;
        let err = l.preflight().unwrap_err();
        assert!(format!("{err:?}").contains("NoImage"), "{err:?}");
    }

    #[test]
    fn moved_aside_manifests_leave_the_manifest_directory() {
        assert_eq!(
            moved_aside_dir(Path::new("/etc/kubernetes/manifests/etcd.yaml")),
            PathBuf::from("/etc/kubernetes/metalguard-moved-aside")
        );
    }
}
