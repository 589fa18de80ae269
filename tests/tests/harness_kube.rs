//! The Kubernetes harness against itself: the pinned kube-apiserver on etcd 3.6 authenticates
//! client certificates (several groups), static ServiceAccount tokens, and RBAC decides; the
//! audit log records the audited user's refusals; a restart plus compaction expires a
//! resourceVersion (410 Gone); with kube-controller-manager, a stopped fake kubelet's Node
//! goes Unknown and is tainted, and comes back when the kubelet registers again.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::time::{Duration, Instant};

use metalguard_e2e::kube::kubelet::NodeTemplate;
use metalguard_e2e::kube::{KubeCluster, KubeOptions, service_account_user};
use metalguard_e2e::process::wait_until;
use metalguard_e2e::tools;
use serde_json::{Value, json};

fn whoami(client: &metalguard_e2e::kube::client::ApiClient) -> (String, Vec<String>) {
    let review = client
        .create(
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            &json!({"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}),
        )
        .unwrap();
    let user = &review["status"]["userInfo"];
    (
        user["username"].as_str().unwrap().to_owned(),
        user["groups"]
            .as_array()
            .unwrap()
            .iter()
            .map(|g| g.as_str().unwrap().to_owned())
            .collect(),
    )
}

#[test]
fn users_groups_and_service_accounts_are_authenticated_and_rbac_decides() {
    let sa_user = service_account_user("team-a", "robot");
    let mut cluster = KubeCluster::start(&KubeOptions {
        etcd_tls: true,
        service_accounts: vec![("team-a".into(), "robot".into())],
        audited_users: vec![sa_user.clone()],
        ..KubeOptions::default()
    })
    .unwrap();
    eprintln!(
        "cluster (etcd 3.6 with TLS + kube-apiserver) ready in {:?} (apiserver {:?}), apiserver RSS {:?} KiB",
        cluster.started_in(),
        cluster.apiserver().ready_after(),
        cluster.apiserver_rss_kib()
    );
    let admin = cluster.admin();
    let version = admin.get("/version").unwrap();
    assert_eq!(version["gitVersion"], tools::kube_version().unwrap());

    // Client certificates: CN is the user, every O a group.
    let bob = cluster.client_as("bob", &["other", "readers"]).unwrap();
    let (user, groups) = whoami(&bob);
    assert_eq!(user, "bob");
    assert!(groups.contains(&"other".to_owned()) && groups.contains(&"readers".to_owned()));
    let carol = cluster.client_as("carol", &["other"]).unwrap();
    for client in [&bob, &carol] {
        let err = client.get("/api/v1/nodes").unwrap_err();
        assert_eq!(err.api_status(), Some(403), "{err}");
    }
    admin
        .create(
            "/apis/rbac.authorization.k8s.io/v1/clusterroles",
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
                "metadata": {"name": "node-reader"},
                "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["list"]}]}),
        )
        .unwrap();
    admin
        .create(
            "/apis/rbac.authorization.k8s.io/v1/clusterrolebindings",
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": "readers-read-nodes"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "node-reader"},
                "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": "readers"}]}),
        )
        .unwrap();
    wait_until("RBAC to admit the group", Duration::from_secs(10), || {
        Ok(bob.get("/api/v1/nodes").is_ok())
    })
    .unwrap();
    assert_eq!(
        carol.get("/api/v1/nodes").unwrap_err().api_status(),
        Some(403)
    );

    // A static token with a ServiceAccount's user name is that ServiceAccount to RBAC.
    let robot = cluster.service_account_client("team-a", "robot").unwrap();
    let (user, groups) = whoami(&robot);
    assert_eq!(user, sa_user);
    assert_eq!(
        groups[..2],
        ["system:serviceaccounts", "system:serviceaccounts:team-a"]
    );
    admin
        .create(
            "/api/v1/namespaces",
            &json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "team-a"}}),
        )
        .unwrap();
    // (Not the aggregated `view` role: its rules are filled by a controller that does not
    // run here.)
    admin
        .create(
            "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/roles",
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "Role",
                "metadata": {"name": "configmap-reader"},
                "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}]}),
        )
        .unwrap();
    admin
        .create(
            "/apis/rbac.authorization.k8s.io/v1/namespaces/team-a/rolebindings",
            &json!({"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "RoleBinding",
                "metadata": {"name": "robot-reads-configmaps"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "configmap-reader"},
                "subjects": [{"kind": "ServiceAccount", "name": "robot", "namespace": "team-a"}]}),
        )
        .unwrap();
    wait_until(
        "RBAC to admit the ServiceAccount",
        Duration::from_secs(10),
        || Ok(robot.get("/api/v1/namespaces/team-a/configmaps").is_ok()),
    )
    .unwrap();
    // Nothing grants Secrets.
    assert_eq!(
        robot
            .get("/api/v1/namespaces/team-a/secrets")
            .unwrap_err()
            .api_status(),
        Some(403)
    );
    let kubeconfig = cluster
        .service_account_kubeconfig("team-a", "robot")
        .unwrap();
    let can_i = cluster
        .kubectl(
            &kubeconfig,
            &["auth", "can-i", "list", "configmaps", "-n", "team-a"],
            None,
        )
        .unwrap();
    assert_eq!(can_i.trim(), "yes");

    // The audit log has the ServiceAccount's calls with RBAC's decisions, and nobody else's.
    let audit = cluster.audit().unwrap();
    assert!(audit.iter().all(|e| e.user == sa_user), "{audit:?}");
    let refused: Vec<_> = audit
        .iter()
        .filter(|e| e.code == 403 && e.resource == "secrets")
        .collect();
    assert_eq!(refused.len(), 1, "{audit:?}");
    assert_eq!(
        (refused[0].verb.as_str(), refused[0].decision.as_str()),
        ("list", "forbid")
    );

    // A resourceVersion older than a restart plus a compaction is gone: 410 on watch.
    let old = admin.get("/api/v1/namespaces").unwrap()["metadata"]["resourceVersion"]
        .as_str()
        .unwrap()
        .to_owned();
    admin
        .create(
            "/api/v1/namespaces/team-a/configmaps",
            &json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "bump"}}),
        )
        .unwrap();
    let restarted = Instant::now();
    cluster.stop_apiserver();
    let compacted = cluster.store().unwrap().compact().unwrap();
    cluster.start_apiserver_again().unwrap();
    eprintln!(
        "apiserver restarted in {:?}; etcd compacted at {compacted}",
        restarted.elapsed()
    );
    let watch = cluster
        .admin()
        .call(
            "GET",
            &format!("/api/v1/namespaces?watch=true&resourceVersion={old}&timeoutSeconds=2"),
            None,
            "",
        )
        .unwrap();
    let text = match &watch.body {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    let first: Value = serde_json::from_str(text.lines().next().unwrap()).unwrap();
    assert_eq!(first["type"], "ERROR", "{text}");
    assert_eq!(first["object"]["code"], 410, "{text}");
}

#[test]
fn a_stopped_fake_kubelet_goes_unknown_and_tainted_and_comes_back() {
    let cluster = KubeCluster::start(&KubeOptions {
        controller_manager: true,
        ..KubeOptions::default()
    })
    .unwrap();
    eprintln!(
        "cluster with kube-controller-manager ready in {:?}",
        cluster.started_in()
    );
    let healthy = cluster.kubelet(&NodeTemplate::named("n-1")).unwrap();
    let node = NodeTemplate::named("n-2").label("team", "storage");
    let dying = cluster.kubelet(&node).unwrap();
    let admin = cluster.admin();
    let ready = |name: &str| -> String {
        let node = admin.get(&format!("/api/v1/nodes/{name}")).unwrap();
        node["status"]["conditions"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["type"] == "Ready")
            .map(|c| c["status"].as_str().unwrap().to_owned())
            .unwrap()
    };
    let tainted = |name: &str, key: &str| -> bool {
        let node = admin.get(&format!("/api/v1/nodes/{name}")).unwrap();
        node["spec"]["taints"]
            .as_array()
            .is_some_and(|t| t.iter().any(|t| t["key"] == key))
    };
    wait_until("heartbeats", Duration::from_secs(10), || {
        Ok(dying.heartbeats() >= 2)
    })
    .unwrap();
    assert_eq!(dying.last_error(), None);
    let lease = admin
        .get("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/n-2")
        .unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "n-2");

    let stopped = Instant::now();
    dying.stop();
    wait_until("n-2 Ready=Unknown", Duration::from_secs(40), || {
        Ok(ready("n-2") == "Unknown")
    })
    .unwrap();
    wait_until(
        "the unreachable taint on n-2",
        Duration::from_secs(20),
        || Ok(tainted("n-2", "node.kubernetes.io/unreachable")),
    )
    .unwrap();
    eprintln!(
        "stopped kubelet -> Unknown and tainted in {:?}",
        stopped.elapsed()
    );
    assert_eq!(ready("n-1"), "True");
    assert!(healthy.is_running());

    dying.register_again(&node).unwrap();
    wait_until(
        "n-2 Ready=True without the taint",
        Duration::from_secs(30),
        || Ok(ready("n-2") == "True" && !tainted("n-2", "node.kubernetes.io/unreachable")),
    )
    .unwrap();
}
