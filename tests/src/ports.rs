//! Port reservation that never collides across parallel test processes.
//!
//! A port is picked at random from a range below Linux's ephemeral range (so outgoing
//! connections of other processes never take it), locked with an exclusive `flock` on a file
//! named after it in a shared directory, and checked to be bindable for both TCP and UDP on
//! 127.0.0.1. The lock is held for as long as the [`PortLease`] lives; the component that uses
//! the port binds it after the harness has released its test sockets.

use std::collections::hash_map::RandomState;
use std::fs::{File, OpenOptions};
use std::hash::{BuildHasher, Hasher};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};

use nix::fcntl::{Flock, FlockArg};

use crate::{HarnessError, Result};

/// Lowest port handed out.
const RANGE_START: u16 = 20_000;
/// One past the highest port handed out (Linux's ephemeral range starts at 32768).
const RANGE_END: u16 = 32_000;
/// How many random ports to try before giving up.
const ATTEMPTS: usize = 2_000;

/// A reserved port on 127.0.0.1, held until dropped.
#[derive(Debug)]
pub struct PortLease {
    port: u16,
    _lock: Flock<File>,
}

impl PortLease {
    /// The port number.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `127.0.0.1:port`.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }
}

fn lock_dir() -> Result<PathBuf> {
    let dir = std::env::temp_dir().join("metalguard-harness-ports");
    std::fs::create_dir_all(&dir).map_err(HarnessError::io(format!(
        "creating the port lock directory {}",
        dir.display()
    )))?;
    Ok(dir)
}

fn random_u64() -> u64 {
    let mut hasher = RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.finish()
}

fn bindable(port: u16) -> bool {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    TcpListener::bind(addr).is_ok() && UdpSocket::bind(addr).is_ok()
}

/// The lock of `port` in `dir`, or `None` when another test holds it.
fn lock_port(dir: &Path, port: u16) -> Result<Option<Flock<File>>> {
    try_lock(&dir.join(format!("{port}.lock")))
}

/// An exclusive lock on the file at `path` (created when missing), or `None` when another
/// process holds it.
pub(crate) fn try_lock(path: &Path) -> Result<Option<Flock<File>>> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .map_err(HarnessError::io(format!("opening {}", path.display())))?;
    Ok(Flock::lock(file, FlockArg::LockExclusiveNonblock).ok())
}

/// Reserves a free port on 127.0.0.1 (free for both TCP and UDP).
pub fn reserve_port() -> Result<PortLease> {
    let dir = lock_dir()?;
    let span = u64::from(RANGE_END - RANGE_START);
    for _ in 0..ATTEMPTS {
        let port = RANGE_START + (random_u64() % span) as u16;
        let Some(lock) = lock_port(&dir, port)? else {
            continue;
        };
        if bindable(port) {
            return Ok(PortLease { port, _lock: lock });
        }
    }
    Err(HarnessError::Other(format!(
        "no free port found in {RANGE_START}..{RANGE_END} after {ATTEMPTS} attempts"
    )))
}

/// Reserves `port` itself (a port fixed by what is under test, such as a Service's
/// `nodePort`), so that no other test is handed it meanwhile; fails when another test holds
/// it or something listens on it.
pub fn reserve_exact(port: u16) -> Result<PortLease> {
    let lock = lock_port(&lock_dir()?, port)?
        .ok_or_else(|| HarnessError::Other(format!("port {port} is reserved by another test")))?;
    if !bindable(port) {
        return Err(HarnessError::Other(format!(
            "port {port} is in use on 127.0.0.1"
        )));
    }
    Ok(PortLease { port, _lock: lock })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_are_distinct_and_bindable() {
        let leases: Vec<_> = (0..50).map(|_| reserve_port().unwrap()).collect();
        let mut ports: Vec<u16> = leases.iter().map(PortLease::port).collect();
        ports.sort_unstable();
        ports.dedup();
        assert_eq!(ports.len(), 50, "a port was handed out twice");
        assert!(ports.iter().all(|p| (RANGE_START..RANGE_END).contains(p)));
        let first = leases[0].addr();
        drop(leases);
        assert!(TcpListener::bind(first).is_ok());
    }
}
