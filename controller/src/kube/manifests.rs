//! Offline checks of `packaging/kubernetes/` (test only).
//!
//! No API server can run here and `kubectl apply --dry-run=client` needs one (discovery), so
//! the manifests are checked the strongest way available offline:
//! - every built-in object is read into its `k8s-openapi` type and written back; a field the
//!   type does not know (a typo) or a value of the wrong type shows up as a difference;
//! - every `metalguard.io` object in `examples/` is validated against the openAPIV3Schema of the
//!   generated CRD (types, unknown fields, required, enums, patterns, bounds, int-or-string) and
//!   read into its Rust type. The CEL rules (`x-kubernetes-validations`) are left to the API
//!   server;
//! - the RBAC grants exactly [`CONTROLLER_PERMISSIONS`], and the Deployment, PodDisruptionBudget
//!   and Service fit together and are hardened.

// Test module: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Secret, Service, ServiceAccount};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding, Role, RoleBinding};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use metalguard_api::k8s::rbac::{
    CONTROLLER_PERMISSIONS, CONTROLLER_ROLE, CREDENTIALS_NAMESPACE, NAMESPACE, Scope, grants,
};
use metalguard_api::k8s::{FenceRequest, GuardedControlPlane, GuardedHost, HostHealthCheck};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::Value;

fn dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../packaging/kubernetes")
}

fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "yaml"))
        .collect();
    files.sort();
    files
}

fn read_docs(path: &Path) -> Vec<Value> {
    let text = std::fs::read_to_string(path).unwrap();
    let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
        .unwrap_or_else(|e| panic!("{} is not valid yaml: {e}", path.display()));
    docs.into_iter().filter(|d| !d.is_null()).collect()
}

/// Every object of the installable manifests (kustomization.yaml excluded).
fn installed() -> Vec<(String, Value)> {
    yaml_files(&dir())
        .into_iter()
        .filter(|p| !p.ends_with("kustomization.yaml"))
        .flat_map(|p| {
            let name = p.file_name().unwrap().to_string_lossy().into_owned();
            read_docs(&p).into_iter().map(move |d| (name.clone(), d))
        })
        .collect()
}

fn examples() -> Vec<(String, Value)> {
    yaml_files(&dir().join("examples"))
        .into_iter()
        .flat_map(|p| {
            let name = format!("examples/{}", p.file_name().unwrap().to_string_lossy());
            read_docs(&p).into_iter().map(move |d| (name.clone(), d))
        })
        .collect()
}

fn find<'a>(objects: &'a [(String, Value)], kind: &str) -> Vec<&'a Value> {
    objects
        .iter()
        .filter(|(_, o)| o["kind"] == kind)
        .map(|(_, o)| o)
        .collect()
}

// ---- built-in objects: read into the API types and written back ----

fn round_trip<T: DeserializeOwned + Serialize>(object: &Value) -> Result<(), String> {
    let typed: T = serde_json::from_value(object.clone()).map_err(|e| e.to_string())?;
    let back = serde_json::to_value(&typed).map_err(|e| e.to_string())?;
    let mut differences = Vec::new();
    diff(object, &back, "", &mut differences);
    if differences.is_empty() {
        Ok(())
    } else {
        Err(differences.join("; "))
    }
}

fn diff(written: &Value, read: &Value, at: &str, out: &mut Vec<String>) {
    match (written, read) {
        (Value::Object(a), Value::Object(b)) => {
            for (k, v) in a {
                match b.get(k) {
                    Some(w) => diff(v, w, &format!("{at}.{k}"), out),
                    None => out.push(format!("{at}.{k} is not a field of this kind")),
                }
            }
        }
        (Value::Array(a), Value::Array(b)) if a.len() == b.len() => {
            for (i, (v, w)) in a.iter().zip(b).enumerate() {
                diff(v, w, &format!("{at}[{i}]"), out);
            }
        }
        _ if written == read => {}
        _ => out.push(format!("{at}: {written} reads back as {read}")),
    }
}

fn check_builtin(object: &Value) -> Result<bool, String> {
    let checked = match (object["apiVersion"].as_str(), object["kind"].as_str()) {
        (Some("v1"), Some("Namespace")) => round_trip::<Namespace>(object),
        (Some("v1"), Some("ServiceAccount")) => round_trip::<ServiceAccount>(object),
        (Some("v1"), Some("Service")) => round_trip::<Service>(object),
        (Some("v1"), Some("Secret")) => round_trip::<Secret>(object),
        (Some("apps/v1"), Some("Deployment")) => round_trip::<Deployment>(object),
        (Some("policy/v1"), Some("PodDisruptionBudget")) => {
            round_trip::<PodDisruptionBudget>(object)
        }
        (Some("rbac.authorization.k8s.io/v1"), Some("ClusterRole")) => {
            round_trip::<ClusterRole>(object)
        }
        (Some("rbac.authorization.k8s.io/v1"), Some("ClusterRoleBinding")) => {
            round_trip::<ClusterRoleBinding>(object)
        }
        (Some("rbac.authorization.k8s.io/v1"), Some("Role")) => round_trip::<Role>(object),
        (Some("rbac.authorization.k8s.io/v1"), Some("RoleBinding")) => {
            round_trip::<RoleBinding>(object)
        }
        (Some("apiextensions.k8s.io/v1"), Some("CustomResourceDefinition")) => {
            round_trip::<CustomResourceDefinition>(object)
        }
        _ => return Ok(false),
    };
    checked.map(|()| true)
}

// ---- custom resources: validated against the generated CRD schemas ----

fn crd_schema(kind: &str) -> Value {
    let crd = metalguard_api::k8s::crds()
        .into_iter()
        .find(|c| c.spec.names.kind == kind)
        .unwrap_or_else(|| panic!("no metalguard.io CRD has kind {kind}"));
    let version = &crd.spec.versions[0];
    let schema = version.schema.as_ref().unwrap().open_api_v3_schema.as_ref();
    serde_json::to_value(schema.unwrap()).unwrap()
}

/// Validates `value` against a structural openAPIV3Schema, collecting every error.
fn validate(schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
    if value.is_null() {
        if schema["nullable"] != true {
            errors.push(format!("{at}: null is not allowed"));
        }
        return;
    }
    if let Some(allowed) = schema["enum"].as_array()
        && !allowed.contains(value)
    {
        errors.push(format!("{at}: {value} is not one of {allowed:?}"));
    }
    if schema["x-kubernetes-int-or-string"] == true {
        match value {
            Value::String(s) => check_string(schema, s, at, errors),
            Value::Number(n) if n.is_i64() => {}
            _ => errors.push(format!("{at}: {value} is neither an integer nor a string")),
        }
        return;
    }
    match schema["type"].as_str() {
        Some("object") => validate_object(schema, value, at, errors),
        Some("array") => match value.as_array() {
            Some(items) => {
                for (i, item) in items.iter().enumerate() {
                    validate(&schema["items"], item, &format!("{at}[{i}]"), errors);
                }
            }
            None => errors.push(format!("{at}: {value} is not an array")),
        },
        Some("string") => match value.as_str() {
            Some(s) => check_string(schema, s, at, errors),
            None => errors.push(format!("{at}: {value} is not a string")),
        },
        Some("integer") => match value.as_i64() {
            Some(n) => {
                #[allow(clippy::cast_precision_loss)] // bounds are small
                let n = n as f64;
                if schema["minimum"].as_f64().is_some_and(|min| n < min)
                    || schema["maximum"].as_f64().is_some_and(|max| n > max)
                {
                    errors.push(format!("{at}: {value} is out of bounds"));
                }
            }
            None => errors.push(format!("{at}: {value} is not an integer")),
        },
        Some("boolean") if !value.is_boolean() => {
            errors.push(format!("{at}: {value} is not a boolean"));
        }
        _ => {}
    }
}

fn validate_object(schema: &Value, value: &Value, at: &str, errors: &mut Vec<String>) {
    let Some(map) = value.as_object() else {
        errors.push(format!("{at}: {value} is not an object"));
        return;
    };
    let root = at.is_empty();
    if let Some(properties) = schema["properties"].as_object() {
        for (key, v) in map {
            if root && matches!(key.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            match properties.get(key) {
                Some(p) => validate(p, v, &format!("{at}.{key}"), errors),
                None if schema["x-kubernetes-preserve-unknown-fields"] == true => {}
                None => errors.push(format!("{at}.{key} is not a field")),
            }
        }
    } else if schema["additionalProperties"].is_object() {
        for (key, v) in map {
            validate(
                &schema["additionalProperties"],
                v,
                &format!("{at}.{key}"),
                errors,
            );
        }
    }
    for required in schema["required"].as_array().into_iter().flatten() {
        let key = required.as_str().unwrap();
        if !map.contains_key(key) {
            errors.push(format!("{at}.{key} is required"));
        }
    }
}

fn check_string(schema: &Value, s: &str, at: &str, errors: &mut Vec<String>) {
    if let Some(pattern) = schema["pattern"].as_str()
        && !regex::Regex::new(pattern).unwrap().is_match(s)
    {
        errors.push(format!("{at}: {s:?} does not match {pattern}"));
    }
    let chars = s.chars().count() as u64;
    if schema["minLength"].as_u64().is_some_and(|min| chars < min)
        || schema["maxLength"].as_u64().is_some_and(|max| chars > max)
    {
        errors.push(format!("{at}: {s:?} has a length out of bounds"));
    }
}

fn check_custom(object: &Value) -> Result<(), String> {
    let kind = object["kind"].as_str().unwrap_or_default();
    let mut errors = Vec::new();
    validate(&crd_schema(kind), object, "", &mut errors);
    if !errors.is_empty() {
        return Err(errors.join("; "));
    }
    let read = match kind {
        "GuardedHost" => serde_json::from_value::<GuardedHost>(object.clone()).map(drop),
        "GuardedControlPlane" => {
            serde_json::from_value::<GuardedControlPlane>(object.clone()).map(drop)
        }
        "HostHealthCheck" => serde_json::from_value::<HostHealthCheck>(object.clone()).map(drop),
        "FenceRequest" => serde_json::from_value::<FenceRequest>(object.clone()).map(drop),
        other => return Err(format!("unknown metalguard.io kind {other}")),
    };
    read.map_err(|e| format!("does not read as {kind}: {e}"))
}

fn check_object(object: &Value) -> Result<(), String> {
    for key in ["apiVersion", "kind"] {
        if !object[key].is_string() {
            return Err(format!("{key} is missing"));
        }
    }
    let meta = &object["metadata"];
    if !meta["name"].is_string() && !meta["generateName"].is_string() {
        return Err("metadata.name is missing".to_owned());
    }
    if check_builtin(object)? {
        return Ok(());
    }
    let api_version = object["apiVersion"].as_str().unwrap_or_default();
    if api_version == "metalguard.io/v1alpha1" {
        return check_custom(object);
    }
    if api_version.starts_with("cert-manager.io/") {
        return Ok(()); // cert-manager's schema is not here; the file is only parsed
    }
    Err(format!("{api_version} is not checked by any rule here"))
}

#[test]
fn every_manifest_and_example_passes_the_offline_checks() {
    let mut checked = 0;
    for (file, object) in installed().iter().chain(&examples()) {
        if let Err(e) = check_object(object) {
            panic!(
                "{file}: {} {}: {e}",
                object["kind"], object["metadata"]["name"]
            );
        }
        checked += 1;
    }
    // namespaces 3, crds 4, rbac 9, deployment 1, pdb 1, service 1; examples: control plane 1,
    // hosts and their Secrets 4, health checks 2, fence request 1, certificates 3, operator
    // RBAC 4.
    assert_eq!(checked, 34);
}

#[test]
fn the_checks_catch_typos_and_bad_values() {
    let deployment = find(&installed(), "Deployment")[0].clone();
    let mut typo = deployment.clone();
    typo["spec"]["replica"] = 2.into();
    let err = check_object(&typo).unwrap_err();
    assert!(err.contains(".spec.replica is not a field"), "{err}");
    let mut wrong_type = deployment;
    wrong_type["spec"]["replicas"] = "two".into();
    assert!(check_object(&wrong_type).is_err());

    let examples = examples();
    let control_plane = find(&examples, "GuardedControlPlane")[0].clone();
    let mut bad = control_plane.clone();
    bad["spec"]["replicas"] = 11.into();
    bad["spec"]["rollout"]["maxSurge"] = 2.into();
    bad["spec"]["etcd"]["endpoints"][0] = "10.0.0.11:2379".into();
    bad["spec"]["replica"] = 3.into();
    let err = check_object(&bad).unwrap_err();
    for expected in [
        ".spec.replicas: 11 is out of bounds",
        ".spec.rollout.maxSurge: 2 is out of bounds",
        ".spec.etcd.endpoints[0]: \"10.0.0.11:2379\" does not match",
        ".spec.replica is not a field",
    ] {
        assert!(err.contains(expected), "{expected} not in {err}");
    }
    let check = find(&examples, "HostHealthCheck")[0].clone();
    for (field, value, expected) in [
        ("maxUnhealthy", "40 %", "does not match"),
        ("maxUnhealthy", "101%", "does not match"),
        ("nodeStartupTimeout", "10 minutes", "does not match"),
        ("nodeStartupTimeout", "1.5h", "does not match"),
    ] {
        let mut bad = check.clone();
        bad["spec"][field] = value.into();
        let err = check_object(&bad).unwrap_err();
        assert!(err.contains(expected), "{field}={value}: {err}");
    }
    let hosts = find(&examples, "GuardedHost");
    let mut bad = hosts[0].clone();
    bad["spec"]["bmc"]["address"] = "redfish+https://admin:pw@10.0.1.11".into();
    bad["spec"]["role"] = "Master".into();
    let err = check_object(&bad).unwrap_err();
    assert!(err.contains("address") && err.contains("Master"), "{err}");
}

#[test]
fn the_duration_pattern_accepts_what_the_parser_accepts() {
    let pattern = regex::Regex::new(metalguard_api::k8s::schema::DURATION_PATTERN).unwrap();
    for text in [
        "0", "300s", "10m", "1h30m", "250ms", "1h0m0s", "", "1.5s", "10", "5 m", "1d", "m", "0s",
        "-1s",
    ] {
        assert_eq!(
            pattern.is_match(text),
            metalguard_api::duration::parse_duration(text).is_ok(),
            "{text:?}"
        );
    }
}

// ---- RBAC ----

fn rules_of(object: &Value, scope: Scope) -> Vec<(Scope, String, String, String)> {
    let mut out = Vec::new();
    for rule in object["rules"].as_array().unwrap() {
        assert!(
            rule.get("resourceNames").is_none() && rule.get("nonResourceURLs").is_none(),
            "{rule}"
        );
        let strings = |key: &str| -> Vec<String> {
            rule[key]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_str().unwrap().to_owned())
                .collect()
        };
        for group in strings("apiGroups") {
            for resource in strings("resources") {
                for verb in strings("verbs") {
                    out.push((scope, group.clone(), resource.clone(), verb));
                }
            }
        }
    }
    out
}

#[test]
fn the_rbac_manifest_grants_exactly_the_permissions_in_code() {
    let objects = installed();
    let cluster_roles = find(&objects, "ClusterRole");
    let roles = find(&objects, "Role");
    assert_eq!((cluster_roles.len(), roles.len()), (1, 3));
    let mut granted = rules_of(cluster_roles[0], Scope::Cluster);
    for role in roles {
        let scope = match role["metadata"]["namespace"].as_str() {
            Some(NAMESPACE) => Scope::Namespace,
            Some(CREDENTIALS_NAMESPACE) => Scope::Credentials,
            Some(metalguard_api::k8s::rbac::NODE_LEASES_NAMESPACE) => Scope::NodeLeases,
            other => panic!("a Role in namespace {other:?}"),
        };
        granted.extend(rules_of(role, scope));
    }
    granted.sort();
    let before = granted.len();
    granted.dedup();
    assert_eq!(before, granted.len(), "rbac.yaml grants a verb twice");
    let wanted = grants(CONTROLLER_PERMISSIONS);
    let missing: BTreeSet<_> = wanted.iter().filter(|g| !granted.contains(g)).collect();
    let extra: BTreeSet<_> = granted.iter().filter(|g| !wanted.contains(g)).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "rbac.yaml differs from CONTROLLER_PERMISSIONS\nmissing: {missing:?}\nextra: {extra:?}"
    );
}

#[test]
fn the_bindings_give_the_roles_to_the_deployments_service_account() {
    let objects = installed();
    let account = find(&objects, "ServiceAccount")[0];
    assert_eq!(account["metadata"]["name"], CONTROLLER_ROLE);
    assert_eq!(account["metadata"]["namespace"], NAMESPACE);
    let bindings = find(&objects, "ClusterRoleBinding")
        .into_iter()
        .map(|b| (b, "ClusterRole"))
        .chain(
            find(&objects, "RoleBinding")
                .into_iter()
                .map(|b| (b, "Role")),
        );
    let mut namespaces = BTreeSet::new();
    for (binding, role_kind) in bindings {
        namespaces.insert(binding["metadata"]["namespace"].as_str().unwrap_or(""));
        assert_eq!(binding["roleRef"]["kind"], role_kind);
        assert_eq!(binding["roleRef"]["name"], CONTROLLER_ROLE);
        let subject = &binding["subjects"][0];
        assert_eq!(subject["name"], CONTROLLER_ROLE);
        assert_eq!(subject["namespace"], NAMESPACE);
    }
    assert_eq!(
        namespaces,
        BTreeSet::from([
            "",
            NAMESPACE,
            CREDENTIALS_NAMESPACE,
            metalguard_api::k8s::rbac::NODE_LEASES_NAMESPACE
        ])
    );
    let deployment = find(&objects, "Deployment")[0];
    assert_eq!(
        deployment["spec"]["template"]["spec"]["serviceAccountName"],
        CONTROLLER_ROLE
    );
}

// ---- Deployment, PodDisruptionBudget, Service ----

#[test]
fn the_deployment_is_hardened_and_fits_the_budget_and_the_service() {
    let objects = installed();
    let deployment = find(&objects, "Deployment")[0];
    let spec = &deployment["spec"];
    let pod = &spec["template"]["spec"];
    let labels = &spec["template"]["metadata"]["labels"];
    assert_eq!(spec["replicas"], 2);
    assert_eq!(pod["securityContext"]["runAsNonRoot"], true);
    assert_eq!(
        pod["securityContext"]["seccompProfile"]["type"],
        "RuntimeDefault"
    );
    let anti =
        &pod["affinity"]["podAntiAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"];
    assert_eq!(anti[0]["topologyKey"], "kubernetes.io/hostname");
    let containers = pod["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 1);
    let container = &containers[0];
    let security = &container["securityContext"];
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"]["drop"][0], "ALL");
    assert!(container["livenessProbe"].is_object() && container["readinessProbe"].is_object());
    let port_names: Vec<&str> = container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["name"].as_str().unwrap())
        .collect();
    for probe in ["livenessProbe", "readinessProbe"] {
        let probe = &container[probe];
        let port = probe["httpGet"]["port"]
            .as_str()
            .or(probe["tcpSocket"]["port"].as_str())
            .unwrap();
        assert!(port_names.contains(&port), "{port}");
    }
    let selects = |selector: &Value| {
        selector
            .as_object()
            .unwrap()
            .iter()
            .all(|(k, v)| labels[k] == *v)
    };
    assert!(selects(&spec["selector"]["matchLabels"]));
    let budget = find(&objects, "PodDisruptionBudget")[0];
    assert!(selects(&budget["spec"]["selector"]["matchLabels"]));
    assert_eq!(budget["spec"]["minAvailable"], 1);
    // The Service selects the pods' labels plus the one the leader puts on its own pod (from
    // the downward API's name and namespace): it reaches the leader only.
    let service = find(&objects, "Service")[0];
    let mut selector = service["spec"]["selector"].clone();
    let leader = selector
        .as_object_mut()
        .unwrap()
        .remove(crate::kube::observe::LEADER_LABEL);
    assert_eq!(leader, Some(Value::from("true")), "{service}");
    assert!(selects(&selector));
    let env_from_field = |name: &str| {
        container["env"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == name)
            .map(|e| e["valueFrom"]["fieldRef"]["fieldPath"].clone())
    };
    assert_eq!(
        env_from_field("METALGUARD_POD_NAME"),
        Some(Value::from("metadata.name"))
    );
    assert_eq!(
        env_from_field("METALGUARD_POD_NAMESPACE"),
        Some(Value::from("metadata.namespace"))
    );
    for port in service["spec"]["ports"].as_array().unwrap() {
        assert!(port_names.contains(&port["targetPort"].as_str().unwrap()));
    }
    // The TLS Secret is cert-manager's layout mapped onto the files the controller reads.
    let volume = &pod["volumes"][0]["secret"];
    let paths: BTreeSet<(&str, &str)> = volume["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| (i["key"].as_str().unwrap(), i["path"].as_str().unwrap()))
        .collect();
    assert_eq!(
        paths,
        BTreeSet::from([
            ("ca.crt", crate::pki::certs::CA_CERT),
            ("tls.crt", "controller.pem"),
            ("tls.key", "controller-key.pem"),
        ])
    );
}

#[test]
fn the_kustomization_lists_every_manifest() {
    let text = std::fs::read_to_string(dir().join("kustomization.yaml")).unwrap();
    let kustomization: Value = serde_saphyr::from_str(&text).unwrap();
    let listed: BTreeSet<String> = kustomization["resources"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r.as_str().unwrap().to_owned())
        .collect();
    let present: BTreeSet<String> = yaml_files(&dir())
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .filter(|n| n != "kustomization.yaml")
        .collect();
    assert_eq!(listed, present);
}
