//! The Kubernetes backend against a scripted fake API server (`tower-test`'s `mock::pair`
//! behind `kube::Client::new`, as kube-rs' controller-rs tests do): the real controller loop
//! ([`Controller`]) runs; the fake server answers from a small object table and records every
//! request (method, path, query, body); each test compares that record with the exact list it
//! expects. Times in bodies are replaced by `<time>`, generated event names by nothing.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use super::term::TERM_ANNOTATION;
use http::{Request, Response};
use http_body_util::BodyExt as _;
use k8s_openapi::api::core::v1::{Node, Secret};
use kube::Client;
use kube::client::Body;
use metalguard_api::k8s::{FenceRequest, GuardedHost, HostHealthCheck};
use metalguard_api::protocol::{CommandResult, Outcome};
use serde_json::{Value, json};

use super::world::{World, WorldWriters, apply};
use super::{KubeBackend, KubeSettings};
use crate::api::hub::{Hub, Inbound};
use crate::control::metrics::Metrics;
use crate::control::service::Controller;
use crate::inventory::ControllerSettings;

const NS: &str = "metalguard-system";
const ME: &str = "controller-0";

/// One recorded request: `METHOD path?query` and the body with times masked.
#[derive(Debug, Clone, PartialEq)]
struct Seen {
    call: String,
    body: Value,
}

/// The fake API server's objects (by path) and whom the Lease names.
#[derive(Default)]
struct Server {
    objects: BTreeMap<String, Value>,
    lease_holder: String,
    /// The term annotation on the Lease (`kube/term.rs`).
    lease_term: Value,
    version: u64,
    seen: Vec<Seen>,
    /// Status applies of `GuardedHost`s that leave their records (remediation, operations)
    /// as they were: the leader's observations (power, agent, member, conditions), kept apart
    /// so that `seen` is the decisions' requests.
    observations: Vec<Seen>,
}

fn mask(value: &mut Value) {
    let time = regex::Regex::new(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$").unwrap();
    match value {
        Value::String(s) if time.is_match(s) => *s = "<time>".to_owned(),
        Value::Array(items) => items.iter_mut().for_each(mask),
        Value::Object(map) => map.values_mut().for_each(mask),
        _ => {}
    }
}

fn merge(target: &mut Value, patch: &Value) {
    match (target, patch) {
        (Value::Object(t), Value::Object(p)) => {
            for (k, v) in p {
                if v.is_null() {
                    t.remove(k);
                } else {
                    merge(t.entry(k.clone()).or_insert(Value::Null), v);
                }
            }
        }
        (t, p) => *t = p.clone(),
    }
}

impl Server {
    fn answer(&mut self, method: &str, path: &str, body: &Value) -> (u16, Value) {
        assert_granted(method, path);
        self.version += 1;
        let version = self.version.to_string();
        if path.ends_with("/leases/metalguard-controller") {
            if method == "PATCH" {
                self.lease_term = body["metadata"]["annotations"][TERM_ANNOTATION].clone();
            }
            let renew = k8s_openapi::jiff::Timestamp::now().to_string();
            return (
                200,
                json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                    "metadata": {"name": "metalguard-controller", "namespace": NS, "resourceVersion": "1",
                        "annotations": {TERM_ANNOTATION: self.lease_term}},
                    "spec": {"holderIdentity": self.lease_holder, "leaseDurationSeconds": 15, "renewTime": renew}}),
            );
        }
        if method == "POST" && path.ends_with("/events") {
            let mut event = body.clone();
            event["metadata"]["name"] = json!(format!("e{version}"));
            return (201, event);
        }
        let key = path.trim_end_matches("/status").to_owned();
        let Some(object) = self.objects.get_mut(&key) else {
            return (
                404,
                json!({"kind": "Status", "apiVersion": "v1", "status": "Failure", "reason": "NotFound", "code": 404, "message": "not found"}),
            );
        };
        match method {
            "DELETE" => {
                let gone = object.clone();
                self.objects.remove(&key);
                (200, gone)
            }
            "PATCH" => {
                let mut change = body.clone();
                if let Some(map) = change.as_object_mut() {
                    map.remove("apiVersion");
                    map.remove("kind");
                }
                if path.ends_with("/status") && path.contains("/nodes/") {
                    // Strategic merge of conditions by type.
                    let mut conditions = object["status"]["conditions"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default();
                    for c in change["status"]["conditions"]
                        .as_array()
                        .cloned()
                        .unwrap_or_default()
                    {
                        conditions.retain(|old| old["type"] != c["type"]);
                        conditions.push(c);
                    }
                    object["status"]["conditions"] = json!(conditions);
                } else {
                    if let Some(meta) = change.get_mut("metadata").and_then(Value::as_object_mut) {
                        meta.remove("resourceVersion");
                    }
                    merge(object, &change);
                }
                object["metadata"]["resourceVersion"] = json!(version);
                (200, object.clone())
            }
            _ => (200, object.clone()),
        }
    }
}

/// Every request the backend makes must be granted by `CONTROLLER_PERMISSIONS` (and so by
/// `packaging/kubernetes/rbac.yaml`, which a manifest test compares with it).
fn assert_granted(method: &str, path: &str) {
    use metalguard_api::k8s::rbac::{CONTROLLER_PERMISSIONS, grants};
    let parts: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (group, rest) = match parts.as_slice() {
        ["api", _version, rest @ ..] => ("", rest),
        ["apis", group, _version, rest @ ..] => (*group, rest),
        _ => panic!("unexpected path {path}"),
    };
    let rest = match rest {
        ["namespaces", _ns, rest @ ..] => rest,
        rest => rest,
    };
    let resource = match rest {
        [resource] | [resource, _] => (*resource).to_owned(),
        [resource, _, sub] => format!("{resource}/{sub}"),
        _ => panic!("unexpected path {path}"),
    };
    let verb = match method {
        "GET" => "get",
        "POST" => "create",
        "PATCH" => "patch",
        "DELETE" => "delete",
        other => panic!("unexpected method {other}"),
    };
    assert!(
        grants(CONTROLLER_PERMISSIONS)
            .iter()
            .any(|(_, g, r, v)| g == group && *r == resource && v == verb),
        "{method} {path} needs {verb} on {group}/{resource}, which the ClusterRole/Role do not grant"
    );
}

type Handle = tower_test::mock::Handle<Request<Body>, Response<Body>>;

async fn serve(mut handle: Handle, server: Arc<Mutex<Server>>) {
    while let Some((request, respond)) = handle.next_request().await {
        let (parts, body) = request.into_parts();
        let bytes = body.collect().await.unwrap().to_bytes();
        let body: Value = if bytes.is_empty() {
            Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap()
        };
        let method = parts.method.to_string();
        let path = parts.uri.path().to_owned();
        let (status, answer) = {
            let mut s = server.lock().unwrap();
            let mut shown = body.clone();
            mask(&mut shown);
            if let Some(meta) = shown.get_mut("metadata").and_then(Value::as_object_mut) {
                meta.remove("name").filter(|_| method != "POST");
            }
            let seen = Seen {
                call: format!("{method} {}", parts.uri.path_and_query().unwrap()),
                body: shown,
            };
            let records = |v: &Value| (v["remediation"].clone(), v["operations"].clone());
            let observation = method == "PATCH"
                && path.contains("/guardedhosts/")
                && path.ends_with("/status")
                && s.objects
                    .get(path.trim_end_matches("/status"))
                    .is_some_and(|o| records(&o["status"]) == records(&body["status"]));
            if observation {
                s.observations.push(seen);
            } else {
                s.seen.push(seen);
            }
            s.answer(&method, &path, &body)
        };
        respond.send_response(
            Response::builder()
                .status(status)
                .body(Body::from(serde_json::to_vec(&answer).unwrap()))
                .unwrap(),
        );
    }
}

/// A cluster of three workers `w-1..3` with BMCs, one health check and a controller.
struct Lab {
    server: Arc<Mutex<Server>>,
    writers: WorldWriters,
    controller: Controller<KubeBackend>,
    hub: std::sync::Arc<Hub>,
    inbox: tokio::sync::mpsc::Receiver<Inbound>,
}

fn node(name: &str, ready: &str, since: k8s_openapi::jiff::Timestamp) -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "resourceVersion": "1", "creationTimestamp": "2026-01-01T00:00:00Z",
            "labels": {"kubernetes.io/hostname": name, "team": "storage"},
            "annotations": {"rack": "r7"}},
        "spec": {"taints": [{"key": "dedicated", "value": "db", "effect": "NoSchedule"}]},
        "status": {"conditions": [{"type": "Ready", "status": ready, "reason": "KubeletReady",
            "lastTransitionTime": since.to_string(), "lastHeartbeatTime": since.to_string()}]}})
}

fn guarded_host(name: &str) -> Value {
    json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "GuardedHost",
        "metadata": {"name": name, "namespace": NS, "resourceVersion": "1",
            "labels": {"pool": "workers"}},
        "spec": {"nodeName": name, "role": "Worker",
            "bmc": {"address": format!("redfish+https://bmc-{name}:8000/redfish/v1/Systems/1"),
                "credentialsSecret": {"name": format!("bmc-{name}")}, "insecure": true}}})
}

fn check(max_unhealthy: &Value, action: &str) -> Value {
    json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "HostHealthCheck",
        "metadata": {"name": "workers", "namespace": NS, "resourceVersion": "1"},
        "spec": {"selector": {"matchLabels": {"pool": "workers"}},
            "unhealthyConditions": [{"type": "Ready", "status": "False", "timeout": "5m"}],
            "maxUnhealthy": max_unhealthy,
            "remediation": {"nodeAction": action}}})
}

fn secret(name: &str) -> Secret {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": format!("bmc-{name}"), "namespace": "metalguard-bmc", "resourceVersion": "1"},
        "data": {"username": "YWRtaW4=", "password": "aHVudGVyMg=="}}))
    .unwrap()
}

const HOSTS: [&str; 3] = ["w-1", "w-2", "w-3"];

/// A report of `host`'s agent: healthy, every other BMC reachable.
fn agent_report(host: &str) -> metalguard_api::protocol::AgentReport {
    serde_json::from_value(json!({
        "host": host, "agent_version": "0.1.0", "sequence": 1, "boot_id": "b",
        "sent_at": crate::clock::now(),
        "conditions": [{"type": "KubeletHealthy", "status": "True", "reason": "Healthy",
            "message": "", "last_transition": 1_700_000_000_000_u64}],
        "bmc_reachability": HOSTS.iter().filter(|h| **h != host).map(|h| json!({
            "host": h, "reachable": true, "checked_at": crate::clock::now()})).collect::<Vec<_>>(),
    }))
    .unwrap()
}

impl Lab {
    /// `unhealthy` hosts' Nodes have been NotReady for 10 minutes.
    fn new(unhealthy: &[&str], max_unhealthy: &Value, action: &str) -> Lab {
        Self::with_hosts(&HOSTS, unhealthy, max_unhealthy, action)
    }

    /// As [`Lab::new`], with `hosts` for `w-1..3`.
    fn with_hosts(hosts: &[&str], unhealthy: &[&str], max_unhealthy: &Value, action: &str) -> Lab {
        let (svc, handle) = tower_test::mock::pair::<Request<Body>, Response<Body>>();
        let client = Client::new(svc, NS);
        let server = Arc::new(Mutex::new(Server {
            lease_holder: ME.to_owned(),
            lease_term: json!("0"),
            ..Server::default()
        }));
        tokio::spawn(serve(handle, server.clone()));
        let (world, mut writers) = World::new(NS);
        let now = k8s_openapi::jiff::Timestamp::now();
        let long_ago = now - k8s_openapi::jiff::SignedDuration::from_secs(600);
        {
            let mut s = server.lock().unwrap();
            for &h in hosts {
                let ready = if unhealthy.contains(&h) {
                    "False"
                } else {
                    "True"
                };
                let since = if unhealthy.contains(&h) {
                    long_ago
                } else {
                    now
                };
                s.objects
                    .insert(format!("/api/v1/nodes/{h}"), node(h, ready, since));
                s.objects.insert(
                    format!("/apis/metalguard.io/v1alpha1/namespaces/{NS}/guardedhosts/{h}"),
                    guarded_host(h),
                );
                apply(&mut writers.secrets, secret(h));
            }
            s.objects.insert(
                format!("/apis/metalguard.io/v1alpha1/namespaces/{NS}/hosthealthchecks/workers"),
                check(max_unhealthy, action),
            );
        }
        let mut lab_writers = writers;
        sync(&server, &mut lab_writers);
        let backend = KubeBackend::new(
            client,
            KubeSettings {
                namespace: NS.to_owned(),
                credentials_namespace: "metalguard-bmc".to_owned(),
                identity: ME.to_owned(),
                lease_name: "metalguard-controller".to_owned(),
                pod: None,
                // The longest the checks allow, so that only a test that means to sees a
                // chain of rounds yield to a due campaign (`a_chain_of_rounds_...`).
                controller: ControllerSettings {
                    plan_interval: LAB_PLAN_INTERVAL,
                    ..ControllerSettings::default()
                },
                timing: crate::kube::run::timing(),
                node_leases: false,
            },
            world,
        );
        let inventory = backend.build_inventory().unwrap();
        let (hub, inbox) = Hub::new();
        let controller = Controller::new(backend, inventory, hub.clone(), Metrics::new())
            .identified(ME.to_owned());
        Lab {
            server,
            writers: lab_writers,
            controller,
            hub,
            inbox,
        }
    }

    /// The observation writes since the last call (see [`Server::observations`]).
    fn take_observations(&self) -> Vec<(String, Value)> {
        std::mem::take(&mut self.server.lock().unwrap().observations)
            .into_iter()
            .map(|s| (s.call, s.body))
            .collect()
    }

    /// The requests seen since the last call, but observation writes.
    fn take(&self) -> Vec<(String, Value)> {
        std::mem::take(&mut self.server.lock().unwrap().seen)
            .into_iter()
            .map(|s| (s.call, s.body))
            .collect()
    }

    /// The watch catches up with the fake server.
    fn sync(&mut self) {
        sync(&self.server, &mut self.writers);
    }

    async fn report(&mut self, host: &str) {
        self.controller
            .handle(Inbound::Report {
                report: agent_report(host),
                received_at: crate::clock::now(),
            })
            .await;
    }

    /// The agent of `host` posts a succeeded result; the answer it would get.
    async fn result(
        &mut self,
        host: &str,
        operation: &str,
    ) -> Result<metalguard_api::protocol::ResultAck, crate::api::hub::ResultError> {
        let (reply, answer) = tokio::sync::oneshot::channel();
        let now = crate::clock::now();
        self.controller
            .handle(Inbound::Result {
                host: host.to_owned(),
                certificate: crate::pki::revocation::CertIdentity {
                    host: host.to_owned(),
                    serial: "01".to_owned(),
                    sha256: String::new(),
                    not_after: 0,
                },
                result: CommandResult {
                    operation_id: metalguard_api::plan::OperationId(operation.to_owned()),
                    outcome: Outcome::Succeeded,
                    started_at: now,
                    finished_at: now,
                    timeline: Vec::new(),
                    error: None,
                    promoted_by: None,
                    term: 0,
                },
                reply,
            })
            .await;
        answer.await.unwrap()
    }

    /// A round that must only read the Lease (nothing to decide, or not leading).
    async fn quiet_round(&mut self) {
        self.round().await;
        assert_calls(&self.take(), &[LEASE.to_owned()]);
    }

    async fn round(&mut self) {
        self.controller.campaign().await;
        self.controller.plan_and_execute().await;
    }
}

fn sync(server: &Arc<Mutex<Server>>, writers: &mut WorldWriters) {
    use kube::runtime::watcher::Event;
    let s = server.lock().unwrap();
    let mut nodes = Vec::new();
    let mut hosts = Vec::new();
    let mut checks = Vec::new();
    let mut fences = Vec::new();
    for (path, object) in &s.objects {
        if path.starts_with("/api/v1/nodes/") {
            nodes.push(serde_json::from_value::<Node>(object.clone()).unwrap());
        } else if path.contains("/guardedhosts/") {
            hosts.push(serde_json::from_value::<GuardedHost>(object.clone()).unwrap());
        } else if path.contains("/hosthealthchecks/") {
            checks.push(serde_json::from_value::<HostHealthCheck>(object.clone()).unwrap());
        } else if path.contains("/fencerequests/") {
            fences.push(serde_json::from_value::<FenceRequest>(object.clone()).unwrap());
        }
    }
    writers.nodes.apply_watcher_event(&Event::Init);
    for n in nodes {
        writers.nodes.apply_watcher_event(&Event::InitApply(n));
    }
    writers.nodes.apply_watcher_event(&Event::InitDone);
    for h in hosts {
        apply(&mut writers.hosts, h);
    }
    for c in checks {
        apply(&mut writers.checks, c);
    }
    for f in fences {
        apply(&mut writers.fences, f);
    }
}

fn calls(seen: &[(String, Value)]) -> Vec<&str> {
    seen.iter().map(|(c, _)| c.as_str()).collect()
}

const GH: &str = "/apis/metalguard.io/v1alpha1/namespaces/metalguard-system/guardedhosts";
const APPLY: &str = "?&force=true&fieldManager=metalguard-controller";
const LEASE: &str =
    "GET /apis/coordination.k8s.io/v1/namespaces/metalguard-system/leases/metalguard-controller";
const EVENT: &str = "POST /apis/events.k8s.io/v1/namespaces/metalguard-system/events?";
/// The first leading round begins a term on the Lease (`kube/term.rs`).
const LEASE_TERM: &str = "PATCH /apis/coordination.k8s.io/v1/namespaces/metalguard-system/leases/metalguard-controller?&fieldManager=metalguard-controller";

/// The calls of a first leading round, without the term it began on the Lease: asserts the
/// term's patch came right after the Lease was read, and removes it.
fn begun_term(mut seen: Vec<(String, Value)>) -> Vec<(String, Value)> {
    let at = seen.iter().position(|(c, _)| c == LEASE_TERM);
    assert!(
        at.is_some_and(|i| i > 0 && seen[i - 1].0 == LEASE),
        "no term begun after the Lease was read: {:?}",
        calls(&seen)
    );
    let (_, patch) = seen.remove(at.unwrap_or_default());
    assert_eq!(patch["metadata"]["annotations"][TERM_ANNOTATION], "1");
    seen
}

/// Asserts the calls exactly, printing all of them on a mismatch.
fn assert_calls(seen: &[(String, Value)], expected: &[String]) {
    let got = calls(seen);
    if got != expected.iter().map(String::as_str).collect::<Vec<_>>() {
        let dump: Vec<String> = seen.iter().map(|(c, b)| format!("{c}\n    {b}")).collect();
        panic!(
            "requests differ\nexpected:\n  {}\ngot:\n  {}",
            expected.join("\n  "),
            dump.join("\n  ")
        );
    }
}

fn hhc_status() -> String {
    format!(
        "PATCH /apis/metalguard.io/v1alpha1/namespaces/{NS}/hosthealthchecks/workers/status{APPLY}"
    )
}

fn status_of(host: &str) -> String {
    format!("PATCH {GH}/{host}/status{APPLY}")
}

/// The remediation phase and operations a status apply wrote.
fn written_phase(body: &Value) -> (&str, Vec<(&str, bool)>) {
    let phase = body["status"]["remediation"]["phase"]
        .as_str()
        .unwrap_or("-");
    let ops = body["status"]["operations"]
        .as_array()
        .map(|ops| {
            ops.iter()
                .map(|op| (op["id"].as_str().unwrap(), op.get("result").is_some()))
                .collect()
        })
        .unwrap_or_default();
    (phase, ops)
}

fn event(seen: &(String, Value)) -> (&str, &str, &str) {
    let b = &seen.1;
    (
        b["regarding"]["name"].as_str().unwrap_or("-"),
        b["type"].as_str().unwrap_or("-"),
        b["reason"].as_str().unwrap_or("-"),
    )
}

#[tokio::test]
async fn an_unhealthy_node_is_fenced_deleted_and_restored_request_by_request() {
    let mut lab = Lab::new(&["w-3"], &json!(1), "Delete");
    // Agents report: their conditions are mirrored onto their Nodes.
    lab.report("w-1").await;
    lab.report("w-2").await;
    lab.round().await;
    let seen = begun_term(lab.take());
    assert_calls(
        &seen,
        &[
            "PATCH /api/v1/nodes/w-1/status?".to_owned(),
            "PATCH /api/v1/nodes/w-2/status?".to_owned(),
            LEASE.to_owned(),
            EVENT.to_owned(),
            hhc_status(),
            status_of("w-3"),
            EVENT.to_owned(),
            status_of("w-3"),
            EVENT.to_owned(),
        ],
    );
    assert_eq!(
        seen[0].1,
        json!({"status": {"conditions": [
            {"type": "KubeletHealthy", "status": "True", "reason": "Healthy", "message": "",
             "lastHeartbeatTime": "<time>", "lastTransitionTime": "<time>"},
            {"type": "MetalguardAgentReady", "status": "True", "reason": "AgentReporting",
             "message": "metalguard agent 0.1.0 reports",
             "lastHeartbeatTime": "<time>", "lastTransitionTime": "<time>"}]}})
    );
    assert_eq!(event(&seen[3]), ("w-3", "Normal", "StartRemediation"));
    assert_eq!(seen[4].1["status"]["conditions"][0]["status"], "True");
    assert_eq!(written_phase(&seen[5].1), ("Gated", vec![]));
    assert_eq!(event(&seen[6]), ("w-3", "Normal", "PowerOff"));
    // Intent first: the power-off operation and PoweringOff in one apply, before any command.
    let mut records = seen[7].1.clone();
    // The apply carries the observed fields too (one manager owns the whole status: an apply
    // without a field it owns would drop it).
    let observed = records["status"]
        .as_object_mut()
        .unwrap()
        .remove("conditions");
    assert_eq!(
        observed.unwrap()[2],
        json!({"type": "Remediating", "status": "True", "reason": "Gated",
            "message": "remediation remediation/w-3/1 is gated", "lastTransitionTime": "<time>"})
    );
    assert_eq!(
        records,
        json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "GuardedHost", "status": {
            "operations": [{"id": "remediation/w-3/1/power-off", "agent": "w-1", "type": "fence",
                "target": "w-3", "power": "off", "remediationId": "remediation/w-3/1",
                "step": "power-off", "createTime": "<time>", "term": 1}],
            "remediation": {"id": "remediation/w-3/1", "phase": "PoweringOff", "attempt": 1,
                "executor": "w-1", "cause": "Ready=False for at least 5m (check workers)",
                "startTime": "<time>", "phaseTransitionTime": "<time>", "seq": 1,
                "strategy": "external-baremetal", "nodeAction": "Delete", "controlPlane": false}}})
    );
    assert_eq!(event(&seen[8]), ("w-3", "Normal", "VerifyPowerOff"));
    // Nothing is done to the Node while the power-off is unverified.
    lab.sync();
    lab.quiet_round().await;

    // The agent's verified-off result: recorded, then backup → delete → power on.
    lab.result("w-1", "remediation/w-3/1/power-off")
        .await
        .unwrap();
    lab.round().await;
    let seen = lab.take();
    assert_calls(
        &seen,
        &[
            status_of("w-3"),
            LEASE.to_owned(),
            status_of("w-3"),
            // The Node is read at once for its backup, not from the watch.
            "GET /api/v1/nodes/w-3".to_owned(),
            EVENT.to_owned(),
            status_of("w-3"),
            EVENT.to_owned(),
            "DELETE /api/v1/nodes/w-3?".to_owned(),
            status_of("w-3"),
            EVENT.to_owned(),
            status_of("w-3"),
            EVENT.to_owned(),
        ],
    );
    assert_eq!(
        written_phase(&seen[0].1),
        ("PoweringOff", vec![("remediation/w-3/1/power-off", true)])
    );
    // VerifyPowerOff was announced in the round that planned it: not repeated.
    assert_eq!(written_phase(&seen[2].1).0, "VerifiedOff");
    let seen: Vec<_> = seen
        .into_iter()
        .filter(|(c, _)| !c.starts_with("GET /api/v1/nodes/"))
        .collect();
    assert_eq!(event(&seen[3]).2, "BackupNodeMetadata");
    // The backup is persisted before the Node is touched.
    assert_eq!(written_phase(&seen[4].1).0, "BackedUp");
    assert_eq!(
        seen[4].1["status"]["remediation"]["nodeBackup"],
        json!({"labels": {"kubernetes.io/hostname": "w-3", "team": "storage"},
               "annotations": {"rack": "r7"}})
    );
    assert_eq!(event(&seen[5]).2, "DeleteNode");
    assert_eq!(seen[6].1, json!({}));
    assert_eq!(written_phase(&seen[7].1).0, "NodeRemoved");
    assert_eq!(event(&seen[8]).2, "PowerOn");
    assert_eq!(
        written_phase(&seen[9].1),
        (
            "PoweringOn",
            vec![
                ("remediation/w-3/1/power-off", true),
                ("remediation/w-3/1/power-on", false)
            ]
        )
    );
    assert_eq!(event(&seen[10]).2, "VerifyPowerOn");

    lab.sync();
    lab.result("w-1", "remediation/w-3/1/power-on")
        .await
        .unwrap();
    lab.round().await;
    let seen = lab.take();
    assert_calls(
        &seen,
        &[status_of("w-3"), LEASE.to_owned(), status_of("w-3")],
    );
    assert_eq!(written_phase(&seen[2].1).0, "WaitingForNode");

    // The host re-registers with a new Node: one saved annotation is already set there.
    {
        let mut s = lab.server.lock().unwrap();
        let mut fresh = node("w-3", "True", k8s_openapi::jiff::Timestamp::now());
        fresh["metadata"]["labels"] = json!({"kubernetes.io/hostname": "w-3"});
        fresh["metadata"]["annotations"] = json!({"rack": "r9"});
        fresh["metadata"]["resourceVersion"] = json!("500");
        s.objects.insert("/api/v1/nodes/w-3".to_owned(), fresh);
    }
    lab.sync();
    lab.round().await;
    let seen = lab.take();
    assert_calls(
        &seen,
        &[
            LEASE.to_owned(),
            EVENT.to_owned(),
            "PATCH /api/v1/nodes/w-3?".to_owned(),
            status_of("w-3"),
            EVENT.to_owned(),
            status_of("w-3"),
            hhc_status(),
        ],
    );
    assert_eq!(seen[6].1["status"]["currentHealthy"], 3);
    assert_eq!(event(&seen[1]).2, "RestoreNodeMetadata");
    // Only what the new Node lacks, conditional on the version it was computed from.
    assert_eq!(
        seen[2].1,
        json!({"metadata": {"labels": {"team": "storage"}, "resourceVersion": "500"}})
    );
    assert_eq!(written_phase(&seen[3].1).0, "Restored");
    assert!(
        seen[3].1["status"]["remediation"]
            .get("nodeBackup")
            .is_none()
    );
    assert_eq!(event(&seen[4]).2, "Complete");
    assert_eq!(written_phase(&seen[5].1).0, "Done");
}

#[tokio::test]
async fn a_short_circuit_touches_no_node_and_says_why() {
    let mut lab = Lab::new(&["w-2", "w-3"], &json!(1), "Delete");
    lab.report("w-1").await;
    let _ = lab.take();
    lab.round().await;
    // Each host's observed status is applied once (w-1's agent reports: power On)...
    let observed = lab.take_observations();
    assert_eq!(
        calls(&observed),
        ["w-1", "w-2", "w-3"].map(|h| format!("PATCH {GH}/{h}/status{APPLY}"))
    );
    assert_eq!(observed[0].1["status"]["power"], "On");
    assert_eq!(observed[0].1["status"]["agent"]["version"], "0.1.0");
    assert_eq!(observed[1].1["status"]["conditions"][0]["status"], "False");
    assert!(
        observed[1].1["status"].get("power").is_none(),
        "never observed"
    );
    let seen = begun_term(lab.take());
    assert_calls(
        &seen,
        &[
            LEASE.to_owned(),
            EVENT.to_owned(),
            EVENT.to_owned(),
            hhc_status(),
            EVENT.to_owned(),
        ],
    );
    for (i, host) in [(1, "w-2"), (2, "w-3")] {
        assert_eq!(event(&seen[i]), (host, "Warning", "Refused"));
        assert!(
            seen[i].1["note"]
                .as_str()
                .unwrap()
                .contains("short-circuited")
        );
    }
    let seen = &seen[2..];
    let condition = &seen[1].1["status"]["conditions"][0];
    assert_eq!(condition["type"], "RemediationAllowed");
    assert_eq!(condition["status"], "False");
    assert_eq!(condition["reason"], "TooManyUnhealthy");
    assert_eq!(seen[1].1["status"]["remediationsAllowed"], 0);
    assert_eq!(
        (seen[2].1["regarding"]["kind"].as_str(), event(&seen[2])),
        (
            Some("HostHealthCheck"),
            ("workers", "Warning", "RemediationShortCircuited")
        )
    );
    assert!(
        seen[2].1["note"].as_str().unwrap().contains("maxUnhealthy"),
        "{}",
        seen[2].1
    );
    // Said once: the next round only reads the Lease, and writes no observation again (the
    // watch has not caught up: our own writes stand for what the object carries).
    lab.quiet_round().await;
    assert_calls(&lab.take_observations(), &[]);
    lab.sync();
    lab.quiet_round().await;
    assert_calls(&lab.take_observations(), &[]);
}

#[tokio::test]
async fn an_admin_fence_request_is_processed_once_with_its_timeline() {
    let mut lab = Lab::new(&[], &json!("100%"), "OutOfServiceTaint");
    lab.server.lock().unwrap().objects.insert(
        format!("/apis/metalguard.io/v1alpha1/namespaces/{NS}/fencerequests/fence-w-2"),
        json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "FenceRequest",
            "metadata": {"name": "fence-w-2", "namespace": NS, "resourceVersion": "1",
                "creationTimestamp": "2026-11-23T10:00:00Z"},
            "spec": {"target": "w-2", "reason": "kernel hung, console frozen", "force": true}}),
    );
    lab.sync();
    lab.report("w-1").await;
    let _ = lab.take();
    lab.round().await;
    let seen = begun_term(lab.take());
    let fence_status = format!(
        "PATCH /apis/metalguard.io/v1alpha1/namespaces/{NS}/fencerequests/fence-w-2/status{APPLY}"
    );
    let hhc = hhc_status();
    assert_calls(
        &seen,
        &[
            LEASE.to_owned(),
            EVENT.to_owned(),
            hhc.clone(),
            status_of("w-2"),
            fence_status.clone(),
            EVENT.to_owned(),
            hhc,
            status_of("w-2"),
            fence_status.clone(),
            EVENT.to_owned(),
        ],
    );
    let seen: Vec<_> = seen
        .into_iter()
        .enumerate()
        .filter(|(i, _)| *i != 6)
        .map(|(_, s)| s)
        .collect();
    assert_eq!(written_phase(&seen[3].1).0, "Gated");
    assert_eq!(
        seen[3].1["status"]["remediation"]["forced"],
        "kernel hung, console frozen"
    );
    let accepted = &seen[4].1["status"];
    assert_eq!(accepted["phase"], "InProgress");
    assert_eq!(accepted["remediationId"], "remediation/w-2/1");
    assert_eq!(accepted["timeline"].as_array().unwrap().len(), 1);
    assert_eq!(written_phase(&seen[6].1).0, "PoweringOff");
    let timeline = seen[7].1["status"]["timeline"].as_array().unwrap();
    assert_eq!(
        timeline
            .iter()
            .map(|t| t["remediationPhase"].as_str().unwrap())
            .collect::<Vec<_>>(),
        ["Gated", "PoweringOff"]
    );
    // Processed once: later rounds (before and after the watch catches up) start nothing.
    lab.quiet_round().await;
    lab.sync();
    lab.quiet_round().await;
    // The power-off is verified: the Node is tainted out-of-service (other taints kept).
    lab.result("w-1", "remediation/w-2/1/power-off")
        .await
        .unwrap();
    lab.round().await;
    let seen = lab.take();
    let taint = seen
        .iter()
        .find(|(c, _)| c == "PATCH /api/v1/nodes/w-2?")
        .expect("the Node is tainted");
    assert_eq!(
        taint.1,
        json!({"metadata": {"resourceVersion": "1"}, "spec": {"taints": [
            {"key": "dedicated", "value": "db", "effect": "NoSchedule"},
            {"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}]}})
    );
    assert!(!calls(&seen).iter().any(|c| c.starts_with("DELETE")));
    let last = seen.iter().rev().find(|(c, _)| *c == fence_status).unwrap();
    assert_eq!(
        last.1["status"]["timeline"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["remediationPhase"].as_str().unwrap())
            .collect::<Vec<_>>(),
        [
            "Gated",
            "PoweringOff",
            "VerifiedOff",
            "BackedUp",
            "NodeRemoved",
            "PoweringOn"
        ]
    );
}

/// A leader handles every message that queued up before a round, not one per round (a
/// backlog made a new leader judge a host on a superseded report: the standalone soak).
#[tokio::test]
async fn reports_queued_before_a_round_are_all_handled_first() {
    let mut lab = Lab::new(&[], &json!("100%"), "Delete");
    for host in HOSTS {
        assert!(
            lab.hub
                .send(Inbound::Report {
                    report: agent_report(host),
                    received_at: crate::clock::now(),
                })
                .await
        );
    }
    // A budget spent before the first message handles none (the bound of a round's wait).
    lab.controller
        .drain_within(&mut lab.inbox, std::time::Duration::ZERO)
        .await;
    assert!(lab.take().is_empty(), "nothing handled without a budget");
    lab.controller
        .drain_within(&mut lab.inbox, std::time::Duration::from_secs(60))
        .await;
    assert_calls(
        &lab.take(),
        &HOSTS.map(|h| format!("PATCH /api/v1/nodes/{h}/status?")),
    );
    assert!(lab.inbox.try_recv().is_err(), "nothing left queued");
}

#[tokio::test]
async fn after_leadership_is_lost_nothing_more_is_written() {
    let mut lab = Lab::new(&["w-3"], &json!(1), "Delete");
    lab.report("w-1").await;
    lab.round().await;
    let seen = lab.take();
    assert_eq!(written_phase(&seen[seen.len() - 2].1).0, "PoweringOff");
    // Another controller holds the Lease now.
    lab.server.lock().unwrap().lease_holder = "controller-1".to_owned();
    lab.sync();
    lab.quiet_round().await;
    // The agent's result arrives: it is not written (the agent will retry with the leader).
    assert!(
        lab.result("w-1", "remediation/w-3/1/power-off")
            .await
            .is_err()
    );
    lab.controller.plan_and_execute().await;
    lab.report("w-2").await;
    let seen = lab.take();
    // Only the agent's own conditions are mirrored (not a decision: any replica does it).
    assert_calls(&seen, &["PATCH /api/v1/nodes/w-2/status?".to_owned()]);
}

/// The lab's plan interval: the longest the inventory's checks allow (half the Lease less the
/// request timeout).
const LAB_PLAN_INTERVAL: std::time::Duration = std::time::Duration::from_secs(5);

/// Found at 20,005 hosts: a chain of rounds (each that persisted something is followed by
/// another) ran 3.7 s without a campaign, past what the Lease read at the last one proved, and
/// its next guarded write was refused. A chain now stops when a campaign is due, and goes on
/// after it: the same writes, in two calls.
#[tokio::test]
async fn a_chain_of_rounds_yields_to_a_due_campaign_and_goes_on_after_it() {
    let mut lab = Lab::new(&["w-3"], &json!(1), "Delete");
    lab.report("w-1").await;
    lab.controller.campaign().await;
    // The plan interval passes before the rounds run (within the hub's grace and the Lease).
    tokio::time::pause();
    tokio::time::advance(LAB_PLAN_INTERVAL).await;
    tokio::time::resume();
    lab.controller.plan_and_execute().await;
    let first = lab.take();
    let phases = |seen: &[(String, Value)]| -> Vec<String> {
        seen.iter()
            .filter(|(call, _)| *call == status_of("w-3"))
            .map(|(_, body)| written_phase(body).0.to_owned())
            .collect()
    };
    // One round: the remediation is gated, and the intent waits for the campaign.
    assert_eq!(phases(&first), ["Gated"], "{:?}", calls(&first));
    lab.round().await;
    let second = lab.take();
    assert_eq!(phases(&second), ["PoweringOff"], "{:?}", calls(&second));
    assert_eq!(calls(&second)[0], LEASE, "the campaign first");
}

/// Statuses a round's write budget left are written at the next round, though nothing about
/// those hosts changed and the watch has not moved: they wait in the observe scope's retry
/// set, not on a change that would bring them back.
#[tokio::test]
async fn statuses_a_spent_budget_left_are_written_at_the_next_round() {
    let mut lab = Lab::new(&[], &json!(1), "Delete");
    lab.controller.backend_mut().write_budget = std::time::Duration::ZERO;
    lab.round().await;
    assert_calls(&lab.take_observations(), &[]);
    lab.controller.backend_mut().write_budget = super::budget::BUDGET;
    lab.round().await;
    let mut written: Vec<String> = lab
        .take_observations()
        .into_iter()
        .map(|(call, _)| call)
        .collect();
    written.sort();
    assert_eq!(written, HOSTS.map(status_of), "each host once");
    lab.round().await;
    assert_calls(&lab.take_observations(), &[]);
}

/// The work of a round after one Node changed (a kubelet's status post) among `n` hosts, two
/// of whose agents report: what the round read, built and observed again.
async fn work_after_one_node_changed(n: usize) -> crate::control::service::RoundWork {
    let names: Vec<String> = (1..=n).map(|i| format!("w-{i}")).collect();
    let hosts: Vec<&str> = names.iter().map(String::as_str).collect();
    let mut lab = Lab::with_hosts(&hosts, &[], &json!("40%"), "Delete");
    lab.report("w-1").await;
    lab.report("w-2").await;
    // The first rounds read and observe everything, and write each host's status once (as
    // many a round as its write budget allows, the rest at the next); the watch then shows
    // those writes, and a round reads those hosts again. Settled when a round after the
    // watch caught up reads nothing again.
    lab.round().await;
    for _ in 0..100 {
        lab.sync();
        lab.round().await;
        if lab.controller.last_round_work().loaded == Some(0) {
            break;
        }
    }
    // However many rounds the budget spread them over, every host's status was written.
    let written: std::collections::BTreeSet<String> = lab
        .take_observations()
        .into_iter()
        .map(|(call, _)| call)
        .collect();
    let expected: std::collections::BTreeSet<String> = names.iter().map(|h| status_of(h)).collect();
    assert_eq!(written, expected, "a host's status was never written");
    lab.round().await;
    let quiet = lab.controller.last_round_work();
    assert_eq!(quiet.loaded, Some(0), "nothing changed: {quiet:?}");
    let node = json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": "w-7", "resourceVersion": "99", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "status": {"conditions": [{"type": "Ready", "status": "True", "reason": "KubeletReady",
            "lastTransitionTime": "2026-01-01T00:00:00Z", "lastHeartbeatTime": "2026-11-29T10:00:00Z"}]}});
    apply(
        &mut lab.writers.nodes,
        serde_json::from_value::<Node>(node).unwrap(),
    );
    lab.round().await;
    lab.controller.last_round_work()
}

/// Issue 27, item 1: a round after one Node changed does work independent of the number of
/// healthy hosts: it reads that host again, builds its snapshot entry and those of the two
/// reporting hosts (their heartbeats are judged against the clock), and observes the same
/// three; 20 hosts or 400.
#[tokio::test]
async fn a_round_after_one_node_changed_visits_the_same_hosts_whatever_the_cluster_size() {
    let small = work_after_one_node_changed(20).await;
    let large = work_after_one_node_changed(400).await;
    assert_eq!(small, large);
    assert_eq!(
        large,
        crate::control::service::RoundWork {
            loaded: Some(1),
            built: 3,
            observed: Some(3),
        }
    );
}

/// A remediation from start to end, every request of each step, observations apart; with the
/// observation scope, or observing every host every round.
async fn transcript(everything: bool) -> Vec<(String, Value)> {
    let mut lab = Lab::new(&["w-3"], &json!(1), "Delete");
    lab.controller.backend_mut().observe_scope.everything = everything;
    let mut seen = Vec::new();
    let mut record = |lab: &Lab| {
        seen.extend(lab.take());
        seen.push(("--- observations".to_owned(), Value::Null));
        seen.extend(lab.take_observations());
        seen.push(("--- step".to_owned(), Value::Null));
    };
    lab.report("w-1").await;
    lab.report("w-2").await;
    lab.round().await;
    record(&lab);
    lab.sync();
    lab.round().await;
    record(&lab);
    lab.result("w-1", "remediation/w-3/1/power-off")
        .await
        .unwrap();
    lab.round().await;
    record(&lab);
    lab.sync();
    lab.report("w-2").await;
    lab.result("w-1", "remediation/w-3/1/power-on")
        .await
        .unwrap();
    lab.round().await;
    record(&lab);
    {
        let mut s = lab.server.lock().unwrap();
        let fresh = node("w-3", "True", k8s_openapi::jiff::Timestamp::now());
        s.objects.insert("/api/v1/nodes/w-3".to_owned(), fresh);
    }
    lab.sync();
    lab.round().await;
    record(&lab);
    lab.sync();
    lab.report("w-1").await;
    lab.round().await;
    record(&lab);
    lab.sync();
    lab.round().await;
    record(&lab);
    seen
}

/// The observation scope (`observe_scope.rs`) changes how many hosts a round derives, never
/// what is written: a whole remediation writes the same requests, in the same order, as
/// observing every host every round.
#[tokio::test]
async fn observing_only_what_changed_writes_what_observing_everything_writes() {
    let scoped = transcript(false).await;
    let everything = transcript(true).await;
    assert!(
        scoped.iter().filter(|(c, _)| c.contains("/status")).count() > 10,
        "the script writes status: {scoped:?}"
    );
    assert_eq!(scoped, everything);
}

/// A Node NotReady for just under the check's timeout, then over it: the host turns unhealthy
/// with nothing written to any object (the clock alone); observed with the scope or not.
async fn unhealthy_by_the_clock(everything: bool) -> Vec<(String, Value)> {
    let mut lab = Lab::new(&[], &json!(0), "Delete");
    lab.controller.backend_mut().observe_scope.everything = everything;
    lab.round().await;
    lab.sync();
    lab.round().await;
    let _ = (lab.take(), lab.take_observations());
    let almost =
        k8s_openapi::jiff::Timestamp::now() - k8s_openapi::jiff::SignedDuration::from_secs(298);
    let notready = node("w-2", "False", almost);
    lab.server
        .lock()
        .unwrap()
        .objects
        .insert("/api/v1/nodes/w-2".to_owned(), notready.clone());
    apply(
        &mut lab.writers.nodes,
        serde_json::from_value::<Node>(notready).unwrap(),
    );
    lab.round().await;
    let mut seen = lab.take_observations();
    seen.push(("--- the timeout passes".to_owned(), Value::Null));
    tokio::time::sleep(std::time::Duration::from_millis(2_500)).await;
    lab.round().await;
    seen.extend(lab.take_observations());
    seen
}

#[tokio::test]
async fn a_host_unhealthy_by_the_clock_alone_is_observed_in_that_round() {
    let scoped = unhealthy_by_the_clock(false).await;
    assert!(
        scoped
            .iter()
            .skip_while(|(c, _)| !c.starts_with("---"))
            .any(|(_, body)| body["status"]["conditions"][0]["status"] == "False"),
        "Healthy=False written after the timeout: {scoped:?}"
    );
    assert_eq!(scoped, unhealthy_by_the_clock(true).await);
}

/// What the backend keeps of its own writes until the watch shows them has no managedFields
/// (the API server's answers with them were the largest part of the start's peak memory at
/// 5,000 hosts, issue 27); the version that says when the watch has caught up stays.
#[test]
fn a_written_object_is_kept_without_its_managed_fields() {
    let mut answer = guarded_host("w-1");
    answer["metadata"]["resourceVersion"] = json!("42");
    answer["metadata"]["managedFields"] = json!([{
        "manager": "metalguard", "operation": "Apply", "subresource": "status",
        "apiVersion": "metalguard.io/v1alpha1", "fieldsType": "FieldsV1",
        "fieldsV1": {"f:status": {"f:conditions": {}}}
    }]);
    let written: GuardedHost = serde_json::from_value(answer).unwrap();
    assert_eq!(
        written.metadata.managed_fields.as_ref().map(Vec::len),
        Some(1)
    );
    let mut kept = super::written::Written::default();
    kept.insert("w-1".to_owned(), written);
    let kept = kept.get("w-1").unwrap();
    assert!(
        kept.metadata
            .managed_fields
            .clone()
            .unwrap_or_default()
            .is_empty()
    );
    assert_eq!(kept.metadata.resource_version.as_deref(), Some("42"));
}
