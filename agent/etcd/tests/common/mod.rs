//! Helpers shared by the integration tests: settings, a concurrent writer, bulk data, and a
//! guard that kills an etcd started by the join flow.
#![allow(
    dead_code,
    unreachable_pub,
    missing_docs,
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic
)]

use etcd_client::{Client, ConnectOptions};
use metalguard_e2e::etcd::{EtcdCluster, HostSlot};
use metalguard_etcd::ClientSettings;
use metalguard_etcd::join::launcher::{ExecLauncher, Launcher};
use metalguard_etcd::join::{DEFAULT_POLL_INTERVAL, JoinConfig};
use metalguard_etcd::ops::DEFAULT_PROMOTE_RETRY;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

/// Probe timeout used in the tests: a hung member must show within it.
pub const PROBE: Duration = Duration::from_secs(1);

pub fn settings(endpoints: Vec<String>) -> ClientSettings {
    let mut s = ClientSettings::new(endpoints);
    s.probe_timeout = PROBE;
    s.change_timeout = Duration::from_secs(15);
    s
}

/// The member ID etcd gave member `i` of the harness cluster.
pub fn member_id(cluster: &EtcdCluster, i: usize) -> u64 {
    let name = cluster.member(i).name().to_owned();
    cluster
        .member_list()
        .unwrap()
        .into_iter()
        .find(|m| m.name == name)
        .unwrap()
        .id
}

pub fn pid_file(slot: &HostSlot) -> PathBuf {
    slot.data_dir.with_file_name(format!("{}.pid", slot.name))
}

pub fn exec_launcher(slot: &HostSlot) -> Launcher {
    let log = slot.data_dir.with_file_name(format!("{}.log", slot.name));
    Launcher::Exec(ExecLauncher::new(
        metalguard_e2e::tools::etcd_bin().unwrap(),
        pid_file(slot),
        Some(log),
    ))
}

pub fn join_config(cluster: &EtcdCluster, slot: &HostSlot, bootstrap: Option<usize>) -> JoinConfig {
    JoinConfig {
        client: settings(cluster.endpoints()),
        name: slot.name.clone(),
        peer_url: slot.peer_url.clone(),
        client_url: slot.client_url.clone(),
        listen_peer_url: None,
        listen_client_url: None,
        data_dir: slot.data_dir.clone(),
        extra_env: vec![],
        bootstrap_desired_voters: bootstrap,
        poll_interval: DEFAULT_POLL_INTERVAL,
        stall_after: Duration::from_secs(10),
        promote_retry: DEFAULT_PROMOTE_RETRY,
    }
}

/// Kills the etcd whose PID is in `pid_file` when dropped (the join flow's child outlives
/// its launcher on purpose, like a real agent's would).
pub struct PidGuard(pub PathBuf);

impl Drop for PidGuard {
    fn drop(&mut self) {
        if let Some(pid) = std::fs::read_to_string(&self.0)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

pub async fn client(endpoints: &[String]) -> Client {
    let options = ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(5));
    Client::connect(endpoints, Some(options)).await.unwrap()
}

/// Writes about `mib` MiB in 100 KiB values with 8 concurrent writers.
pub async fn fill(endpoints: &[String], mib: usize) {
    let value = vec![b'x'; 100 * 1024];
    let per_task = mib * 10 / 8 + 1;
    let mut tasks = Vec::new();
    for t in 0..8 {
        let mut c = client(endpoints).await;
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..per_task {
                c.put(format!("/fill/{t}/{i}"), value.clone(), None)
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// A writer that puts `/writer/<n>` = `<n>` in a loop, recording acknowledged writes and errors.
pub struct Writer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<(Vec<u64>, Vec<String>)>,
}

impl Writer {
    pub async fn start(endpoints: &[String]) -> Self {
        let mut c = client(endpoints).await;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let (mut acked, mut errors) = (Vec::new(), Vec::new());
            let mut n = 0u64;
            while !flag.load(Ordering::SeqCst) {
                match c.put(format!("/writer/{n}"), n.to_string(), None).await {
                    Ok(_) => acked.push(n),
                    Err(e) => errors.push(e.to_string()),
                }
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            (acked, errors)
        });
        Self { stop, task }
    }

    /// Stops the writer; returns (acknowledged writes, errors).
    pub async fn finish(self) -> (Vec<u64>, Vec<String>) {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.unwrap()
    }
}

/// Checks that every acknowledged write reads back with its value.
pub async fn assert_all_acked_readable(endpoints: &[String], acked: &[u64]) {
    let mut c = client(endpoints).await;
    let resp = c
        .get(
            "/writer/",
            Some(etcd_client::GetOptions::new().with_prefix()),
        )
        .await
        .unwrap();
    let present: std::collections::HashMap<String, String> = resp
        .kvs()
        .iter()
        .map(|kv| {
            (
                kv.key_str().unwrap().to_owned(),
                kv.value_str().unwrap().to_owned(),
            )
        })
        .collect();
    for n in acked {
        assert_eq!(
            present.get(&format!("/writer/{n}")),
            Some(&n.to_string()),
            "acknowledged write {n} lost"
        );
    }
}
