//! The Kubernetes permissions the controller needs, and why: the source of truth for the
//! ClusterRole and Role in `packaging/kubernetes/rbac.yaml` (a controller test compares the two).
//! Nothing here grants more than the Kubernetes backend's calls use.

/// Where a permission is granted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// In a ClusterRole (cluster-scoped objects, or objects in any namespace).
    Cluster,
    /// In a Role of the controller's own namespace.
    Namespace,
    /// In a Role of the BMC credentials namespace ([`CREDENTIALS_NAMESPACE`]), which holds the
    /// BMC credentials Secrets and nothing else: the controller reads no other Secret (not
    /// the CA's key, not an agent's key, not its own serving key, which its pod mounts).
    Credentials,
    /// In a Role of the node leases' namespace ([`NODE_LEASES_NAMESPACE`]): the per-node
    /// Leases Node Health Check and Node Maintenance coordinate disruptions with.
    NodeLeases,
}

/// The controller's namespace: custom resources, Lease, Events.
pub const NAMESPACE: &str = "metalguard-system";
/// The namespace of the BMC credentials Secrets, and of nothing else.
pub const CREDENTIALS_NAMESPACE: &str = "metalguard-bmc";

/// The namespace of the node leases (`node-<name>`), shared with Node Health Check and Node
/// Maintenance.
pub const NODE_LEASES_NAMESPACE: &str = "medik8s-leases";

/// One rule: verbs on one resource of one API group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Permission {
    /// ClusterRole or Role.
    pub scope: Scope,
    /// The API group (`""` for the core group).
    pub api_group: &'static str,
    /// The resource, with `/subresource` where one is meant.
    pub resource: &'static str,
    /// The verbs.
    pub verbs: &'static [&'static str],
    /// Which calls need it.
    pub why: &'static str,
}

const fn rule(
    scope: Scope,
    api_group: &'static str,
    resource: &'static str,
    verbs: &'static [&'static str],
    why: &'static str,
) -> Permission {
    Permission {
        scope,
        api_group,
        resource,
        verbs,
        why,
    }
}

/// Name of the ClusterRole and Role (and their bindings and the ServiceAccount).
pub const CONTROLLER_ROLE: &str = "metalguard-controller";

/// Every permission of the controller's ServiceAccount.
pub const CONTROLLER_PERMISSIONS: &[Permission] = &[
    rule(
        Scope::Cluster,
        "",
        "nodes",
        &["get", "list", "watch", "delete", "patch"],
        "watch Node conditions; read the Node of a powered-off host when its labels and annotations are backed up (the watch can lag); delete it or patch the out-of-service taint on it; merge saved labels and annotations back",
    ),
    rule(
        Scope::Cluster,
        "",
        "nodes/status",
        &["patch"],
        "mirror the agents' conditions (EtcdMemberHealthy, MetalguardAgentReady, ...) onto their Nodes",
    ),
    rule(
        Scope::Namespace,
        "events.k8s.io",
        "events",
        &["create"],
        "an Event for every decision and refusal, regarding the custom resource it is about",
    ),
    rule(
        Scope::Namespace,
        "metalguard.io",
        "guardedhosts",
        &["list", "watch", "patch"],
        "read hosts; place and release the etcd-quorum preDrain hook",
    ),
    rule(
        Scope::Namespace,
        "metalguard.io",
        "guardedhosts/status",
        &["patch"],
        "power, agent, etcd member, remediation and the Node metadata backup",
    ),
    rule(
        Scope::Namespace,
        "metalguard.io",
        "guardedcontrolplanes",
        &["list", "watch"],
        "read the desired control plane",
    ),
    rule(
        Scope::Namespace,
        "metalguard.io",
        "guardedcontrolplanes/status",
        &["patch"],
        "replicas, etcd voters, learners and leader, quorum tolerance, disruption budget, conditions",
    ),
    rule(
        Scope::Namespace,
        "",
        "pods",
        &["patch"],
        "the leader labels its own pod metalguard.io/leader=true (and removes it when it stops leading), so the Service reaches only the leader",
    ),
    rule(
        Scope::Namespace,
        "metalguard.io",
        "hosthealthchecks",
        &["list", "watch"],
        "read health checks",
    ),
    rule(
        Scope::Namespace,
        "metalguard.io",
        "hosthealthchecks/status",
        &["patch"],
        "expected and healthy hosts, remediations allowed",
    ),
    rule(
        Scope::Namespace,
        "metalguard.io",
        "fencerequests",
        &["list", "watch"],
        "read fence requests (administrators create them)",
    ),
    rule(
        Scope::Namespace,
        "metalguard.io",
        "fencerequests/status",
        &["patch"],
        "phase and timeline",
    ),
    rule(
        Scope::Credentials,
        "",
        "secrets",
        &["list", "watch"],
        "BMC credentials named by the GuardedHosts (a watch of the credentials namespace's Secrets; never read one by one, never written)",
    ),
    rule(
        Scope::Namespace,
        "coordination.k8s.io",
        "leases",
        &["get", "create", "patch"],
        "leader election (kube-lease-manager reads, creates and patches one Lease)",
    ),
    rule(
        Scope::NodeLeases,
        "coordination.k8s.io",
        "leases",
        &["get", "list", "create", "update", "delete"],
        "the node leases: read who holds each, take a host's when free before disrupting it (create, or update a free one), renew it, release it",
    ),
];

/// Every `(scope, apiGroup, resource, verb)` the permissions grant, sorted and deduplicated.
pub fn grants(permissions: &[Permission]) -> Vec<(Scope, String, String, String)> {
    let mut out: Vec<_> = permissions
        .iter()
        .flat_map(|p| {
            p.verbs.iter().map(move |verb| {
                (
                    p.scope,
                    p.api_group.to_owned(),
                    p.resource.to_owned(),
                    (*verb).to_owned(),
                )
            })
        })
        .collect();
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_wildcards_and_no_write_to_secrets() {
        for p in CONTROLLER_PERMISSIONS {
            assert!(!p.verbs.contains(&"*") && p.resource != "*" && p.api_group != "*");
            if p.resource == "secrets" {
                assert_eq!(p.verbs, &["list", "watch"], "{p:?}");
                assert_eq!(p.scope, Scope::Credentials);
            }
        }
    }

    #[test]
    fn every_custom_resource_and_its_status_is_covered() {
        let all = grants(CONTROLLER_PERMISSIONS);
        for plural in [
            "guardedhosts",
            "guardedcontrolplanes",
            "hosthealthchecks",
            "fencerequests",
        ] {
            // Read through watches only (reflectors list, then watch): never a get by name.
            for verb in ["list", "watch"] {
                assert!(
                    all.iter()
                        .any(|(_, g, r, v)| g == "metalguard.io" && r == plural && v == verb)
                );
            }
            let status = format!("{plural}/status");
            assert!(all.iter().any(|(_, _, r, v)| *r == status && v == "patch"));
        }
    }
}
