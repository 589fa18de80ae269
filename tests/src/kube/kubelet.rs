//! Fake kubelets: a thread per Node that does what a kubelet does for the control plane and
//! nothing else. It registers the Node (labels, annotations, taints), renews the Node's Lease
//! in `kube-node-lease` and posts its `Ready` condition (`nodes/status`, strategic merge, so
//! other conditions on the Node stay). On demand it reports NotReady, stops (a dead or
//! powered-off host: the Node is left as it was and goes stale), and registers again (the
//! host booted: the Node is created if it is gone, its status posted, its Lease renewed).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime};

use serde_json::{Value, json};

use super::client::ApiClient;
use super::time::{rfc3339, rfc3339_micros};
use crate::{HarnessError, Result};

/// How often a running fake kubelet renews its Lease (a kubelet: every 10 s of a 40 s Lease;
/// faster here so that kube-controller-manager's 10 s grace period sees a steady beat).
pub const HEARTBEAT: Duration = Duration::from_secs(1);
/// How often it posts its `Ready` condition while nothing changes (a kubelet: 10 s).
pub const STATUS_EVERY: Duration = Duration::from_secs(10);
/// How often it compares the Node's `Ready` with its own and posts its own when they differ:
/// a kubelet does so every `nodeStatusUpdateFrequency` (10 s, a thirtieth of a typical
/// `Ready=Unknown` timeout of 300 s), so a `Ready=Unknown` that kube-controller-manager set
/// while the API server was unavailable is gone well before any health check's timeout. The
/// lab's timeouts are seconds: so is this. (Posting only every [`STATUS_EVERY`] left such an
/// `Unknown` for up to 10 s, past the lab's 5 s timeout: the soak fenced a healthy host after
/// an API server freeze.)
const STATUS_CHECK: Duration = Duration::from_secs(2);
/// The Lease duration a kubelet uses.
const LEASE_SECONDS: u32 = 40;

/// What a Node looks like when its kubelet registers it.
#[derive(Debug, Clone, Default)]
pub struct NodeTemplate {
    /// The Node's name.
    pub name: String,
    /// Labels.
    pub labels: BTreeMap<String, String>,
    /// Annotations.
    pub annotations: BTreeMap<String, String>,
    /// Taints, as the API writes them (`{"key", "value", "effect"}`).
    pub taints: Vec<Value>,
}

impl NodeTemplate {
    /// A Node `name` with the label `kubernetes.io/hostname` a kubelet always sets.
    pub fn named(name: &str) -> Self {
        Self {
            name: name.to_owned(),
            labels: [("kubernetes.io/hostname".to_owned(), name.to_owned())].into(),
            ..Self::default()
        }
    }

    /// Adds a label.
    #[must_use]
    pub fn label(mut self, key: &str, value: &str) -> Self {
        self.labels.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Adds an annotation.
    #[must_use]
    pub fn annotation(mut self, key: &str, value: &str) -> Self {
        self.annotations.insert(key.to_owned(), value.to_owned());
        self
    }

    /// Adds a taint.
    #[must_use]
    pub fn taint(mut self, key: &str, value: &str, effect: &str) -> Self {
        self.taints
            .push(json!({"key": key, "value": value, "effect": effect}));
        self
    }
}

#[derive(Debug)]
struct Shared {
    running: bool,
    ready: bool,
    ready_since: SystemTime,
    heartbeats: u64,
    last_error: Option<String>,
}

/// One fake kubelet. Dropping it stops its thread (the Node stays).
#[derive(Debug)]
pub struct FakeKubelet {
    name: String,
    api: ApiClient,
    shared: Arc<Mutex<Shared>>,
    quit: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

fn node_path(name: &str) -> String {
    format!("/api/v1/nodes/{name}")
}

fn lease_path(name: &str) -> String {
    format!("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{name}")
}

fn lock(shared: &Mutex<Shared>) -> std::sync::MutexGuard<'_, Shared> {
    shared.lock().unwrap_or_else(PoisonError::into_inner)
}

impl FakeKubelet {
    /// Registers `node` (Node, Ready status, Lease) and starts heartbeats.
    pub fn start(api: &ApiClient, node: &NodeTemplate) -> Result<Self> {
        let shared = Arc::new(Mutex::new(Shared {
            running: true,
            ready: true,
            ready_since: SystemTime::now(),
            heartbeats: 0,
            last_error: None,
        }));
        let kubelet = Self {
            name: node.name.clone(),
            api: api.clone(),
            shared,
            quit: Arc::new(AtomicBool::new(false)),
            thread: None,
        };
        kubelet.register(node)?;
        Ok(kubelet.spawn())
    }

    fn spawn(mut self) -> Self {
        let (api, name, shared, quit) = (
            self.api.clone(),
            self.name.clone(),
            self.shared.clone(),
            self.quit.clone(),
        );
        self.thread = Some(std::thread::spawn(move || {
            let mut last_status = std::time::Instant::now();
            let mut last_check = std::time::Instant::now();
            while !quit.load(Ordering::SeqCst) {
                let (running, ready) = {
                    let s = lock(&shared);
                    (s.running, s.ready)
                };
                if running {
                    let status_due = last_status.elapsed() >= STATUS_EVERY;
                    let check_due = last_check.elapsed() >= STATUS_CHECK;
                    let beat = renew_lease(&api, &name).and_then(|()| {
                        if check_due {
                            last_check = std::time::Instant::now();
                        }
                        if status_due || (check_due && ready_differs(&api, &name, ready)?) {
                            last_status = std::time::Instant::now();
                            // Read again and posted under the lock, as `set_ready` posts: a
                            // state read before a change cannot be posted after it.
                            let s = lock(&shared);
                            post_status(&api, &name, s.ready, s.ready_since)
                        } else {
                            Ok(())
                        }
                    });
                    let mut s = lock(&shared);
                    match beat {
                        Ok(()) => s.heartbeats += 1,
                        Err(e) => s.last_error = Some(e.to_string()),
                    }
                }
                std::thread::park_timeout(HEARTBEAT);
            }
        }));
        self
    }

    /// Creates the Node (an existing one is kept, as a restarted kubelet finds it), posts
    /// its status and creates or renews its Lease.
    fn register(&self, node: &NodeTemplate) -> Result<()> {
        let object = json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": node.name, "labels": node.labels, "annotations": node.annotations},
            "spec": {"taints": node.taints},
        });
        match self.api.create("/api/v1/nodes", &object) {
            Ok(_) => {}
            Err(e) if e.api_status() == Some(409) => {}
            Err(e) => return Err(e),
        }
        let uid = self.api.get(&node_path(&node.name))?["metadata"]["uid"].clone();
        {
            let s = lock(&self.shared);
            post_status(&self.api, &node.name, s.ready, s.ready_since)?;
        }
        let lease = json!({
            "apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
            "metadata": {"name": node.name, "namespace": "kube-node-lease",
                "ownerReferences": [{"apiVersion": "v1", "kind": "Node", "name": node.name, "uid": uid}]},
            "spec": {"holderIdentity": node.name, "leaseDurationSeconds": LEASE_SECONDS,
                "renewTime": rfc3339_micros(SystemTime::now())},
        });
        match self.api.create(
            "/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases",
            &lease,
        ) {
            Ok(_) => Ok(()),
            Err(e) if e.api_status() == Some(409) => renew_lease(&self.api, &node.name),
            Err(e) => Err(e),
        }
    }

    /// The Node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reports `Ready` as `ready` from now on (posted at once; the transition time is now).
    pub fn set_ready(&self, ready: bool) -> Result<()> {
        // Posted under the lock, so the heartbeat thread cannot post the state it read before
        // this change after it (the Node would be Ready again until its next status check).
        let mut s = lock(&self.shared);
        if s.ready != ready {
            s.ready = ready;
            s.ready_since = SystemTime::now();
        }
        post_status(&self.api, &self.name, ready, s.ready_since)
    }

    /// The host died: no more Lease renewals or status posts.
    pub fn stop(&self) {
        lock(&self.shared).running = false;
    }

    /// Whether heartbeats are being sent.
    pub fn is_running(&self) -> bool {
        lock(&self.shared).running
    }

    /// The host booted: registers `node` (created if it is gone, Ready), then heartbeats.
    pub fn register_again(&self, node: &NodeTemplate) -> Result<()> {
        {
            let mut s = lock(&self.shared);
            s.ready = true;
            s.ready_since = SystemTime::now();
            s.last_error = None;
        }
        self.register(node)?;
        lock(&self.shared).running = true;
        Ok(())
    }

    /// Heartbeats sent so far.
    pub fn heartbeats(&self) -> u64 {
        lock(&self.shared).heartbeats
    }

    /// The last heartbeat error, if any.
    pub fn last_error(&self) -> Option<String> {
        lock(&self.shared).last_error.clone()
    }
}

impl Drop for FakeKubelet {
    fn drop(&mut self) {
        self.quit.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            thread.thread().unpark();
            let _ = thread.join();
        }
    }
}

fn renew_lease(api: &ApiClient, name: &str) -> Result<()> {
    api.merge_patch(
        &lease_path(name),
        &json!({"spec": {"holderIdentity": name, "renewTime": rfc3339_micros(SystemTime::now())}}),
    )
    .map(|_| ())
}

/// Whether the Node's `Ready` status is not the one this kubelet posts (someone else, such as
/// kube-controller-manager, changed it).
fn ready_differs(api: &ApiClient, name: &str, ready: bool) -> Result<bool> {
    let node = api.get(&node_path(name))?;
    let posted = node["status"]["conditions"]
        .as_array()
        .and_then(|c| c.iter().find(|c| c["type"] == "Ready"))
        .and_then(|c| c["status"].as_str())
        .unwrap_or("");
    Ok(posted != if ready { "True" } else { "False" })
}

fn post_status(api: &ApiClient, name: &str, ready: bool, since: SystemTime) -> Result<()> {
    let (status, reason, message) = if ready {
        (
            "True",
            "KubeletReady",
            "fake kubelet is posting ready status",
        )
    } else {
        ("False", "KubeletNotReady", "fake kubelet reports not ready")
    };
    let patch = json!({"status": {"conditions": [{
        "type": "Ready", "status": status, "reason": reason, "message": message,
        "lastHeartbeatTime": rfc3339(SystemTime::now()),
        "lastTransitionTime": rfc3339(since),
    }]}});
    api.strategic_patch(&format!("{}/status", node_path(name)), &patch)
        .map(|_| ())
        .map_err(|e| match e {
            HarnessError::Api { status: 404, .. } => HarnessError::Other(format!(
                "Node {name} is gone (deleted while its kubelet runs)"
            )),
            other => other,
        })
}
