//! The UDP exchange under the IPMI client: send, wait, retransmit with backoff, accept only
//! the answer, and classify what else arrives.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::UdpSocket;
use tokio::time::Instant;

use super::client::{Event, RetryPolicy};
use super::commands::{self, NETFN_APP};
use super::error::IpmiError;
use super::wire::{
    DecodeError, Envelope, IpmiRequest, IpmiResponse, PayloadType, decode_envelope,
    encode_rmcp_plus, encode_v15,
};

/// Largest datagram we accept.
const MAX_DATAGRAM: usize = 1024;
/// Ignored datagrams recorded one by one per exchange; further ones are only counted (a
/// flood of them — a broken BMC, or spoofed packets — once grew the events by the
/// hundred thousand).
const IGNORED_RECORDED: usize = 4;

/// How a request may be retransmitted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Retransmit {
    /// Resend with a new session sequence number (safe for idempotent requests).
    Fresh,
    /// Never resend; wait the whole retry budget for the answer. For power cycle and hard
    /// reset: a BMC may run a repeated request again even when it is byte-identical (ipmi_sim
    /// resets twice), and a lost answer must not reset the host twice.
    Never,
}

/// The socket and the bookkeeping shared by the handshake and the session.
pub(super) struct Transport {
    pub(super) socket: Arc<UdpSocket>,
    pub(super) bmc: String,
    pub(super) retry: RetryPolicy,
    pub(super) events: Vec<Event>,
}

impl Transport {
    pub(super) fn record(&mut self, what: &'static str, step: &'static str, detail: String) {
        tracing::debug!(bmc = %self.bmc, what, step, detail = %detail, "ipmi exchange");
        self.events.push(Event {
            at: Instant::now(),
            what,
            step,
            detail,
        });
    }

    /// Records, once, how many ignored datagrams of an exchange were not recorded one by one.
    fn record_ignored_beyond(&mut self, step: &'static str, ignored: usize) {
        if ignored > IGNORED_RECORDED {
            let more = ignored - IGNORED_RECORDED;
            self.record(
                "ignored",
                step,
                format!("{more} more datagrams, not the answer"),
            );
        }
    }

    pub(super) fn io_error(&self, source: std::io::Error) -> IpmiError {
        if source.kind() == std::io::ErrorKind::ConnectionRefused {
            IpmiError::Unreachable {
                bmc: self.bmc.clone(),
            }
        } else {
            IpmiError::Io {
                bmc: self.bmc.clone(),
                source,
            }
        }
    }

    /// Sends what `make` builds and waits for a datagram `accept` takes, retransmitting per
    /// the policy (or, with [`Retransmit::Never`], sending once and waiting the policy's whole
    /// budget). `accept` returns `None` for datagrams that are not the answer (ignored),
    /// `Some(Err)` for an answer that ends the exchange with an error.
    pub(super) async fn exchange<S, T>(
        &mut self,
        state: &mut S,
        step: &'static str,
        retransmit: Retransmit,
        mut make: impl FnMut(&mut S) -> Result<Vec<u8>, IpmiError>,
        mut accept: impl FnMut(&mut S, &[u8]) -> Result<Option<T>, AcceptError>,
    ) -> Result<T, IpmiError> {
        let begun = Instant::now();
        let mut buf = [0u8; MAX_DATAGRAM];
        let mut last_malformed: Option<DecodeError> = None;
        let mut ignored = 0usize;
        let retry = match retransmit {
            Retransmit::Fresh => self.retry,
            Retransmit::Never => RetryPolicy {
                first_timeout: self.retry.worst_case(),
                max_timeout: self.retry.worst_case(),
                attempts: 1,
            },
        };
        let attempts = retry.attempts.max(1);
        for attempt in 0..attempts {
            let datagram = make(state)?;
            self.record(
                if attempt == 0 { "sent" } else { "retransmit" },
                step,
                format!("attempt {}", attempt + 1),
            );
            self.socket
                .send(&datagram)
                .await
                .map_err(|e| self.io_error(e))?;
            let deadline = Instant::now() + retry.attempt_timeout(attempt);
            loop {
                let received = tokio::time::timeout_at(deadline, self.socket.recv(&mut buf)).await;
                let Ok(received) = received else { break };
                let len = received.map_err(|e| self.io_error(e))?;
                match accept(state, &buf[..len]) {
                    Ok(Some(v)) => {
                        self.record_ignored_beyond(step, ignored);
                        self.record("received", step, format!("{len} bytes"));
                        return Ok(v);
                    }
                    Ok(None) => {
                        ignored += 1;
                        if ignored <= IGNORED_RECORDED {
                            self.record("ignored", step, format!("{len} bytes, not the answer"));
                        }
                    }
                    Err(AcceptError::Malformed(e)) => {
                        ignored += 1;
                        if ignored <= IGNORED_RECORDED {
                            self.record("ignored", step, e.to_string());
                        }
                        last_malformed = Some(e);
                    }
                    Err(AcceptError::Fatal(e)) => {
                        self.record_ignored_beyond(step, ignored);
                        self.record("received", step, e.to_string());
                        return Err(e);
                    }
                }
            }
        }
        self.record_ignored_beyond(step, ignored);
        if let Some(source) = last_malformed {
            return Err(IpmiError::Malformed {
                bmc: self.bmc.clone(),
                step,
                source,
            });
        }
        Err(IpmiError::Timeout {
            bmc: self.bmc.clone(),
            step,
            attempts,
            elapsed: begun.elapsed(),
        })
    }

    /// Sends a session-less IPMI 1.5 request and returns the response data (completion 0).
    pub(super) async fn presession(
        &mut self,
        rq_seq: u8,
        cmd: u8,
        data: Vec<u8>,
        step: &'static str,
    ) -> Result<Vec<u8>, IpmiError> {
        let req = IpmiRequest {
            netfn: NETFN_APP,
            cmd,
            rq_seq,
            data,
        };
        let datagram = encode_v15(&req.encode());
        let bmc = self.bmc.clone();
        self.exchange(
            &mut (),
            step,
            Retransmit::Fresh,
            |()| Ok(datagram.clone()),
            |(), dg| {
                // Some BMCs (pyghmi) answer session-less requests in RMCP+ format.
                let message = match decode_envelope(dg, 0)? {
                    Envelope::V15 { message, .. } => message,
                    Envelope::V20(p)
                        if p.payload_type == PayloadType::Ipmi as u8
                            && !p.authenticated
                            && !p.encrypted =>
                    {
                        p.payload
                    }
                    Envelope::V20(p) => {
                        return Err(DecodeError::UnexpectedPayloadType(p.payload_type).into());
                    }
                };
                let resp = IpmiResponse::decode(message)?;
                if !resp.answers(&req) {
                    return Ok(None);
                }
                if resp.completion != 0 {
                    return Err(AcceptError::Fatal(completion_error(
                        &bmc,
                        step,
                        resp.completion,
                    )));
                }
                Ok(Some(resp.data))
            },
        )
        .await
    }

    /// Sends an unauthenticated RMCP+ session-setup payload and returns the answer's payload.
    pub(super) async fn setup(
        &mut self,
        ptype: PayloadType,
        expect: PayloadType,
        payload: &[u8],
        step: &'static str,
    ) -> Result<Vec<u8>, IpmiError> {
        let (datagram, _) = encode_rmcp_plus(ptype, false, false, 0, 0, payload);
        self.exchange(
            &mut (),
            step,
            Retransmit::Fresh,
            |()| Ok(datagram.clone()),
            |(), dg| match decode_envelope(dg, 0)? {
                Envelope::V20(p) if p.payload_type == expect as u8 => Ok(Some(p.payload.to_vec())),
                _ => Ok(None),
            },
        )
        .await
    }
}

/// How `accept` rejects a datagram.
pub(super) enum AcceptError {
    /// Undecodable: ignored, remembered for the final error.
    Malformed(DecodeError),
    /// The answer says the exchange failed.
    Fatal(IpmiError),
}

impl From<DecodeError> for AcceptError {
    fn from(e: DecodeError) -> Self {
        Self::Malformed(e)
    }
}

pub(super) fn completion_error(bmc: &str, command: &'static str, code: u8) -> IpmiError {
    IpmiError::Completion {
        bmc: bmc.to_owned(),
        command,
        code,
        meaning: commands::completion_meaning(code),
    }
}

pub(super) fn random<const N: usize>(bmc: &str) -> Result<[u8; N], IpmiError> {
    let mut out = [0u8; N];
    getrandom::fill(&mut out).map_err(|_| IpmiError::Random {
        bmc: bmc.to_owned(),
    })?;
    Ok(out)
}

pub(super) async fn resolve(host: &str, port: u16, bmc: &str) -> Result<SocketAddr, IpmiError> {
    let mut addrs = tokio::net::lookup_host((host, port))
        .await
        .map_err(|source| IpmiError::Resolve {
            bmc: bmc.to_owned(),
            source,
        })?;
    addrs.next().ok_or_else(|| IpmiError::Resolve {
        bmc: bmc.to_owned(),
        source: std::io::Error::new(std::io::ErrorKind::NotFound, "no address"),
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::time::Duration;

    use tokio::net::UdpSocket;

    use super::{Retransmit, Transport};
    use crate::ipmi::client::RetryPolicy;
    use crate::ipmi::error::IpmiError;

    /// A peer that answers every request with a flood of datagrams that are not the answer.
    #[tokio::test]
    async fn a_flood_of_ignored_datagrams_is_counted_not_kept() {
        let bmc = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let socket = UdpSocket::bind("127.0.0.1:0").await.unwrap();
        socket.connect(bmc.local_addr().unwrap()).await.unwrap();
        bmc.connect(socket.local_addr().unwrap()).await.unwrap();
        let sent = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let flood = {
            let (sent, stop) = (sent.clone(), stop.clone());
            tokio::spawn(async move {
                let mut buf = [0u8; 64];
                let _ = bmc.recv(&mut buf).await;
                while !stop.load(Ordering::Relaxed) {
                    for _ in 0..64 {
                        if bmc.send(b"not an rmcp answer").await.is_ok() {
                            sent.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    tokio::task::yield_now().await;
                }
            })
        };
        let mut transport = Transport {
            socket: Arc::new(socket),
            bmc: "127.0.0.1:623".to_owned(),
            retry: RetryPolicy {
                first_timeout: Duration::from_millis(400),
                max_timeout: Duration::from_millis(400),
                attempts: 1,
            },
            events: Vec::new(),
        };
        let result: Result<(), IpmiError> = transport
            .exchange(
                &mut (),
                "test",
                Retransmit::Fresh,
                |()| Ok(b"request".to_vec()),
                |(), _| Ok(None),
            )
            .await;
        stop.store(true, Ordering::Relaxed);
        flood.await.unwrap();
        assert!(
            matches!(result, Err(IpmiError::Timeout { .. })),
            "{result:?}"
        );
        let flooded = sent.load(Ordering::Relaxed);
        assert!(flooded > 1_000, "the flood sent only {flooded} datagrams");
        assert!(
            transport.events.len() <= 16,
            "{} events kept for {flooded} ignored datagrams",
            transport.events.len()
        );
        let summary = transport.events.last().unwrap();
        assert!(
            summary.what == "ignored" && summary.detail.contains("more datagrams"),
            "{summary:?}"
        );
    }
}
