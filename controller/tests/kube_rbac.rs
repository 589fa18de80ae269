//! RBAC for real: with only `packaging/kubernetes/rbac.yaml` applied, the controller's
//! ServiceAccount may do exactly what `CONTROLLER_PERMISSIONS` lists (the API server's own
//! rules review, what `kubectl auth can-i --list` prints), reads no Secret but the BMC
//! credentials (the CA's key, the agents' keys and its own serving key are out of reach),
//! and a whole remediation run under it is allowed request by request, using every grant:
//! no verb is granted that the code does not use.

#![cfg(feature = "kubernetes")]
// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod kubelab;

use std::collections::BTreeSet;
use std::time::Duration;

use kubelab::{CREDENTIALS_NS, KubeLab, LabOptions, MG, NS, SERVICE_ACCOUNT, controller_user};
use metalguard_api::k8s::rbac::{CONTROLLER_PERMISSIONS, NODE_LEASES_NAMESPACE, Scope, grants};
use metalguard_api::protocol::Outcome;
use metalguard_e2e::kube::client::ApiClient;
use serde_json::{Value, json};

type Grant = (Scope, String, String, String);

/// What RBAC lets `client` do in `namespace` (a SelfSubjectRulesReview, which `kubectl auth
/// can-i --list` prints).
fn rules(client: &ApiClient, namespace: &str) -> BTreeSet<(String, String, String)> {
    let review = client
        .create(
            "/apis/authorization.k8s.io/v1/selfsubjectrulesreviews",
            &json!({"apiVersion": "authorization.k8s.io/v1", "kind": "SelfSubjectRulesReview",
                "spec": {"namespace": namespace}}),
        )
        .unwrap();
    assert_eq!(review["status"]["incomplete"], false, "{review}");
    let mut out = BTreeSet::new();
    for rule in review["status"]["resourceRules"].as_array().unwrap() {
        assert!(
            rule.get("resourceNames").is_none(),
            "no rule is limited by name: {rule}"
        );
        let strings = |key: &str| -> Vec<String> {
            rule[key]
                .as_array()
                .map(|a| a.iter().map(|v| v.as_str().unwrap().to_owned()).collect())
                .unwrap_or_default()
        };
        for group in strings("apiGroups") {
            for resource in strings("resources") {
                for verb in strings("verbs") {
                    out.insert((group.clone(), resource.clone(), verb));
                }
            }
        }
    }
    out
}

fn scoped(
    scope: Scope,
    set: &BTreeSet<(String, String, String)>,
) -> impl Iterator<Item = Grant> + '_ {
    set.iter()
        .map(move |(g, r, v)| (scope, g.clone(), r.clone(), v.clone()))
}

#[test]
fn the_service_account_may_do_exactly_what_the_code_lists_and_reads_no_other_secret() {
    let lab = KubeLab::start(&LabOptions::default());
    let sa = lab
        .cluster
        .service_account_client(NS, SERVICE_ACCOUNT)
        .unwrap();
    // What any ServiceAccount of the namespace may do without a binding (discovery, reviews,
    // cluster trust bundles): same user name form and groups, another name.
    let nobody = lab
        .cluster
        .client_as(
            &metalguard_e2e::kube::service_account_user(NS, "nobody"),
            &[
                "system:serviceaccounts",
                &format!("system:serviceaccounts:{NS}"),
            ],
        )
        .unwrap();
    let granted_in = |namespace: &str| -> BTreeSet<(String, String, String)> {
        let everyone = rules(&nobody, namespace);
        rules(&sa, namespace)
            .difference(&everyone)
            .cloned()
            .collect()
    };
    let cluster = granted_in("default");
    let own: BTreeSet<_> = granted_in(NS).difference(&cluster).cloned().collect();
    let credentials: BTreeSet<_> = granted_in(CREDENTIALS_NS)
        .difference(&cluster)
        .cloned()
        .collect();
    let leases: BTreeSet<_> = granted_in(NODE_LEASES_NAMESPACE)
        .difference(&cluster)
        .cloned()
        .collect();
    let mut granted: Vec<Grant> = scoped(Scope::Cluster, &cluster)
        .chain(scoped(Scope::Namespace, &own))
        .chain(scoped(Scope::Credentials, &credentials))
        .chain(scoped(Scope::NodeLeases, &leases))
        .collect();
    granted.sort();
    let wanted = grants(CONTROLLER_PERMISSIONS);
    assert_eq!(
        granted, wanted,
        "what the API server lets the ServiceAccount do differs from CONTROLLER_PERMISSIONS"
    );
    eprintln!(
        "{}",
        lab.cluster
            .kubectl_admin(&[
                "auth",
                "can-i",
                "--list",
                "-n",
                NS,
                &format!("--as={}", controller_user()),
            ])
            .unwrap()
    );

    // The keys cert-manager (or `certs init`/`issue`) keeps in the controller's namespace.
    let admin = lab.admin();
    for name in [
        "metalguard-ca",
        "agent-cp-1-tls",
        "metalguard-controller-tls",
    ] {
        admin
            .create(
                &format!("/api/v1/namespaces/{NS}/secrets"),
                &json!({"apiVersion": "v1", "kind": "Secret", "type": "kubernetes.io/tls",
                    "metadata": {"name": name, "namespace": NS},
                    "stringData": {"tls.crt": "-", "tls.key": "-"}}),
            )
            .unwrap();
        let err = sa
            .get(&format!("/api/v1/namespaces/{NS}/secrets/{name}"))
            .unwrap_err();
        assert_eq!(err.api_status(), Some(403), "{name}: {err}");
    }
    for path in [
        format!("/api/v1/namespaces/{NS}/secrets"),
        "/api/v1/secrets".to_owned(),
        format!("/api/v1/namespaces/{NS}/secrets?watch=true&timeoutSeconds=1"),
    ] {
        let answer = sa.call("GET", &path, None, "").unwrap();
        assert_eq!(answer.status, 403, "{path}: {}", answer.message());
    }
    // The BMC credentials: listed (and watched), never read by name or written.
    let listed = sa
        .list(&format!("/api/v1/namespaces/{CREDENTIALS_NS}/secrets"))
        .unwrap();
    assert!(listed.iter().any(|s| s["metadata"]["name"] == "bmc-w-1"));
    let by_name = sa
        .get(&format!(
            "/api/v1/namespaces/{CREDENTIALS_NS}/secrets/bmc-w-1"
        ))
        .unwrap_err();
    assert_eq!(by_name.api_status(), Some(403));
    let write = sa
        .create(
            &format!("/api/v1/namespaces/{CREDENTIALS_NS}/secrets"),
            &json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "planted"}}),
        )
        .unwrap_err();
    assert_eq!(write.api_status(), Some(403));
    for (namespace, secret, expected) in [
        (NS, "metalguard-ca", (false, "no")),
        (CREDENTIALS_NS, "bmc-w-1", (false, "no")),
    ] {
        let (allowed, said) = lab
            .cluster
            .kubectl_answer(&[
                "auth",
                "can-i",
                "get",
                &format!("secrets/{secret}"),
                "-n",
                namespace,
                &format!("--as={}", controller_user()),
            ])
            .unwrap();
        assert_eq!(
            (allowed, said.as_str()),
            expected,
            "get {namespace}/{secret}"
        );
    }
    let (allowed, said) = lab
        .cluster
        .kubectl_answer(&[
            "auth",
            "can-i",
            "watch",
            "secrets",
            "-n",
            CREDENTIALS_NS,
            &format!("--as={}", controller_user()),
        ])
        .unwrap();
    assert_eq!((allowed, said.as_str()), (true, "yes"));
}

#[test]
fn every_request_of_a_remediation_is_allowed_and_every_grant_is_used() {
    let mut lab = KubeLab::start(&LabOptions {
        control_plane: vec!["cp-1"],
        ..LabOptions::default()
    });
    lab.agents.report_etcd_voter("cp-1");
    kubelab::create_control_plane(lab.admin(), 1);
    lab.start_controller_in_pod("controller-0");
    lab.wait_leading("w-1", Duration::from_secs(60));
    // A node lease Node Health Check left behind, expired: free, so the controller takes it
    // over (update) before the power-off, and releases it (delete) after the recovery.
    lab.admin()
        .create(
            &format!("/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASES_NAMESPACE}/leases"),
            &json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease",
                "metadata": {"name": "node-w-2"},
                "spec": {"holderIdentity": "NodeHealthCheck", "leaseDurationSeconds": 60,
                    "renewTime": "2026-01-01T00:00:00.000000Z"}}),
        )
        .unwrap();
    lab.admin()
        .create(
            &format!("{MG}/fencerequests"),
            &json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "FenceRequest",
                "metadata": {"name": "fence-w-2", "namespace": NS},
                "spec": {"target": "w-2", "reason": "kernel hung", "force": true}}),
        )
        .unwrap();
    let off = "remediation/w-2/1/power-off";
    lab.agents.wait_offered(off, Duration::from_secs(30));
    let lease_path =
        format!("/apis/coordination.k8s.io/v1/namespaces/{NODE_LEASES_NAMESPACE}/leases/node-w-2");
    assert_eq!(
        lab.admin().get(&lease_path).unwrap()["spec"]["holderIdentity"],
        "metalguard",
        "the node lease is taken before the power-off is offered"
    );
    lab.kubelets["w-2"].stop();
    lab.agents.set_live("w-2", false);
    assert_eq!(lab.agents.finish(off, Outcome::Succeeded), 200);
    let on = "remediation/w-2/1/power-on";
    lab.agents.wait_offered(on, Duration::from_secs(30));
    assert_eq!(lab.agents.finish(on, Outcome::Succeeded), 200);
    lab.wait("WaitingForNode", Duration::from_secs(20), |lab| {
        lab.phase("w-2") == "WaitingForNode"
    });
    // The new Node lacks the old labels and annotations: the restore patches it.
    lab.kubelets["w-2"]
        .register_again(&metalguard_e2e::kube::kubelet::NodeTemplate::named("w-2"))
        .unwrap();
    lab.agents.set_live("w-2", true);
    lab.wait(
        "the fence request Succeeded",
        Duration::from_secs(30),
        |lab| {
            let fence = lab
                .admin()
                .get(&format!("{MG}/fencerequests/fence-w-2"))
                .unwrap();
            fence["status"]["phase"] == "Succeeded"
        },
    );
    assert!(!kubelab::quorum_hooks(&lab.host("cp-1")).is_empty());
    lab.wait("the node lease released", Duration::from_secs(20), |lab| {
        lab.admin().get_opt(&lease_path).unwrap().is_none()
    });
    // The control plane's status and the leader's pod label (their grants are used).
    lab.wait("control plane status", Duration::from_secs(20), |lab| {
        lab.admin()
            .get(&format!("{MG}/guardedcontrolplanes/control-plane"))
            .unwrap()["status"]["etcdVoters"]
            == 1
    });
    assert_eq!(
        lab.pod_labels("controller-0")
            .get("metalguard.io/leader")
            .map(String::as_str),
        Some("true")
    );

    lab.assert_nothing_forbidden();
    let mut used: Vec<Grant> = lab
        .controller_calls()
        .iter()
        .filter(|e| !e.resource.starts_with('/')) // `/version`, `/api`: every user may
        .map(|e| {
            let scope = match e.namespace.as_str() {
                "" => Scope::Cluster,
                NS => Scope::Namespace,
                CREDENTIALS_NS => Scope::Credentials,
                NODE_LEASES_NAMESPACE => Scope::NodeLeases,
                other => panic!("the controller asked about namespace {other}: {e:?}"),
            };
            (
                scope,
                e.api_group.clone(),
                e.resource.clone(),
                e.verb.clone(),
            )
        })
        .collect();
    used.sort();
    used.dedup();
    let granted = grants(CONTROLLER_PERMISSIONS);
    let unused: Vec<_> = granted.iter().filter(|g| !used.contains(g)).collect();
    let ungranted: Vec<_> = used.iter().filter(|u| !granted.contains(u)).collect();
    assert!(
        unused.is_empty() && ungranted.is_empty(),
        "granted but never used: {unused:#?}\nused but not granted: {ungranted:#?}"
    );
    let last: Value = lab.host("w-2");
    assert_eq!(last["status"]["remediation"]["phase"], "Done");
}
