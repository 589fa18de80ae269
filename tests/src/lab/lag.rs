//! A TCP relay in front of a controller replica that can hold the controller's answers for a
//! while: a slow path from that controller to the agents (a congested link, a stalled
//! middlebox). The soak's `leader-lag` fault uses it to deliver a controller's answers,
//! commands included, after a newer leadership began. What the agents send passes at once
//! (a report stamped on arrival stays true). TLS passes through untouched: the relay sees
//! only bytes, and the agents still verify the controller's certificate.
//!
//! Data flow per connection: agent → relay → controller and back, one reader thread per
//! direction putting each chunk on a queue with the time it is due (read time, plus the lag
//! then in force on the way back), one writer thread per direction sending chunks when due,
//! in order. An end of stream travels the same queue, so the bytes read before it still
//! arrive, late.

use std::io::{Read as _, Write as _};
use std::net::{Ipv4Addr, Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use crate::{HarnessError, Result};

/// How often the accept loop looks at its stop flag.
const ACCEPT_POLL: Duration = Duration::from_millis(50);

/// A relay to one address; dropping it stops accepting (open connections end with their
/// peers).
#[derive(Debug)]
pub struct LagRelay {
    addr: SocketAddr,
    lag_ms: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    accept: Option<thread::JoinHandle<()>>,
}

impl LagRelay {
    /// Listens on `address` (a port chosen by the system) and relays to `to`.
    pub fn start(address: Ipv4Addr, to: SocketAddr) -> Result<Self> {
        let io = HarnessError::io;
        let listener = TcpListener::bind((address, 0)).map_err(io("binding a lag relay"))?;
        listener
            .set_nonblocking(true)
            .map_err(io("setting up a lag relay"))?;
        let addr = listener
            .local_addr()
            .map_err(io("setting up a lag relay"))?;
        let lag_ms = Arc::new(AtomicU64::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let accept = {
            let (lag_ms, stop) = (lag_ms.clone(), stop.clone());
            thread::Builder::new()
                .name(format!("lag-relay-{}", addr.port()))
                .spawn(move || accept_loop(&listener, to, &lag_ms, &stop))
                .map_err(io("starting a lag relay"))?
        };
        Ok(Self {
            addr,
            lag_ms,
            stop,
            accept: Some(accept),
        })
    }

    /// Where the agents connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Holds every byte of the controller's read from now on for `lag` (zero: none).
    pub fn set_lag(&self, lag: Duration) {
        self.lag_ms.store(
            u64::try_from(lag.as_millis()).unwrap_or(u64::MAX),
            Ordering::Relaxed,
        );
    }
}

impl Drop for LagRelay {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, to: SocketAddr, lag_ms: &Arc<AtomicU64>, stop: &AtomicBool) {
    while !stop.load(Ordering::Relaxed) {
        match listener.accept() {
            Ok((agent, _)) => {
                // A controller that is down refuses: so does the relay (the agent tries
                // another).
                let Ok(controller) = TcpStream::connect_timeout(&to, Duration::from_secs(1)) else {
                    let _ = agent.shutdown(Shutdown::Both);
                    continue;
                };
                let _ = agent.set_nonblocking(false);
                let no_lag = Arc::new(AtomicU64::new(0));
                for (from, into, lag) in [
                    (&agent, &controller, &no_lag),
                    (&controller, &agent, lag_ms),
                ] {
                    if let (Ok(from), Ok(into)) = (from.try_clone(), into.try_clone()) {
                        pump(from, into, lag.clone());
                    }
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => thread::sleep(ACCEPT_POLL),
            Err(_) => thread::sleep(ACCEPT_POLL),
        }
    }
}

/// A chunk and when it is due; `None` is the end of the stream.
type Due = (Instant, Option<Vec<u8>>);

/// Relays `from` into `into`, each chunk held for the lag in force when it was read.
fn pump(mut from: TcpStream, mut into: TcpStream, lag_ms: Arc<AtomicU64>) {
    let (tx, rx) = mpsc::channel::<Due>();
    let _ = thread::Builder::new()
        .name("lag-read".into())
        .spawn(move || {
            let mut buf = vec![0u8; 16 * 1024];
            loop {
                let lag = Duration::from_millis(lag_ms.load(Ordering::Relaxed));
                match from.read(&mut buf) {
                    Ok(0) | Err(_) => {
                        let _ = tx.send((Instant::now() + lag, None));
                        return;
                    }
                    Ok(n) => {
                        if tx
                            .send((Instant::now() + lag, Some(buf[..n].to_vec())))
                            .is_err()
                        {
                            let _ = from.shutdown(Shutdown::Read);
                            return;
                        }
                    }
                }
            }
        });
    let _ = thread::Builder::new()
        .name("lag-write".into())
        .spawn(move || {
            for (due, chunk) in rx {
                if let Some(wait) = due.checked_duration_since(Instant::now()) {
                    thread::sleep(wait);
                }
                match chunk {
                    Some(bytes) if into.write_all(&bytes).is_ok() => {}
                    _ => {
                        let _ = into.shutdown(Shutdown::Write);
                        return;
                    }
                }
            }
        });
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An echo server on loopback.
    fn echo() -> SocketAddr {
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        thread::spawn(move || {
            for mut stream in listener.incoming().flatten() {
                thread::spawn(move || {
                    let mut buf = [0u8; 1024];
                    while let Ok(n) = stream.read(&mut buf) {
                        if n == 0 || stream.write_all(&buf[..n]).is_err() {
                            return;
                        }
                    }
                });
            }
        });
        addr
    }

    fn round_trip(relay: &LagRelay, text: &[u8]) -> (Vec<u8>, Duration) {
        let mut s = TcpStream::connect(relay.addr()).unwrap();
        let started = Instant::now();
        s.write_all(text).unwrap();
        let mut got = vec![0u8; text.len()];
        s.read_exact(&mut got).unwrap();
        (got, started.elapsed())
    }

    #[test]
    fn bytes_pass_in_order_and_a_lag_holds_the_answers() {
        let relay = LagRelay::start(Ipv4Addr::LOCALHOST, echo()).unwrap();
        let (got, quick) = round_trip(&relay, b"hello");
        assert_eq!(got, b"hello");
        assert!(quick < Duration::from_millis(300), "{quick:?}");
        relay.set_lag(Duration::from_millis(400));
        let (got, slow) = round_trip(&relay, b"late bytes");
        assert_eq!(got, b"late bytes");
        // Held on the way back only.
        assert!(
            (Duration::from_millis(400)..Duration::from_millis(750)).contains(&slow),
            "{slow:?}"
        );
        relay.set_lag(Duration::ZERO);
        let (_, quick) = round_trip(&relay, b"x");
        assert!(quick < Duration::from_millis(300), "{quick:?}");
    }

    #[test]
    fn bytes_read_before_the_far_end_closes_still_arrive_late() {
        // A server that answers once and closes at once (a controller killed right after it
        // answered): the answer is delivered after the lag, then the end of the stream.
        let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
        let addr = listener.local_addr().unwrap();
        thread::spawn(move || {
            if let Ok((mut s, _)) = listener.accept() {
                let _ = s.write_all(b"command");
            }
        });
        let relay = LagRelay::start(Ipv4Addr::LOCALHOST, addr).unwrap();
        relay.set_lag(Duration::from_millis(500));
        let mut s = TcpStream::connect(relay.addr()).unwrap();
        let started = Instant::now();
        let mut got = Vec::new();
        s.read_to_end(&mut got).unwrap();
        assert_eq!(got, b"command");
        assert!(started.elapsed() >= Duration::from_millis(450));
    }

    #[test]
    fn a_relay_to_a_closed_port_refuses_and_stops_when_dropped() {
        let closed = {
            let l = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
            l.local_addr().unwrap()
        };
        let relay = LagRelay::start(Ipv4Addr::LOCALHOST, closed).unwrap();
        let mut s = TcpStream::connect(relay.addr()).unwrap();
        let mut got = Vec::new();
        // Closed at once, with nothing (or a reset).
        let _ = s.read_to_end(&mut got);
        assert!(got.is_empty());
        let addr = relay.addr();
        drop(relay);
        assert!(TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_err());
    }
}
