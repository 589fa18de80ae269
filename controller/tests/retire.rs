//! Retiring a control-plane host with the real controller binary on real etcd, the test
//! playing every agent (mTLS with each host's certificate): the retirement request, the
//! inventory edit that adds the replacement, the join go-ahead at the new host's own agent,
//! promotion, the leadership move and the removal at other voters' agents, and the single
//! power-off of the retired host through another agent — each asserted in the store and in
//! the commands offered.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::time::{Duration, Instant};

use common::*;
use metalguard_api::duration::Timestamp;
use metalguard_api::protocol::*;
use metalguard_e2e::ports::reserve_port;

/// One agent as the test plays it.
struct Agent {
    host: &'static str,
    client: reqwest::Client,
    sequence: u64,
}

impl Agent {
    fn new(lab: &Lab, host: &'static str) -> Self {
        Self {
            host,
            client: client(&lab.tls(), Some(host)),
            sequence: 0,
        }
    }

    /// Reports `members` (id, name, learner) with `leader` as seen from `local`.
    async fn report(
        &mut self,
        port: u16,
        local: Option<u64>,
        leader: u64,
        members: &[(u64, &str, bool)],
    ) {
        self.sequence += 1;
        let mut r = report(self.host, self.sequence);
        r.etcd = (!members.is_empty()).then(|| EtcdView {
            local_member_id: local,
            leader_id: Some(leader),
            members: members
                .iter()
                .map(|&(id, name, learner)| EtcdMemberView {
                    id,
                    name: name.to_owned(),
                    peer_urls: Vec::new(),
                    client_urls: Vec::new(),
                    learner,
                    healthy: true,
                    alarms: Vec::new(),
                    raft_applied_index: Some(100),
                    error: None,
                })
                .collect(),
        });
        let status = self
            .client
            .post(url(port, &report_path(self.host)))
            .json(&r)
            .send()
            .await
            .unwrap()
            .status();
        assert_eq!(status.as_u16(), 200, "report of {}", self.host);
    }

    /// Long-polls until a command matching `want` is offered (others stay unanswered).
    async fn await_command(
        &self,
        port: u16,
        what: &str,
        want: impl Fn(&CommandKind) -> bool,
    ) -> Command {
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let batch = poll(&self.client, port, self.host, Duration::from_secs(2)).await;
            if let Some(c) = batch.commands.into_iter().find(|c| want(&c.kind)) {
                return c;
            }
            assert!(
                Instant::now() < deadline,
                "{} was never offered {what}",
                self.host
            );
        }
    }

    async fn succeed(&self, port: u16, command: &Command) {
        let result = CommandResult {
            operation_id: command.operation_id.clone(),
            outcome: Outcome::Succeeded,
            started_at: Timestamp(1),
            finished_at: Timestamp(2),
            timeline: Vec::new(),
            error: None,
            promoted_by: None,
            term: 0,
        };
        let ack: ResultAck = self
            .client
            .post(url(port, &results_path(self.host)))
            .json(&result)
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        assert!(ack.first);
    }
}

fn inventory_text(lab: &Lab, port: u16, extra_hosts: &str) -> String {
    let endpoints: Vec<String> = lab
        .etcd
        .endpoints()
        .iter()
        .map(|e| format!("{e:?}"))
        .collect();
    let creds = lab.dir.path().join("bmc-creds");
    format!(
        r#"
[controller]
listen = "127.0.0.1:{port}"
tls_dir = "{tls}"
plan_interval = "200ms"

[etcd]
endpoints = [{endpoints}]
lease_ttl = "2s"
timeout = "500ms"
{etcd_tls}
[control_plane]
desired_replicas = 1

[[hosts]]
name = "cp-1"
role = "control-plane"
bmc = {{ address = "ipmi://127.0.0.1:1623", credentials_dir = "{creds}" }}

[[hosts]]
name = "w-1"
role = "worker"
{extra_hosts}"#,
        tls = lab.tls().display(),
        endpoints = endpoints.join(", "),
        etcd_tls = lab.etcd_tls_keys(),
        creds = creds.display(),
    )
}

/// Runs the CLI; returns (success, stdout + stderr).
fn cli(args: &[&str]) -> (bool, String) {
    let out = Process::new(BIN).args(args).output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success(), text)
}

fn status(inventory: &Path) -> String {
    run(&["status", "--inventory", inventory.to_str().unwrap()])
}

/// Waits until `status` contains `needle`.
async fn await_status(inventory: &Path, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let text = status(inventory);
        if text.contains(needle) {
            return text;
        }
        assert!(
            Instant::now() < deadline,
            "status never showed {needle:?}:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn write_inventory(path: &PathBuf, text: &str) {
    // Through a rename, as editors do, so the controller never reads half a file.
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, text).unwrap();
    std::fs::rename(&tmp, path).unwrap();
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retired_control_plane_host_is_replaced_removed_and_powered_off_once() {
    let lab = Lab::start();
    run(&["certs", "issue", "cp-4", lab.tls().to_str().unwrap()]);
    let port = reserve_port().unwrap();
    let p = port.port();
    let inventory = lab.dir.path().join("retire.toml");
    std::fs::write(&inventory, inventory_text(&lab, p, "")).unwrap();
    let controller = lab.controller_from("ctl-r", &inventory);
    // The admin's copy for the CLI: the controller's own file is broken on purpose below.
    let admin = lab.dir.path().join("admin.toml");
    std::fs::write(&admin, inventory_text(&lab, p, "")).unwrap();
    let inv = admin.to_str().unwrap();
    let mut cp1 = Agent::new(&lab, "cp-1");
    let mut cp4 = Agent::new(&lab, "cp-4");
    let mut w1 = Agent::new(&lab, "w-1");
    wait_leader(&w1.client, p, Duration::from_secs(15)).await;
    cp1.report(p, Some(1), 1, &[(1, "cp-1", false)]).await;

    // Workers and unknown hosts cannot be retired.
    let (ok, text) = cli(&["retire", "w-1", "--reason", "x", "--inventory", inv]);
    assert!(!ok && text.contains("w-1 is a worker"), "{text}");
    let (ok, text) = cli(&["retire", "cp-9", "--reason", "x", "--inventory", inv]);
    assert!(
        !ok && text.contains("host cp-9 is not in the inventory"),
        "{text}"
    );

    // 1. The admin retires cp-1; without a replacement the controller asks for a host.
    let out = run(&[
        "retire",
        "cp-1",
        "--reason",
        "disk replacement",
        "--requested-by",
        "alice",
        "--inventory",
        inv,
    ]);
    assert!(out.contains("retirement of cp-1 requested"), "{out}");
    let again = run(&["retire", "cp-1", "--reason", "other", "--inventory", inv]);
    assert!(again.contains("already retired"), "{again}");
    let text = await_status(&admin, "add a control-plane host to the inventory").await;
    assert!(
        text.contains("cp-1: retired")
            && text.contains("by alice (cli, run by ")
            && text.contains(") (disk replacement): retired: waiting for replacement"),
        "{text}"
    );
    assert!(text.contains("inventory: generation 1"), "{text}");
    eprintln!("status while waiting for a replacement:\n{text}");

    // 2. A broken edit is rejected with its error; the fixed one adding cp-4 is taken.
    let with_cp4 = inventory_text(
        &lab,
        p,
        "\n[[hosts]]\nname = \"cp-4\"\nrole = \"control-plane\"\n",
    );
    write_inventory(
        &inventory,
        &with_cp4.replacen("name = \"cp-4\"", "nme = \"cp-4\"", 1),
    );
    let text = await_status(&admin, "REJECTED").await;
    assert!(text.contains("nme"), "the error names the key:\n{text}");
    write_inventory(&inventory, &with_cp4);
    await_status(&admin, "inventory: generation 2").await;

    // 3. cp-4's own agent gets the join go-ahead (intent persisted first).
    cp4.report(p, None, 1, &[]).await;
    let join = cp4
        .await_command(p, "a join go-ahead", |k| {
            matches!(k, CommandKind::EtcdJoinGoAhead {})
        })
        .await;
    assert_eq!(join.operation_id.0, "quorum/add-learner/cp-4");
    assert!(
        operation_keys(&lab.etcd)
            .iter()
            .any(|k| k.ends_with("quorum/add-learner/cp-4"))
    );
    // The agent added its learner (member 4) and it caught up.
    let learning: &[(u64, &str, bool)] = &[(1, "cp-1", false), (4, "cp-4", true)];
    cp4.report(p, Some(4), 1, learning).await;
    cp1.report(p, Some(1), 1, learning).await;
    cp4.succeed(p, &join).await;

    // 4. Hook, then promotion by the leader's agent (cp-1).
    let promote = cp1
        .await_command(p, "a promotion", |k| {
            matches!(k, CommandKind::EtcdPromote { member_id: 4 })
        })
        .await;
    let voting: &[(u64, &str, bool)] = &[(1, "cp-1", false), (4, "cp-4", false)];
    cp1.report(p, Some(1), 1, voting).await;
    cp4.report(p, Some(4), 1, voting).await;
    cp1.succeed(p, &promote).await;

    // 5. cp-1 leads and leaves: the move goes to cp-4's agent, never cp-1's.
    let moved = cp4
        .await_command(p, "a leadership move", |k| {
            matches!(k, CommandKind::EtcdMoveLeader { to_member: 4 })
        })
        .await;
    cp1.report(p, Some(1), 4, voting).await;
    cp4.report(p, Some(4), 4, voting).await;
    cp4.succeed(p, &moved).await;

    // 6. The removal also goes to cp-4's agent; cp-1's etcd then stops.
    let remove = cp4
        .await_command(p, "the removal of cp-1's member", |k| {
            matches!(k, CommandKind::EtcdRemove { member_id: 1 })
        })
        .await;
    let after: &[(u64, &str, bool)] = &[(4, "cp-4", false)];
    cp4.report(p, Some(4), 4, after).await;
    cp1.report(p, None, 4, &[]).await;
    w1.report(p, None, 4, &[]).await;
    // Too late to withdraw now.
    let (ok, text) = cli(&["retire", "cp-1", "--cancel", "--inventory", inv]);
    assert!(!ok && text.contains("cannot be withdrawn"), "{text}");
    cp4.succeed(p, &remove).await;

    // 7. Hook released, then one verified power-off of cp-1 through another agent.
    let off = cp4
        .await_command(p, "the power-off of cp-1", |k| {
            matches!(k, CommandKind::Fence(f) if f.target == "cp-1" && f.action == PowerAction::Off)
        })
        .await;
    assert!(
        off.operation_id.0.starts_with("retire/cp-1/")
            && off.operation_id.0.ends_with("/power-off"),
        "{off:?}"
    );
    let hooks = lab
        .etcd
        .etcdctl(&["get", "/metalguard/hooks/cp-1", "--print-value-only"])
        .unwrap();
    // Stored sealed: {"record": [...], "seal": {...}}.
    let hooks: serde_json::Value = serde_json::from_str(hooks.trim()).unwrap();
    assert_eq!(
        hooks["record"],
        serde_json::json!([]),
        "the hook is released before the power-off: {hooks}"
    );
    let text = status(&admin);
    assert!(
        text.contains("member removed; powering off through cp-4's agent"),
        "{text}"
    );
    cp4.succeed(p, &off).await;
    let text = await_status(
        &inventory,
        "powered off (verified by cp-4's agent); remove cp-1 from the inventory",
    )
    .await;
    assert!(!text.contains("hunter2"), "{text}");
    eprintln!("status at the end:\n{text}");

    // Never a second power-off, whatever the agents report.
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        // At an agent's pace: posts beyond 2 a second are refused (429).
        tokio::time::sleep(Duration::from_millis(500)).await;
        cp4.report(p, Some(4), 4, after).await;
        let batch = poll(&cp4.client, p, "cp-4", Duration::from_millis(500)).await;
        let w = poll(&w1.client, p, "w-1", Duration::from_millis(100)).await;
        assert!(
            batch.commands.is_empty() && w.commands.is_empty(),
            "{batch:?} {w:?}\n{}",
            controller.log_tail(80)
        );
    }
    let power_offs = operation_keys(&lab.etcd)
        .iter()
        .filter(|k| k.contains("/retire/cp-1/"))
        .count();
    assert_eq!(power_offs, 1);
    // cp-1 is retired and verified off: its certificate no longer speaks for anyone.
    for path in [report_path("cp-1"), commands_path("cp-1", Duration::ZERO)] {
        let request = if path.contains("/report") {
            cp1.client.post(url(p, &path)).json(&report("cp-1", 99))
        } else {
            cp1.client.get(url(p, &path))
        };
        let status = request.send().await.unwrap().status().as_u16();
        assert_eq!(status, 403, "{path} of the retired cp-1");
    }
    let log = std::fs::read_to_string(lab.dir.path().join("ctl-r.log")).unwrap();
    for line in [
        "inventory change rejected",
        "inventory reloaded",
        "the controller needs a person",
    ] {
        assert!(log.contains(line), "the log lacks {line:?}");
    }
    assert!(
        log.lines()
            .any(|l| l.contains("intent persisted") && l.contains("retire/cp-1/")),
        "the power-off's intent is logged"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn a_retirement_is_withdrawn_before_anything_was_replaced() {
    let lab = Lab::start();
    let port = reserve_port().unwrap();
    let p = port.port();
    let inventory = lab.dir.path().join("cancel.toml");
    std::fs::write(&inventory, inventory_text(&lab, p, "")).unwrap();
    let inv = inventory.to_str().unwrap();
    let _controller = lab.controller_from("ctl-c", &inventory);
    let mut cp1 = Agent::new(&lab, "cp-1");
    wait_leader(&client(&lab.tls(), Some("w-1")), p, Duration::from_secs(15)).await;
    cp1.report(p, Some(1), 1, &[(1, "cp-1", false)]).await;
    run(&["retire", "cp-1", "--reason", "mistake", "--inventory", inv]);
    await_status(&inventory, "cp-1: retired").await;
    let out = run(&["retire", "cp-1", "--cancel", "--inventory", inv]);
    assert!(out.contains("retirement of cp-1 withdrawn"), "{out}");
    let text = await_status(&inventory, "leader:").await;
    assert!(!text.contains("cp-1: retired"), "{text}");
    let (ok, text) = cli(&["retire", "cp-1", "--cancel", "--inventory", inv]);
    assert!(!ok && text.contains("host cp-1 is not retired"), "{text}");
}
