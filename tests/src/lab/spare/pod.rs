//! A spare host whose etcd runs as kubeadm's static Pod: the agent's `static-pod` launcher
//! writes `manifests/etcd.yaml` in the host's directory, and the lab plays the host's kubelet
//! ([`Kubelet`]: manifest present = runs, changed = restarted, absent = stopped; refusing what a
//! real kubelet could not run). The template is a cluster member's manifest as kubeadm writes
//! it ([`kubeadm_manifest`]), copied to the spare, as a person copies it from another
//! control-plane host.

use std::path::{Path, PathBuf};

use super::{SpareEtcd, Supervised};
use crate::etcd::EtcdMember;
use crate::kubelet::{KubeadmMember, Kubelet, KubeletEvent, kubeadm_manifest};
use crate::{HarnessError, Result};

/// The manifest's file name in the host's manifest directory.
pub const MANIFEST: &str = "etcd.yaml";

/// The host's kubelet and its manifest directory (`<host dir>/manifests`).
pub fn kubelet(host_dir: &Path) -> Kubelet {
    Kubelet::new(&host_dir.join("manifests"), host_dir)
}

/// Where the template (a member's kubeadm manifest) is kept on the spare.
pub fn template_path(host_dir: &Path) -> PathBuf {
    host_dir.join("etcd-template.yaml")
}

/// Writes `member`'s manifest as kubeadm writes it to `path` (the spare's template).
pub fn write_template(path: &Path, member: &EtcdMember) -> Result<()> {
    let pki = member.pki().ok_or_else(|| {
        HarnessError::Other("the static-pod layout needs the lab's TLS etcd (kubeadm's)".into())
    })?;
    let text = kubeadm_manifest(&KubeadmMember {
        etcd: crate::tools::etcd_version()?,
        name: member.name(),
        peer_url: member.peer_url(),
        client_url: member.client_url(),
        metrics_url: member.metrics_url(),
        data_dir: member.data_dir(),
        pki_dir: &pki.dir,
        initial_cluster: "",
        state: "new",
    });
    crate::tls::write_file(path, text.as_bytes(), 0o600)
}

impl SpareEtcd {
    /// The agent's `[etcd.join]` for the static-pod launcher: the host's manifest, the template,
    /// kubeadm's certificate directory; the metrics URL is the host's own (every lab host shares
    /// 127.0.0.1, so the template's is another member's).
    pub(super) fn static_pod_join_config(&self, kubelet: &Kubelet) -> String {
        let pki_dir = self
            .pki
            .as_ref()
            .map_or_else(String::new, |p| p.dir.display().to_string());
        format!(
            "[etcd.join]\nname = \"{name}\"\npeer_url = \"{peer}\"\nclient_url = \"{client}\"\n\
             data_dir = \"{data}\"\nlauncher = \"static-pod\"\nmanifest = \"{manifest}\"\n\
             template = \"{template}\"\npki_dir = \"{pki_dir}\"\n\
             start_timeout = \"30s\"\ntimeout = \"2m\"\n\
             [etcd.join.env]\nETCD_LISTEN_METRICS_URLS = \"{metrics}\"\n",
            name = self.name,
            peer = self.peer_url(),
            client = self.client_url(),
            data = self.data_dir.display(),
            manifest = kubelet.manifest_dir().join(MANIFEST).display(),
            template = self
                .template
                .as_ref()
                .map_or_else(String::new, |t| t.display().to_string()),
            metrics = self.metrics_url(),
        )
    }
}

/// One sync of the kubelet, as the lab narrates it (the first thing it did; a sync handles one
/// manifest here).
pub fn sync(kubelet: &mut Kubelet) -> Result<Option<Supervised>> {
    let events = kubelet.sync()?;
    Ok(events.into_iter().next().map(|event| match event {
        KubeletEvent::Started {
            initial_cluster, ..
        } => Supervised::Started { initial_cluster },
        KubeletEvent::Restarted { .. } => Supervised::Restarted,
        KubeletEvent::Revived { tail, .. } => Supervised::Revived { tail },
        KubeletEvent::Stopped { .. } => Supervised::Stopped,
        KubeletEvent::Refused { why, .. } => Supervised::Refused { why },
    }))
}
