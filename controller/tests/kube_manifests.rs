//! `packaging/kubernetes` on a real kube-apiserver: `kubectl apply --server-side
//! --dry-run=server -k` passes and creates nothing; the real apply installs everything, the
//! CRDs are structural and established; the examples apply; and the server refuses bad
//! resources with the schema's and the CEL rules' own messages, prunes unknown fields (or
//! refuses them under strict field validation), and keeps `status` out of the main resource.

#![cfg(feature = "kubernetes")]
// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use metalguard_e2e::kube::client::ApiClient;
use metalguard_e2e::kube::{KubeCluster, KubeOptions};
use serde_json::{Value, json};

const NS: &str = "metalguard-system";
const MG: &str = "/apis/metalguard.io/v1alpha1/namespaces/metalguard-system";

/// Creates `object` in `collection` and returns the server's refusal message (panics if it
/// was accepted or refused for another reason than 422 Invalid).
fn refused(admin: &ApiClient, collection: &str, object: &Value) -> String {
    match admin.create(collection, object) {
        Ok(created) => panic!("accepted: {created}"),
        Err(e) => {
            assert_eq!(e.api_status(), Some(422), "{e}");
            e.to_string()
        }
    }
}

fn host(name: &str, bmc: &Value) -> Value {
    json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "GuardedHost",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"nodeName": name, "role": "Worker", "bmc": bmc}})
}

#[test]
fn the_manifests_apply_and_the_crds_refuse_bad_resources_with_their_own_messages() {
    let cluster = KubeCluster::start(&KubeOptions::default()).unwrap();
    let admin = cluster.admin();
    // A server-side dry run cannot create the namespaces the other objects go into.
    cluster
        .kubectl_admin(&[
            "apply",
            "--server-side",
            "-f",
            "packaging/kubernetes/namespace.yaml",
        ])
        .unwrap();
    let dry = cluster
        .kubectl_admin(&[
            "apply",
            "--server-side",
            "--dry-run=server",
            "-k",
            "packaging/kubernetes",
        ])
        .unwrap();
    eprintln!("{dry}");
    // 3 namespaces, 4 CRDs, ServiceAccount, ClusterRole, 3 Roles, 4 bindings, Service,
    // Deployment, PodDisruptionBudget.
    assert_eq!(dry.lines().count(), 19, "{dry}");
    assert!(
        dry.lines().all(|l| l.ends_with("(server dry run)")),
        "{dry}"
    );
    assert!(
        admin
            .get_opt(
                "/apis/apiextensions.k8s.io/v1/customresourcedefinitions/guardedhosts.metalguard.io"
            )
            .unwrap()
            .is_none(),
        "a dry run created a CRD"
    );

    let applied = cluster
        .kubectl_admin(&["apply", "--server-side", "-k", "packaging/kubernetes"])
        .unwrap();
    assert_eq!(applied.lines().count(), 19, "{applied}");
    cluster
        .kubectl_admin(&[
            "wait",
            "--for=condition=Established",
            "crd",
            "--all",
            "--timeout=60s",
        ])
        .unwrap();
    for crd in admin
        .list("/apis/apiextensions.k8s.io/v1/customresourcedefinitions")
        .unwrap()
    {
        let conditions = crd["status"]["conditions"].as_array().unwrap();
        let status = |t: &str| {
            conditions
                .iter()
                .find(|c| c["type"] == t)
                .map(|c| c["status"].as_str().unwrap().to_owned())
        };
        assert_eq!(status("NamesAccepted").as_deref(), Some("True"), "{crd}");
        assert_eq!(status("NonStructuralSchema"), None, "{crd}");
    }
    let deployment = admin
        .get("/apis/apps/v1/namespaces/metalguard-system/deployments/metalguard-controller")
        .unwrap();
    assert_eq!(deployment["spec"]["replicas"], 2);

    // The examples: every custom resource and the BMC Secrets (cert-manager's objects need
    // cert-manager's CRDs, which are not here; the fence request uses generateName, so create).
    let examples = cluster
        .kubectl_admin(&[
            "apply",
            "--server-side",
            "-f",
            "packaging/kubernetes/examples/hosts.yaml",
            "-f",
            "packaging/kubernetes/examples/control-plane.yaml",
            "-f",
            "packaging/kubernetes/examples/health-checks.yaml",
        ])
        .unwrap();
    assert_eq!(examples.lines().count(), 7, "{examples}");
    let fence = cluster
        .kubectl_admin(&[
            "create",
            "-f",
            "packaging/kubernetes/examples/fence-request.yaml",
        ])
        .unwrap();
    assert!(
        fence.starts_with("fencerequest.metalguard.io/worker-1-"),
        "{fence}"
    );
    assert_eq!(admin.list(&format!("{MG}/guardedhosts")).unwrap().len(), 2);
    assert_eq!(
        admin
            .list("/api/v1/namespaces/metalguard-bmc/secrets")
            .unwrap()
            .len(),
        2
    );

    // CEL: odd replicas.
    let control_plane = |replicas: i64| {
        json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "GuardedControlPlane",
            "metadata": {"name": format!("cp-{replicas}"), "namespace": NS},
            "spec": {"replicas": replicas, "failureDomains": ["a"], "hostSelector": {},
                "etcd": {"endpoints": ["https://10.0.0.1:2379"]}}})
    };
    let err = refused(
        admin,
        &format!("{MG}/guardedcontrolplanes"),
        &control_plane(4),
    );
    assert!(err.contains("replicas must be odd"), "{err}");
    // Schema: bounds.
    let err = refused(
        admin,
        &format!("{MG}/guardedcontrolplanes"),
        &control_plane(11),
    );
    assert!(
        err.contains("spec.replicas") && err.contains("less than or equal to 9"),
        "{err}"
    );
    // CEL: one BMC trust mode.
    let two_modes = host(
        "two-modes",
        &json!({"address": "redfish+https://10.0.1.9/redfish/v1/Systems/1",
            "credentialsSecret": {"name": "x"}, "insecure": true,
            "fingerprintSha256": "AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89:AB:CD:EF:01:23:45:67:89"}),
    );
    let err = refused(admin, &format!("{MG}/guardedhosts"), &two_modes);
    assert!(
        err.contains("set at most one of caBundle, fingerprintSha256 and insecure"),
        "{err}"
    );
    // Schema: no credentials in a BMC address; enums.
    let mut in_url = host(
        "in-url",
        &json!({"address": "redfish+https://admin:pw@10.0.1.9/redfish/v1/Systems/1",
            "credentialsSecret": {"name": "x"}}),
    );
    in_url["spec"]["role"] = json!("Master");
    let err = refused(admin, &format!("{MG}/guardedhosts"), &in_url);
    assert!(
        err.contains("spec.bmc.address") && err.contains("spec.role") && err.contains("Master"),
        "{err}"
    );
    // CEL: maxUnhealthy is not negative; schema: its string pattern.
    let check = |max: Value| {
        json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "HostHealthCheck",
            "metadata": {"name": "bad", "namespace": NS},
            "spec": {"selector": {}, "unhealthyConditions": [
                {"type": "Ready", "status": "False", "timeout": "5m"}],
                "maxUnhealthy": max}})
    };
    let err = refused(admin, &format!("{MG}/hosthealthchecks"), &check(json!(-1)));
    assert!(err.contains("maxUnhealthy must not be negative"), "{err}");
    let err = refused(
        admin,
        &format!("{MG}/hosthealthchecks"),
        &check(json!("40 %")),
    );
    assert!(err.contains("spec.maxUnhealthy"), "{err}");

    // CEL with oldSelf: a fence request cannot be changed.
    let name = fence
        .split_whitespace()
        .next()
        .unwrap()
        .rsplit('/')
        .next()
        .unwrap();
    let err = admin
        .merge_patch(
            &format!("{MG}/fencerequests/{name}"),
            &json!({"spec": {"reason": "changed my mind"}}),
        )
        .unwrap_err();
    assert_eq!(err.api_status(), Some(422), "{err}");
    assert!(
        err.to_string()
            .contains("a fence request cannot be changed; delete it and create another"),
        "{err}"
    );

    // Unknown fields: pruned by default, refused under strict field validation.
    let mut typo = host(
        "typo",
        &json!({"address": "ipmi://10.0.1.21:623", "credentialsSecret": {"name": "x"}}),
    );
    typo["spec"]["nodeNmae"] = json!("typo");
    let err = admin
        .create(&format!("{MG}/guardedhosts?fieldValidation=Strict"), &typo)
        .unwrap_err();
    assert!(
        err.api_status() == Some(400) || err.api_status() == Some(422),
        "{err}"
    );
    assert!(err.to_string().contains("nodeNmae"), "{err}");
    let created = admin.create(&format!("{MG}/guardedhosts"), &typo).unwrap();
    assert!(created["spec"].get("nodeNmae").is_none(), "{created}");
    // Status is a subresource: the main resource ignores it.
    let mut with_status = host(
        "with-status",
        &json!({"address": "ipmi://10.0.1.22:623", "credentialsSecret": {"name": "x"}}),
    );
    with_status["status"] = json!({"remediation": {"id": "forged"}});
    let created = admin
        .create(&format!("{MG}/guardedhosts"), &with_status)
        .unwrap();
    assert!(created.get("status").is_none(), "{created}");
}
