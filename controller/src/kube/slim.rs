//! What the watches keep of an object: only what the controller reads (issue 27, "caches
//! with only what is read"). Every write is a patch of the fields it names, so nothing is
//! ever put back from a slimmed object.

use k8s_openapi::api::core::v1::{Node, NodeSpec, NodeStatus, Secret};

/// Keeps of a watched Node only what the controller reads: its metadata (name, version,
/// labels, annotations, creation and deletion times), its taints and its conditions. A
/// kubelet's Node also carries up to 50 images, addresses, `nodeInfo`, capacity, allocatable
/// and volumes (most of its size), none of which a decision or a write here uses; every write
/// to a Node is a patch of the fields it names, never the cached object put back.
pub fn slim_node(node: &mut Node) {
    node.metadata.owner_references = None;
    if let Some(spec) = node.spec.as_mut() {
        *spec = NodeSpec {
            taints: spec.taints.take(),
            ..Default::default()
        };
    }
    if let Some(status) = node.status.as_mut() {
        *status = NodeStatus {
            conditions: status.conditions.take(),
            ..Default::default()
        };
    }
}

/// The keys of a BMC credentials Secret the controller reads.
pub const CREDENTIAL_KEYS: [&str; 2] = ["username", "password"];

/// Keeps of a watched Secret its name, namespace and version and the two keys the controller
/// reads ([`CREDENTIAL_KEYS`]). Everything else goes before it is cached: other keys, the
/// labels, and the annotations, among them `kubectl apply`'s last-applied configuration,
/// which holds the whole Secret, password included, a second time.
pub fn slim_secret(secret: &mut Secret) {
    let meta = &mut secret.metadata;
    meta.annotations = None;
    meta.labels = None;
    meta.owner_references = None;
    meta.finalizers = None;
    secret.string_data = None;
    if let Some(data) = secret.data.as_mut() {
        data.retain(|key, _| CREDENTIAL_KEYS.contains(&key.as_str()));
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    /// A Node the size a kubelet writes: 50 images, addresses, nodeInfo, capacity.
    fn kubelet_node() -> Node {
        let images: Vec<_> = (0..50)
            .map(|i| json!({"names": [format!("registry.example/app-{i}@sha256:{:064x}", i)], "sizeBytes": 1_000_000 + i}))
            .collect();
        serde_json::from_value(json!({"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": "cp-1", "resourceVersion": "7", "creationTimestamp": "2026-01-01T00:00:00Z",
                "labels": {"kubernetes.io/hostname": "cp-1"}, "annotations": {"rack": "r7"}},
            "spec": {"podCIDR": "10.0.0.0/24", "providerID": "metal://cp-1",
                "taints": [{"key": "node.kubernetes.io/out-of-service", "value": "nodeshutdown", "effect": "NoExecute"}]},
            "status": {
                "conditions": [
                    {"type": "Ready", "status": "False", "reason": "KubeletNotReady",
                     "lastHeartbeatTime": "2026-01-01T00:01:00Z", "lastTransitionTime": "2026-01-01T00:00:30Z"},
                    {"type": "EtcdMemberHealthy", "status": "True", "reason": "Healthy",
                     "lastHeartbeatTime": "2026-01-01T00:01:00Z", "lastTransitionTime": "2026-01-01T00:00:10Z"}],
                "addresses": [{"type": "InternalIP", "address": "10.0.0.11"}, {"type": "Hostname", "address": "cp-1"}],
                "capacity": {"cpu": "64", "memory": "263855480Ki", "pods": "110"},
                "allocatable": {"cpu": "63", "memory": "263000000Ki", "pods": "110"},
                "nodeInfo": {"machineID": "m", "systemUUID": "u", "bootID": "b", "kernelVersion": "6.1",
                    "osImage": "Debian 12", "containerRuntimeVersion": "containerd://1.6", "kubeletVersion": "v1.37.2",
                    "kubeProxyVersion": "v1.37.2", "operatingSystem": "linux", "architecture": "amd64"},
                "images": images}}))
        .unwrap()
    }

    #[test]
    fn a_slimmed_secret_keeps_the_credentials_and_drops_the_applied_copy() {
        let mut secret: Secret =
            serde_json::from_value(json!({"apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": "bmc-cp-1", "namespace": "mg-bmc", "resourceVersion": "9",
                "labels": {"team": "infra"},
                "annotations": {"kubectl.kubernetes.io/last-applied-configuration":
                    "{\"data\":{\"password\":\"aHVudGVyMg==\"}}"}},
            "data": {"username": "YWRtaW4=", "password": "aHVudGVyMg==", "notes": "eA=="}}))
            .unwrap();
        slim_secret(&mut secret);
        let json = serde_json::to_value(&secret).unwrap();
        assert_eq!(json["metadata"]["name"], "bmc-cp-1");
        assert_eq!(json["metadata"]["resourceVersion"], "9");
        assert_eq!(
            json["data"],
            json!({"username": "YWRtaW4=", "password": "aHVudGVyMg=="})
        );
        assert!(json["metadata"].get("annotations").is_none(), "{json}");
        assert!(json["metadata"].get("labels").is_none(), "{json}");
    }

    #[test]
    fn a_slimmed_node_keeps_everything_the_controller_reads_and_little_else() {
        let full = kubelet_node();
        let mut slim = full.clone();
        slim_node(&mut slim);
        assert_eq!(
            crate::kube::world::node_status(&slim),
            crate::kube::world::node_status(&full)
        );
        assert_eq!(slim.metadata, full.metadata);
        let conditions = |n: &Node| n.status.as_ref().and_then(|s| s.conditions.clone());
        assert_eq!(conditions(&slim), conditions(&full));
        let taints = |n: &Node| n.spec.as_ref().and_then(|s| s.taints.clone());
        assert_eq!(taints(&slim), taints(&full));
        let size = |n: &Node| serde_json::to_vec(n).unwrap().len();
        assert!(
            size(&slim) * 5 < size(&full),
            "{} of {} bytes kept",
            size(&slim),
            size(&full)
        );
    }
}
