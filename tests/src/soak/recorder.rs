//! The recorder: gathers everything the checker reads into one history.
//!
//! Data flow: the driver calls [`Recorder::poll`] on every tick → new lines of every agent's
//! and controller's log ([`super::logs`]), new entries of every BMC's power log, changes of
//! each host's health and of each remediation's phase (as the lab reads the leader's status)
//! → entries stamped with when they happened; an [`EtcdSampler`] thread probes every member's
//! `/health` (a linearizable read behind it: `true` means the member answered with quorum)
//! and the member list, and sends samples in. [`Recorder::finish`] writes the entries in time
//! order as NDJSON; a raw copy is appended as they arrive, so a soak that dies leaves its
//! history behind.

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{Receiver, Sender, channel};
use std::thread::JoinHandle;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::history::{Entry, Event, MemberSample, Power};
use super::logs::{Tail, Writer, parse_line};
use crate::etcd::{ClientTls, etcdctl_with};
use crate::lab::Lab;
use crate::{HarnessError, Result, http};

/// How often etcd is sampled.
const SAMPLE_PERIOD: Duration = Duration::from_millis(500);
/// How long a member's `/health` may take.
const HEALTH_TIMEOUT: Duration = Duration::from_millis(400);
/// How often the member list (who votes) is read again.
const MEMBER_LIST_PERIOD: Duration = Duration::from_secs(5);

/// Unix milliseconds now.
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// The history being written.
#[derive(Debug)]
pub struct Recorder {
    start_unix_ms: u64,
    entries: Vec<Entry>,
    raw: BufWriter<File>,
    tails: Vec<(Writer, Tail)>,
    power_seen: Vec<usize>,
    health: Vec<Option<bool>>,
    phases: BTreeMap<String, String>,
    samples: Receiver<(u64, Event)>,
    /// The highest term each controller replica has begun leading in.
    leader_terms: BTreeMap<String, u64>,
    /// When each controller replica last persisted a power-off intent (history time).
    last_power_off: BTreeMap<String, u64>,
}

impl Recorder {
    /// Starts recording `lab`; the raw history goes to `raw_path` as it arrives.
    pub fn new(lab: &Lab, raw_path: &Path, samples: Receiver<(u64, Event)>) -> Result<Self> {
        let raw = File::create(raw_path).map_err(HarnessError::io("creating the raw history"))?;
        let mut tails = Vec::new();
        for h in lab.hosts() {
            tails.push((Writer::Agent(h.name.clone()), Tail::new(h.agent_log())));
        }
        for (slot, name) in lab.controller_names().into_iter().enumerate() {
            tails.push((
                Writer::Controller(name),
                Tail::new(lab.controller_log_of(slot)),
            ));
        }
        let mut power_seen = Vec::new();
        for h in lab.hosts() {
            power_seen.push(h.power_log()?.len());
        }
        Ok(Self {
            start_unix_ms: unix_ms(),
            entries: Vec::new(),
            raw: BufWriter::new(raw),
            tails,
            power_seen,
            health: vec![None; lab.hosts().len()],
            phases: BTreeMap::new(),
            samples,
            leader_terms: BTreeMap::new(),
            last_power_off: BTreeMap::new(),
        })
    }

    /// Milliseconds since the soak started.
    pub fn now(&self) -> u64 {
        unix_ms().saturating_sub(self.start_unix_ms)
    }

    /// Records `event` as happening now.
    pub fn record(&mut self, event: Event) {
        let t = self.now();
        self.push(Entry { t, event });
    }

    /// Records `event` as happening at `at_unix_ms`.
    pub fn record_at(&mut self, at_unix_ms: u64, event: Event) {
        let t = at_unix_ms.saturating_sub(self.start_unix_ms);
        self.push(Entry { t, event });
    }

    fn push(&mut self, entry: Entry) {
        if let Event::Leader { controller, term } = &entry.event {
            let best = self.leader_terms.entry(controller.clone()).or_default();
            *best = (*best).max(*term);
        }
        if let Event::Intent { controller, op, .. } = &entry.event
            && op.ends_with("/power-off")
        {
            let last = self.last_power_off.entry(controller.clone()).or_default();
            *last = (*last).max(entry.t);
        }
        if let Ok(line) = serde_json::to_string(&entry) {
            let _ = writeln!(self.raw, "{line}");
        }
        self.entries.push(entry);
    }

    /// Whether `controller` persisted a power-off intent after history time `since`.
    pub fn power_off_intent_after(&self, controller: &str, since: u64) -> bool {
        self.last_power_off
            .get(controller)
            .is_some_and(|&t| t > since)
    }

    /// The controller replica that began the newest leadership seen in the logs.
    pub fn newest_leader(&self) -> Option<&str> {
        self.leader_terms
            .iter()
            .max_by_key(|(_, term)| **term)
            .map(|(name, _)| name.as_str())
    }

    /// Reads what happened since the last poll: logs, power logs, etcd samples, host health
    /// and remediation phases.
    pub fn poll(&mut self, lab: &mut Lab) -> Result<()> {
        let mut found = Vec::new();
        for (writer, tail) in &mut self.tails {
            for line in tail.new_lines() {
                if let Some(event) = parse_line(writer, &line) {
                    found.push(event);
                }
            }
        }
        for (at, event) in found {
            self.record_at(at, event);
        }
        for i in 0..lab.hosts().len() {
            let log = lab.hosts()[i].power_log()?;
            let name = lab.hosts()[i].name.clone();
            for e in log.iter().skip(self.power_seen[i]) {
                let state = if e.is_off() {
                    Some(Power::Off)
                } else if e.is_on() {
                    Some(Power::On)
                } else {
                    None
                };
                if let Some(state) = state {
                    self.record_at(
                        e.at_ms,
                        Event::Power {
                            host: name.clone(),
                            state,
                        },
                    );
                }
            }
            self.power_seen[i] = log.len();
        }
        while let Ok((at, event)) = self.samples.try_recv() {
            self.record_at(at, event);
        }
        for exit in lab.take_controller_exits() {
            self.record(Event::ControllerExit {
                controller: exit.controller,
                code: exit.code,
                signal: exit.signal,
                restart_in_ms: u64::try_from(exit.restart_in.as_millis()).unwrap_or(u64::MAX),
                last_line: exit.last_line,
            });
        }
        for i in 0..lab.hosts().len() {
            let healthy = lab.host_healthy(i);
            if self.health[i] != Some(healthy) {
                self.health[i] = Some(healthy);
                let host = lab.hosts()[i].name.clone();
                self.record(Event::HostHealth { host, healthy });
            }
        }
        for (id, target, phase) in lab.remediations() {
            if self.phases.get(&id) != Some(&phase) {
                self.phases.insert(id.clone(), phase.clone());
                self.record(Event::Remediation { id, target, phase });
            }
        }
        Ok(())
    }

    /// Writes the history in time order to `path` and returns it.
    pub fn finish(mut self, path: &Path) -> Result<Vec<Entry>> {
        let _ = self.raw.flush();
        self.entries.sort_by_key(|e| e.t);
        let mut out = String::new();
        for e in &self.entries {
            out.push_str(
                &serde_json::to_string(e)
                    .map_err(|e| HarnessError::Other(format!("history entry: {e}")))?,
            );
            out.push('\n');
        }
        std::fs::write(path, out).map_err(HarnessError::io("writing the history"))?;
        Ok(self.entries)
    }
}

/// What the etcd sampler reads: every member's health address (by host), and how to read the
/// member list.
#[derive(Debug, Clone)]
pub struct SamplerTarget {
    /// `(host name, metrics address)` of every member.
    pub members: Vec<(String, SocketAddr)>,
    /// Client URLs, for the member list.
    pub endpoints: Vec<String>,
    /// The harness's client certificate.
    pub tls: Option<ClientTls>,
}

/// A thread that samples etcd's members and quorum until stopped.
#[derive(Debug)]
pub struct EtcdSampler {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl EtcdSampler {
    /// Starts sampling `target`; samples (Unix ms, [`Event::EtcdSample`]) go to the returned
    /// receiver.
    pub fn start(target: SamplerTarget) -> (Self, Receiver<(u64, Event)>) {
        let (tx, rx) = channel();
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::spawn(move || sample_loop(&target, &flag, &tx));
        (
            Self {
                stop,
                thread: Some(thread),
            },
            rx,
        )
    }
}

impl Drop for EtcdSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn sample_loop(target: &SamplerTarget, stop: &AtomicBool, tx: &Sender<(u64, Event)>) {
    // Who votes, by name; every member votes until the first list says otherwise.
    let mut voters: BTreeMap<String, bool> = target
        .members
        .iter()
        .map(|(n, _)| (n.clone(), true))
        .collect();
    let mut listed_at: Option<Instant> = None;
    while !stop.load(Ordering::Relaxed) {
        let began = Instant::now();
        if listed_at.is_none_or(|t| t.elapsed() >= MEMBER_LIST_PERIOD) {
            listed_at = Some(Instant::now());
            if let Some(list) = member_list(target) {
                voters = list;
            }
        }
        let at = unix_ms();
        let probes: Vec<_> = target
            .members
            .iter()
            .map(|(name, addr)| {
                let (name, addr) = (name.clone(), *addr);
                std::thread::spawn(move || {
                    let healthy =
                        http::get(addr, "/health", HEALTH_TIMEOUT).is_some_and(|(status, body)| {
                            status == 200 && body.contains("\"health\":\"true\"")
                        });
                    (name, healthy)
                })
            })
            .collect();
        let members: Vec<MemberSample> = probes
            .into_iter()
            .filter_map(|p| p.join().ok())
            .filter(|(name, _)| voters.contains_key(name))
            .map(|(name, healthy)| MemberSample {
                voter: voters.get(&name).copied().unwrap_or(true),
                name,
                healthy,
            })
            .collect();
        // A member answers `/health` true only after a linearizable read through the leader.
        let quorum = members.iter().any(|m| m.healthy);
        if tx
            .send((at, Event::EtcdSample { members, quorum }))
            .is_err()
        {
            return;
        }
        std::thread::sleep(SAMPLE_PERIOD.saturating_sub(began.elapsed()));
    }
}

/// Who votes, by member name, or `None` when the list could not be read.
fn member_list(target: &SamplerTarget) -> Option<BTreeMap<String, bool>> {
    let out = etcdctl_with(
        &target.endpoints,
        target.tls.as_ref(),
        Duration::from_secs(2),
        &["member", "list", "-w", "json"],
    )
    .ok()?;
    let value: serde_json::Value = serde_json::from_str(&out).ok()?;
    let list = value["members"].as_array()?;
    Some(
        list.iter()
            .filter_map(|m| {
                let name = m["name"].as_str()?.to_owned();
                (!name.is_empty()).then(|| (name, !m["isLearner"].as_bool().unwrap_or(false)))
            })
            .collect(),
    )
}

/// Where a soak writes its files.
#[derive(Debug, Clone)]
pub struct Paths {
    /// The directory.
    pub dir: PathBuf,
}

impl Paths {
    /// The history in time order.
    pub fn history(&self) -> PathBuf {
        self.dir.join("history.ndjson")
    }

    /// The entries as they arrived.
    pub fn raw(&self) -> PathBuf {
        self.dir.join("history.raw.ndjson")
    }

    /// The checker's report.
    pub fn report(&self) -> PathBuf {
        self.dir.join("report.txt")
    }
}
