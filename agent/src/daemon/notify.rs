//! systemd's notification protocol (`sd_notify(3)`), spoken directly: one datagram per state
//! change to `$NOTIFY_SOCKET`. Owning these few lines lets tests point the notifier at a socket
//! they own, and keeps the watchdog honest: `WATCHDOG=1` is sent only while every registered
//! loop has beaten recently ([`Heartbeats`]).

use std::collections::HashMap;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// Where notifications go, and the watchdog interval systemd asked for.
#[derive(Debug, Clone, Default)]
pub struct Notifier {
    target: Option<PathBuf>,
    watchdog: Option<Duration>,
}

impl Notifier {
    /// Reads `NOTIFY_SOCKET`, `WATCHDOG_USEC` and `WATCHDOG_PID` (the watchdog applies only
    /// when its pid is ours or unset). Without `NOTIFY_SOCKET`, every call is a no-op.
    pub fn from_env() -> Self {
        let target = std::env::var_os("NOTIFY_SOCKET").map(PathBuf::from);
        let pid_matches = std::env::var("WATCHDOG_PID")
            .map_or(true, |pid| pid.trim() == std::process::id().to_string());
        let watchdog = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|v| v.trim().parse::<u64>().ok())
            .filter(|&usec| usec > 0 && pid_matches)
            .map(Duration::from_micros);
        Self { target, watchdog }
    }

    /// A notifier for an explicit socket (tests).
    #[cfg(test)]
    pub fn to_socket(path: PathBuf, watchdog: Option<Duration>) -> Self {
        Self {
            target: Some(path),
            watchdog,
        }
    }

    /// The watchdog timeout systemd enforces, if any.
    pub fn watchdog(&self) -> Option<Duration> {
        self.watchdog
    }

    /// Sends `state` (e.g. `READY=1`); failures are logged, never fatal.
    pub fn send(&self, state: &str) {
        let Some(target) = &self.target else {
            return;
        };
        if let Err(err) = send_datagram(target, state) {
            tracing::warn!(socket = %target.display(), error = %err, "systemd notification failed");
        }
    }

    /// `READY=1` with a status line.
    pub fn ready(&self, status: &str) {
        self.send(&format!("READY=1\nSTATUS={status}"));
    }

    /// `STATUS=…`.
    pub fn status(&self, status: &str) {
        self.send(&format!("STATUS={status}"));
    }

    /// `WATCHDOG=1`.
    pub fn watchdog_ping(&self) {
        self.send("WATCHDOG=1");
    }

    /// `STOPPING=1`.
    pub fn stopping(&self) {
        self.send("STOPPING=1\nSTATUS=stopping");
    }
}

fn send_datagram(target: &std::path::Path, state: &str) -> std::io::Result<()> {
    let socket = UnixDatagram::unbound()?;
    let text = target.to_string_lossy();
    let addr = match text.strip_prefix('@') {
        Some(name) => SocketAddr::from_abstract_name(name.as_bytes())?,
        None => SocketAddr::from_pathname(target)?,
    };
    socket.send_to_addr(state.as_bytes(), &addr)?;
    Ok(())
}

/// Liveness of the agent's loops: each registers with how stale it may get, then beats.
#[derive(Debug, Clone, Default)]
pub struct Heartbeats {
    inner: Arc<Mutex<HashMap<String, (Instant, Duration)>>>,
}

impl Heartbeats {
    /// Registers (or re-arms) loop `name`, which must beat at least every `stale_after`.
    pub fn beat(&self, name: &str, stale_after: Duration) {
        let mut map = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        map.insert(name.to_owned(), (Instant::now(), stale_after));
    }

    /// Removes a loop that ended on purpose.
    pub fn retire(&self, name: &str) {
        self.inner
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(name);
    }

    /// The loops that have not beaten in time.
    pub fn stale(&self) -> Vec<String> {
        let map = self.inner.lock().unwrap_or_else(PoisonError::into_inner);
        let mut stale: Vec<String> = map
            .iter()
            .filter(|(_, (at, limit))| at.elapsed() > *limit)
            .map(|(name, _)| name.clone())
            .collect();
        stale.sort();
        stale
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn states_reach_a_test_owned_socket() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify.sock");
        let server = UnixDatagram::bind(&path).unwrap();
        server
            .set_read_timeout(Some(Duration::from_secs(2)))
            .unwrap();
        let notifier = Notifier::to_socket(path, Some(Duration::from_secs(10)));
        notifier.ready("probing");
        notifier.watchdog_ping();
        notifier.stopping();
        let mut buf = [0u8; 256];
        let mut seen = Vec::new();
        for _ in 0..3 {
            let n = server.recv(&mut buf).unwrap();
            seen.push(String::from_utf8_lossy(&buf[..n]).into_owned());
        }
        assert!(seen[0].starts_with("READY=1\n"), "{seen:?}");
        assert_eq!(seen[1], "WATCHDOG=1");
        assert!(seen[2].starts_with("STOPPING=1"), "{seen:?}");
    }

    #[test]
    fn stale_loops_are_named() {
        let beats = Heartbeats::default();
        beats.beat("fresh", Duration::from_secs(60));
        beats.beat("stale", Duration::ZERO);
        std::thread::sleep(Duration::from_millis(5));
        assert_eq!(beats.stale(), vec!["stale".to_owned()]);
        beats.retire("stale");
        assert!(beats.stale().is_empty());
    }
}
