//! `metalguard-agent etcd …` as a real process against real etcd: status output, and a join
//! whose agent is SIGKILLed at each step and restarted.
//!
//! Plain HTTP on purpose (`EtcdCluster::start_plain_http`): the subject here is the membership
//! mechanics, not the transport. The same client over TLS with client certificates is tested
//! in `agent/etcd/tests/tls.rs`, and every membership step runs over TLS in the lab's
//! `replace` scenario (`tests/tests/lab_replace.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use metalguard_e2e::etcd::EtcdCluster;
use metalguard_etcd::ClientSettings;
use metalguard_etcd::ops::{self, DEFAULT_PROMOTE_RETRY};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const AGENT: &str = env!("CARGO_BIN_EXE_metalguard-agent");

fn read_step(state_file: &Path) -> Option<String> {
    let text = std::fs::read_to_string(state_file).ok()?;
    let value: serde_json::Value = serde_json::from_str(&text).ok()?;
    value.get("step")?.as_str().map(str::to_owned)
}

/// Kills the etcd the agent left running (its PID file) when dropped.
struct EtcdPid(PathBuf);

impl Drop for EtcdPid {
    fn drop(&mut self) {
        if let Some(pid) = std::fs::read_to_string(&self.0)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

/// Kills the agent when dropped (also on a failed assertion).
struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn status_prints_every_member_and_exits_degraded_with_a_dead_voter() {
    let mut cluster = EtcdCluster::start_plain_http(3).unwrap();
    let endpoints = cluster.endpoints().join(",");
    let out = Command::new(AGENT)
        .args(["etcd", "--endpoints", &endpoints, "status"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    assert_eq!(text.matches(" voter ").count(), 3, "{text}");
    assert!(
        text.contains(
            "voters 3 (healthy 3), learners 0, unstarted 0, quorum 2, failure tolerance 1"
        ),
        "{text}"
    );

    cluster.kill(2);
    let out = Command::new(AGENT)
        .args([
            "etcd",
            "--endpoints",
            &endpoints,
            "--output",
            "json",
            "status",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3));
    let view: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(view["summary"]["healthy_voters"], 2);
    assert_eq!(view["summary"]["voters"], 3);
}

#[test]
fn join_survives_the_agent_being_killed_at_each_step() {
    let mut cluster = EtcdCluster::start_plain_http(3).unwrap();
    let slot = cluster.reserve_host().unwrap();
    let state_file = slot
        .data_dir
        .with_file_name(format!("{}.metalguard-join.json", slot.name));
    let pid_file = slot
        .data_dir
        .with_file_name(format!("{}.etcd.pid", slot.name));
    let etcd_pid =
        || -> Option<i32> { std::fs::read_to_string(&pid_file).ok()?.trim().parse().ok() };
    let _etcd = EtcdPid(pid_file.clone());
    let log = slot.data_dir.with_file_name("agent.log");
    let endpoints = cluster.endpoints().join(",");
    let spawn = || {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log)
            .unwrap();
        Agent(
            Command::new(AGENT)
                .env(
                    "METALGUARD_ETCD_BIN",
                    metalguard_e2e::tools::etcd_bin().unwrap(),
                )
                .args([
                    "etcd",
                    "--endpoints",
                    &endpoints,
                    "--output",
                    "json",
                    "join",
                ])
                .args(["--name", &slot.name, "--peer-url", &slot.peer_url])
                .args(["--client-url", &slot.client_url, "--exit-when-member"])
                .arg("--data-dir")
                .arg(&slot.data_dir)
                .stdout(Stdio::piped())
                .stderr(log)
                .spawn()
                .unwrap(),
        )
    };

    // Without bootstrap mode the agent waits in "promotable" for the controller: SIGKILL it
    // as soon as each step is on disk, then start a new one.
    let mut killed_at = Vec::new();
    let mut etcd_pids = Vec::new();
    for target in ["added", "started", "promotable"] {
        let mut agent = spawn();
        let deadline = Instant::now() + Duration::from_secs(40);
        let order = ["discover", "added", "started", "promotable", "member"];
        let rank = |s: &str| order.iter().position(|o| *o == s).unwrap_or(0);
        loop {
            if let Some(step) = read_step(&state_file)
                && rank(&step) >= rank(target)
            {
                agent.0.kill().unwrap();
                agent.0.wait().unwrap();
                if rank(&step) >= rank("started") {
                    etcd_pids.push(etcd_pid());
                }
                killed_at.push(step);
                break;
            }
            assert!(agent.0.try_wait().unwrap().is_none(), "agent exited early");
            assert!(Instant::now() < deadline, "step {target} not reached");
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    assert_eq!(
        killed_at.last().map(String::as_str),
        Some("promotable"),
        "{killed_at:?}"
    );

    // The controller promotes; a restarted agent sees it and finishes.
    let member = cluster
        .member_list()
        .unwrap()
        .into_iter()
        .find(|m| m.peer_urls.contains(&slot.peer_url))
        .unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime
        .block_on(ops::promote(
            &ClientSettings::new(cluster.endpoints()),
            member.id,
            DEFAULT_PROMOTE_RETRY,
        ))
        .unwrap();
    let mut agent = spawn();
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = agent.0.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "agent did not finish");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "agent failed; see {}", log.display());
    assert_eq!(read_step(&state_file).as_deref(), Some("member"));
    let mine: Vec<_> = cluster
        .member_list()
        .unwrap()
        .into_iter()
        .filter(|m| m.peer_urls.contains(&slot.peer_url))
        .collect();
    assert_eq!(mine.len(), 1, "{mine:?} (killed at {killed_at:?})");
    assert!(!mine[0].is_learner);
    assert_eq!(mine[0].id, member.id);
    assert_eq!(cluster.member_list().unwrap().len(), 4);
    // etcd was started once: each new agent adopted the one its killed predecessor left.
    etcd_pids.push(etcd_pid());
    etcd_pids.dedup();
    assert!(
        matches!(etcd_pids.as_slice(), [Some(_)]),
        "etcd pids across the agent restarts: {etcd_pids:?}"
    );
}
