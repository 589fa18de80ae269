//! Tests of the inventory file (`inventory.rs`).

use super::*;
use std::os::unix::fs::PermissionsExt as _;

const MINIMAL: &str = r#"
[etcd]
endpoints = ["http://127.0.0.1:2379"]

[control_plane]
desired_replicas = 3
failure_domains = ["a", "b"]

[[hosts]]
name = "cp-1"
role = "control-plane"
failure_domain = "a"
bmc = { address = "ipmi://127.0.0.1:623", credentials_dir = "/nonexistent" }
"#;

fn parse(text: &str) -> Result<Inventory, InventoryError> {
    Inventory::parse(Path::new("inv.toml"), text)
}

#[test]
fn a_minimal_inventory_gets_the_defaults() {
    let inv = parse(MINIMAL).unwrap();
    assert_eq!(inv.etcd.prefix, DEFAULT_PREFIX);
    assert_eq!(inv.etcd.lease_ttl, DEFAULT_LEASE_TTL);
    assert_eq!(inv.controller.listen.to_string(), "127.0.0.1:8443");
    assert_eq!(inv.hosts[0].role, Role::ControlPlane);
}

#[test]
fn unknown_keys_are_rejected_naming_the_key_and_file() {
    let text = MINIMAL.replace("desired_replicas = 3", "desired_replicas = 3\nreplcas = 3");
    let err = parse(&text).unwrap_err().to_string();
    assert!(err.contains("inv.toml") && err.contains("replcas"), "{err}");
    let text = MINIMAL.replace("credentials_dir", "credential_dir");
    let err = parse(&text).unwrap_err().to_string();
    assert!(err.contains("credential_dir"), "{err}");
}

#[test]
fn semantic_errors_name_the_host_and_key() {
    let err = parse(&MINIMAL.replace("= \"a\"\nbmc", "= \"z\"\nbmc"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("cp-1") && err.contains("\"z\""), "{err}");
    let err = parse(&MINIMAL.replace("desired_replicas = 3", "desired_replicas = 2"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("desired_replicas is 2"), "{err}");
    let err = parse(
        &MINIMAL
            .replace("lease_ttl", "x")
            .replace("endpoints = [", "lease_ttl = \"10ms\"\nendpoints = ["),
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("etcd.lease_ttl"), "{err}");
}

#[test]
fn world_readable_credentials_are_refused_and_never_echoed() {
    let dir = tempfile::tempdir().unwrap();
    fs::write(dir.path().join("username"), "admin\n").unwrap();
    fs::write(dir.path().join("password"), "hunter2\n").unwrap();
    fs::set_permissions(
        dir.path().join("username"),
        fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    fs::set_permissions(
        dir.path().join("password"),
        fs::Permissions::from_mode(0o644),
    )
    .unwrap();
    let bmc = BmcSettings {
        address: "ipmi://127.0.0.1".into(),
        credentials_dir: dir.path().to_owned(),
        tls: TrustSetting::default(),
        from_cluster: None,
    };
    let err = crate::error::chain(&bmc.credentials("cp-1").unwrap_err());
    assert!(
        err.contains("password") && err.contains("644") && err.contains("cp-1"),
        "{err}"
    );
    assert!(!err.contains("hunter2"));
    fs::set_permissions(
        dir.path().join("password"),
        fs::Permissions::from_mode(0o600),
    )
    .unwrap();
    let creds = bmc.credentials("cp-1").unwrap();
    let mut inv = parse(MINIMAL).unwrap();
    inv.hosts[0].bmc = Some(bmc.clone());
    assert!(inv.check_files().is_empty());
    fs::remove_file(dir.path().join("username")).unwrap();
    let problems = inv.check_files();
    assert_eq!(problems.len(), 1);
    assert!(
        problems[0].to_string().contains("username"),
        "{}",
        problems[0]
    );
    assert_eq!(creds.username, "admin");
    assert_eq!(creds.password.expose(), "hunter2");
}

#[test]
fn a_host_is_found_by_its_index_and_after_the_list_changed() {
    let mut inventory = crate::testkit::inventory(
        &[("cp-1", "control-plane", true), ("w-1", "worker", false)],
        "",
    );
    assert_eq!(inventory.host("w-1").map(|h| h.role), Some(Role::Worker));
    assert!(inventory.host("w-9").is_none());
    // The index was built above; the list changes under it.
    let extra = inventory.hosts[1].clone();
    inventory.hosts.remove(0);
    inventory.hosts.push(InventoryHost {
        name: "w-2".into(),
        ..extra
    });
    assert!(inventory.host("cp-1").is_none());
    assert_eq!(inventory.host("w-1").map(|h| h.name.as_str()), Some("w-1"));
    assert_eq!(inventory.host("w-2").map(|h| h.name.as_str()), Some("w-2"));
}
