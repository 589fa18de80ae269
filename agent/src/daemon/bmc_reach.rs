//! Checks of the BMCs this agent may be asked to fence, on a period.
//!
//! Data flow: the report loop hands the controller's list of targets (each report's answer,
//! [`ReportAck::bmc_targets`](metalguard_api::protocol::ReportAck)) to
//! [`Reachability::set_targets`]; [`run`] checks every target each `[bmc_reachability]`
//! period, concurrently, each under its timeout: with the credentials the controller handed
//! out for it, a read-only login, power and identity check ([`super::bmc_check`], refused
//! logins backed off); without, reachability only with [`metalguard_bmc::check_reachable`].
//! The results go into the next report's `bmc_reachability` and the
//! `metalguard_agent_bmc_reachable{host}` gauge. A target's first result, and any change of
//! reachability or of the check's verdict, wakes the report loop so the controller hears of
//! it at once.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use metalguard_api::duration::Timestamp;
use metalguard_api::protocol::{BmcReachability, BmcTarget};
use metalguard_bmc::{BmcAddress, CallTimeouts};
use tokio::sync::{Notify, watch};
use tokio_util::sync::CancellationToken;

use super::execute::{error_chain, tls_trust};
use super::metrics::AgentMetrics;
use super::notify::Heartbeats;
use super::probes::now_ms;
use crate::config::BmcReachabilityConfig;

/// Margin of the overall deadline of one check over its configured timeout (the protocol
/// clients enforce the timeout themselves; this only bounds a client that would not).
const DEADLINE_MARGIN: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
struct Inner {
    targets: Vec<BmcTarget>,
    results: BTreeMap<String, BmcReachability>,
}

/// The targets to check and the latest result per target; cheap to clone.
#[derive(Debug, Clone)]
pub struct Reachability {
    inner: Arc<Mutex<Inner>>,
    changes: Arc<watch::Sender<u64>>,
    retarget: Arc<Notify>,
}

impl Default for Reachability {
    fn default() -> Self {
        Self {
            inner: Arc::default(),
            changes: Arc::new(watch::channel(0).0),
            retarget: Arc::default(),
        }
    }
}

impl Reachability {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned lock only means another thread panicked mid-update of plain data.
        self.inner
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Replaces the targets when the controller's list changed: results of hosts no longer
    /// listed are dropped, and the next round starts at once.
    pub fn set_targets(&self, targets: Vec<BmcTarget>) {
        let mut inner = self.lock();
        if inner.targets == targets {
            return;
        }
        inner
            .results
            .retain(|host, _| targets.iter().any(|t| &t.host == host));
        tracing::info!(
            targets = ?targets.iter().map(|t| t.host.as_str()).collect::<Vec<_>>(),
            "bmc reachability targets from the controller"
        );
        inner.targets = targets;
        drop(inner);
        self.retarget.notify_one();
    }

    /// The latest result of every current target, by host.
    pub fn results(&self) -> Vec<BmcReachability> {
        self.lock().results.values().cloned().collect()
    }

    /// Changes when a target's reachability or check verdict changed or it got its first
    /// result.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    fn targets(&self) -> Vec<BmcTarget> {
        self.lock().targets.clone()
    }

    /// Keeps `results` of hosts still listed; true when one's reachability, or its
    /// credentialed check's verdict, is new or changed.
    fn record(&self, results: Vec<BmcReachability>) -> bool {
        let mut inner = self.lock();
        let mut changed = false;
        for result in results {
            if !inner.targets.iter().any(|t| t.host == result.host) {
                continue;
            }
            let verdict = |r: &BmcReachability| {
                (
                    r.reachable,
                    r.check.as_ref().map(|c| (c.failure, c.request.clone())),
                )
            };
            let before = inner.results.get(&result.host).map(verdict);
            changed |= before != Some(verdict(&result));
            inner.results.insert(result.host.clone(), result);
        }
        drop(inner);
        if changed {
            self.changes.send_modify(|n| *n += 1);
        }
        changed
    }
}

/// Checks one target under `timeout` (and an overall deadline): read-only with the
/// credentials the controller handed out for it ([`super::bmc_check`]), or without any.
pub async fn check(target: &BmcTarget, ca_dir: &Path, timeout: Duration) -> BmcReachability {
    if let Some(credentials) = &target.credentials {
        return super::bmc_check::check(target, credentials, ca_dir, timeout).await;
    }
    let outcome = check_target(target, ca_dir, timeout).await;
    BmcReachability {
        host: target.host.clone(),
        reachable: outcome.is_ok(),
        checked_at: Timestamp(now_ms()),
        error: outcome.err(),
        check: None,
    }
}

async fn check_target(target: &BmcTarget, ca_dir: &Path, timeout: Duration) -> Result<(), String> {
    let address = target
        .bmc_address
        .parse::<BmcAddress>()
        .map_err(|e| format!("bmc address of {}: {e}", target.host))?;
    let trust = tls_trust(ca_dir, &target.tls)
        .map_err(|e| format!("tls trust for bmc of {}: {e}", target.host))?;
    let timeouts = CallTimeouts {
        connect: timeout,
        request: timeout,
    };
    let deadline = timeout + DEADLINE_MARGIN;
    match tokio::time::timeout(
        deadline,
        metalguard_bmc::check_reachable(&address, &trust, timeouts),
    )
    .await
    {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(error)) => Err(error_chain(&error)),
        Err(_) => Err(format!(
            "bmc {} did not answer within {deadline:?}",
            address.host_port()
        )),
    }
}

/// Checks every target each period (at once when the targets change) until `cancel`.
pub async fn run(
    reach: Reachability,
    config: BmcReachabilityConfig,
    ca_dir: PathBuf,
    metrics: AgentMetrics,
    beats: Heartbeats,
    cancel: CancellationToken,
) {
    let name = "bmc-reachability";
    // A credentialed check is three calls: log in, power state, identity.
    let stale_after = config.period + (config.timeout * 3 + DEADLINE_MARGIN) * 2;
    let mut logins = super::bmc_check::LoginBackoff::default();
    loop {
        beats.beat(name, stale_after);
        let started = tokio::time::Instant::now();
        // A target whose login was refused keeps its last result while it backs off.
        let targets: Vec<BmcTarget> = reach
            .targets()
            .into_iter()
            .filter(|t| logins.allows(t, config.period, started))
            .collect();
        let mut round = tokio::task::JoinSet::new();
        for target in targets.clone() {
            let ca_dir = ca_dir.clone();
            round.spawn(async move {
                let result = check(&target, &ca_dir, config.timeout).await;
                (target, result)
            });
        }
        let mut results = Vec::with_capacity(targets.len());
        while let Some(done) = round.join_next().await {
            match done {
                Ok((target, result)) => {
                    logins.record(&target, &result, config.period, started);
                    results.push(result);
                }
                Err(error) => tracing::error!(%error, "bmc reachability check task failed"),
            }
        }
        for r in &results {
            if !r.reachable {
                tracing::debug!(target_host = %r.host, error = r.error.as_deref().unwrap_or(""), "bmc not reachable");
            }
        }
        metrics.set_bmc_reachability(&results);
        if reach.record(results) {
            tracing::info!(
                reachable = ?reach.results().iter().filter(|r| r.reachable).map(|r| r.host.clone()).collect::<Vec<_>>(),
                unreachable = ?reach.results().iter().filter(|r| !r.reachable).map(|r| r.host.clone()).collect::<Vec<_>>(),
                "bmc reachability changed"
            );
        }
        beats.beat(name, stale_after);
        tokio::select! {
            () = cancel.cancelled() => break,
            () = tokio::time::sleep(config.period) => {}
            () = reach.retarget.notified() => {}
        }
    }
    beats.retire(name);
}

#[cfg(test)]
mod tests {
    use metalguard_api::protocol::BmcTrust;
    use metalguard_e2e::ipmi::{IpmiOptions, IpmiSim};
    use metalguard_e2e::redfish::{RedfishBmc, RedfishOptions, Tls};

    use super::*;

    const TIMEOUT: Duration = Duration::from_secs(2);

    fn target(host: &str, address: String, tls: BmcTrust) -> BmcTarget {
        BmcTarget {
            host: host.into(),
            bmc_address: address,
            tls,
            credentials: None,
            expected_identity: None,
            credentials_id: None,
            credentials_new: false,
            check_request: None,
        }
    }

    fn redfish_target(bmc: &RedfishBmc, tls: BmcTrust) -> BmcTarget {
        target(
            "cp-2",
            format!(
                "redfish+https://127.0.0.1:{}/redfish/v1/Systems/x",
                bmc.port()
            ),
            tls,
        )
    }

    #[tokio::test]
    async fn a_redfish_bmc_is_reachable_with_its_ca_and_unreachable_with_a_wrong_trust() {
        let bmc = RedfishBmc::start(RedfishOptions {
            tls: Tls::CaSigned,
            ..RedfishOptions::default()
        })
        .unwrap();
        let ca_dir = tempfile::tempdir().unwrap();
        let pem = std::fs::read_to_string(bmc.ca_pem_path().unwrap()).unwrap();
        let ok = check(
            &redfish_target(&bmc, BmcTrust::CaPem { pem }),
            ca_dir.path(),
            TIMEOUT,
        )
        .await;
        assert!(ok.reachable && ok.error.is_none(), "{ok:?}");
        assert_eq!(ok.host, "cp-2");
        // The system roots do not know the emulator's CA: the TLS refusal is the reason.
        let wrong = check(
            &redfish_target(&bmc, BmcTrust::SystemRoots),
            ca_dir.path(),
            TIMEOUT,
        )
        .await;
        assert!(!wrong.reachable, "{wrong:?}");
        let error = wrong.error.unwrap();
        assert!(
            error.contains("tls") && error.contains("certificate"),
            "{error}"
        );
        // A wrong pin as well.
        let pin = BmcTrust::Fingerprint {
            sha256: "00".repeat(32),
        };
        let pinned = check(&redfish_target(&bmc, pin), ca_dir.path(), TIMEOUT).await;
        assert!(!pinned.reachable, "{pinned:?}");
    }

    #[tokio::test]
    async fn an_ipmi_bmc_is_reachable_and_a_dead_address_says_why_not() {
        let sim = IpmiSim::start(IpmiOptions::default()).unwrap();
        let ca_dir = tempfile::tempdir().unwrap();
        let live = target(
            "cp-3",
            format!("ipmi://127.0.0.1:{}", sim.port()),
            BmcTrust::default(),
        );
        let ok = check(&live, ca_dir.path(), TIMEOUT).await;
        assert!(ok.reachable, "{ok:?}");
        let port = std::net::UdpSocket::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let dead = target(
            "cp-4",
            format!("ipmi://127.0.0.1:{port}"),
            BmcTrust::default(),
        );
        let result = check(&dead, ca_dir.path(), TIMEOUT).await;
        assert!(!result.reachable, "{result:?}");
        let error = result.error.unwrap();
        assert!(
            error.contains(&format!("127.0.0.1:{port}"))
                && error.contains("nothing listens on that udp port"),
            "{error}"
        );
        // A peer that takes the datagrams and never answers: a timeout, within the timeout.
        let silent_socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let silent = target(
            "cp-5",
            format!("ipmi://{}", silent_socket.local_addr().unwrap()),
            BmcTrust::default(),
        );
        let started = std::time::Instant::now();
        let result = check(&silent, ca_dir.path(), Duration::from_millis(600)).await;
        assert!(!result.reachable, "{result:?}");
        assert!(
            started.elapsed() < Duration::from_secs(2),
            "{:?}",
            started.elapsed()
        );
        let error = result.error.unwrap();
        assert!(error.contains("did not answer"), "{error}");
    }

    #[test]
    fn changes_of_reachability_wake_the_report_and_unlisted_hosts_are_forgotten() {
        let reach = Reachability::default();
        let mut changes = reach.subscribe();
        let t = |host: &str| target(host, format!("ipmi://{host}"), BmcTrust::default());
        let r = |host: &str, reachable: bool| BmcReachability {
            host: host.into(),
            reachable,
            checked_at: Timestamp(1),
            error: (!reachable).then(|| "e".to_owned()),
            check: None,
        };
        reach.set_targets(vec![t("cp-2"), t("cp-3")]);
        assert!(
            reach.record(vec![r("cp-2", true), r("cp-3", false)]),
            "first results"
        );
        assert!(changes.has_changed().unwrap());
        changes.mark_unchanged();
        assert!(!reach.record(vec![r("cp-2", true), r("cp-3", false)]));
        assert!(!changes.has_changed().unwrap());
        assert!(
            reach.record(vec![r("cp-3", true)]),
            "unreachable -> reachable"
        );
        assert!(!reach.record(vec![r("cp-9", true)]), "not a target");
        reach.set_targets(vec![t("cp-3")]);
        let hosts: Vec<String> = reach.results().into_iter().map(|r| r.host).collect();
        assert_eq!(hosts, ["cp-3"]);
    }
}
