//! `metalguard-controller plan` as a script uses it: with `--now` the JSON is the same bytes
//! for the same files, every refusal carries its kind, and a snapshot that cannot be planned
//! from exits non-zero.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::Path;
use std::process::{Command, Output};

const BIN: &str = env!("CARGO_BIN_EXE_metalguard-controller");

/// Three control-plane hosts, one of them NotReady for an hour, and a held worker.
const SNAPSHOT: &str = r#"{
  "observed_at": 1795600800000,
  "control_plane": {"desired_replicas": 3},
  "hosts": [
    {"name": "cp-0", "role": "control-plane", "created_at": 0, "bmc_configured": true,
     "pre_drain_hooks": ["metalguard.io/etcd-quorum"],
     "node": {"created_at": 0, "conditions": [{"type": "Ready", "status": "False", "last_transition": 1795597200000}]},
     "node_seen": true,
     "agent": {"last_heartbeat": 1795597200000},
     "etcd": {"id": 1, "learner": false, "healthy": false}},
    {"name": "cp-1", "role": "control-plane", "created_at": 0, "bmc_configured": true,
     "pre_drain_hooks": ["metalguard.io/etcd-quorum"],
     "node": {"created_at": 0, "conditions": [{"type": "Ready", "status": "True", "last_transition": 0}]},
     "node_seen": true,
     "agent": {"last_heartbeat": 1795600799000},
     "etcd": {"id": 2, "learner": false, "healthy": true, "leader": true}},
    {"name": "cp-2", "role": "control-plane", "created_at": 0, "bmc_configured": true,
     "pre_drain_hooks": ["metalguard.io/etcd-quorum"],
     "node": {"created_at": 0, "conditions": [{"type": "Ready", "status": "True", "last_transition": 0}]},
     "node_seen": true,
     "agent": {"last_heartbeat": 1795600799000},
     "etcd": {"id": 3, "learner": false, "healthy": true}},
    {"name": "w-0", "role": "worker", "created_at": 0, "bmc_configured": true,
     "node": {"created_at": 0, "conditions": [{"type": "Ready", "status": "False", "last_transition": 0}]},
     "node_seen": true,
     "hold": {"id": "cp-1/1795600000000", "target": "w-0", "since": 1795600000000,
              "by": "alice on cp-1", "reason": "disk swap", "action": "off"}}
  ]
}"#;

const POLICY: &str = r#"{
  "health_checks": [
    {"name": "control-plane", "selector": {"role": "control-plane"},
     "unhealthy_conditions": [{"type": "Ready", "status": "False", "timeout": "5m"}]},
    {"name": "workers", "selector": {"role": "worker"},
     "unhealthy_conditions": [{"type": "Ready", "status": "False", "timeout": "5m"}]}
  ]
}"#;

fn run_plan(dir: &Path, snapshot: &str, extra: &[&str]) -> Output {
    let s = dir.join("snapshot.json");
    let p = dir.join("policy.json");
    std::fs::write(&s, snapshot).unwrap();
    std::fs::write(&p, POLICY).unwrap();
    let mut args = vec![
        "plan",
        "--snapshot",
        s.to_str().unwrap(),
        "--policy",
        p.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    Command::new(BIN).args(&args).output().unwrap()
}

#[test]
fn plan_json_with_a_fixed_now_is_deterministic_and_names_every_reason_kind() {
    let dir = tempfile::tempdir().unwrap();
    let args = ["--now", "2026-11-25T10:00:00Z", "--output", "json"];
    let first = run_plan(dir.path(), SNAPSHOT, &args);
    let second = run_plan(dir.path(), SNAPSHOT, &args);
    assert!(
        first.status.success(),
        "{}",
        String::from_utf8_lossy(&first.stderr)
    );
    assert_eq!(first.stdout, second.stdout, "same files, same bytes");
    let plan: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(plan["now"], 1_795_600_800_000_u64);
    let starts: Vec<&str> = plan["actions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|a| a["kind"]["kind"] == "start-remediation")
        .map(|a| a["kind"]["remediation"]["target"].as_str().unwrap())
        .collect();
    assert_eq!(starts, ["cp-0"], "{plan:#}");
    let held = plan["refusals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["subject"] == "w-0")
        .unwrap_or_else(|| panic!("{plan:#}"));
    assert_eq!(held["kind"], "hold", "{held}");
    assert!(held["reason"].as_str().unwrap().contains("alice on cp-1"));
    // The same instant in milliseconds gives the same plan.
    let ms = plan_with(dir.path(), &["--now", "1795600800000", "--output", "json"]);
    assert_eq!(ms.stdout, first.stdout);
}

fn plan_with(dir: &Path, extra: &[&str]) -> Output {
    run_plan(dir, SNAPSHOT, extra)
}

#[test]
fn an_invalid_snapshot_or_input_exits_non_zero_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    // Two hosts with one name: printed as a plan that refuses, exit 3.
    let dup = SNAPSHOT.replace("\"name\": \"cp-2\"", "\"name\": \"cp-1\"");
    let out = run_plan(dir.path(), &dup, &["--now", "0", "--output", "json"]);
    assert_eq!(out.status.code(), Some(3));
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(plan["actions"], serde_json::json!([]));
    assert_eq!(plan["refusals"][0]["kind"], "invalid");
    assert!(String::from_utf8_lossy(&out.stderr).contains("inconsistent"));
    // Unparseable: nothing on stdout, exit 2, the file and the field named.
    let out = run_plan(dir.path(), r#"{"observed_at": 0, "bogus": 1}"#, &[]);
    assert_eq!(out.status.code(), Some(2));
    assert!(out.stdout.is_empty());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("snapshot.json") && err.contains("bogus"),
        "{err}"
    );
    // A bad --now is a usage error.
    let out = run_plan(dir.path(), SNAPSHOT, &["--now", "yesterday"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("neither RFC 3339"));
}

/// Issue 24: the reasons `plan` prints for the seed rules quote the seed. cp-0 (NotReady, its
/// member lost) is remediated as seed 004's scenario 2 allows; with one host desired, the
/// scale-down removes the host marked with Cluster API's delete annotation, saying so.
#[test]
fn plan_text_quotes_the_seed_behind_each_seed_rule() {
    let dir = tempfile::tempdir().unwrap();
    let now = ["--now", "2026-11-25T10:00:00Z"];
    let out = run_plan(dir.path(), SNAPSHOT, &now);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains(
            "its etcd member is already lost, so fencing it costs no quorum (2 of 3 voters stay healthy, quorum 2; seed 004 scenario 2: \"As long as we continue to only have at most one unhealthy etcd member"
        ),
        "{text}"
    );

    let mut snapshot: serde_json::Value = serde_json::from_str(SNAPSHOT).unwrap();
    snapshot["control_plane"]["desired_replicas"] = 1.into();
    let cp0 = &mut snapshot["hosts"][0];
    cp0["node"]["conditions"][0]["status"] = "True".into();
    cp0["etcd"]["healthy"] = true.into();
    snapshot["hosts"][2]["annotations"] =
        serde_json::json!({"cluster.x-k8s.io/delete-machine": ""});
    let out = run_plan(dir.path(), &snapshot.to_string(), &now);
    assert!(out.status.success(), "{out:?}");
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.contains(
            "3 hosts, desired 1: remove cp-2: it is marked with cluster.x-k8s.io/delete-machine (seed 004 scale down: \"outdated machines with the delete annotation\""
        ),
        "{text}"
    );
}
