//! A test "kubelet": runs etcd static Pods from a manifest directory with the real etcd
//! binary, the way the kubelet runs kubeadm's etcd, and a writer of manifests as kubeadm
//! writes them ([`kubeadm_manifest`]).
//!
//! What it keeps of the kubelet's static Pod source: every regular file of the directory whose
//! name does not start with a dot is a Pod; a file that appears is started, one whose content
//! changes is restarted with the new content, one that disappears is stopped (SIGTERM, then
//! SIGKILL after a grace), a container that exits is started again after a back-off
//! (`restartPolicy: Always`). What it checks before it runs a Pod, so that a manifest that
//! would not run under a real kubelet does not run here either: `kind: Pod`, `hostNetwork:
//! true` (etcd's URLs are the host's), a container with an image whose command is `etcd` and
//! `--flag=value` arguments, and every file or directory a flag names (`--data-dir`,
//! `--cert-file`, …) inside a volume mount whose hostPath volume is that same path (kubeadm
//! mounts each directory at its own path). `etcd` is replaced by the harness's binary
//! ([`crate::tools::etcd_bin`]); probes are not run. [`Kubelet::sync`] applies the directory
//! once; [`KubeletThread`] does so every 50 ms on a thread of its own.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::process::Proc;
use crate::tools::EtcdVersion;
use crate::{HarnessError, Result, tools};

/// Grace between SIGTERM and SIGKILL when a manifest disappears (the kubelet's default
/// termination grace for a static Pod is 30 s; a test needs less).
const STOP_GRACE: Duration = Duration::from_secs(5);
/// Least time between two starts of a container that keeps exiting (a restart back-off).
const RESTART_BACKOFF: Duration = Duration::from_secs(1);
/// Flags whose values are paths the container must see.
const PATH_FLAGS: &[&str] = &[
    "data-dir",
    "wal-dir",
    "cert-file",
    "key-file",
    "trusted-ca-file",
    "peer-cert-file",
    "peer-key-file",
    "peer-trusted-ca-file",
];

/// What one [`Kubelet::sync`] did with a manifest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KubeletEvent {
    /// A manifest appeared (or the host booted with it): its etcd started.
    Started {
        /// The manifest's file name.
        file: String,
        /// `--name`.
        member: String,
        /// `--initial-cluster`.
        initial_cluster: String,
    },
    /// A manifest changed: its etcd restarted with the new content.
    Restarted {
        /// The manifest's file name.
        file: String,
    },
    /// Its etcd had exited while the manifest was unchanged: started again.
    Revived {
        /// The manifest's file name.
        file: String,
        /// The last lines of its log.
        tail: String,
    },
    /// A manifest disappeared: its etcd stopped.
    Stopped {
        /// The manifest's file name.
        file: String,
        /// Whether its etcd was still running, so that the kubelet stopped it. `false`: it had
        /// exited on its own before the kubelet saw the manifest gone (a removed member shuts
        /// itself down; etcd 3.6 does so before the agent has moved its manifest aside).
        was_running: bool,
        /// Whether its `--data-dir` still existed when the kubelet saw the manifest gone (for
        /// a running etcd: when the kubelet stopped it).
        data_dir_existed: bool,
    },
    /// A manifest a real kubelet would not run as an etcd (or that it cannot read): not run.
    Refused {
        /// The manifest's file name.
        file: String,
        /// Why.
        why: String,
    },
}

/// A Pod as the kubelet runs it.
#[derive(Debug)]
struct Running {
    content: String,
    data_dir: Option<PathBuf>,
    proc: Proc,
    started: Instant,
}

/// The kubelet of one host: its manifest directory and the etcd processes it runs.
#[derive(Debug)]
pub struct Kubelet {
    manifest_dir: PathBuf,
    log_dir: PathBuf,
    pods: BTreeMap<String, Running>,
    /// Manifests refused with this content (reported once per content).
    refused: BTreeMap<String, String>,
}

impl Kubelet {
    /// A kubelet for `manifest_dir`, writing each Pod's output to `log_dir/<file>.log`.
    pub fn new(manifest_dir: &Path, log_dir: &Path) -> Self {
        Self {
            manifest_dir: manifest_dir.to_owned(),
            log_dir: log_dir.to_owned(),
            pods: BTreeMap::new(),
            refused: BTreeMap::new(),
        }
    }

    /// The manifest directory.
    pub fn manifest_dir(&self) -> &Path {
        &self.manifest_dir
    }

    /// The log of the Pod of manifest `file`.
    pub fn log_path(&self, file: &str) -> PathBuf {
        self.log_dir.join(format!("{file}.log"))
    }

    /// The process ids of the running Pods.
    pub fn pids(&self) -> Vec<u32> {
        self.pods.values().filter_map(|p| p.proc.pid()).collect()
    }

    /// Whether a Pod runs (or is frozen).
    pub fn is_running(&self) -> bool {
        !self.pods.is_empty()
    }

    /// Applies the manifest directory once; returns what it did.
    pub fn sync(&mut self) -> Result<Vec<KubeletEvent>> {
        let manifests = self.read_manifests()?;
        let mut events = Vec::new();
        let gone: Vec<String> = self
            .pods
            .keys()
            .filter(|f| !manifests.contains_key(*f))
            .cloned()
            .collect();
        for file in gone {
            if let Some(mut pod) = self.pods.remove(&file) {
                let was_running = pod.proc.is_running();
                let data_dir_existed = pod.data_dir.as_ref().is_some_and(|d| d.exists());
                pod.proc.terminate(STOP_GRACE);
                events.push(KubeletEvent::Stopped {
                    file,
                    was_running,
                    data_dir_existed,
                });
            }
        }
        self.refused.retain(|f, _| manifests.contains_key(f));
        for (file, content) in manifests {
            if let Some(event) = self.apply(&file, &content)? {
                events.push(event);
            }
        }
        Ok(events)
    }

    fn apply(&mut self, file: &str, content: &str) -> Result<Option<KubeletEvent>> {
        let restart = match self.pods.get_mut(file) {
            Some(pod) if pod.content == content => {
                if pod.proc.is_running() || pod.started.elapsed() < RESTART_BACKOFF {
                    return Ok(None);
                }
                let tail = crate::process::tail_of(pod.proc.log_path(), 3);
                self.start(file, content)?;
                return Ok(Some(KubeletEvent::Revived {
                    file: file.to_owned(),
                    tail,
                }));
            }
            Some(_) => true,
            None => false,
        };
        let pod = match PodSpec::parse(content) {
            Ok(pod) => pod,
            Err(why) => {
                if let Some(mut old) = self.pods.remove(file) {
                    old.proc.terminate(STOP_GRACE);
                }
                if self.refused.get(file).map(String::as_str) == Some(content) {
                    return Ok(None);
                }
                self.refused.insert(file.to_owned(), content.to_owned());
                return Ok(Some(KubeletEvent::Refused {
                    file: file.to_owned(),
                    why,
                }));
            }
        };
        if let Some(mut old) = self.pods.remove(file) {
            old.proc.terminate(STOP_GRACE);
        }
        let (member, initial_cluster) = (
            pod.member.clone(),
            pod.flag("initial-cluster").unwrap_or_default().to_owned(),
        );
        self.run(file, content, &pod)?;
        Ok(Some(if restart {
            KubeletEvent::Restarted {
                file: file.to_owned(),
            }
        } else {
            KubeletEvent::Started {
                file: file.to_owned(),
                member,
                initial_cluster,
            }
        }))
    }

    /// Starts the Pod of `file` again with the content it runs.
    fn start(&mut self, file: &str, content: &str) -> Result<()> {
        let pod = PodSpec::parse(content).map_err(HarnessError::Other)?;
        self.run(file, content, &pod)
    }

    fn run(&mut self, file: &str, content: &str, pod: &PodSpec) -> Result<()> {
        let mut command = Command::new(tools::etcd_bin()?);
        command.env_clear();
        if let Some(path) = std::env::var_os("PATH") {
            command.env("PATH", path);
        }
        command.envs(pod.env.iter().cloned()).args(&pod.args);
        let log = self.log_path(file);
        let proc = Proc::spawn(format!("etcd {} (static pod)", pod.member), command, &log)?;
        self.pods.insert(
            file.to_owned(),
            Running {
                content: content.to_owned(),
                data_dir: pod.flag("data-dir").map(PathBuf::from),
                proc,
                started: Instant::now(),
            },
        );
        Ok(())
    }

    fn read_manifests(&self) -> Result<BTreeMap<String, String>> {
        let entries = match std::fs::read_dir(&self.manifest_dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(BTreeMap::new()),
            Err(e) => {
                return Err(HarnessError::Io {
                    context: format!("listing {}", self.manifest_dir.display()),
                    source: e,
                });
            }
        };
        let mut manifests = BTreeMap::new();
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with('.') || !entry.file_type().is_ok_and(|t| t.is_file()) {
                continue;
            }
            // A file removed between listing and reading is gone.
            if let Ok(content) = std::fs::read_to_string(entry.path()) {
                manifests.insert(name, content);
            }
        }
        Ok(manifests)
    }

    /// Kills every Pod at once (the host lost power); the manifests stay.
    pub fn kill_all(&mut self) {
        for (_, mut pod) in std::mem::take(&mut self.pods) {
            pod.proc.kill();
        }
    }

    /// Freezes every Pod (SIGSTOP).
    pub fn freeze(&self) -> Result<()> {
        self.pods.values().try_for_each(|p| p.proc.freeze())
    }

    /// Thaws every Pod (SIGCONT).
    pub fn thaw(&self) -> Result<()> {
        self.pods.values().try_for_each(|p| p.proc.thaw())
    }
}

/// What the test kubelet reads from a manifest.
#[derive(Debug)]
struct PodSpec {
    member: String,
    args: Vec<String>,
    env: Vec<(String, String)>,
}

impl PodSpec {
    fn parse(text: &str) -> std::result::Result<Self, String> {
        let pod: Value = serde_saphyr::from_str(text).map_err(|e| format!("not YAML ({e})"))?;
        if pod["kind"] != "Pod" {
            return Err("its kind is not Pod".into());
        }
        if pod.pointer("/spec/hostNetwork") != Some(&Value::Bool(true)) {
            return Err(
                "hostNetwork is not true: etcd would not listen on the host's addresses".into(),
            );
        }
        let container = pod
            .pointer("/spec/containers/0")
            .ok_or("it has no container")?;
        if container["image"].as_str().is_none_or(str::is_empty) {
            return Err("its container has no image".into());
        }
        let words: Vec<String> = ["command", "args"]
            .iter()
            .filter_map(|k| container[*k].as_array())
            .flatten()
            .map(|w| {
                w.as_str()
                    .map(str::to_owned)
                    .ok_or("a command word is not a string")
            })
            .collect::<std::result::Result<_, _>>()?;
        let (program, args) = words.split_first().ok_or("it has no command")?;
        if program != "etcd" {
            return Err(format!("its command runs {program}, not etcd"));
        }
        if let Some(bad) = args
            .iter()
            .find(|a| !a.starts_with("--") || !a.contains('='))
        {
            return Err(format!("argument {bad} is not --flag=value"));
        }
        let env = container["env"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|e| {
                Some((
                    e["name"].as_str()?.to_owned(),
                    e["value"].as_str()?.to_owned(),
                ))
            })
            .collect();
        let spec = Self {
            member: String::new(),
            args: args.to_vec(),
            env,
        };
        let member = spec.flag("name").ok_or("it has no --name")?.to_owned();
        spec.check_mounts(&pod, container)?;
        Ok(Self { member, ..spec })
    }

    fn flag(&self, name: &str) -> Option<&str> {
        let prefix = format!("--{name}=");
        self.args.iter().find_map(|a| a.strip_prefix(&prefix))
    }

    /// Every path flag must be inside a mount whose hostPath volume is the same path.
    fn check_mounts(&self, pod: &Value, container: &Value) -> std::result::Result<(), String> {
        let volumes: BTreeMap<&str, &str> = pod
            .pointer("/spec/volumes")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|v| Some((v["name"].as_str()?, v.pointer("/hostPath/path")?.as_str()?)))
            .collect();
        let mounts: Vec<&str> = container["volumeMounts"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|m| {
                let path = m["mountPath"].as_str()?;
                (volumes.get(m["name"].as_str()?) == Some(&path)).then_some(path)
            })
            .collect();
        for flag in PATH_FLAGS {
            let Some(path) = self.flag(flag) else {
                continue;
            };
            if !mounts.iter().any(|m| Path::new(path).starts_with(m)) {
                return Err(format!(
                    "--{flag}={path} is not inside a hostPath volume mounted at its own path"
                ));
            }
        }
        Ok(())
    }
}

/// A [`Kubelet`] syncing every 50 ms on a thread of its own until finished (tests without a
/// lab loop). Errors (a refused manifest) are collected as [`KubeletEvent::Refused`].
#[derive(Debug)]
pub struct KubeletThread {
    stop: Arc<AtomicBool>,
    events: Arc<Mutex<Vec<KubeletEvent>>>,
    pids: Arc<Mutex<Vec<u32>>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl KubeletThread {
    /// Starts watching `manifest_dir`.
    pub fn watch(manifest_dir: &Path, log_dir: &Path) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let events = Arc::new(Mutex::new(Vec::new()));
        let pids = Arc::new(Mutex::new(Vec::new()));
        let mut kubelet = Kubelet::new(manifest_dir, log_dir);
        let (flag, seen, running) = (stop.clone(), events.clone(), pids.clone());
        let thread = std::thread::spawn(move || {
            while !flag.load(Ordering::SeqCst) {
                let new = kubelet.sync().unwrap_or_else(|e| {
                    vec![KubeletEvent::Refused {
                        file: String::new(),
                        why: e.to_string(),
                    }]
                });
                if let Ok(mut all) = seen.lock() {
                    all.extend(new);
                }
                if let Ok(mut p) = running.lock() {
                    *p = kubelet.pids();
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            kubelet.kill_all();
        });
        Self {
            stop,
            events,
            pids,
            thread: Some(thread),
        }
    }

    /// What the kubelet did so far.
    pub fn events(&self) -> Vec<KubeletEvent> {
        self.events.lock().map(|e| e.clone()).unwrap_or_default()
    }

    /// The process ids of the Pods running at the last sync.
    pub fn pids(&self) -> Vec<u32> {
        self.pids.lock().map(|p| p.clone()).unwrap_or_default()
    }

    /// Stops watching and kills the Pods; returns every event.
    pub fn finish(mut self) -> Vec<KubeletEvent> {
        self.stop_thread();
        self.events()
    }

    fn stop_thread(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for KubeletThread {
    fn drop(&mut self) {
        self.stop_thread();
    }
}

/// One member as kubeadm describes it in its etcd manifest.
#[derive(Debug, Clone)]
pub struct KubeadmMember<'a> {
    /// The etcd release the manifest is for: kubeadm names the same settings differently for
    /// etcd 3.6 (feature gates) and earlier (`--experimental-*` flags).
    pub etcd: EtcdVersion,
    /// `--name` (kubeadm: the node name).
    pub name: &'a str,
    /// `--initial-advertise-peer-urls`, `--listen-peer-urls`.
    pub peer_url: &'a str,
    /// `--advertise-client-urls` (and, with loopback, `--listen-client-urls`).
    pub client_url: &'a str,
    /// `--listen-metrics-urls`.
    pub metrics_url: &'a str,
    /// `--data-dir`.
    pub data_dir: &'a Path,
    /// The certificate directory (`ca.crt`, `server.*`, `peer.*`).
    pub pki_dir: &'a Path,
    /// `--initial-cluster`.
    pub initial_cluster: &'a str,
    /// `--initial-cluster-state`: `new` (kubeadm init) or `existing` (kubeadm join).
    pub state: &'a str,
}

/// The image kubeadm names for `etcd` (the test kubelet runs the harness's etcd binary
/// whatever the image says).
pub fn kubeadm_image(etcd: EtcdVersion) -> String {
    format!("registry.k8s.io/etcd:{etcd}-0")
}

/// The etcd manifest kubeadm writes for `m`, written out by hand (not by metalguard's
/// renderer), with the flags kubeadm passes for `m.etcd`: kubeadm 1.34 and later give etcd 3.6
/// `--feature-gates=InitialCorruptCheck=true` and `--watch-progress-notify-interval`, where
/// earlier etcd releases take `--experimental-initial-corrupt-check` and
/// `--experimental-watch-progress-notify-interval` (3.6 still accepts those, deprecated; 3.4
/// refuses `--feature-gates`).
pub fn kubeadm_manifest(m: &KubeadmMember<'_>) -> String {
    // kubeadm sorts its flags: the `--experimental-*` ones come right after `--data-dir`.
    let (after_data_dir, last) = if m.etcd.at_least(3, 6) {
        (
            "    - --feature-gates=InitialCorruptCheck=true\n",
            "    - --watch-progress-notify-interval=5s\n",
        )
    } else {
        (
            "    - --experimental-initial-corrupt-check=true\n    \
             - --experimental-watch-progress-notify-interval=5s\n",
            "",
        )
    };
    let pki = |f: &str| m.pki_dir.join(f).display().to_string();
    let listen_client = if m.client_url.contains("://127.0.0.1:") {
        m.client_url.to_owned()
    } else {
        let port = m.client_url.rsplit(':').next().unwrap_or("2379");
        let scheme = m.client_url.split("://").next().unwrap_or("https");
        format!("{scheme}://127.0.0.1:{port},{}", m.client_url)
    };
    let metrics_port = m.metrics_url.rsplit(':').next().unwrap_or("2381");
    let data_dir = m.data_dir.display();
    let pki_dir = m.pki_dir.display();
    format!(
        "apiVersion: v1
kind: Pod
metadata:
  annotations:
    kubeadm.kubernetes.io/etcd.advertise-client-urls: {client}
  creationTimestamp: null
  labels:
    component: etcd
    tier: control-plane
  name: etcd
  namespace: kube-system
spec:
  containers:
  - command:
    - etcd
    - --advertise-client-urls={client}
    - --cert-file={server_crt}
    - --client-cert-auth=true
    - --data-dir={data_dir}
{after_data_dir}    - --initial-advertise-peer-urls={peer}
    - --initial-cluster={initial_cluster}
    - --initial-cluster-state={state}
    - --key-file={server_key}
    - --listen-client-urls={listen_client}
    - --listen-metrics-urls={metrics}
    - --listen-peer-urls={peer}
    - --logger=zap
    - --name={name}
    - --peer-cert-file={peer_crt}
    - --peer-client-cert-auth=true
    - --peer-key-file={peer_key}
    - --peer-trusted-ca-file={ca}
    - --snapshot-count=10000
    - --trusted-ca-file={ca}
{last}    image: {image}
    imagePullPolicy: IfNotPresent
    livenessProbe:
      failureThreshold: 8
      httpGet:
        host: 127.0.0.1
        path: /health?exclude=NOSPACE&serializable=true
        port: {metrics_port}
        scheme: HTTP
      initialDelaySeconds: 10
      periodSeconds: 10
      timeoutSeconds: 15
    name: etcd
    resources:
      requests:
        cpu: 100m
        memory: 100Mi
    startupProbe:
      failureThreshold: 24
      httpGet:
        host: 127.0.0.1
        path: /health?serializable=false
        port: {metrics_port}
        scheme: HTTP
      initialDelaySeconds: 10
      periodSeconds: 10
      timeoutSeconds: 15
    volumeMounts:
    - mountPath: {data_dir}
      name: etcd-data
    - mountPath: {pki_dir}
      name: etcd-certs
  hostNetwork: true
  priority: 2000001000
  priorityClassName: system-node-critical
  securityContext:
    seccompProfile:
      type: RuntimeDefault
  volumes:
  - hostPath:
      path: {pki_dir}
      type: DirectoryOrCreate
    name: etcd-certs
  - hostPath:
      path: {data_dir}
      type: DirectoryOrCreate
    name: etcd-data
status: {{}}
",
        client = m.client_url,
        server_crt = pki("server.crt"),
        server_key = pki("server.key"),
        peer_crt = pki("peer.crt"),
        peer_key = pki("peer.key"),
        ca = pki("ca.crt"),
        peer = m.peer_url,
        initial_cluster = m.initial_cluster,
        state = m.state,
        metrics = m.metrics_url,
        name = m.name,
        image = kubeadm_image(m.etcd),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const ETCD_34: EtcdVersion = EtcdVersion {
        major: 3,
        minor: 4,
        patch: 23,
    };

    fn member(dir: &Path) -> KubeadmMember<'_> {
        KubeadmMember {
            etcd: ETCD_34,
            name: "cp-1",
            peer_url: "https://127.0.0.1:2380",
            client_url: "https://127.0.0.1:2379",
            metrics_url: "http://127.0.0.1:2381",
            data_dir: dir,
            pki_dir: Path::new("/etc/kubernetes/pki/etcd"),
            initial_cluster: "cp-1=https://127.0.0.1:2380",
            state: "new",
        }
    }

    #[test]
    fn a_kubeadm_manifest_is_runnable_and_names_its_member() {
        let text = kubeadm_manifest(&member(Path::new("/var/lib/etcd")));
        let pod = PodSpec::parse(&text).unwrap();
        assert_eq!(pod.member, "cp-1");
        assert_eq!(pod.flag("initial-cluster-state"), Some("new"));
        assert_eq!(
            pod.flag("cert-file"),
            Some("/etc/kubernetes/pki/etcd/server.crt")
        );
        assert_eq!(pod.args.len(), 21);
        assert_eq!(pod.flag("experimental-initial-corrupt-check"), Some("true"));
        assert_eq!(pod.flag("feature-gates"), None);
    }

    #[test]
    fn a_kubeadm_manifest_for_etcd_3_6_uses_its_feature_gates() {
        let dir = Path::new("/var/lib/etcd");
        let v36 = EtcdVersion {
            minor: 6,
            patch: 16,
            ..ETCD_34
        };
        let text = kubeadm_manifest(&KubeadmMember {
            etcd: v36,
            ..member(dir)
        });
        let pod = PodSpec::parse(&text).unwrap();
        assert_eq!(pod.args.len(), 21);
        assert_eq!(pod.flag("feature-gates"), Some("InitialCorruptCheck=true"));
        assert_eq!(pod.flag("watch-progress-notify-interval"), Some("5s"));
        assert!(
            !pod.args.iter().any(|a| a.contains("experimental")),
            "{:?}",
            pod.args
        );
        assert!(
            text.contains("    image: registry.k8s.io/etcd:3.6.16-0\n"),
            "{text}"
        );
    }

    #[test]
    fn what_a_real_kubelet_would_not_run_as_etcd_is_refused() {
        let good = kubeadm_manifest(&member(Path::new("/var/lib/etcd")));
        for (bad, why) in [
            (
                good.replace("hostNetwork: true", "hostNetwork: false"),
                "hostNetwork",
            ),
            (
                good.replace("    - etcd\n", "    - kube-apiserver\n"),
                "not etcd",
            ),
            (
                good.replace("--data-dir=/var/lib/etcd", "--data-dir=/srv/etcd"),
                "--data-dir=/srv/etcd is not inside",
            ),
            (
                good.replace(
                    "      path: /etc/kubernetes/pki/etcd\n",
                    "      path: /elsewhere\n",
                ),
                "--cert-file=",
            ),
            (
                good.replace("--logger=zap", "--logger zap"),
                "not --flag=value",
            ),
            (
                good.replace("    image: registry.k8s.io/etcd:3.4.23-0\n", ""),
                "no image",
            ),
        ] {
            let err = PodSpec::parse(&bad).unwrap_err();
            assert!(err.contains(why), "{why}: {err}");
        }
    }
}
