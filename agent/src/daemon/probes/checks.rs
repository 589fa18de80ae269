//! The individual checks. Each returns a short message on success or a [`ProbeFailure`] with a
//! machine-readable reason; the runner applies the timeout.

use std::path::PathBuf;
use std::time::Duration;

use metalguard_bmc::TlsTrust;

use crate::daemon::execute::error_chain;

/// Why a check failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProbeFailure {
    /// CamelCase reason, as in Kubernetes conditions.
    pub reason: &'static str,
    /// Human-readable detail.
    pub message: String,
    /// The check could not tell either way (the thing it reads did not answer): the verdict
    /// becomes unknown instead of failing. Pressure probes use it, so that an unreachable etcd
    /// is not reported as an alarm.
    pub unknown: bool,
}

impl ProbeFailure {
    pub(super) fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
            unknown: false,
        }
    }

    pub(super) fn unknown(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            unknown: true,
            ..Self::new(reason, message)
        }
    }
}

/// Result of one check.
pub type CheckResult = Result<String, ProbeFailure>;

/// An HTTP(S) endpoint that must answer 2xx (API server `/readyz`, kubelet `/healthz`, etcd
/// `/health`). For etcd the body must also say `"health":"true"`.
#[derive(Debug, Clone)]
pub struct HttpCheck {
    url: String,
    client: reqwest::Client,
    etcd_body: bool,
}

/// A client certificate an [`HttpCheck`] presents, with the configuration section that names
/// it (for messages).
#[derive(Debug, Clone)]
pub struct ClientCert {
    /// `etcd`, `probes.kubelet`, …
    pub section: &'static str,
    /// Certificate chain.
    pub cert: PathBuf,
    /// Private key.
    pub key: PathBuf,
}

impl HttpCheck {
    /// Builds the check with its own client (CA bundle or system roots, the probe's timeout),
    /// presenting `client_cert` over `https://` when given: etcd with `--client-cert-auth`
    /// refuses the handshake without one.
    pub fn new(
        url: &str,
        ca: Option<PathBuf>,
        client_cert: Option<ClientCert>,
        timeout: Duration,
        etcd_body: bool,
    ) -> Result<Self, String> {
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .no_proxy();
        if url.starts_with("https://") {
            let config = match (ca, client_cert) {
                (Some(ca), Some(c)) => {
                    crate::client_tls::config(c.section, &ca, Some((&c.cert, &c.key)))?
                }
                (None, Some(c)) => {
                    return Err(format!(
                        "{}: a client certificate needs the CA of the server (ca)",
                        c.section
                    ));
                }
                (ca, None) => {
                    let trust = ca.map_or(TlsTrust::SystemRoots, TlsTrust::CaBundle);
                    metalguard_bmc::tls::client_config(&trust).map_err(|e| e.to_string())?
                }
            };
            builder = builder.tls_backend_preconfigured(config);
        } else {
            let config = metalguard_bmc::tls::trust_nothing_config().map_err(|e| e.to_string())?;
            builder = builder.tls_backend_preconfigured(config);
        }
        let client = builder
            .build()
            .map_err(|e| format!("building the http client: {e}"))?;
        Ok(Self {
            url: url.to_owned(),
            client,
            etcd_body,
        })
    }

    /// One request.
    pub async fn run(&self) -> CheckResult {
        let response = self.client.get(&self.url).send().await.map_err(|e| {
            let chain = error_chain(&e);
            // rustls' words for a refused certificate, ours or the server's.
            let tls = [
                "invalid peer certificate",
                "received fatal alert",
                "certificate",
            ]
            .iter()
            .any(|needle| chain.contains(needle));
            let reason = if e.is_timeout() {
                "Timeout"
            } else if tls {
                "TlsFailed"
            } else {
                "Unreachable"
            };
            ProbeFailure::new(reason, format!("GET {}: {chain}", self.url))
        })?;
        let status = response.status();
        let body = response.text().await.unwrap_or_default();
        let body = body.trim();
        if !status.is_success() {
            return Err(ProbeFailure::new(
                "BadStatus",
                format!(
                    "GET {} answered {status}: {}",
                    self.url,
                    truncate(body, 200)
                ),
            ));
        }
        if self.etcd_body && !body.contains("\"health\":\"true\"") {
            return Err(ProbeFailure::new(
                "Unhealthy",
                format!("etcd reports {}", truncate(body, 200)),
            ));
        }
        Ok(format!("{} answered {status}", self.url))
    }
}

/// The `EtcdNoSpace` check, a pressure check: it *fails* while a NOSPACE alarm is active.
///
/// The alarm is read from the local member's status (`errors[]`), not from `/health`: etcd
/// 3.4.23 answers `/health` with 503 and a bare `{"health":"false"}` under NOSPACE, naming no
/// alarm (it only logs `/health error due to memberID:<id> alarm:NOSPACE`). A member that does
/// not answer leaves the verdict unknown: `EtcdMemberHealthy` reports that, not this check.
pub async fn check_etcd_nospace(
    settings: &metalguard_etcd::ClientSettings,
    endpoint: &str,
) -> CheckResult {
    judge_nospace(&metalguard_etcd::observe::endpoint_status(settings, endpoint).await)
}

/// Pure verdict of [`check_etcd_nospace`] over one status probe.
pub fn judge_nospace(probe: &metalguard_etcd::view::Probe) -> CheckResult {
    let Some(status) = &probe.status else {
        return Err(ProbeFailure::unknown(
            "EtcdUnreachable",
            format!(
                "the alarms of {} were not read: {}",
                probe.endpoint,
                probe.error.as_deref().unwrap_or("no answer")
            ),
        ));
    };
    if !status.has_nospace() {
        return Ok(format!("{} reports no NOSPACE alarm", probe.endpoint));
    }
    let mut raised_by: Vec<String> = status
        .alarms
        .iter()
        .filter(|a| a.name == metalguard_etcd::view::NOSPACE)
        .map(|a| {
            if a.member_id == status.member_id {
                format!("{:x} (this member)", a.member_id)
            } else {
                format!("{:x}", a.member_id)
            }
        })
        .collect();
    raised_by.sort();
    raised_by.dedup();
    Err(ProbeFailure::new(
        "AlarmNoSpace",
        format!(
            "etcd NOSPACE alarm raised by member {}: the cluster refuses writes but still \
             serves reads and keeps quorum, so fencing would not cure it; compact, defragment \
             every member, then `etcdctl alarm disarm` (docs/runbooks.md, \"etcd NOSPACE alarm\")",
            raised_by.join(", ")
        ),
    ))
}

fn truncate(text: &str, max: usize) -> &str {
    match text.char_indices().nth(max) {
        Some((i, _)) => &text[..i],
        None => text,
    }
}

/// Free space on the filesystem holding `path`.
pub fn check_disk(path: &std::path::Path, min_free_bytes: u64) -> CheckResult {
    let stat = nix::sys::statvfs::statvfs(path)
        .map_err(|e| ProbeFailure::new("StatFailed", format!("statvfs {}: {e}", path.display())))?;
    let free = stat.blocks_available().saturating_mul(stat.fragment_size());
    let message = format!(
        "{} has {} free (minimum {})",
        path.display(),
        bytes(free),
        bytes(min_free_bytes)
    );
    if free < min_free_bytes {
        Err(ProbeFailure::new("LowDiskSpace", message))
    } else {
        Ok(message)
    }
}

fn bytes(n: u64) -> String {
    const GIB: u64 = 1024 * 1024 * 1024;
    const MIB: u64 = 1024 * 1024;
    let (unit, name) = if n >= GIB { (GIB, "GiB") } else { (MIB, "MiB") };
    let tenths = n / (unit / 10);
    format!("{}.{} {name}", tenths / 10, tenths % 10)
}

/// The kernel's view of clock synchronisation (`adjtimex(2)` in read-only mode).
pub fn check_clock(max_offset: Duration) -> CheckResult {
    let clock = read_kernel_clock()
        .map_err(|e| ProbeFailure::new("ClockUnreadable", format!("adjtimex: {e}")))?;
    judge_clock(clock, max_offset)
}

/// What `adjtimex` reports, reduced to what the probe judges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelClock {
    /// The kernel says the clock is not synchronised (`TIME_ERROR` / `STA_UNSYNC`).
    pub unsynchronised: bool,
    /// Current offset from the reference.
    pub offset: Duration,
    /// Estimated error.
    pub estimated_error: Duration,
}

/// Pure verdict over a kernel clock reading.
pub fn judge_clock(clock: KernelClock, max_offset: Duration) -> CheckResult {
    if clock.unsynchronised {
        return Err(ProbeFailure::new(
            "ClockUnsynchronized",
            "the kernel reports the clock as not synchronised (is chrony/ntpd/timesyncd running?)",
        ));
    }
    let worst = clock.offset.max(clock.estimated_error);
    if worst > max_offset {
        return Err(ProbeFailure::new(
            "ClockOffsetTooLarge",
            format!(
                "clock offset {:?} (estimated error {:?}) exceeds {max_offset:?}",
                clock.offset, clock.estimated_error
            ),
        ));
    }
    Ok(format!("clock synchronised, offset {:?}", clock.offset))
}

/// Reads the kernel clock state.
///
/// This is the crate's only `unsafe`: no maintained crate wraps `adjtimex(2)`. With `modes = 0`
/// the call only reads kernel state into the zeroed struct we own.
#[allow(unsafe_code)]
fn read_kernel_clock() -> std::io::Result<KernelClock> {
    // SAFETY: `timex` is a plain C struct for which all-zero bytes are a valid value, and
    // adjtimex only writes into the struct we pass, which lives for the whole call.
    let mut timex: libc::timex = unsafe { std::mem::zeroed() };
    // SAFETY: `&mut timex` is a valid, exclusive pointer to an initialised `timex`;
    // modes = 0 asks the kernel to read, not change, the clock.
    let state = unsafe { libc::adjtimex(&raw mut timex) };
    if state < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let nano = timex.status & libc::STA_NANO != 0;
    let offset_abs = timex.offset.unsigned_abs();
    let offset = if nano {
        Duration::from_nanos(offset_abs)
    } else {
        Duration::from_micros(offset_abs)
    };
    Ok(KernelClock {
        unsynchronised: state == libc::TIME_ERROR || timex.status & libc::STA_UNSYNC != 0,
        offset,
        estimated_error: Duration::from_micros(timex.esterror.unsigned_abs()),
    })
}

/// A custom command: exit status 0 means healthy. Runs without a shell; killed on timeout by
/// the runner dropping the future (`kill_on_drop`).
pub async fn check_exec(command: &[String]) -> CheckResult {
    let Some((program, args)) = command.split_first() else {
        return Err(ProbeFailure::new("BadCommand", "empty command"));
    };
    let output = tokio::process::Command::new(program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .kill_on_drop(true)
        .output()
        .await
        .map_err(|e| ProbeFailure::new("ExecFailed", format!("starting {program}: {e}")))?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    let said = truncate(
        if stdout.trim().is_empty() {
            stderr.trim()
        } else {
            stdout.trim()
        },
        200,
    )
    .to_owned();
    if output.status.success() {
        Ok(if said.is_empty() {
            format!("{program} exited 0")
        } else {
            said
        })
    } else {
        Err(ProbeFailure::new(
            "CommandFailed",
            format!("{program} {}: {said}", output.status),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use metalguard_etcd::view::{Alarm, MemberStatus, Probe};

    fn answered(member_id: u64, alarms: &[(u64, &str)]) -> Probe {
        Probe {
            endpoint: "http://127.0.0.1:2379".into(),
            reachable: true,
            healthy: alarms.is_empty(),
            status: Some(MemberStatus {
                member_id,
                leader: 7,
                is_learner: false,
                raft_term: 2,
                raft_index: 10,
                raft_applied_index: 10,
                db_size: 1,
                version: "3.4.23".into(),
                alarms: alarms
                    .iter()
                    .map(|&(member_id, name)| Alarm {
                        member_id,
                        name: name.into(),
                    })
                    .collect(),
                errors: vec![],
            }),
            error: None,
            latency_ms: 1,
        }
    }

    #[test]
    fn nospace_verdicts() {
        assert!(judge_nospace(&answered(1, &[])).is_ok());
        assert!(judge_nospace(&answered(1, &[(2, "CORRUPT")])).is_ok());
        let own = judge_nospace(&answered(0xa, &[(0xa, "NOSPACE")])).unwrap_err();
        assert_eq!((own.reason, own.unknown), ("AlarmNoSpace", false));
        assert!(
            own.message.contains("member a (this member)"),
            "{}",
            own.message
        );
        for step in [
            "compact",
            "defragment",
            "etcdctl alarm disarm",
            "runbooks.md",
        ] {
            assert!(own.message.contains(step), "{step}: {}", own.message);
        }
        let other = judge_nospace(&answered(1, &[(0xb, "NOSPACE"), (0xb, "NOSPACE")])).unwrap_err();
        assert!(other.message.contains("member b:"), "{}", other.message);
        let down = Probe {
            reachable: false,
            healthy: false,
            status: None,
            error: Some("connect timed out".into()),
            ..answered(1, &[])
        };
        let unknown = judge_nospace(&down).unwrap_err();
        assert_eq!((unknown.reason, unknown.unknown), ("EtcdUnreachable", true));
        assert!(unknown.message.contains("connect timed out"));
    }

    #[test]
    fn clock_verdicts() {
        let max = Duration::from_millis(500);
        let synced = KernelClock {
            unsynchronised: false,
            offset: Duration::from_millis(3),
            estimated_error: Duration::from_millis(1),
        };
        assert!(judge_clock(synced, max).is_ok());
        let off = KernelClock {
            offset: Duration::from_secs(2),
            ..synced
        };
        assert_eq!(
            judge_clock(off, max).unwrap_err().reason,
            "ClockOffsetTooLarge"
        );
        let unsynced = KernelClock {
            unsynchronised: true,
            ..synced
        };
        assert_eq!(
            judge_clock(unsynced, max).unwrap_err().reason,
            "ClockUnsynchronized"
        );
        // The real kernel can be read (whatever its verdict on this machine).
        assert!(read_kernel_clock().is_ok());
    }

    #[test]
    fn disk_check_compares_free_space() {
        let dir = tempfile::tempdir().unwrap();
        assert!(check_disk(dir.path(), 1).is_ok());
        assert_eq!(
            check_disk(dir.path(), u64::MAX).unwrap_err().reason,
            "LowDiskSpace"
        );
        assert_eq!(
            check_disk(&dir.path().join("missing"), 1)
                .unwrap_err()
                .reason,
            "StatFailed"
        );
    }

    #[tokio::test]
    async fn exec_check_uses_the_exit_status() {
        assert!(check_exec(&["/bin/true".into()]).await.is_ok());
        let err = check_exec(&[
            "/bin/sh".into(),
            "-c".into(),
            "echo broken >&2; exit 3".into(),
        ])
        .await
        .unwrap_err();
        assert_eq!(err.reason, "CommandFailed");
        assert!(err.message.contains("broken"), "{}", err.message);
        assert_eq!(
            check_exec(&["/nonexistent".into()])
                .await
                .unwrap_err()
                .reason,
            "ExecFailed"
        );
    }
}
