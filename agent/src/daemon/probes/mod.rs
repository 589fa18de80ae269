//! Local health probes: each runs on its own period under its own timeout, its verdict is
//! smoothed by [`Hysteresis`], and the [`Board`] holds the latest state of all of them for
//! reports, `/status` and metrics. A verdict change wakes the reporter at once.

mod checks;
mod hysteresis;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use serde::Serialize;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub use checks::{CheckResult, ProbeFailure};
pub use hysteresis::Hysteresis;

use super::metrics::AgentMetrics;
use super::notify::Heartbeats;
use crate::config::{AgentConfig, ProbeTiming};

/// What a probe checks.
#[derive(Debug, Clone)]
enum Check {
    Http(checks::HttpCheck),
    Disk {
        path: PathBuf,
        min_free_bytes: u64,
    },
    Clock {
        max_offset: Duration,
    },
    Exec {
        command: Vec<String>,
    },
    EtcdNoSpace {
        settings: Box<metalguard_etcd::ClientSettings>,
        endpoint: String,
    },
}

/// Which way a probe's condition reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Polarity {
    /// `True` while the check passes (`EtcdMemberHealthy`, `APIServerReady`, ...).
    Healthy,
    /// `True` while the check fails, like Kubernetes' `MemoryPressure`/`DiskPressure`
    /// (`EtcdNoSpace`): a pressure is reported, it does not make the host unready.
    Pressure {
        /// The condition's reason while the check passes (`False`), e.g. `NoAlarm`.
        #[serde(skip)]
        calm_reason: &'static str,
    },
}

impl Polarity {
    /// The reason recorded when the check passes.
    fn passing_reason(self) -> &'static str {
        match self {
            Polarity::Healthy => "Healthy",
            Polarity::Pressure { calm_reason } => calm_reason,
        }
    }
}

/// One configured probe.
#[derive(Debug, Clone)]
pub struct Probe {
    /// The condition it reports (`EtcdMemberHealthy`, `APIServerReady`, ...).
    pub condition: String,
    /// Period, timeout and hysteresis.
    pub timing: ProbeTiming,
    /// Which way the condition reads.
    pub polarity: Polarity,
    check: Check,
}

impl Probe {
    /// Runs the check once under the probe's timeout.
    pub async fn run_once(&self) -> CheckResult {
        let work = async {
            match &self.check {
                Check::Http(http) => http.run().await,
                Check::Disk {
                    path,
                    min_free_bytes,
                } => checks::check_disk(path, *min_free_bytes),
                Check::Clock { max_offset } => checks::check_clock(*max_offset),
                Check::Exec { command } => checks::check_exec(command).await,
                Check::EtcdNoSpace { settings, endpoint } => {
                    checks::check_etcd_nospace(settings, endpoint).await
                }
            }
        };
        match tokio::time::timeout(self.timing.timeout, work).await {
            Ok(result) => result,
            Err(_) => Err(ProbeFailure {
                reason: "Timeout",
                message: format!("no answer within {:?}", self.timing.timeout),
                // A pressure probe that got no answer cannot tell whether the pressure is on.
                unknown: matches!(self.polarity, Polarity::Pressure { .. }),
            }),
        }
    }
}

/// Builds the probes the configuration enables.
pub fn build(config: &AgentConfig) -> Result<Vec<Probe>, String> {
    let mut probes = Vec::new();
    if let Some(etcd) = &config.etcd
        && let Some(endpoint) = etcd.endpoints.first()
    {
        // `exclude=NOSPACE`: a member whose cluster hit its space quota refuses writes but
        // still serves reads and votes, and no fence cures it, so it must not turn the host
        // unhealthy; `EtcdNoSpace` reports the alarm instead. Measured on etcd 3.4.23 with the
        // alarm active on a 3-member cluster: `/health` answers 503 `{"health":"false"}` on
        // every member (the alarm is cluster-wide; the body names no alarm),
        // `/health?exclude=NOSPACE` answers 200 `{"health":"true"}`, and still 503 without a
        // leader or with a CORRUPT alarm; `?serializable=true` alone stays 503. An etcd that
        // ignores the parameter only makes the probe as strict as before.
        //
        // Where: etcd's plain-HTTP metrics URL when configured (kubeadm's liveness probe reads
        // `http://127.0.0.1:2381/health`), else the local member's client URL, presenting the
        // client certificate (an etcd with `--client-cert-auth` refuses the handshake
        // without one).
        let base = etcd.metrics_url.as_ref().unwrap_or(endpoint);
        let url = format!("{}/health?exclude=NOSPACE", base.trim_end_matches('/'));
        let client_cert =
            etcd.cert
                .clone()
                .zip(etcd.key.clone())
                .map(|(cert, key)| checks::ClientCert {
                    section: "etcd",
                    cert,
                    key,
                });
        let http =
            checks::HttpCheck::new(&url, etcd.ca.clone(), client_cert, etcd.probe.timeout, true)
                .map_err(|e| format!("etcd probe: {e}"))?;
        probes.push(Probe {
            condition: "EtcdMemberHealthy".into(),
            timing: etcd.probe,
            polarity: Polarity::Healthy,
            check: Check::Http(http),
        });
        if let Some(mut settings) = super::etcd_settings(config) {
            settings.probe_timeout = etcd.probe.timeout;
            probes.push(Probe {
                condition: metalguard_api::protocol::ETCD_NO_SPACE.into(),
                timing: etcd.probe,
                polarity: Polarity::Pressure {
                    calm_reason: "NoAlarm",
                },
                check: Check::EtcdNoSpace {
                    settings: Box::new(settings),
                    endpoint: endpoint.clone(),
                },
            });
        }
    }
    let p = &config.probes;
    for (condition, probe) in [
        ("APIServerReady", &p.apiserver),
        ("KubeletHealthy", &p.kubelet),
    ] {
        if let Some(probe) = probe {
            let timing = probe.timing();
            let http =
                checks::HttpCheck::new(&probe.url, probe.ca.clone(), None, timing.timeout, false)
                    .map_err(|e| format!("{condition} probe: {e}"))?;
            probes.push(Probe {
                condition: condition.into(),
                timing,
                polarity: Polarity::Healthy,
                check: Check::Http(http),
            });
        }
    }
    if let Some(disk) = &p.disk {
        let path = disk
            .path
            .clone()
            .or_else(|| config.etcd.as_ref().and_then(|e| e.data_dir.clone()))
            .ok_or("disk probe: no path and no etcd.data_dir")?;
        probes.push(Probe {
            condition: "DiskSpaceSufficient".into(),
            timing: disk.timing(),
            polarity: Polarity::Healthy,
            check: Check::Disk {
                path,
                min_free_bytes: disk.min_free_bytes,
            },
        });
    }
    if let Some(clock) = &p.clock {
        probes.push(Probe {
            condition: "ClockSynchronized".into(),
            timing: clock.timing(),
            polarity: Polarity::Healthy,
            check: Check::Clock {
                max_offset: clock.max_offset,
            },
        });
    }
    for exec in &p.exec {
        probes.push(Probe {
            condition: exec.name.clone(),
            timing: exec.timing(),
            polarity: Polarity::Healthy,
            check: Check::Exec {
                command: exec.command.clone(),
            },
        });
    }
    Ok(probes)
}

/// The latest state of one probe.
#[derive(Debug, Clone, Serialize, PartialEq, Eq)]
pub struct ProbeState {
    /// Condition name.
    pub condition: String,
    /// The check's verdict (for a pressure probe: `true` = no pressure); `None` until the
    /// first run finished, and while a pressure probe cannot tell.
    pub healthy: Option<bool>,
    /// Which way the condition reads.
    pub polarity: Polarity,
    /// Reason of the last verdict change (`Healthy` or the failure reason).
    pub reason: String,
    /// Detail of the last run.
    pub message: String,
    /// When the verdict last changed, Unix milliseconds.
    pub last_transition_ms: u64,
    /// When the probe last ran, Unix milliseconds.
    pub last_run_ms: u64,
    /// Consecutive failures so far.
    pub consecutive_failures: u32,
}

/// Shared state of every probe; a change of any verdict bumps a generation counter.
#[derive(Debug, Clone)]
pub struct Board {
    states: Arc<Mutex<BTreeMap<String, ProbeState>>>,
    generation: watch::Sender<u64>,
}

impl Default for Board {
    fn default() -> Self {
        Self {
            states: Arc::default(),
            generation: watch::channel(0).0,
        }
    }
}

impl Board {
    /// Registers the probes (no verdict yet).
    pub fn register(&self, probes: &[Probe]) {
        let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
        for probe in probes {
            states.insert(
                probe.condition.clone(),
                ProbeState {
                    condition: probe.condition.clone(),
                    healthy: None,
                    polarity: probe.polarity,
                    reason: "Pending".into(),
                    message: "not run yet".into(),
                    last_transition_ms: now_ms(),
                    last_run_ms: 0,
                    consecutive_failures: 0,
                },
            );
        }
    }

    /// Every probe's state, by condition name.
    pub fn snapshot(&self) -> Vec<ProbeState> {
        self.states
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .cloned()
            .collect()
    }

    /// Whether every probe has run (the first probe round is complete; a pressure probe
    /// that could not tell has run without a verdict).
    pub fn first_round_done(&self) -> bool {
        self.states
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .values()
            .all(|s| s.last_run_ms > 0)
    }

    /// Subscribes to verdict changes.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }

    fn record(
        &self,
        condition: &str,
        hysteresis: &Hysteresis,
        changed: bool,
        result: &CheckResult,
    ) {
        let mut states = self.states.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(state) = states.get_mut(condition) else {
            return;
        };
        let now = now_ms();
        state.last_run_ms = now;
        state.consecutive_failures = hysteresis.consecutive_failures();
        match result {
            Ok(message) => state.message.clone_from(message),
            Err(failure) => state.message.clone_from(&failure.message),
        }
        if changed {
            state.healthy = hysteresis.verdict();
            state.reason = match result {
                Ok(_) => state.polarity.passing_reason().into(),
                Err(failure) => failure.reason.into(),
            };
            state.last_transition_ms = now;
            drop(states);
            self.generation.send_modify(|g| *g += 1);
        }
    }
}

/// Wall-clock milliseconds since the Unix epoch (adapters may read the clock; decisions may not).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Runs `probe` every period until `cancel`, recording into `board` and beating `beats`.
pub async fn run(
    probe: Probe,
    board: Board,
    beats: Heartbeats,
    metrics: AgentMetrics,
    cancel: CancellationToken,
) {
    let loop_name = format!("probe:{}", probe.condition);
    let stale_after = (probe.timing.period + probe.timing.timeout) * 3;
    let mut hysteresis = Hysteresis::new(
        probe.timing.failure_threshold,
        probe.timing.success_threshold,
    );
    let mut ticker = tokio::time::interval(probe.timing.period);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            _ = ticker.tick() => {}
        }
        beats.beat(&loop_name, stale_after);
        let started = Instant::now();
        let result = probe.run_once().await;
        let elapsed = started.elapsed();
        let changed = match &result {
            Err(f) if f.unknown => hysteresis.forget(),
            _ => hysteresis.observe(result.is_ok()).is_some(),
        };
        if changed {
            let healthy = hysteresis.verdict();
            match &result {
                Ok(message) => {
                    tracing::info!(condition = %probe.condition, ?healthy, message = %message, "probe verdict changed");
                }
                Err(f) => {
                    tracing::warn!(condition = %probe.condition, ?healthy, reason = f.reason, message = %f.message, "probe verdict changed");
                }
            }
        }
        metrics.observe_probe(
            &probe.condition,
            result.is_ok(),
            hysteresis.verdict(),
            elapsed,
        );
        board.record(&probe.condition, &hysteresis, changed, &result);
        beats.beat(&loop_name, stale_after);
    }
    beats.retire(&loop_name);
}
