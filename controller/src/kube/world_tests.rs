//! Tests of [`super`] (the watched objects as inventory and state).
use serde_json::json;

use super::*;

fn host(name: &str, node: &str) -> GuardedHost {
    serde_json::from_value(json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "GuardedHost",
        "metadata": {"name": name, "namespace": "mg", "resourceVersion": "1"},
        "spec": {"nodeName": node, "role": "Worker",
            "bmc": {"address": "ipmi://10.0.0.5", "credentialsSecret": {"name": format!("bmc-{name}")}}}}))
    .unwrap()
}

fn node(name: &str) -> Node {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "resourceVersion": "1"}}))
    .unwrap()
}

fn secret(name: &str, namespace: &str, user: &str) -> Secret {
    serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace, "resourceVersion": "1"},
        "stringData": {}, "data": {"username": user, "password": "aHVudGVyMg=="}}))
    .unwrap()
}

#[test]
fn hosts_nodes_and_secrets_are_found_by_key_in_their_namespace() {
    let (world, mut writers) = World::new("mg");
    apply(&mut writers.hosts, host("h-1", "node-a"));
    apply(&mut writers.hosts, host("h-2", "node-b"));
    apply(&mut writers.nodes, node("node-a"));
    // The same Secret name outside the credentials namespace is never a host's.
    apply(
        &mut writers.secrets,
        secret("bmc-h-1", "mg-bmc", "YWRtaW4="),
    );
    apply(
        &mut writers.secrets,
        secret("bmc-h-2", "elsewhere", "YWRtaW4="),
    );

    assert_eq!(world.host("h-1").unwrap().name_any(), "h-1");
    assert!(world.host("node-a").is_none());
    assert_eq!(world.node_of("h-1").unwrap().name_any(), "node-a");
    assert!(world.node_of("h-2").is_none(), "node-b is not watched");
    assert!(world.node_of("h-3").is_none());
    assert_eq!(
        credentials(&world, "mg-bmc", "bmc-h-1").unwrap().username,
        "admin"
    );
    assert_eq!(
        credentials(&world, "mg-bmc", "bmc-h-2").unwrap_err(),
        "Secret mg-bmc/bmc-h-2 was not found"
    );
}

/// Seed 004: "machines with the delete annotation" go first on scale-down; a
/// `GuardedHost`'s annotations are its Machine's, Cluster API's key among them.
#[test]
fn a_guarded_hosts_annotations_reach_the_inventory() {
    let (world, mut writers) = World::new("mg");
    let mut marked = host("h-1", "node-a");
    marked.metadata.annotations = Some(BTreeMap::from([(
        "cluster.x-k8s.io/delete-machine".to_owned(),
        "yes".to_owned(),
    )]));
    apply(&mut writers.hosts, marked);
    apply(&mut writers.hosts, host("h-2", "node-b"));
    let etcd = crate::kube::run::timing();
    let inventory = inventory(
        &world,
        "mg",
        "mg-bmc",
        &ControllerSettings::default(),
        &etcd,
    )
    .unwrap();
    let annotations: Vec<usize> = inventory
        .hosts
        .iter()
        .map(|h| h.annotations.len())
        .collect();
    assert_eq!(annotations, [1, 0]);
    assert_eq!(
        inventory.hosts[0].annotations["cluster.x-k8s.io/delete-machine"],
        "yes"
    );
}

#[test]
fn a_zero_executor_heartbeat_timeout_is_refused_naming_the_check_and_field() {
    let (world, mut writers) = World::new("mg");
    let check: HostHealthCheck = serde_json::from_value(json!({
        "apiVersion": "metalguard.io/v1alpha1", "kind": "HostHealthCheck",
        "metadata": {"name": "cp", "namespace": "mg", "resourceVersion": "1"},
        "spec": {"selector": {}, "remediation": {"executorHeartbeatTimeout": "0s"}}}))
    .unwrap();
    apply(&mut writers.checks, check);
    let etcd = crate::kube::run::timing();
    let error = inventory(
        &world,
        "mg",
        "mg-bmc",
        &ControllerSettings::default(),
        &etcd,
    )
    .unwrap_err();
    assert_eq!(
        error,
        "HostHealthCheck cp: remediation.executorHeartbeatTimeout must be greater than zero"
    );
}
