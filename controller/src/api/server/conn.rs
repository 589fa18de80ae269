//! The agent API's connection bounds: how many connections are served at once, how many TLS
//! handshakes may be in progress, how many established connections one host may hold, and
//! when an idle connection is closed.
//!
//! A handshake goes through two stages, each with `max_handshakes` slots, and a new arrival in
//! a full stage evicts the oldest connection in it: waiting for the client's complete
//! ClientHello (where idle and half-open connections sit for free), then the rest of the
//! handshake. An agent sends its ClientHello at once and finishes within milliseconds, so a
//! flood of idle, half-open or stalled connections can delay it but not lock it out (an
//! agent's handshake was evicted in the first stage when both stages were one).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::inventory::ApiLimits;

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means another thread panicked mid-update of plain counters.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Slots that, when full, make room for a newcomer by evicting the oldest holder.
#[derive(Debug)]
struct EvictingSlots {
    max: usize,
    next_id: AtomicU64,
    /// Holders, oldest first, each with the token that evicts it.
    held: Mutex<VecDeque<(u64, CancellationToken)>>,
}

impl EvictingSlots {
    fn new(max: usize) -> Arc<Self> {
        Arc::new(Self {
            max: max.max(1),
            next_id: AtomicU64::new(0),
            held: Mutex::new(VecDeque::new()),
        })
    }

    fn take(self: &Arc<Self>) -> HandshakeSlot {
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        let mut held = lock(&self.held);
        while held.len() >= self.max {
            match held.pop_front() {
                Some((_, oldest)) => oldest.cancel(),
                None => break,
            }
        }
        held.push_back((id, token.clone()));
        HandshakeSlot {
            slots: self.clone(),
            id,
            evicted: token,
        }
    }
}

/// The counts behind the bounds.
#[derive(Debug)]
pub struct Connections {
    max_open: usize,
    max_per_host: usize,
    open: AtomicUsize,
    /// Connections waiting for their complete ClientHello.
    hellos: Arc<EvictingSlots>,
    /// Connections past their ClientHello, finishing the handshake.
    handshakes: Arc<EvictingSlots>,
    per_host: Mutex<HashMap<String, usize>>,
}

impl Connections {
    /// Counts for `limits`, serving at most `max_connections` at once (the configured number,
    /// or less when the open-file limit is lower).
    pub fn new(limits: &ApiLimits, max_connections: usize) -> Arc<Self> {
        let stage = limits.max_handshakes.min(max_connections);
        Arc::new(Self {
            max_open: max_connections,
            max_per_host: limits.max_connections_per_host,
            open: AtomicUsize::new(0),
            hellos: EvictingSlots::new(stage),
            handshakes: EvictingSlots::new(stage),
            per_host: Mutex::new(HashMap::new()),
        })
    }

    /// Connections served right now.
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// A slot for a new connection, held while it is served; `None` when all are taken.
    pub fn admit(self: &Arc<Self>) -> Option<ConnectionSlot> {
        let admitted = self
            .open
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |open| {
                (open < self.max_open).then_some(open + 1)
            })
            .is_ok();
        admitted.then(|| ConnectionSlot {
            connections: self.clone(),
        })
    }

    /// A slot while waiting for the client's complete ClientHello; when every slot is taken,
    /// the oldest waiting connection is told to give up (its token is cancelled).
    pub fn await_hello(&self) -> HandshakeSlot {
        self.hellos.take()
    }

    /// A slot for the rest of the handshake, evicting the oldest the same way.
    pub fn begin_handshake(&self) -> HandshakeSlot {
        self.handshakes.take()
    }

    /// A slot among `host`'s established connections; `None` when it holds as many as allowed.
    pub fn join_host(self: &Arc<Self>, host: &str) -> Option<HostSlot> {
        let mut per_host = lock(&self.per_host);
        let held = per_host.entry(host.to_owned()).or_insert(0);
        if *held >= self.max_per_host {
            return None;
        }
        *held += 1;
        Some(HostSlot {
            connections: self.clone(),
            host: host.to_owned(),
        })
    }
}

/// A connection being served.
#[derive(Debug)]
pub struct ConnectionSlot {
    connections: Arc<Connections>,
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        self.connections.open.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A connection in one stage of its TLS handshake.
#[derive(Debug)]
pub struct HandshakeSlot {
    slots: Arc<EvictingSlots>,
    id: u64,
    evicted: CancellationToken,
}

impl HandshakeSlot {
    /// Resolves when a newer connection took this slot.
    pub async fn evicted(&self) {
        self.evicted.cancelled().await;
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        let mut held = lock(&self.slots.held);
        if let Some(at) = held.iter().position(|(id, _)| *id == self.id) {
            held.remove(at);
        }
    }
}

/// One of a host's established connections.
#[derive(Debug)]
pub struct HostSlot {
    connections: Arc<Connections>,
    host: String,
}

impl Drop for HostSlot {
    fn drop(&mut self) {
        let mut per_host = lock(&self.connections.per_host);
        if let Some(held) = per_host.get_mut(&self.host) {
            *held = held.saturating_sub(1);
            if *held == 0 {
                per_host.remove(&self.host);
            }
        }
    }
}

/// What a connection is doing: requests in flight, and when the last one ended.
#[derive(Debug)]
pub struct Activity {
    in_flight: AtomicUsize,
    last: Mutex<Instant>,
}

impl Activity {
    /// A connection that starts idle now.
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            in_flight: AtomicUsize::new(0),
            last: Mutex::new(Instant::now()),
        })
    }

    /// Since when the connection is idle; `None` while a request is in flight.
    pub fn idle_since(&self) -> Option<Instant> {
        (self.in_flight.load(Ordering::Acquire) == 0).then(|| *lock(&self.last))
    }
}

/// A request in flight on a connection.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        *lock(&self.0.last) = Instant::now();
        self.0.in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Counts the request as in flight on its connection (the [`Activity`] extension) until its
/// answer is ready; a long-poll keeps its connection busy.
pub async fn track_activity(request: Request, next: Next) -> Response {
    let activity = request.extensions().get::<Arc<Activity>>().cloned();
    let _in_flight = activity.map(|activity| {
        activity.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(activity)
    });
    next.run(request).await
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(handshakes: usize, per_host: usize) -> ApiLimits {
        ApiLimits {
            max_handshakes: handshakes,
            max_connections_per_host: per_host,
            ..ApiLimits::default()
        }
    }

    #[test]
    fn connections_beyond_the_cap_are_not_admitted_and_slots_come_back() {
        let connections = Connections::new(&limits(2, 2), 3);
        let slots: Vec<_> = (0..3).map(|_| connections.admit().unwrap()).collect();
        assert!(connections.admit().is_none());
        assert_eq!(connections.open(), 3);
        drop(slots);
        assert_eq!(connections.open(), 0);
        assert!(connections.admit().is_some());
    }

    #[tokio::test]
    async fn a_new_handshake_evicts_the_oldest_of_its_stage_when_all_slots_are_taken() {
        let connections = Connections::new(&limits(2, 2), 100);
        let waiting = connections.await_hello();
        let first = connections.begin_handshake();
        let second = connections.begin_handshake();
        let third = connections.begin_handshake();
        assert!(
            !waiting.evicted.is_cancelled(),
            "the other stage is not touched"
        );
        tokio::time::timeout(std::time::Duration::from_millis(100), first.evicted())
            .await
            .expect("the oldest handshake was not evicted");
        assert!(!second.evicted.is_cancelled() && !third.evicted.is_cancelled());
        drop((first, second));
        let _fourth = connections.begin_handshake();
        assert!(
            !third.evicted.is_cancelled(),
            "a slot came back: no eviction"
        );
    }

    #[test]
    fn a_host_holds_at_most_its_share_of_connections() {
        let connections = Connections::new(&limits(2, 2), 100);
        let a = connections.join_host("w-1").unwrap();
        let _b = connections.join_host("w-1").unwrap();
        assert!(connections.join_host("w-1").is_none());
        assert!(connections.join_host("w-2").is_some());
        drop(a);
        assert!(connections.join_host("w-1").is_some());
    }
}
