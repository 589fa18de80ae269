//! The Kubernetes custom resources (group `metalguard.io`, version `v1alpha1`) and the
//! controller's permissions. Only compiled with the `k8s` feature.
//!
//! | kind | short | one per | holds |
//! |---|---|---|---|
//! | [`GuardedHost`] | `gh` | physical host | Node name, BMC, failure domain, role, hooks; status: power, agent, etcd member, remediation |
//! | [`GuardedControlPlane`] | `gcp` | cluster | odd replicas, failure domains, host selector, rollout, etcd |
//! | [`HostHealthCheck`] | `hhc` | group of hosts | MachineHealthCheck fields and remediation settings |
//! | [`FenceRequest`] | `fence` | request | target, action, reason, force; status: phase and timeline |
//!
//! The names avoid metal3's `BareMetalHost`, Cluster API's and OpenShift's `Machine`,
//! `MachineHealthCheck` and `ControlPlaneMachineSet`, KCP's `KubeadmControlPlane` and medik8s'
//! `NodeHealthCheck` / `FenceAgentsRemediation`, so `kubectl get` never has to guess.
//!
//! Data flow (the Kubernetes backend, `controller/src/kube/`): watches of these objects, Nodes and Secrets
//! → a [`crate::snapshot::Snapshot`] and [`crate::policy::Policy`] → the core's plan →
//! the executor, which writes status here. `metalguard-controller crd` renders [`crds`] into
//! `packaging/kubernetes/crds.yaml`.

pub mod control_plane;
pub mod fence;
pub mod health_check;
pub mod host;
pub mod rbac;
pub mod schema;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube_core::CustomResourceExt as _;

pub use control_plane::GuardedControlPlane;
pub use fence::FenceRequest;
pub use health_check::HostHealthCheck;
pub use host::GuardedHost;

/// The API group of every metalguard resource.
pub const GROUP: &str = "metalguard.io";
/// The served and stored version.
pub const VERSION: &str = "v1alpha1";

/// The four CustomResourceDefinitions, in the order they are written out.
pub fn crds() -> Vec<CustomResourceDefinition> {
    vec![
        GuardedHost::crd(),
        GuardedControlPlane::crd(),
        HostHealthCheck::crd(),
        FenceRequest::crd(),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_crd_is_in_the_group_and_version_with_a_status_subresource() {
        for crd in crds() {
            assert_eq!(crd.spec.group, GROUP);
            assert_eq!(crd.spec.scope, "Namespaced");
            assert_eq!(crd.spec.versions.len(), 1);
            let version = &crd.spec.versions[0];
            assert_eq!(version.name, VERSION);
            assert!(version.served && version.storage);
            let subresources = version.subresources.as_ref().unwrap();
            assert!(subresources.status.is_some(), "{}", crd.spec.names.kind);
            assert!(
                version
                    .additional_printer_columns
                    .as_ref()
                    .is_some_and(|c| c.len() >= 4)
            );
            assert_eq!(
                crd.spec.names.categories.as_deref(),
                Some(&["metalguard".to_owned()][..])
            );
        }
    }

    #[test]
    fn kinds_and_plurals_do_not_collide_with_metal3_capi_or_openshift() {
        let taken = [
            "BareMetalHost",
            "Machine",
            "MachineSet",
            "MachineHealthCheck",
            "ControlPlaneMachineSet",
            "KubeadmControlPlane",
            "NodeHealthCheck",
            "FenceAgentsRemediation",
            "SelfNodeRemediation",
            "Metal3Remediation",
        ];
        for crd in crds() {
            let names = &crd.spec.names;
            assert!(!taken.contains(&names.kind.as_str()), "{}", names.kind);
            for other in taken {
                assert_ne!(names.plural, format!("{}s", other.to_lowercase()));
            }
        }
    }
}
