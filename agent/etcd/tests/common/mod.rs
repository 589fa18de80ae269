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
use metalguard_etcd::EtcdErrorKind;
use metalguard_etcd::error::classify;
use metalguard_etcd::join::launcher::{ExecLauncher, Launcher};
use metalguard_etcd::join::{DEFAULT_POLL_INTERVAL, JoinConfig};
use metalguard_etcd::ops::DEFAULT_PROMOTE_RETRY;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

/// Probe timeout used in the tests: a hung member must show within it.
pub const PROBE: Duration = Duration::from_secs(1);

pub fn settings(endpoints: Vec<String>) -> ClientSettings {
    let mut s = ClientSettings::new(endpoints);
    s.probe_timeout = PROBE;
    s.change_timeout = Duration::from_secs(15);
    s
}

/// The member ID etcd gave member `i` of the harness cluster, found by its peer URL: a
/// learner that serves `/health` may not have published its name yet (etcd 3.4 showed it
/// nameless in the member list right after it started).
pub fn member_id(cluster: &EtcdCluster, i: usize) -> u64 {
    let peer_url = cluster.member(i).peer_url().to_owned();
    let members = cluster.member_list().unwrap();
    members
        .iter()
        .find(|m| m.peer_urls.contains(&peer_url))
        .unwrap_or_else(|| panic!("no member with peer url {peer_url} in {members:?}"))
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
        state_file: None,
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
    fill_under(endpoints, "/fill", mib).await;
}

/// Writes `mib` more MiB under keys of their own (`round` keeps rounds apart).
#[allow(dead_code)] // not every test binary tops up
pub async fn fill_more(endpoints: &[String], round: usize, mib: usize) {
    fill_under(endpoints, &format!("/fill-more/{round}"), mib).await;
}

async fn fill_under(endpoints: &[String], prefix: &str, mib: usize) {
    let value = vec![b'x'; 100 * 1024];
    let per_task = mib * 10 / 8 + 1;
    let mut tasks = Vec::new();
    for t in 0..8 {
        let mut c = client(endpoints).await;
        let value = value.clone();
        let prefix = prefix.to_owned();
        tasks.push(tokio::spawn(async move {
            for i in 0..per_task {
                c.put(format!("{prefix}/{t}/{i}"), value.clone(), None)
                    .await
                    .unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
}

/// A writer that puts `/writer/<n>` = `<n>`, recording acknowledged writes, failed writes, and
/// writes whose first attempt got no answer.
///
/// A put that gets no answer within the client timeout (tonic's deadline or etcd's own
/// `request timed out`) has an unknown outcome: etcd may have dropped the proposal before it
/// was committed. etcd's contract is that the client sends such a write again; the writer does
/// so once, with the same key and value (idempotent), and records it in
/// [`Written::unanswered`] so that each test decides how many it tolerates. Any other error,
/// or no answer to the resend either, is a failed write.
pub struct Writer {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Written>,
}

/// What a [`Writer`] saw.
#[derive(Debug, Default)]
pub struct Written {
    /// Writes etcd acknowledged.
    pub acked: Vec<u64>,
    /// When each acknowledgement arrived, in order.
    pub acked_at: Vec<Instant>,
    /// Writes that failed: a definite error, or no answer to the resend either.
    pub errors: Vec<String>,
    /// Writes whose first attempt got no answer and were sent again, with when that first
    /// attempt was sent.
    pub unanswered: Vec<(u64, Instant)>,
}

impl Written {
    /// The longest time between `from` and `to` in which no write was acknowledged.
    pub fn longest_without_ack(&self, from: Instant, to: Instant) -> Duration {
        let inside = self
            .acked_at
            .iter()
            .copied()
            .filter(|t| *t > from && *t < to);
        let times: Vec<Instant> = std::iter::once(from)
            .chain(inside)
            .chain(std::iter::once(to))
            .collect();
        times
            .windows(2)
            .map(|w| w[1] - w[0])
            .max()
            .unwrap_or_default()
    }

    fn add(&mut self, other: Written) {
        self.acked.extend(other.acked);
        self.acked_at.extend(other.acked_at);
        self.errors.extend(other.errors);
        self.unanswered.extend(other.unanswered);
    }

    fn sorted(mut self) -> Self {
        self.acked.sort_unstable();
        self.acked_at.sort();
        self.unanswered.sort_by_key(|(_, sent)| *sent);
        self
    }
}

/// Whether a put's outcome is unknown: no answer in time (the proposal may have been dropped).
fn got_no_answer(err: &etcd_client::Error) -> bool {
    matches!(err, etcd_client::Error::GRpcStatus(status)
        if classify(i32::from(status.code()), status.message()) == EtcdErrorKind::Timeout)
}

/// Puts write `n`, sends it once more if it got no answer, and records what happened.
async fn put_recorded(mut c: Client, n: u64) -> Written {
    let mut written = Written::default();
    let (key, value) = (format!("/writer/{n}"), n.to_string());
    let sent = Instant::now();
    let result = match c.put(key.clone(), value.clone(), None).await {
        Err(e) if got_no_answer(&e) => {
            written.unanswered.push((n, sent));
            c.put(key, value, None)
                .await
                .map_err(|e| format!("{n} (sent again): {e}"))
        }
        other => other.map_err(|e| format!("{n}: {e}")),
    };
    match result {
        Ok(_) => {
            written.acked.push(n);
            written.acked_at.push(Instant::now());
        }
        Err(e) => written.errors.push(e),
    }
    written
}

impl Writer {
    /// One put at a time: the next is sent 5 ms after the previous one was answered.
    pub async fn start(endpoints: &[String]) -> Self {
        let c = client(endpoints).await;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut written = Written::default();
            let mut n = 0u64;
            while !flag.load(Ordering::SeqCst) {
                written.add(put_recorded(c.clone(), n).await);
                n += 1;
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            written.sorted()
        });
        Self { stop, task }
    }

    /// A put every `every`, without waiting for earlier ones to be answered: a put that etcd
    /// dropped waits out the client timeout without holding up the next ones.
    pub async fn start_paced(endpoints: &[String], every: Duration) -> Self {
        let c = client(endpoints).await;
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let task = tokio::spawn(async move {
            let mut puts = tokio::task::JoinSet::new();
            let mut tick = tokio::time::interval(every);
            let mut n = 0u64;
            while !flag.load(Ordering::SeqCst) {
                tick.tick().await;
                puts.spawn(put_recorded(c.clone(), n));
                n += 1;
            }
            let mut written = Written::default();
            while let Some(put) = puts.join_next().await {
                written.add(put.unwrap());
            }
            written.sorted()
        });
        Self { stop, task }
    }

    /// Stops the writer, waits for the puts in flight and returns what it saw.
    pub async fn finish(self) -> Written {
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
