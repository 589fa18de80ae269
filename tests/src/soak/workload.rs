//! The soak's workload: a thread writing keys to the guarded etcd while the nemesis works,
//! remembering every write etcd acknowledged; at the end one linearizable read of the prefix
//! finds which acknowledged keys are missing or changed (rule `acked-lost`).
//!
//! Writes go through `etcdctl` (a client independent of the code under test) to every
//! member's endpoint; a write that fails or times out is counted, not remembered: etcd may
//! refuse it or apply it, and only acknowledged writes are promised.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

use crate::etcd::{ClientTls, etcdctl_with};
use crate::{Result, tools};

/// The prefix every workload key has.
pub const PREFIX: &str = "/metalguard-soak/workload/";
/// Pause between two writes.
const PERIOD: Duration = Duration::from_millis(250);
/// How long one write may take.
const WRITE_TIMEOUT: Duration = Duration::from_secs(3);

/// What the workload did.
#[derive(Debug, Default, Clone)]
pub struct Tally {
    /// Acknowledged writes, key → value.
    pub acked: BTreeMap<String, String>,
    /// Writes that failed or got no answer.
    pub failed: u64,
}

/// A running workload.
#[derive(Debug)]
pub struct Workload {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<Tally>>,
    endpoints: Vec<String>,
    tls: Option<ClientTls>,
}

impl Workload {
    /// Starts writing through `endpoints`.
    pub fn start(endpoints: Vec<String>, tls: Option<ClientTls>) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let (flag, eps, client) = (stop.clone(), endpoints.clone(), tls.clone());
        let thread = std::thread::spawn(move || write_loop(&eps, client.as_ref(), &flag));
        Self {
            stop,
            thread: Some(thread),
            endpoints,
            tls,
        }
    }

    /// Stops writing and returns the tally and the acknowledged keys a final read did not
    /// find with their value (the read is retried for up to a minute: etcd may still be
    /// settling).
    pub fn finish(mut self) -> Result<(Tally, Vec<String>)> {
        self.stop.store(true, Ordering::Relaxed);
        let tally = self
            .thread
            .take()
            .and_then(|t| t.join().ok())
            .unwrap_or_default();
        let mut last_err = None;
        for _ in 0..12 {
            match self.read_all() {
                Ok(found) => {
                    let lost = tally
                        .acked
                        .iter()
                        .filter(|(k, v)| found.get(*k) != Some(*v))
                        .map(|(k, _)| k.clone())
                        .collect();
                    return Ok((tally, lost));
                }
                Err(e) => last_err = Some(e),
            }
            std::thread::sleep(Duration::from_secs(5));
        }
        Err(last_err.unwrap_or_else(|| crate::HarnessError::Other("no final read".into())))
    }

    fn read_all(&self) -> Result<BTreeMap<String, String>> {
        let out = etcdctl_with(
            &self.endpoints,
            self.tls.as_ref(),
            Duration::from_secs(10),
            &["get", "--prefix", PREFIX],
        )?;
        let lines: Vec<&str> = out.lines().collect();
        Ok(lines
            .chunks(2)
            .filter_map(|kv| match kv {
                [k, v] => Some(((*k).to_owned(), (*v).to_owned())),
                _ => None,
            })
            .collect())
    }
}

impl Drop for Workload {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn write_loop(endpoints: &[String], tls: Option<&ClientTls>, stop: &AtomicBool) -> Tally {
    let mut tally = Tally::default();
    let mut n: u64 = 0;
    while !stop.load(Ordering::Relaxed) {
        n += 1;
        let key = format!("{PREFIX}{n:08}");
        let value = format!("v{n}-{}", tools::random_token(6));
        match etcdctl_with(endpoints, tls, WRITE_TIMEOUT, &["put", &key, &value]) {
            Ok(out) if out.trim() == "OK" => {
                tally.acked.insert(key, value);
            }
            _ => tally.failed += 1,
        }
        std::thread::sleep(PERIOD);
    }
    tally
}
