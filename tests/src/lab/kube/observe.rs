//! What the lab reads from the API server in Kubernetes mode and tells on the timeline: the
//! Nodes (`Ready`, deleted, registered again, the zone label back) and the `GuardedHost`s
//! (`Healthy`, the agent's heartbeat), each read bounded by [`super::READ_TIMEOUT`].

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, SystemTime};

use serde_json::Value;

use super::{KubeSide, MG, NS, ZONE_LABEL};
use crate::Result;
use crate::kube::time::parse_rfc3339;
use crate::lab::timeline::Timeline;

impl KubeSide {
    /// Reads every Node and `GuardedHost` (for [`KubeSide::host_healthy`] and narration);
    /// an error when the API server does not answer.
    pub fn refresh(&mut self) -> Result<()> {
        let nodes = self.reader.list("/api/v1/nodes")?;
        let guarded = self.reader.list(&format!("{MG}/guardedhosts"))?;
        let by_name = |list: Vec<Value>| {
            list.into_iter()
                .map(|o| (o["metadata"]["name"].as_str().unwrap_or("").to_owned(), o))
                .collect::<BTreeMap<_, _>>()
        };
        self.nodes = by_name(nodes);
        self.guarded = by_name(guarded);
        Ok(())
    }

    /// Tells Node and `GuardedHost` changes since the last call: a Node's `Ready`, a Node
    /// deleted or registered (with its zone label), a host's `Healthy` condition.
    pub fn narrate(&mut self, timeline: &mut Timeline) {
        let names: BTreeSet<String> = self
            .kubelets
            .keys()
            .chain(self.nodes.keys())
            .cloned()
            .collect();
        for name in names {
            let ready = self.nodes.get(&name).map(|n| ready_of(n).to_owned());
            // Deleted and registered again between two reads: still a deletion.
            let uid = self
                .nodes
                .get(&name)
                .and_then(|n| n["metadata"]["uid"].as_str());
            if let (Some(uid), Some(old)) = (uid, self.told_uid.get(&name))
                && uid != old
                && self.told_ready.get(&name).is_some_and(Option::is_some)
            {
                timeline.add(
                    "kubernetes",
                    format!("Node {name} is gone"),
                    "deleted and registered again between two reads (a new uid)",
                );
                self.told_ready.insert(name.clone(), None);
            }
            if let Some(uid) = uid {
                self.told_uid.insert(name.clone(), uid.to_owned());
            }
            let told = self.told_ready.get(&name).cloned();
            if told.as_ref() == Some(&ready) {
                continue;
            }
            let (what, why) = match (&ready, told.flatten()) {
                (None, _) => (format!("Node {name} is gone"), String::new()),
                (Some(r), None) => (
                    format!("Node {name} registered, Ready={r}"),
                    format!(
                        "label {ZONE_LABEL}={}",
                        self.node_label(&name, ZONE_LABEL)
                            .unwrap_or_else(|| "(none)".into())
                    ),
                ),
                (Some(r), Some(_)) => (format!("Node {name} Ready={r}"), self.ready_reason(&name)),
            };
            timeline.add("kubernetes", what, why);
            self.told_ready.insert(name, ready);
        }
        for name in self.nodes.keys() {
            let zone = self.node_label(name, ZONE_LABEL);
            let told = self.told_zone.insert(name.clone(), zone.clone());
            if let (Some(None), Some(zone)) = (told, zone) {
                timeline.add(
                    "kubernetes",
                    format!("Node {name} has its label {ZONE_LABEL}={zone} back"),
                    "restored by metalguard from the backup it took before the Node was deleted",
                );
            }
        }
        for (name, host) in &self.guarded {
            let Some(healthy) = condition(host, "Healthy") else {
                continue;
            };
            let status = healthy["status"].as_str().unwrap_or("").to_owned();
            if self.told_healthy.get(name) == Some(&status) {
                continue;
            }
            if status == "False" {
                timeline.add(
                    "controller",
                    format!("{name} is unhealthy"),
                    healthy["message"].as_str().unwrap_or_default(),
                );
            } else if self.told_healthy.contains_key(name) {
                timeline.add("controller", format!("{name} is healthy again"), "");
            }
            self.told_healthy.insert(name.clone(), status);
        }
    }

    fn ready_reason(&self, name: &str) -> String {
        self.nodes
            .get(name)
            .and_then(|n| ready_condition(n))
            .and_then(|c| c["reason"].as_str())
            .unwrap_or_default()
            .to_owned()
    }

    /// Whether, by the last read, Node `name` is `Ready=True` and its `GuardedHost` says
    /// `Healthy=True` with an agent heartbeat newer than `heartbeat_timeout`.
    pub fn host_healthy(&self, name: &str, heartbeat_timeout: Duration) -> bool {
        let node_ready = self.nodes.get(name).is_some_and(|n| ready_of(n) == "True");
        let Some(host) = self.guarded.get(name) else {
            return false;
        };
        let healthy = condition(host, "Healthy").is_some_and(|c| c["status"] == "True");
        let heartbeat_fresh = host["status"]["agent"]["lastHeartbeatTime"]
            .as_str()
            .and_then(parse_rfc3339)
            .is_some_and(|at| {
                SystemTime::now()
                    .duration_since(at)
                    .map_or(true, |age| age <= heartbeat_timeout)
            });
        node_ready && healthy && heartbeat_fresh
    }

    /// Label `key` of Node `name`, by the last read.
    pub fn node_label(&self, name: &str, key: &str) -> Option<String> {
        self.nodes.get(name)?["metadata"]["labels"][key]
            .as_str()
            .map(str::to_owned)
    }

    /// Node `name` as last read.
    pub fn node(&self, name: &str) -> Option<&Value> {
        self.nodes.get(name)
    }

    /// Log tails of the API server and kube-controller-manager and the controller's last
    /// Events, for failure reports.
    pub fn logs(&self) -> String {
        let dir = self.cluster.dir();
        let events = self
            .reader
            .list(&format!("/apis/events.k8s.io/v1/namespaces/{NS}/events"))
            .map_or_else(
                |e| format!("(not readable: {e})"),
                |mut list| {
                    list.sort_by_key(|e| e["eventTime"].as_str().unwrap_or("").to_owned());
                    let start = list.len().saturating_sub(20);
                    list[start..]
                        .iter()
                        .map(|e| {
                            format!(
                                "{} {}/{} {}: {}",
                                e["eventTime"].as_str().unwrap_or(""),
                                e["regarding"]["kind"].as_str().unwrap_or(""),
                                e["regarding"]["name"].as_str().unwrap_or(""),
                                e["reason"].as_str().unwrap_or(""),
                                e["note"].as_str().unwrap_or("")
                            )
                        })
                        .collect::<Vec<_>>()
                        .join("\n")
                },
            );
        let pods = self.pods.as_ref().map(|p| p.logs(30)).unwrap_or_default();
        format!(
            "--- kube-apiserver\n{}\n--- kube-controller-manager\n{}\n--- Events in {NS}\n{events}\n{pods}",
            crate::process::tail_of(&dir.join("kube-apiserver.log"), 15),
            crate::process::tail_of(&dir.join("kube-controller-manager.log"), 15)
        )
    }
}

fn condition<'a>(object: &'a Value, kind: &str) -> Option<&'a Value> {
    object["status"]["conditions"]
        .as_array()?
        .iter()
        .find(|c| c["type"] == kind)
}

fn ready_condition(node: &Value) -> Option<&Value> {
    condition(node, "Ready")
}

fn ready_of(node: &Value) -> &str {
    ready_condition(node)
        .and_then(|c| c["status"].as_str())
        .unwrap_or("Unknown")
}
