//! The env-file launcher against real etcd: the test plays the host's supervisor, starting
//! etcd from the file while it exists and stopping it when the file disappears.
//!
//! Plain HTTP on purpose (`EtcdCluster::start_plain_http`): the subject here is the membership
//! mechanics, not the transport. The same client over TLS with client certificates is tested
//! in `agent/etcd/tests/tls.rs`, and every membership step runs over TLS in the lab's
//! `replace` scenario (`tests/tests/lab_replace.rs`).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use common::*;
use metalguard_e2e::etcd::EtcdCluster;
use metalguard_etcd::join::launcher::{EnvFileLauncher, Launcher};
use metalguard_etcd::join::state::JoinState;
use metalguard_etcd::join::{JoinFlow, StepOutcome};
use metalguard_etcd::ops;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Parses a systemd EnvironmentFile as `render_environment_file` writes it.
fn parse_env_file(text: &str) -> Vec<(String, String)> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
        .map(|line| {
            let (key, quoted) = line.split_once('=').unwrap();
            let inner = quoted.strip_prefix('"').unwrap().strip_suffix('"').unwrap();
            let mut value = String::new();
            let mut chars = inner.chars();
            while let Some(c) = chars.next() {
                value.push(if c == '\\' { chars.next().unwrap() } else { c });
            }
            (key.to_owned(), value)
        })
        .collect()
}

/// The host's supervisor: runs etcd with the file's variables while the file exists, restarts
/// it when the file changes, stops it when the file is gone.
struct Supervisor {
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<usize>>,
}

impl Supervisor {
    fn watch(env_file: PathBuf, log: PathBuf) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || {
            let mut running: Option<(Child, String)> = None;
            let mut starts = 0;
            while !flag.load(Ordering::SeqCst) {
                let content = std::fs::read_to_string(&env_file).ok();
                let current = running.as_ref().map(|(_, c)| c.clone());
                if content != current {
                    if let Some((mut child, _)) = running.take() {
                        let _ = child.kill();
                        let _ = child.wait();
                    }
                    if let Some(content) = content {
                        running = Some((spawn_etcd(&content, &log), content));
                        starts += 1;
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if let Some((mut child, _)) = running.take() {
                let _ = child.kill();
                let _ = child.wait();
            }
            starts
        });
        Self {
            stop,
            thread: Some(thread),
        }
    }

    /// Stops watching (and etcd); returns how many times etcd was started.
    fn finish(mut self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for Supervisor {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

fn spawn_etcd(content: &str, log: &Path) -> Child {
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(log)
        .unwrap();
    Command::new(metalguard_e2e::tools::etcd_bin().unwrap())
        .env_clear()
        .envs(parse_env_file(content))
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .spawn()
        .unwrap()
}

fn env_file_launcher(path: &Path) -> Launcher {
    Launcher::EnvFile(EnvFileLauncher::new(
        path.to_owned(),
        Vec::new(),
        Duration::from_secs(60),
    ))
}

/// Steps the flow until `done` holds for its state, within a deadline.
async fn step_until(flow: &mut JoinFlow, done: impl Fn(&JoinState) -> bool) -> Vec<&'static str> {
    let deadline = Instant::now() + Duration::from_secs(90);
    let mut steps = vec![flow.state().name()];
    while !done(flow.state()) {
        assert!(Instant::now() < deadline, "no progress past {steps:?}");
        match flow.step().await.unwrap() {
            StepOutcome::Advanced(state) => steps.push(state.name()),
            StepOutcome::Waiting(_) => tokio::time::sleep(Duration::from_millis(100)).await,
            StepOutcome::Done => break,
        }
    }
    steps
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn env_file_launcher_writes_the_file_and_the_supervisor_runs_etcd_from_it() {
    let mut cluster = EtcdCluster::start_plain_http(1).unwrap();
    let slot = cluster.reserve_host().unwrap();
    let env_file = cluster.dir().join("run/etcd.env");
    let supervisor = Supervisor::watch(
        env_file.clone(),
        slot.data_dir.with_file_name(format!("{}.log", slot.name)),
    );
    let config = join_config(&cluster, &slot, None);

    let mut flow = JoinFlow::load(config.clone(), env_file_launcher(&env_file)).unwrap();
    let steps = step_until(&mut flow, |s| matches!(s, JoinState::Promotable { .. })).await;
    assert_eq!(
        steps,
        vec!["discover", "added", "started", "promotable"],
        "{steps:?}"
    );
    let member_id = flow.state().member_id().unwrap();

    // The file is public, whole, and says what etcd needs to join.
    let mode = std::fs::metadata(&env_file).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o644);
    let vars = parse_env_file(&std::fs::read_to_string(&env_file).unwrap());
    let get = |k: &str| {
        vars.iter()
            .find(|(key, _)| key == k)
            .map(|(_, v)| v.as_str())
    };
    assert_eq!(get("ETCD_NAME"), Some(slot.name.as_str()));
    assert_eq!(get("ETCD_INITIAL_CLUSTER_STATE"), Some("existing"));
    assert_eq!(
        get("ETCD_ADVERTISE_CLIENT_URLS"),
        Some(slot.client_url.as_str())
    );
    let listed = cluster.member_list().unwrap();
    let mine = listed.iter().find(|m| m.id == member_id).unwrap();
    assert!(mine.is_learner, "{mine:?}");
    assert_eq!(mine.name, slot.name, "the learner started under its name");

    // A new agent resumes: the file is unchanged, so the supervisor does not restart etcd.
    let mut flow = JoinFlow::load(config.clone(), env_file_launcher(&env_file)).unwrap();
    assert!(matches!(
        flow.step().await.unwrap(),
        StepOutcome::Waiting(_)
    ));

    // The member is removed: the next agent removes the file, the supervisor stops etcd, and
    // only then is the data dir wiped.
    ops::remove(&settings(cluster.endpoints()), member_id)
        .await
        .unwrap();
    let mut flow = JoinFlow::load(config, env_file_launcher(&env_file)).unwrap();
    assert_eq!(
        flow.step().await.unwrap(),
        StepOutcome::Advanced(JoinState::Discover)
    );
    assert!(!env_file.exists());
    assert!(!slot.data_dir.exists());
    assert_eq!(supervisor.finish(), 1, "etcd was started once");
}
