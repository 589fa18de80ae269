//! A spare host's etcd: no member at first, joined by its own agent on the controller's
//! go-ahead through the agent's `env-file` launcher. The lab is that host's supervisor and
//! keeps the launcher's contract (docs/design-agent.md, `EnvFileLauncher`):
//!
//! - file present = etcd runs with exactly the file's `ETCD_*` variables (the environment is
//!   cleared but for `PATH`);
//! - file changed = etcd is restarted with the new variables;
//! - file absent = etcd is stopped.
//!
//! [`SpareEtcd::supervise`] applies that once; the lab calls it on every tick while the host
//! is powered. Power loss kills the process ([`SpareEtcd::kill`]); the next tick with power
//! starts it again if the file is still there, as a host's init system would at boot.
//!
//! With the static-Pod layout ([`EtcdLayout::StaticPod`](super::EtcdLayout)) the agent's
//! `static-pod` launcher writes kubeadm's manifest instead, and the lab is the host's kubelet
//! ([`pod`]), with the same contract for the manifest.

mod pod;

pub use pod::write_template;

use std::fmt::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::EtcdLayout;
use super::host::Standing;
use crate::etcd_pki::MemberPki;
use crate::kubelet::Kubelet;
use crate::ports::{PortLease, reserve_port};
use crate::process::Proc;
use crate::{HarnessError, Result, http, tools};

/// Grace between SIGTERM and SIGKILL when the file disappears.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// Least time between two starts of an etcd that keeps exiting while its file is unchanged
/// (a supervisor's restart back-off).
const RESTART_BACKOFF: Duration = Duration::from_secs(1);
/// Per-request timeout of the harness's `/health` probe.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);

/// What one [`SpareEtcd::supervise`] did, for the narration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Supervised {
    /// The file appeared (or the host booted with it): etcd started with its variables.
    Started {
        /// `ETCD_INITIAL_CLUSTER` of the file.
        initial_cluster: String,
    },
    /// The file changed: etcd restarted with the new variables.
    Restarted,
    /// etcd had exited while its file was unchanged: started again.
    Revived {
        /// The last lines of its log.
        tail: String,
    },
    /// The file disappeared: etcd stopped.
    Stopped,
    /// The kubelet would not run the manifest (static-Pod layout).
    Refused {
        /// Why.
        why: String,
    },
}

/// The etcd of a spare host and its supervision state.
#[derive(Debug)]
pub struct SpareEtcd {
    name: String,
    client: PortLease,
    peer: PortLease,
    metrics: PortLease,
    pki: Option<MemberPki>,
    env_file: PathBuf,
    data_dir: PathBuf,
    log: PathBuf,
    proc: Option<Proc>,
    /// The file's content etcd was started with.
    running_env: Option<String>,
    last_start: Option<Instant>,
    /// The static-Pod layout: the host's kubelet runs etcd (instead of the env-file fields).
    kubelet: Option<Kubelet>,
    /// The static-Pod layout: the template manifest the agent is configured with.
    template: Option<PathBuf>,
}

impl SpareEtcd {
    /// Reserves the ports of the spare `name` whose files live in `host_dir`; starts nothing.
    /// With `pki` (the host's certificates in kubeadm's layout) its etcd serves clients and
    /// peers over TLS and requires client certificates, as the cluster's members do. The
    /// static-Pod layout needs `pki` (kubeadm's manifest names its certificate files).
    pub fn reserve(
        name: &str,
        host_dir: &Path,
        pki: Option<MemberPki>,
        layout: EtcdLayout,
    ) -> Result<Self> {
        let static_pod = layout == EtcdLayout::StaticPod;
        if static_pod && pki.is_none() {
            return Err(HarnessError::Other(
                "the static-pod layout needs the lab's TLS etcd (kubeadm's certificate layout)"
                    .into(),
            ));
        }
        Ok(Self {
            name: name.to_owned(),
            client: reserve_port()?,
            peer: reserve_port()?,
            metrics: reserve_port()?,
            pki,
            env_file: host_dir.join("etcd.env"),
            data_dir: host_dir.join("etcd-data"),
            log: host_dir.join("etcd.log"),
            proc: None,
            running_env: None,
            last_start: None,
            kubelet: static_pod.then(|| pod::kubelet(host_dir)),
            template: static_pod.then(|| pod::template_path(host_dir)),
        })
    }

    /// Where the static-Pod layout's template goes (`None` with the env-file layout).
    pub fn template_path(&self) -> Option<&Path> {
        self.template.as_deref()
    }

    /// Who runs etcd on this host, for the narration: `supervisor` or `kubelet`.
    pub fn runner(&self) -> &'static str {
        if self.kubelet.is_some() {
            "kubelet"
        } else {
            "supervisor"
        }
    }

    fn scheme(&self) -> &'static str {
        if self.pki.is_some() { "https" } else { "http" }
    }

    /// `https://127.0.0.1:<client port>` (`http://` without TLS).
    pub fn client_url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme(), self.client.port())
    }

    /// `https://127.0.0.1:<peer port>` (`http://` without TLS).
    pub fn peer_url(&self) -> String {
        format!("{}://127.0.0.1:{}", self.scheme(), self.peer.port())
    }

    /// `http://127.0.0.1:<metrics port>`: `/health` without TLS.
    pub fn metrics_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.metrics.port())
    }

    /// The host's certificates in kubeadm's layout (`None` without TLS).
    pub fn pki(&self) -> Option<&MemberPki> {
        self.pki.as_ref()
    }

    /// The file the agent writes and etcd runs from: the environment file, or the static Pod
    /// manifest.
    pub fn watched_file(&self) -> PathBuf {
        match &self.kubelet {
            Some(kubelet) => kubelet.manifest_dir().join(pod::MANIFEST),
            None => self.env_file.clone(),
        }
    }

    /// etcd's log file.
    pub fn log_path(&self) -> PathBuf {
        match &self.kubelet {
            Some(kubelet) => kubelet.log_path(pod::MANIFEST),
            None => self.log.clone(),
        }
    }

    /// The agent's `[etcd.join]` table for this host: with TLS, `[etcd.join.env]` passes the
    /// host's server and peer certificates and the client-certificate requirements to etcd.
    pub fn join_config(&self) -> String {
        if let Some(kubelet) = &self.kubelet {
            return self.static_pod_join_config(kubelet);
        }
        let mut text = format!(
            "[etcd.join]\nname = \"{name}\"\npeer_url = \"{peer}\"\nclient_url = \"{client}\"\n\
             data_dir = \"{data}\"\nlauncher = \"env-file\"\nenv_file = \"{env}\"\n\
             start_timeout = \"30s\"\ntimeout = \"2m\"\n\
             [etcd.join.env]\nETCD_LOGGER = \"zap\"\nETCD_LISTEN_METRICS_URLS = \"{metrics}\"\n",
            name = self.name,
            peer = self.peer_url(),
            client = self.client_url(),
            data = self.data_dir.display(),
            env = self.env_file.display(),
            metrics = self.metrics_url(),
        );
        for (key, value) in self.pki.iter().flat_map(MemberPki::etcd_env) {
            let _ = writeln!(text, "{key} = {value:?}");
        }
        text
    }

    /// Address of the plain-HTTP metrics listener (`/health`).
    pub fn metrics_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.metrics.port()))
    }

    /// etcd's process id while the process exists.
    pub fn pid(&self) -> Option<u32> {
        match &self.kubelet {
            Some(kubelet) => kubelet.pids().first().copied(),
            None => self.proc.as_ref().and_then(Proc::pid),
        }
    }

    /// Whether etcd's process exists (running or frozen).
    pub fn is_running(&self) -> bool {
        match &self.kubelet {
            Some(kubelet) => kubelet.is_running(),
            None => self.proc.is_some(),
        }
    }

    /// Whether the member answers `/health` (on its metrics URL) with `"health":"true"` now.
    pub fn is_healthy(&self) -> bool {
        let addr = self.metrics_addr();
        http::get(addr, "/health", PROBE_TIMEOUT)
            .is_some_and(|(status, body)| status == 200 && body.contains("\"health\":\"true\""))
    }

    /// Applies the env-file contract once; returns what it did, if anything.
    pub fn supervise(&mut self) -> Result<Option<Supervised>> {
        if let Some(kubelet) = &mut self.kubelet {
            return pod::sync(kubelet);
        }
        let content = match std::fs::read_to_string(&self.env_file) {
            Ok(text) => Some(text),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
            Err(e) => {
                return Err(HarnessError::Io {
                    context: format!("reading {}", self.env_file.display()),
                    source: e,
                });
            }
        };
        let Some(content) = content else {
            if self.proc.is_some() {
                self.stop();
                return Ok(Some(Supervised::Stopped));
            }
            return Ok(None);
        };
        let exited = self.proc.as_mut().is_some_and(|p| !p.is_running());
        if self.running_env.as_deref() == Some(content.as_str()) && !exited {
            return Ok(None);
        }
        if exited && self.running_env.as_deref() == Some(content.as_str()) {
            if self
                .last_start
                .is_some_and(|t| t.elapsed() < RESTART_BACKOFF)
            {
                return Ok(None);
            }
            let tail = crate::process::tail_of(&self.log, 3);
            self.start(&content)?;
            return Ok(Some(Supervised::Revived { tail }));
        }
        let restart = self.proc.is_some();
        self.start(&content)?;
        Ok(Some(if restart {
            Supervised::Restarted
        } else {
            Supervised::Started {
                initial_cluster: value_of(&content, "ETCD_INITIAL_CLUSTER").unwrap_or_default(),
            }
        }))
    }

    /// Kills etcd at once (the host lost power); the file stays.
    pub fn kill(&mut self) {
        if let Some(kubelet) = &mut self.kubelet {
            kubelet.kill_all();
        }
        if let Some(mut p) = self.proc.take() {
            p.kill();
        }
        self.running_env = None;
    }

    /// Freezes etcd (SIGSTOP), if it runs.
    pub fn freeze(&self) -> Result<()> {
        match &self.kubelet {
            Some(kubelet) => kubelet.freeze(),
            None => self.proc.as_ref().map_or(Ok(()), Proc::freeze),
        }
    }

    /// Thaws etcd (SIGCONT), if it runs.
    pub fn thaw(&self) -> Result<()> {
        match &self.kubelet {
            Some(kubelet) => kubelet.thaw(),
            None => self.proc.as_ref().map_or(Ok(()), Proc::thaw),
        }
    }

    fn stop(&mut self) {
        if let Some(mut p) = self.proc.take() {
            p.terminate(STOP_GRACE);
        }
        self.running_env = None;
    }

    fn start(&mut self, content: &str) -> Result<()> {
        self.stop();
        let vars = parse_env_file(content).map_err(|line| {
            HarnessError::Other(format!(
                "environment file {} has a line the supervisor cannot read: {line}",
                self.env_file.display()
            ))
        })?;
        let mut command = Command::new(tools::etcd_bin()?);
        command.env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            command.env("PATH", path);
        }
        command.envs(vars);
        self.proc = Some(Proc::spawn(
            format!("etcd {}", self.name),
            command,
            &self.log,
        )?);
        self.running_env = Some(content.to_owned());
        self.last_start = Some(Instant::now());
        Ok(())
    }
}

/// The variables of a systemd EnvironmentFile as the agent writes it (`KEY="value"`, with
/// `\`, `"` and `$` escaped by `\`; `#` lines and blank lines skipped). Returns the first
/// line it cannot read.
pub fn parse_env_file(text: &str) -> std::result::Result<Vec<(String, String)>, String> {
    let mut vars = Vec::new();
    for line in text.lines() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') {
            continue;
        }
        let parsed = trimmed.split_once('=').and_then(|(key, quoted)| {
            let inner = quoted.strip_prefix('"')?.strip_suffix('"')?;
            let mut value = String::with_capacity(inner.len());
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                value.push(if c == '\\' { chars.next()? } else { c });
            }
            key.starts_with("ETCD_").then(|| (key.to_owned(), value))
        });
        vars.push(parsed.ok_or_else(|| line.to_owned())?);
    }
    Ok(vars)
}

fn value_of(content: &str, key: &str) -> Option<String> {
    parse_env_file(content)
        .ok()?
        .into_iter()
        .find_map(|(k, v)| (k == key).then_some(v))
}

/// The lab's side of spares: the supervisor on every tick, the member helpers that route a
/// host index to the [`EtcdCluster`](crate::etcd::EtcdCluster) member or to the spare's own
/// etcd, and inventory changes.
impl super::Lab {
    /// Applies the env-file contract for host `i` if it is a powered spare, and narrates.
    pub(super) fn supervise_spare(&mut self, i: usize) -> Result<()> {
        if !self.hosts[i].powered() {
            return Ok(());
        }
        let Some(spare) = self.hosts[i].spare_etcd_mut() else {
            return Ok(());
        };
        let Some(done) = spare.supervise()? else {
            return Ok(());
        };
        let file = spare
            .watched_file()
            .file_name()
            .map_or_else(String::new, |f| f.to_string_lossy().into_owned());
        let actor = format!("{} {}", spare.runner(), self.hosts[i].name);
        let (what, why) = match done {
            Supervised::Started { initial_cluster } => (
                format!("{file} present: started etcd with its variables"),
                format!("initial cluster {initial_cluster}"),
            ),
            Supervised::Restarted => (
                format!("{file} changed: restarted etcd with the new variables"),
                String::new(),
            ),
            Supervised::Revived { tail } => (
                format!("etcd had exited while {file} is unchanged: started it again"),
                tail.lines().last().unwrap_or_default().to_owned(),
            ),
            Supervised::Stopped => (
                format!("{file} removed: stopped etcd"),
                "the agent's member was removed".to_owned(),
            ),
            Supervised::Refused { why } => (format!("{file} not run as etcd"), why),
        };
        self.timeline.add(&actor, what, why);
        Ok(())
    }

    /// Whether host `i`'s etcd member answers `/health` healthy (a spare without a running
    /// etcd does not).
    pub fn member_healthy(&self, i: usize) -> bool {
        match self.hosts[i].spare_etcd() {
            Some(spare) => spare.is_running() && spare.is_healthy(),
            None => self.etcd.is_healthy(i),
        }
    }

    pub(super) fn kill_member(&mut self, i: usize) {
        match self.hosts[i].spare_etcd_mut() {
            Some(spare) => spare.kill(),
            None => self.etcd.kill(i),
        }
    }

    /// A voter's member restarts from its data dir; a spare's etcd is started by the next
    /// tick's supervision if its environment file is there.
    pub(super) fn restart_member(&mut self, i: usize) -> Result<()> {
        match self.hosts[i].spare_etcd() {
            Some(_) => Ok(()),
            None => self.etcd.restart(i),
        }
    }

    pub(super) fn hang_member(&mut self, i: usize) -> Result<()> {
        match self.hosts[i].spare_etcd() {
            Some(spare) => spare.freeze(),
            None => self.etcd.hang(i),
        }
    }

    pub(super) fn resume_member(&mut self, i: usize) -> Result<()> {
        match self.hosts[i].spare_etcd() {
            Some(spare) => spare.thaw(),
            None => self.etcd.resume(i),
        }
    }

    /// The `[etcd] endpoints` of host `i`'s agent. The agent takes the first as its local
    /// member (its `EtcdMemberHealthy` probe and the local member of its reports): a voter's
    /// own member first. A spare has none until it joins, so a voter's comes first (the last
    /// voter's, as the replace scenario retires the first host) and its own client URL last,
    /// as docs/design-agent.md's `[etcd.join]` example lists it.
    pub(super) fn agent_endpoints(&self, i: usize, endpoints: &[String]) -> Vec<String> {
        if let Some(spare) = self.hosts[i].spare_etcd() {
            let mut ordered: Vec<String> = endpoints.iter().rev().cloned().collect();
            ordered.push(spare.client_url());
            return ordered;
        }
        let mut ordered = vec![endpoints[i].clone()];
        ordered.extend(endpoints.iter().filter(|e| **e != endpoints[i]).cloned());
        ordered
    }

    /// The plain-HTTP metrics address (`/health`) of the lab member or spare that advertises
    /// `client_url`.
    pub fn metrics_addr_of(&self, client_url: &str) -> Option<SocketAddr> {
        let spare = self
            .hosts
            .iter()
            .filter_map(|h| h.spare_etcd())
            .find(|s| s.client_url() == client_url)
            .map(SpareEtcd::metrics_addr);
        spare.or_else(|| {
            (0..self.etcd.len())
                .map(|i| self.etcd.member(i))
                .find(|m| m.client_url() == client_url)
                .map(crate::etcd::EtcdMember::metrics_addr)
        })
    }

    /// Indices of the hosts in service (listed and not retired), in order: scenarios pick
    /// their targets among these, never a spare on standby or a retired host.
    pub fn in_service(&self) -> Vec<usize> {
        (0..self.hosts.len())
            .filter(|&i| self.hosts[i].in_service())
            .collect()
    }

    /// Lists host `i` in the inventory (the running controller re-reads it).
    pub fn add_to_inventory(&mut self, i: usize) -> Result<()> {
        self.hosts[i].set_standing(Standing::InService);
        let name = self.hosts[i].name.clone();
        if let Some(kube) = self.kube.as_mut() {
            kube.add_host(&self.hosts[i])?;
            self.timeline.add(
                "admin",
                format!("adds GuardedHost {name}"),
                "role ControlPlane, its BMC and credentials Secret; its kubelet registers its Node",
            );
            return Ok(());
        }
        self.write_inventory()?;
        self.timeline.add(
            "admin",
            format!("adds {name} to the inventory"),
            "role control-plane, its BMC and credentials; the controller re-reads the file",
        );
        Ok(())
    }

    /// Removes host `i` from the inventory.
    pub fn remove_from_inventory(&mut self, i: usize) -> Result<()> {
        self.hosts[i].set_standing(Standing::Removed);
        let name = self.hosts[i].name.clone();
        if let Some(kube) = self.kube.as_mut() {
            kube.remove_host(&name)?;
            self.timeline.add(
                "admin",
                format!("deletes GuardedHost {name}, its Secret and its Node"),
                "",
            );
            return Ok(());
        }
        self.write_inventory()?;
        self.timeline
            .add("admin", format!("removes {name} from the inventory"), "");
        Ok(())
    }

    /// `metalguard-controller retire HOST --reason REASON`; from now on the lab expects host
    /// `i` to go away rather than to be healthy.
    pub fn retire(&mut self, i: usize, reason: &str) -> Result<String> {
        let name = self.hosts[i].name.clone();
        let out =
            self.controller_cli(&["retire", &name, "--reason", reason, "--requested-by", "lab"])?;
        let retire = if self.kube.is_some() {
            "declares spec.retirement of GuardedHost"
        } else {
            "metalguard-controller retire"
        };
        self.hosts[i].set_standing(Standing::Retired);
        self.timeline.add(
            "admin",
            format!("{retire} {name}"),
            out.lines().next().unwrap_or_default().trim().to_owned(),
        );
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agents_environment_file_is_read_back_with_its_escapes() {
        let text = "# written by metalguard-agent etcd join; do not edit\n\
                    ETCD_NAME=\"cp-4\"\n\
                    ETCD_INITIAL_CLUSTER=\"cp-2=http://127.0.0.1:1,cp-4=http://127.0.0.1:2\"\n\
                    ETCD_WEIRD=\"a\\\"b\\\\c\\$d\"\n\n";
        let vars = parse_env_file(text).unwrap();
        assert_eq!(
            vars,
            vec![
                ("ETCD_NAME".to_owned(), "cp-4".to_owned()),
                (
                    "ETCD_INITIAL_CLUSTER".to_owned(),
                    "cp-2=http://127.0.0.1:1,cp-4=http://127.0.0.1:2".to_owned()
                ),
                ("ETCD_WEIRD".to_owned(), "a\"b\\c$d".to_owned()),
            ]
        );
    }

    #[test]
    fn anything_but_quoted_etcd_variables_is_refused() {
        for bad in [
            "PATH=\"/tmp\"",
            "ETCD_NAME=cp-4",
            "ETCD_NAME",
            "ETCD_X=\"ends\\\"",
        ] {
            assert_eq!(parse_env_file(bad), Err(bad.to_owned()), "{bad}");
        }
    }
}
