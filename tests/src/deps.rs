//! The workspace's dependency rules, checked from `cargo metadata`.
//!
//! The pure crates must never reach the network stack, the clock-driven runtime or the
//! Kubernetes and etcd clients, even transitively; the agent crates must never reach the
//! Kubernetes client crates; the test harness reaches no kube-rs crate at all (it checks the
//! controller's kube-rs calls with its own HTTP client). Only normal and build dependencies count (dev-dependencies never
//! ship).

use std::collections::{HashMap, HashSet, VecDeque};
use std::process::Command;

use serde_json::Value;

use crate::{HarnessError, Result, tools};

/// Crates the pure crates must not depend on.
pub const PURE_FORBIDDEN: &[&str] = &[
    "tokio",
    "hyper",
    "reqwest",
    "kube",
    "kube-client",
    "kube-runtime",
    "etcd-client",
];
/// Crates the agent crates must not depend on.
pub const AGENT_FORBIDDEN: &[&str] = &["kube", "kube-client", "kube-runtime"];
/// Crates the test harness must not depend on: its Kubernetes client ([`crate::kube::client`])
/// is plain HTTPS so that the tests check the controller's kube-rs calls with a client that
/// shares none of their code.
pub const HARNESS_FORBIDDEN: &[&str] = &["kube", "kube-client", "kube-runtime", "kube-core"];

/// The rules: each workspace crate with the crates it must never reach.
pub const RULES: &[(&str, &[&str])] = &[
    ("metalguard-core", PURE_FORBIDDEN),
    ("metalguard-api", PURE_FORBIDDEN),
    ("metalguard-agent", AGENT_FORBIDDEN),
    ("metalguard-bmc", AGENT_FORBIDDEN),
    ("metalguard-etcd", AGENT_FORBIDDEN),
    ("metalguard-fs", AGENT_FORBIDDEN),
    ("metalguard-e2e", HARNESS_FORBIDDEN),
];

/// The resolved dependency graph: package names and normal/build edges.
#[derive(Debug, Default)]
pub struct Graph {
    names: HashMap<String, String>,
    edges: HashMap<String, Vec<String>>,
}

impl Graph {
    /// Builds the graph from `cargo metadata --format-version 1` output.
    pub fn from_metadata(metadata: &Value) -> Result<Self> {
        let bad = |what: &str| HarnessError::Other(format!("cargo metadata: missing {what}"));
        let mut graph = Self::default();
        for package in metadata["packages"]
            .as_array()
            .ok_or_else(|| bad("packages"))?
        {
            let id = package["id"].as_str().ok_or_else(|| bad("package id"))?;
            let name = package["name"]
                .as_str()
                .ok_or_else(|| bad("package name"))?;
            graph.names.insert(id.to_owned(), name.to_owned());
        }
        let nodes = metadata["resolve"]["nodes"]
            .as_array()
            .ok_or_else(|| bad("resolve"))?;
        for node in nodes {
            let id = node["id"].as_str().ok_or_else(|| bad("node id"))?;
            let mut targets = Vec::new();
            for dep in node["deps"].as_array().into_iter().flatten() {
                let ships = dep["dep_kinds"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .any(|kind| matches!(kind["kind"].as_str(), None | Some("build")));
                if ships {
                    let pkg = dep["pkg"].as_str().ok_or_else(|| bad("dep pkg"))?;
                    targets.push(pkg.to_owned());
                }
            }
            graph.edges.insert(id.to_owned(), targets);
        }
        Ok(graph)
    }

    /// Adds a package and its edges (for tests of the checker itself).
    pub fn add(&mut self, name: &str, deps: &[&str]) {
        self.names.insert(name.to_owned(), name.to_owned());
        self.edges.insert(
            name.to_owned(),
            deps.iter().map(|d| (*d).to_owned()).collect(),
        );
    }

    /// For each forbidden crate `root` reaches, the path from `root` to it.
    pub fn forbidden_paths(&self, root: &str, forbidden: &[&str]) -> Vec<Vec<String>> {
        let starts: Vec<&String> = self
            .names
            .iter()
            .filter(|(_, name)| *name == root)
            .map(|(id, _)| id)
            .collect();
        let mut parent: HashMap<&String, &String> = HashMap::new();
        let mut seen: HashSet<&String> = starts.iter().copied().collect();
        let mut queue: VecDeque<&String> = starts.into_iter().collect();
        let mut found = Vec::new();
        while let Some(id) = queue.pop_front() {
            for next in self.edges.get(id).into_iter().flatten() {
                if !seen.insert(next) {
                    continue;
                }
                parent.insert(next, id);
                let name = self.names.get(next).map_or(next.as_str(), String::as_str);
                if forbidden.contains(&name) {
                    let mut path = vec![name.to_owned()];
                    let mut at = next;
                    while let Some(p) = parent.get(at) {
                        path.push(self.names.get(*p).cloned().unwrap_or_else(|| (*p).clone()));
                        at = p;
                    }
                    path.reverse();
                    found.push(path);
                }
                queue.push_back(next);
            }
        }
        found
    }

    /// Every violation of [`RULES`], as readable `a -> b -> c` chains.
    pub fn violations(&self) -> Vec<String> {
        RULES
            .iter()
            .flat_map(|(root, forbidden)| self.forbidden_paths(root, forbidden))
            .map(|path| path.join(" -> "))
            .collect()
    }
}

/// Loads the graph of this workspace with `cargo metadata`.
pub fn load_workspace() -> Result<Graph> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let output = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--manifest-path"])
        .arg(tools::repo_root().join("Cargo.toml"))
        .output()
        .map_err(HarnessError::io("running cargo metadata"))?;
    if !output.status.success() {
        return Err(HarnessError::Command {
            command: "cargo metadata".into(),
            detail: String::from_utf8_lossy(&output.stderr).into_owned(),
        });
    }
    let metadata: Value = serde_json::from_slice(&output.stdout)
        .map_err(|e| HarnessError::Other(format!("cargo metadata output unparsable: {e}")))?;
    Graph::from_metadata(&metadata)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_a_transitive_forbidden_dependency_with_its_path() {
        let mut graph = Graph::default();
        graph.add("metalguard-core", &["metalguard-api", "serde"]);
        graph.add("metalguard-api", &["helper"]);
        graph.add("helper", &["tokio"]);
        graph.add("tokio", &[]);
        graph.add("serde", &[]);
        assert_eq!(
            graph.violations(),
            vec![
                "metalguard-core -> metalguard-api -> helper -> tokio".to_owned(),
                "metalguard-api -> helper -> tokio".to_owned()
            ]
        );
    }

    #[test]
    fn agent_may_use_tokio_but_not_kube() {
        let mut graph = Graph::default();
        graph.add("metalguard-agent", &["tokio", "kube-core"]);
        graph.add("tokio", &[]);
        graph.add("kube-core", &[]);
        assert!(graph.violations().is_empty());
        graph.add("metalguard-agent", &["tokio", "kube"]);
        graph.add("kube", &[]);
        assert_eq!(
            graph.violations(),
            vec!["metalguard-agent -> kube".to_owned()]
        );
    }
}
