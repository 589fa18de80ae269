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
}

impl ProbeFailure {
    fn new(reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            reason,
            message: message.into(),
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

impl HttpCheck {
    /// Builds the check with its own client (CA bundle or system roots, the probe's timeout).
    pub fn new(
        url: &str,
        ca: Option<PathBuf>,
        timeout: Duration,
        etcd_body: bool,
    ) -> Result<Self, String> {
        let mut builder = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .no_proxy();
        if url.starts_with("https://") {
            let trust = ca.map_or(TlsTrust::SystemRoots, TlsTrust::CaBundle);
            let config = metalguard_bmc::tls::client_config(&trust).map_err(|e| e.to_string())?;
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
            let reason = if e.is_timeout() {
                "Timeout"
            } else {
                "Unreachable"
            };
            ProbeFailure::new(reason, format!("GET {}: {}", self.url, error_chain(&e)))
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
