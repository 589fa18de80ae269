//! kubeadm's etcd static Pod manifest, without I/O: the joining member's manifest rendered in
//! kubeadm's layout, and an existing manifest read back (whose member it runs, whether the
//! agent wrote it, what a new member may take from it).
//!
//! The manifest is the Pod kubeadm's `GetEtcdPodSpec` writes (kubeadm 1.33): `etcd` in
//! `kube-system`, labels `component: etcd` and `tier: control-plane`, the annotation
//! `kubeadm.kubernetes.io/etcd.advertise-client-urls`, `hostNetwork`, priority class
//! `system-node-critical`, the `RuntimeDefault` seccomp profile, and the hostPath volumes
//! `etcd-data` (the data directory) and `etcd-certs` (the certificate directory), each mounted
//! at its own path. The command is `etcd` followed by `--flag=value` arguments sorted by name,
//! as kubeadm sorts them.
//!
//! Where the flags come from, later sources winning:
//! 1. defaults: kubeadm's TLS flags, `--snapshot-count=10000` and
//!    `--listen-metrics-urls=http://127.0.0.1:2381`;
//! 2. a template, an existing member's manifest: every flag but the member's own
//!    ([`MEMBER_FLAGS`]) and the TLS file flags ([`PKI_FLAGS`]), plus its image, pull policy,
//!    resources and probes;
//! 3. the join's further settings (`ETCD_FOO_BAR` = `--foo-bar`);
//! 4. the member's own flags from the join (name, data directory, URLs, `--initial-cluster`,
//!    `--initial-cluster-state=existing`).
//!
//! The TLS file flags always name kubeadm's files in the certificate directory, because that
//! is the directory the Pod mounts. A startup probe on `/readyz` (kubeadm's since 1.31) is
//! asked on `/livez` instead: etcd answers `/readyz` with 503 while the member is a learner,
//! and a learner that waits for metalguard's promotion longer than the startup probe allows
//! (kubeadm: 24 × 10 s) would be restarted by the kubelet again and again.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use super::super::EtcdLaunch;

/// The annotation that marks a manifest the agent wrote.
pub const WRITTEN_BY_ANNOTATION: &str = "metalguard.io/written-by";
/// Its value.
pub const WRITTEN_BY_AGENT: &str = "metalguard-agent";
/// kubeadm's annotation with the member's advertised client URL.
const ADVERTISE_CLIENT_URLS_ANNOTATION: &str = "kubeadm.kubernetes.io/etcd.advertise-client-urls";
/// kubeadm's etcd metrics URL (`/health`, `/livez`, `/readyz`, `/metrics` over plain HTTP).
const DEFAULT_METRICS_URL: &str = "http://127.0.0.1:2381";
/// The container's name in kubeadm's manifest.
const CONTAINER: &str = "etcd";

/// Flags that belong to one member: set from the join, never taken from a template.
pub const MEMBER_FLAGS: &[&str] = &[
    "name",
    "data-dir",
    "initial-advertise-peer-urls",
    "listen-peer-urls",
    "advertise-client-urls",
    "listen-client-urls",
    "initial-cluster",
    "initial-cluster-state",
];

/// TLS file flags and kubeadm's file in the certificate directory for each.
pub const PKI_FLAGS: &[(&str, &str)] = &[
    ("cert-file", "server.crt"),
    ("key-file", "server.key"),
    ("trusted-ca-file", "ca.crt"),
    ("peer-cert-file", "peer.crt"),
    ("peer-key-file", "peer.key"),
    ("peer-trusted-ca-file", "ca.crt"),
];

/// What the manifest is built from besides the join.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSettings {
    /// The etcd image (`registry.k8s.io/etcd:3.6.5-0`); the template's when `None`.
    pub image: Option<String>,
    /// kubeadm's etcd certificate directory (`/etc/kubernetes/pki/etcd`): `ca.crt`,
    /// `server.*`, `peer.*`.
    pub pki_dir: PathBuf,
}

/// Errors reading or rendering a manifest.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The text is not YAML.
    #[error("not a YAML document")]
    Yaml(#[source] Box<serde_saphyr::Error>),
    /// The document is not a Pod with an etcd container.
    #[error("not an etcd static Pod: {0}")]
    NotEtcdPod(&'static str),
    /// Neither the settings nor a template name an image.
    #[error("no etcd image: set image, or a template manifest that has one")]
    NoImage,
    /// Rendering failed.
    #[error("rendering the manifest failed")]
    Render(#[source] Box<serde_saphyr::SerializeError>),
}

/// What a new member takes from an existing member's manifest.
#[derive(Debug, Clone, PartialEq)]
pub struct Template {
    /// The container image.
    pub image: String,
    /// The image pull policy, if set.
    pub image_pull_policy: Option<String>,
    /// Flags other than [`MEMBER_FLAGS`] and [`PKI_FLAGS`].
    pub flags: BTreeMap<String, String>,
    /// The container's resources, if set.
    pub resources: Option<Value>,
    /// `livenessProbe`, `readinessProbe`, `startupProbe`, as set.
    pub probes: BTreeMap<String, Value>,
}

/// A manifest found on disk, read back.
#[derive(Debug, Clone, PartialEq)]
pub struct ExistingManifest {
    /// Whether the agent wrote it ([`WRITTEN_BY_ANNOTATION`]).
    pub written_by_agent: bool,
    /// The etcd container.
    container: Value,
    /// Its `--flag=value` arguments (a bare `--flag` is `true`).
    pub flags: BTreeMap<String, String>,
}

impl ExistingManifest {
    /// Reads a manifest: a Pod with a container named `etcd` (or a single container) whose
    /// command or arguments run etcd.
    pub fn parse(text: &str) -> Result<Self, ManifestError> {
        let pod: Value =
            serde_saphyr::from_str(text).map_err(|e| ManifestError::Yaml(Box::new(e)))?;
        if pod.get("kind").and_then(Value::as_str) != Some("Pod") {
            return Err(ManifestError::NotEtcdPod("its kind is not Pod"));
        }
        let written_by_agent = pod
            .pointer("/metadata/annotations")
            .and_then(|a| a.get(WRITTEN_BY_ANNOTATION))
            .and_then(Value::as_str)
            == Some(WRITTEN_BY_AGENT);
        let containers = pod
            .pointer("/spec/containers")
            .and_then(Value::as_array)
            .ok_or(ManifestError::NotEtcdPod("it has no containers"))?;
        let container = containers
            .iter()
            .find(|c| c.get("name").and_then(Value::as_str) == Some(CONTAINER))
            .or_else(|| (containers.len() == 1).then(|| &containers[0]))
            .ok_or(ManifestError::NotEtcdPod("it has no container named etcd"))?
            .clone();
        let words: Vec<&str> = ["command", "args"]
            .iter()
            .filter_map(|k| container.get(*k).and_then(Value::as_array))
            .flatten()
            .filter_map(Value::as_str)
            .collect();
        if !words.first().is_some_and(|w| w.ends_with("etcd")) {
            return Err(ManifestError::NotEtcdPod("its command does not run etcd"));
        }
        Ok(Self {
            written_by_agent,
            flags: parse_flags(&words[1..]),
            container,
        })
    }

    /// The container image.
    pub fn image(&self) -> Option<&str> {
        self.container.get("image").and_then(Value::as_str)
    }

    /// The peer URLs the manifest's member advertises (`--initial-advertise-peer-urls`).
    pub fn peer_urls(&self) -> Vec<&str> {
        split_urls(self.flags.get("initial-advertise-peer-urls"))
    }

    /// Whether the manifest runs the member with `peer_url` (the member's identity).
    pub fn runs_member(&self, peer_url: &str) -> bool {
        self.peer_urls().contains(&peer_url)
    }

    /// The flag `name`, if set.
    pub fn flag(&self, name: &str) -> Option<&str> {
        self.flags.get(name).map(String::as_str)
    }

    /// What a new member takes from this manifest.
    pub fn template(&self) -> Result<Template, ManifestError> {
        let image = self
            .image()
            .ok_or(ManifestError::NotEtcdPod("its etcd container has no image"))?
            .to_owned();
        let flags = self
            .flags
            .iter()
            .filter(|(k, _)| {
                !MEMBER_FLAGS.contains(&k.as_str()) && !PKI_FLAGS.iter().any(|(f, _)| f == k)
            })
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        let probes = ["livenessProbe", "readinessProbe", "startupProbe"]
            .into_iter()
            .filter_map(|p| Some((p.to_owned(), self.container.get(p)?.clone())))
            .collect();
        Ok(Template {
            image,
            image_pull_policy: self
                .container
                .get("imagePullPolicy")
                .and_then(Value::as_str)
                .map(str::to_owned),
            flags,
            resources: self.container.get("resources").cloned(),
            probes,
        })
    }
}

fn split_urls(value: Option<&String>) -> Vec<&str> {
    value
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|u| !u.is_empty())
                .collect()
        })
        .unwrap_or_default()
}

/// `--flag=value` (and `--flag value`, and a bare `--flag` = `true`) into a map.
fn parse_flags(words: &[&str]) -> BTreeMap<String, String> {
    let mut flags = BTreeMap::new();
    let mut i = 0;
    while i < words.len() {
        let word = words[i].trim_start_matches('-');
        if let Some((k, v)) = word.split_once('=') {
            flags.insert(k.to_owned(), v.to_owned());
        } else if let Some(next) = words.get(i + 1).filter(|n| !n.starts_with('-')) {
            flags.insert(word.to_owned(), (*next).to_owned());
            i += 1;
        } else {
            flags.insert(word.to_owned(), "true".to_owned());
        }
        i += 1;
    }
    flags
}

/// `ETCD_FOO_BAR` → `foo-bar`.
pub fn flag_of_env(key: &str) -> String {
    key.trim_start_matches("ETCD_")
        .to_ascii_lowercase()
        .replace('_', "-")
}

/// The loopback client URL kubeadm listens on next to the advertised one
/// (`https://127.0.0.1:2379` for `https://10.0.0.4:2379`); `None` when the advertised URL is
/// on loopback already or cannot be read.
fn loopback_client_url(client_url: &str) -> Option<String> {
    let (scheme, rest) = client_url.split_once("://")?;
    let authority = rest.split('/').next()?;
    let (host, port) = authority.rsplit_once(':')?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host == "localhost" || host.parse::<std::net::IpAddr>().ok()?.is_loopback() {
        return None;
    }
    let loopback = if host.contains(':') {
        "[::1]"
    } else {
        "127.0.0.1"
    };
    Some(format!("{scheme}://{loopback}:{port}"))
}

/// Every flag of the member's etcd, by the precedence in the module docs.
pub fn flags(
    launch: &EtcdLaunch,
    settings: &PodSettings,
    template: Option<&Template>,
) -> BTreeMap<String, String> {
    let mut flags = BTreeMap::new();
    let pki = |file: &str| settings.pki_dir.join(file).display().to_string();
    for (flag, file) in PKI_FLAGS {
        flags.insert((*flag).to_owned(), pki(file));
    }
    for flag in ["client-cert-auth", "peer-client-cert-auth"] {
        flags.insert(flag.to_owned(), "true".to_owned());
    }
    flags.insert("snapshot-count".to_owned(), "10000".to_owned());
    flags.insert(
        "listen-metrics-urls".to_owned(),
        DEFAULT_METRICS_URL.to_owned(),
    );
    if let Some(t) = template {
        flags.extend(t.flags.clone());
    }
    for (key, value) in &launch.extra_env {
        flags.insert(flag_of_env(key), value.clone());
    }
    let listen_client = launch.listen_client_url.clone().unwrap_or_else(|| {
        loopback_client_url(&launch.client_url).map_or_else(
            || launch.client_url.clone(),
            |lo| format!("{lo},{}", launch.client_url),
        )
    });
    let member = [
        ("name", launch.name.clone()),
        ("data-dir", launch.data_dir.display().to_string()),
        ("initial-advertise-peer-urls", launch.peer_url.clone()),
        (
            "listen-peer-urls",
            launch
                .listen_peer_url
                .clone()
                .unwrap_or_else(|| launch.peer_url.clone()),
        ),
        ("advertise-client-urls", launch.client_url.clone()),
        ("listen-client-urls", listen_client),
        ("initial-cluster", launch.initial_cluster.clone()),
        ("initial-cluster-state", "existing".to_owned()),
    ];
    for (flag, value) in member {
        flags.insert(flag.to_owned(), value);
    }
    flags
}

/// kubeadm's probe on `path` at the metrics URL (`http://host:port`).
fn probe(metrics: (&str, u16), path: &str, kind: &str) -> Value {
    let (host, port) = metrics;
    let get = json!({"host": host, "path": path, "port": port, "scheme": "HTTP"});
    match kind {
        "readinessProbe" => json!({
            "failureThreshold": 3, "httpGet": get, "periodSeconds": 1, "timeoutSeconds": 15
        }),
        "startupProbe" => json!({
            "failureThreshold": 24, "httpGet": get, "initialDelaySeconds": 10,
            "periodSeconds": 10, "timeoutSeconds": 15
        }),
        _ => json!({
            "failureThreshold": 8, "httpGet": get, "initialDelaySeconds": 10,
            "periodSeconds": 10, "timeoutSeconds": 15
        }),
    }
}

/// Host and port of the first plain-HTTP metrics URL (kubeadm's probes read it).
fn metrics_endpoint(flags: &BTreeMap<String, String>) -> (String, u16) {
    let url = split_urls(flags.get("listen-metrics-urls"))
        .into_iter()
        .find(|u| u.starts_with("http://"))
        .unwrap_or(DEFAULT_METRICS_URL);
    let authority = url.trim_start_matches("http://").split('/').next();
    authority
        .and_then(|a| a.rsplit_once(':'))
        .and_then(|(h, p)| Some((h.trim_matches(['[', ']']).to_owned(), p.parse().ok()?)))
        .unwrap_or_else(|| ("127.0.0.1".to_owned(), 2381))
}

/// The template's probes pointed at this member's metrics endpoint, a startup probe on
/// `/readyz` moved to `/livez` (module docs); kubeadm's probes without a template.
fn probes(template: Option<&Template>, metrics: (&str, u16)) -> BTreeMap<String, Value> {
    let mut probes: BTreeMap<String, Value> = match template {
        Some(t) if !t.probes.is_empty() => t.probes.clone(),
        _ => [
            ("livenessProbe", "/livez"),
            ("readinessProbe", "/readyz"),
            ("startupProbe", "/readyz"),
        ]
        .into_iter()
        .map(|(kind, path)| (kind.to_owned(), probe(metrics, path, kind)))
        .collect(),
    };
    for (kind, p) in &mut probes {
        if let Some(get) = p.get_mut("httpGet").and_then(Value::as_object_mut) {
            get.insert("host".to_owned(), json!(metrics.0));
            get.insert("port".to_owned(), json!(metrics.1));
            let readyz = get
                .get("path")
                .and_then(Value::as_str)
                .is_some_and(|path| path == "/readyz" || path.starts_with("/readyz?"));
            if kind == "startupProbe" && readyz {
                get.insert("path".to_owned(), json!("/livez"));
            }
        }
    }
    probes
}

fn host_path_volume(name: &str, path: &Path) -> Value {
    json!({"hostPath": {"path": path.display().to_string(), "type": "DirectoryOrCreate"}, "name": name})
}

/// The joining member's manifest in kubeadm's layout (module docs), marked as the agent's.
pub fn render(
    launch: &EtcdLaunch,
    settings: &PodSettings,
    template: Option<&Template>,
) -> Result<String, ManifestError> {
    let image = settings
        .image
        .clone()
        .or_else(|| template.map(|t| t.image.clone()))
        .ok_or(ManifestError::NoImage)?;
    let flags = flags(launch, settings, template);
    let (metrics_host, metrics_port) = metrics_endpoint(&flags);
    let mut command = vec![CONTAINER.to_owned()];
    command.extend(flags.iter().map(|(k, v)| format!("--{k}={v}")));
    let data_dir = launch.data_dir.display().to_string();
    let pki_dir = settings.pki_dir.display().to_string();
    let mut container = json!({
        "command": command,
        "image": image,
        "imagePullPolicy": template
            .and_then(|t| t.image_pull_policy.clone())
            .unwrap_or_else(|| "IfNotPresent".to_owned()),
        "name": CONTAINER,
        "resources": template
            .and_then(|t| t.resources.clone())
            .unwrap_or_else(|| json!({"requests": {"cpu": "100m", "memory": "100Mi"}})),
        "volumeMounts": [
            {"mountPath": data_dir, "name": "etcd-data"},
            {"mountPath": pki_dir, "name": "etcd-certs"},
        ],
    });
    if let Some(obj) = container.as_object_mut() {
        for (kind, p) in probes(template, (&metrics_host, metrics_port)) {
            obj.insert(kind, p);
        }
    }
    let pod = json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "annotations": {
                ADVERTISE_CLIENT_URLS_ANNOTATION: launch.client_url,
                WRITTEN_BY_ANNOTATION: WRITTEN_BY_AGENT,
            },
            "labels": {"component": "etcd", "tier": "control-plane"},
            "name": "etcd",
            "namespace": "kube-system",
        },
        "spec": {
            "containers": [container],
            "hostNetwork": true,
            "priority": 2_000_001_000,
            "priorityClassName": "system-node-critical",
            "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
            "volumes": [
                host_path_volume("etcd-certs", &settings.pki_dir),
                host_path_volume("etcd-data", &launch.data_dir),
            ],
        },
        "status": {},
    });
    serde_saphyr::to_string(&pod).map_err(|e| ManifestError::Render(Box::new(e)))
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
            listen_client_url: None,
            initial_cluster: "cp-1=https://10.0.0.1:2380,cp-4=https://10.0.0.4:2380".into(),
            extra_env: vec![],
        }
    }

    fn settings(image: Option<&str>) -> PodSettings {
        PodSettings {
            image: image.map(str::to_owned),
            pki_dir: "/etc/kubernetes/pki/etcd".into(),
        }
    }

    /// cp-1's manifest as kubeadm 1.33 writes it.
    const KUBEADM_CP1: &str = r"apiVersion: v1
kind: Pod
metadata:
  annotations:
    kubeadm.kubernetes.io/etcd.advertise-client-urls: https://10.0.0.1:2379
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
    - --advertise-client-urls=https://10.0.0.1:2379
    - --cert-file=/etc/kubernetes/pki/etcd/server.crt
    - --client-cert-auth=true
    - --data-dir=/var/lib/etcd
    - --feature-gates=InitialCorruptCheck=true
    - --initial-advertise-peer-urls=https://10.0.0.1:2380
    - --initial-cluster=cp-1=https://10.0.0.1:2380
    - --key-file=/etc/kubernetes/pki/etcd/server.key
    - --listen-client-urls=https://127.0.0.1:2379,https://10.0.0.1:2379
    - --listen-metrics-urls=http://127.0.0.1:2381
    - --listen-peer-urls=https://10.0.0.1:2380
    - --name=cp-1
    - --peer-cert-file=/etc/kubernetes/pki/etcd/peer.crt
    - --peer-client-cert-auth=true
    - --peer-key-file=/etc/kubernetes/pki/etcd/peer.key
    - --peer-trusted-ca-file=/etc/kubernetes/pki/etcd/ca.crt
    - --snapshot-count=10000
    - --trusted-ca-file=/etc/kubernetes/pki/etcd/ca.crt
    - --watch-progress-notify-interval=5s
    image: registry.k8s.io/etcd:3.6.5-0
    imagePullPolicy: IfNotPresent
    livenessProbe:
      failureThreshold: 8
      httpGet:
        host: 127.0.0.1
        path: /livez
        port: 2381
        scheme: HTTP
      initialDelaySeconds: 10
      periodSeconds: 10
      timeoutSeconds: 15
    name: etcd
    readinessProbe:
      failureThreshold: 3
      httpGet:
        host: 127.0.0.1
        path: /readyz
        port: 2381
        scheme: HTTP
      periodSeconds: 1
      timeoutSeconds: 15
    resources:
      requests:
        cpu: 100m
        memory: 100Mi
    startupProbe:
      failureThreshold: 24
      httpGet:
        host: 127.0.0.1
        path: /readyz
        port: 2381
        scheme: HTTP
      initialDelaySeconds: 10
      periodSeconds: 10
      timeoutSeconds: 15
    volumeMounts:
    - mountPath: /var/lib/etcd
      name: etcd-data
    - mountPath: /etc/kubernetes/pki/etcd
      name: etcd-certs
  hostNetwork: true
  priority: 2000001000
  priorityClassName: system-node-critical
  securityContext:
    seccompProfile:
      type: RuntimeDefault
  volumes:
  - hostPath:
      path: /etc/kubernetes/pki/etcd
      type: DirectoryOrCreate
    name: etcd-certs
  - hostPath:
      path: /var/lib/etcd
      type: DirectoryOrCreate
    name: etcd-data
status: {}
";

    #[test]
    fn a_kubeadm_manifest_is_read_and_its_member_recognised() {
        let m = ExistingManifest::parse(KUBEADM_CP1).unwrap();
        assert!(!m.written_by_agent);
        assert_eq!(m.image(), Some("registry.k8s.io/etcd:3.6.5-0"));
        assert_eq!(m.flag("name"), Some("cp-1"));
        assert!(m.runs_member("https://10.0.0.1:2380"));
        assert!(!m.runs_member("https://10.0.0.4:2380"));
        let t = m.template().unwrap();
        // Only what is not the member's own or a TLS file.
        assert_eq!(
            t.flags.keys().map(String::as_str).collect::<Vec<_>>(),
            [
                "client-cert-auth",
                "feature-gates",
                "listen-metrics-urls",
                "peer-client-cert-auth",
                "snapshot-count",
                "watch-progress-notify-interval"
            ]
        );
        assert_eq!(t.probes.len(), 3);
    }

    #[test]
    fn the_joining_members_manifest_takes_the_template_and_sets_its_own_flags() {
        let template = ExistingManifest::parse(KUBEADM_CP1)
            .unwrap()
            .template()
            .unwrap();
        let text = render(&launch(), &settings(None), Some(&template)).unwrap();
        let m = ExistingManifest::parse(&text).unwrap();
        assert!(m.written_by_agent);
        assert_eq!(m.image(), Some("registry.k8s.io/etcd:3.6.5-0"));
        assert!(m.runs_member("https://10.0.0.4:2380"));
        let want = [
            ("advertise-client-urls", "https://10.0.0.4:2379"),
            ("cert-file", "/etc/kubernetes/pki/etcd/server.crt"),
            ("client-cert-auth", "true"),
            ("data-dir", "/var/lib/etcd"),
            ("feature-gates", "InitialCorruptCheck=true"),
            ("initial-advertise-peer-urls", "https://10.0.0.4:2380"),
            (
                "initial-cluster",
                "cp-1=https://10.0.0.1:2380,cp-4=https://10.0.0.4:2380",
            ),
            ("initial-cluster-state", "existing"),
            ("key-file", "/etc/kubernetes/pki/etcd/server.key"),
            (
                "listen-client-urls",
                "https://127.0.0.1:2379,https://10.0.0.4:2379",
            ),
            ("listen-metrics-urls", "http://127.0.0.1:2381"),
            ("listen-peer-urls", "https://10.0.0.4:2380"),
            ("name", "cp-4"),
            ("peer-cert-file", "/etc/kubernetes/pki/etcd/peer.crt"),
            ("peer-client-cert-auth", "true"),
            ("peer-key-file", "/etc/kubernetes/pki/etcd/peer.key"),
            ("peer-trusted-ca-file", "/etc/kubernetes/pki/etcd/ca.crt"),
            ("snapshot-count", "10000"),
            ("trusted-ca-file", "/etc/kubernetes/pki/etcd/ca.crt"),
            ("watch-progress-notify-interval", "5s"),
        ];
        let got: Vec<(&str, &str)> = m
            .flags
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(got, want);
        // Sorted as kubeadm sorts them, after `etcd`.
        assert!(
            text.contains(
                "  - command:\n    - etcd\n    - --advertise-client-urls=https://10.0.0.4:2379\n"
            ),
            "{text}"
        );
        let pod: Value = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(
            pod.pointer("/metadata/annotations/kubeadm.kubernetes.io~1etcd.advertise-client-urls"),
            Some(&json!("https://10.0.0.4:2379"))
        );
        assert_eq!(pod.pointer("/spec/hostNetwork"), Some(&json!(true)));
        assert_eq!(
            pod.pointer("/spec/volumes"),
            Some(&json!([
                {"hostPath": {"path": "/etc/kubernetes/pki/etcd", "type": "DirectoryOrCreate"}, "name": "etcd-certs"},
                {"hostPath": {"path": "/var/lib/etcd", "type": "DirectoryOrCreate"}, "name": "etcd-data"},
            ]))
        );
        let c = pod.pointer("/spec/containers/0").unwrap();
        assert_eq!(
            c["startupProbe"]["httpGet"]["path"],
            json!("/livez"),
            "a learner fails /readyz"
        );
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], json!("/readyz"));
        assert_eq!(c["livenessProbe"]["httpGet"]["port"], json!(2381));
        // Deterministic: the same join renders the same bytes (an unchanged manifest is
        // never rewritten, so the kubelet does not restart etcd).
        assert_eq!(
            render(&launch(), &settings(None), Some(&template)).unwrap(),
            text
        );
    }

    #[test]
    fn settings_override_the_template_and_the_member_flags_win() {
        let template = ExistingManifest::parse(KUBEADM_CP1)
            .unwrap()
            .template()
            .unwrap();
        let mut launch = launch();
        launch.extra_env = vec![
            (
                "ETCD_LISTEN_METRICS_URLS".into(),
                "http://127.0.0.1:12381".into(),
            ),
            ("ETCD_SNAPSHOT_COUNT".into(), "5000".into()),
        ];
        let mut s = settings(Some("registry.example/etcd:3.6.6-0"));
        s.pki_dir = "/srv/pki".into();
        let text = render(&launch, &s, Some(&template)).unwrap();
        let m = ExistingManifest::parse(&text).unwrap();
        assert_eq!(m.image(), Some("registry.example/etcd:3.6.6-0"));
        assert_eq!(m.flag("snapshot-count"), Some("5000"));
        assert_eq!(m.flag("cert-file"), Some("/srv/pki/server.crt"));
        assert_eq!(
            m.flag("listen-metrics-urls"),
            Some("http://127.0.0.1:12381")
        );
        let pod: Value = serde_saphyr::from_str(&text).unwrap();
        assert_eq!(
            pod.pointer("/spec/containers/0/livenessProbe/httpGet/port"),
            Some(&json!(12381)),
            "probes follow the metrics URL"
        );
        // A loopback client URL is not listed twice.
        launch.client_url = "https://127.0.0.1:2379".into();
        let m = ExistingManifest::parse(&render(&launch, &s, None).unwrap()).unwrap();
        assert_eq!(m.flag("listen-client-urls"), Some("https://127.0.0.1:2379"));
    }

    #[test]
    fn without_image_or_template_nothing_is_rendered() {
        assert!(matches!(
            render(&launch(), &settings(None), None),
            Err(ManifestError::NoImage)
        ));
        let text = render(
            &launch(),
            &settings(Some("registry.k8s.io/etcd:3.6.5-0")),
            None,
        )
        .unwrap();
        let pod: Value = serde_saphyr::from_str(&text).unwrap();
        let c = pod.pointer("/spec/containers/0").unwrap();
        assert_eq!(
            c["resources"],
            json!({"requests": {"cpu": "100m", "memory": "100Mi"}})
        );
        assert_eq!(c["startupProbe"]["httpGet"]["path"], json!("/livez"));
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], json!("/livez"));
    }

    #[test]
    fn what_is_not_an_etcd_pod_is_refused() {
        for (text, why) in [
            ("a: [", "not a YAML"),
            ("kind: Deployment\n", "kind is not Pod"),
            ("kind: Pod\nspec: {}\n", "no containers"),
            (
                "kind: Pod\nspec:\n  containers:\n  - name: a\n  - name: b\n",
                "no container named etcd",
            ),
            (
                "kind: Pod\nspec:\n  containers:\n  - name: etcd\n    command: [kube-apiserver]\n",
                "does not run etcd",
            ),
        ] {
            let err = ExistingManifest::parse(text).unwrap_err();
            assert!(err.to_string().contains(why), "{text}: {err}");
        }
    }

    #[test]
    fn flags_in_either_form_are_read() {
        let words = ["--name", "a", "--client-cert-auth", "--data-dir=/d", "-x=1"];
        let flags = parse_flags(&words);
        assert_eq!(flags["name"], "a");
        assert_eq!(flags["client-cert-auth"], "true");
        assert_eq!(flags["data-dir"], "/d");
        assert_eq!(flags["x"], "1");
        assert_eq!(
            flag_of_env("ETCD_LISTEN_METRICS_URLS"),
            "listen-metrics-urls"
        );
        assert_eq!(
            loopback_client_url("https://[fd00::4]:2379"),
            Some("https://[::1]:2379".to_owned())
        );
        assert_eq!(loopback_client_url("https://localhost:2379"), None);
    }
}
