//! One etcd client per endpoint, with failover.
//!
//! A single `etcd-client` over several endpoints keeps sending to a dead one: with one member
//! of three down ~40-50% of calls failed with `tcp connect error` (DOMAIN §1), which would
//! make a healthy cluster look quorum-less and the leader step down. Each call here starts at
//! the endpoint that answered last and moves on only for transport-level failures
//! (unreachable, timed out); an answer from etcd (including a refused compare) is final. A
//! hung member costs one request timeout, after which calls stay on the endpoint that answered.

use std::future::Future;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};

use super::BackendError;

/// gRPC codes that say "this endpoint could not answer": Unavailable, DeadlineExceeded, and
/// Cancelled (what the client's own request timeout produces: "Timeout expired").
const TRANSPORT_CODES: [i32; 3] = [14, 4, 1];

/// Clients for every endpoint, connected on first use.
pub struct Endpoints {
    urls: Vec<String>,
    clients: Vec<Option<Client>>,
    options: ConnectOptions,
    current: usize,
    timeout: Duration,
}

/// True for failures that another endpoint may not have.
fn is_transport(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
        etcd_client::Error::GRpcStatus(status) => TRANSPORT_CODES.contains(&(status.code() as i32)),
        _ => false,
    }
}

/// An `IoError` standing for a call that did not finish in time (so it fails over).
pub fn timed_out(what: &str, after: Duration) -> etcd_client::Error {
    etcd_client::Error::IoError(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("{what} had no answer within {after:?}"),
    ))
}

impl Endpoints {
    /// Endpoints with a per-request and connect `timeout`; nothing is connected yet.
    pub fn new(urls: &[String], timeout: Duration) -> Self {
        Self {
            urls: urls.to_vec(),
            clients: vec![None; urls.len()],
            options: ConnectOptions::new()
                .with_timeout(timeout)
                .with_connect_timeout(timeout),
            current: 0,
            timeout,
        }
    }

    /// The per-request timeout.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    async fn client(&mut self, i: usize) -> Result<Client, etcd_client::Error> {
        if let Some(client) = &self.clients[i] {
            return Ok(client.clone());
        }
        let client = Client::connect([&self.urls[i]], Some(self.options.clone())).await?;
        self.clients[i] = Some(client.clone());
        Ok(client)
    }

    /// Runs `call` against the endpoints in turn until one answers.
    pub async fn call<T, F, Fut>(&mut self, what: &str, call: F) -> Result<T, BackendError>
    where
        F: Fn(Client) -> Fut,
        Fut: Future<Output = Result<T, etcd_client::Error>>,
    {
        let n = self.urls.len();
        let mut last = None;
        for k in 0..n {
            let i = (self.current + k) % n;
            let result = match self.client(i).await {
                Ok(client) => call(client).await,
                Err(error) => Err(error),
            };
            match result {
                Ok(value) => {
                    self.current = i;
                    return Ok(value);
                }
                Err(error) if is_transport(&error) => {
                    tracing::debug!(endpoint = %self.urls[i], %error, what, "etcd endpoint failed; trying the next");
                    last = Some(error);
                }
                Err(error) => return Err(unavailable(what, error)),
            }
        }
        Err(unavailable(
            what,
            last.unwrap_or_else(|| etcd_client::Error::InvalidArgs("no etcd endpoints".into())),
        ))
    }

    /// A client for a long-lived stream (a watch), trying the next endpoint each time.
    pub async fn next_client(&mut self) -> Option<Client> {
        let n = self.urls.len();
        for _ in 0..n {
            let i = self.current;
            self.current = (self.current + 1) % n;
            if let Ok(client) = self.client(i).await {
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
            options: self.options.clone(),
            current: self.current,
            timeout: self.timeout,
        }
    }
}

/// A store failure naming what was attempted.
pub fn unavailable(what: &str, error: etcd_client::Error) -> BackendError {
    BackendError::Unavailable {
        what: what.to_owned(),
        source: Box::new(error),
    }
}
