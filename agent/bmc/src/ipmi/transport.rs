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
                        self.record("received", step, format!("{len} bytes"));
                        return Ok(v);
                    }
                    Ok(None) => {
                        self.record("ignored", step, format!("{len} bytes, not the answer"));
                    }
                    Err(AcceptError::Malformed(e)) => {
                        self.record("ignored", step, e.to_string());
                        last_malformed = Some(e);
                    }
                    Err(AcceptError::Fatal(e)) => {
                        self.record("received", step, e.to_string());
                        return Err(e);
                    }
                }
            }
        }
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
