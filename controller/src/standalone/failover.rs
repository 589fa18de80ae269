//! One etcd client per endpoint, with failover.
//!
//! A single `etcd-client` over several endpoints keeps sending to a dead one: with one member
//! of three down ~40-50% of calls failed with `tcp connect error` (DOMAIN §1), which would
//! make a healthy cluster look quorum-less and the leader step down. Each call here starts at
//! the endpoint that answered last and moves on only for transport-level failures
//! (unreachable, timed out, TLS refused); an answer from etcd (including a refused compare) is
//! final. A hung member costs one request timeout, after which calls stay on the endpoint that
//! answered.
//!
//! Every connect and every call sits under a deadline of its own, a backstop half a request
//! timeout after the client's own: the client's timeouts do not cover a TLS handshake that
//! never finishes (a listener that accepts and never answers hung a call for minutes). Only
//! when the backstop fires is the endpoint's client dropped and made afresh; a call the client
//! timed out itself (etcd busy electing) keeps its connection. When no endpoint answers, the
//! error lists each endpoint with how it failed ([`super::diagnosis`]).

use std::future::Future;
use std::time::Duration;

use etcd_client::Client;

use super::access::EtcdAccess;
use super::diagnosis::{EndpointFailure, EndpointFailures, describe};
use crate::backend::BackendError;

/// gRPC codes that say "this endpoint could not answer": Unavailable, DeadlineExceeded, and
/// Cancelled (what the client's own request timeout produces: "Timeout expired", and what a
/// connection closed under a call gives).
const TRANSPORT_CODES: [i32; 3] = [14, 4, 1];
/// gRPC Unknown, which tonic gives a broken connection ("transport error").
const CODE_UNKNOWN: i32 = 2;

/// Clients for every endpoint, connected on first use.
pub struct Endpoints {
    urls: Vec<String>,
    clients: Vec<Option<Client>>,
    access: EtcdAccess,
    current: usize,
}

/// True for failures that another endpoint may not have.
fn is_transport(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(status) => {
            let code = status.code() as i32;
            TRANSPORT_CODES.contains(&code)
                || (code == CODE_UNKNOWN && status.message() == "transport error")
        }
        _ => false,
    }
}

/// What one attempt at one endpoint gave.
enum Attempt<T> {
    Answer(T),
    Failed(etcd_client::Error),
    NoAnswer,
}

/// An `IoError` standing for a call that did not finish in time (so it fails over).
pub fn timed_out(what: &str, after: Duration) -> etcd_client::Error {
    etcd_client::Error::IoError(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("{what} had no answer within {after:?}"),
    ))
}

impl Endpoints {
    /// Endpoints reached with `access` (TLS, user, timeouts); nothing is connected yet.
    pub fn new(urls: &[String], access: EtcdAccess) -> Self {
        Self {
            urls: urls.to_vec(),
            clients: vec![None; urls.len()],
            access,
            current: 0,
        }
    }

    /// The per-request timeout.
    pub fn timeout(&self) -> Duration {
        self.access.timeout()
    }

    /// The deadline of one connect or call: after the client's own timeout, so that this one
    /// fires only where the client's does not.
    fn backstop(&self) -> Duration {
        self.timeout() + self.timeout() / 2
    }

    /// A client of endpoint `i`, connected under the request timeout (connecting
    /// authenticates when a user is configured).
    async fn client(&mut self, i: usize) -> Attempt<Client> {
        if let Some(client) = &self.clients[i] {
            return Attempt::Answer(client.clone());
        }
        let connect = Client::connect([&self.urls[i]], Some(self.access.options()));
        match tokio::time::timeout(self.backstop(), connect).await {
            Ok(Ok(client)) => {
                self.clients[i] = Some(client.clone());
                Attempt::Answer(client)
            }
            Ok(Err(error)) => Attempt::Failed(error),
            Err(_) => Attempt::NoAnswer,
        }
    }

    /// Runs `call` against the endpoints in turn until one answers; each attempt (connecting
    /// included) has the request timeout as its deadline.
    pub async fn call<T, F, Fut>(&mut self, what: &str, call: F) -> Result<T, BackendError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let n = self.urls.len();
        let mut failures = Vec::new();
        for k in 0..n {
            let i = (self.current + k) % n;
            let attempt = match self.client(i).await {
                Attempt::Answer(client) => {
                    match tokio::time::timeout(self.backstop(), call(client)).await {
                        Ok(Ok(value)) => Attempt::Answer(value),
                        Ok(Err(error)) => Attempt::Failed(error),
                        Err(_) => Attempt::NoAnswer,
                    }
                }
                Attempt::Failed(error) => Attempt::Failed(error),
                Attempt::NoAnswer => Attempt::NoAnswer,
            };
            let endpoint = &self.urls[i];
            match attempt {
                Attempt::Answer(value) => {
                    self.current = i;
                    return Ok(value);
                }
                Attempt::NoAnswer => {
                    tracing::debug!(%endpoint, what, "etcd endpoint did not answer in time; trying the next");
                    // A connection stuck in its handshake never recovers: start afresh next time.
                    self.clients[i] = None;
                    failures.push(EndpointFailure::timeout(endpoint, self.backstop()));
                }
                Attempt::Failed(error) if is_transport(&error) => {
                    tracing::debug!(%endpoint, %error, what, "etcd endpoint failed; trying the next");
                    failures.push(describe(endpoint, &error, &self.access).await);
                }
                Attempt::Failed(error) => {
                    let failure = describe(endpoint, &error, &self.access).await;
                    return Err(unavailable(what, vec![failure]));
                }
            }
        }
        Err(unavailable(what, failures))
    }

    /// A client for a long-lived stream (a watch), trying the next endpoint each time.
    pub async fn next_client(&mut self) -> Option<Client> {
        let n = self.urls.len();
        for _ in 0..n {
            let i = self.current;
            self.current = (self.current + 1) % n;
            if let Attempt::Answer(client) = self.client(i).await {
                return Some(client);
            }
        }
        None
    }

    /// A copy for a background task (clients are shared, cheap handles).
    pub fn share(&self) -> Self {
        Self {
            urls: self.urls.clone(),
            clients: self.clients.clone(),
            access: self.access.clone(),
            current: self.current,
        }
    }
}

/// A store failure naming what was attempted and how each endpoint tried failed.
fn unavailable(what: &str, failures: Vec<EndpointFailure>) -> BackendError {
    let failures = if failures.is_empty() {
        vec![EndpointFailure {
            endpoint: "(none)".to_owned(),
            kind: super::diagnosis::FailureKind::Other,
            detail: "no etcd endpoints are configured".to_owned(),
        }]
    } else {
        failures
    };
    BackendError::Unavailable {
        what: what.to_owned(),
        source: Box::new(EndpointFailures(failures)),
    }
}
