//! One etcd client per endpoint, each with a connect timeout, a request timeout and an
//! overall deadline around every call.
//!
//! `etcd-client` balances one client over all endpoints, so a status call lands on whichever
//! endpoint the balancer picks and a dead endpoint fails a share of all calls. Observation
//! therefore needs one client per endpoint (DOMAIN.md §1).

use crate::error::{EtcdError, classify_client_error};
use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};
use std::future::Future;
use std::path::PathBuf;
use std::time::Duration;

/// Default time to establish a connection to one endpoint.
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// Default time for one probe (status, member list) to answer: a hung member shows as
/// unhealthy after this long.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_millis(1500);
/// Default time for one membership change (add, promote, remove, move leader) to answer.
pub const DEFAULT_CHANGE_TIMEOUT: Duration = Duration::from_secs(10);

/// Files for TLS to etcd: the CA bundle, and a client certificate and key.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TlsFiles {
    /// PEM CA bundle that signed the etcd server certificates.
    pub ca: Option<PathBuf>,
    /// PEM client certificate.
    pub cert: Option<PathBuf>,
    /// PEM client private key (never logged).
    pub key: Option<PathBuf>,
}

/// How to reach etcd.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientSettings {
    /// The configured endpoints (`http://host:2379` or `https://…`).
    pub endpoints: Vec<String>,
    /// TLS files, used for `https://` endpoints.
    pub tls: Option<TlsFiles>,
    /// Time to establish a connection.
    pub connect_timeout: Duration,
    /// Deadline of a probe; a member that does not answer within it is unhealthy.
    pub probe_timeout: Duration,
    /// Deadline of a membership change.
    pub change_timeout: Duration,
}

impl ClientSettings {
    /// Settings for these endpoints with the default timeouts and no TLS.
    pub fn new(endpoints: Vec<String>) -> Self {
        Self {
            endpoints,
            tls: None,
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            probe_timeout: DEFAULT_PROBE_TIMEOUT,
            change_timeout: DEFAULT_CHANGE_TIMEOUT,
        }
    }

    fn read_tls(&self) -> Result<Option<TlsOptions>, EtcdError> {
        let Some(files) = &self.tls else {
            return Ok(None);
        };
        let read = |path: &PathBuf| {
            std::fs::read(path).map_err(|source| EtcdError::TlsFile {
                path: path.clone(),
                source,
            })
        };
        let mut tls = TlsOptions::new();
        if let Some(ca) = &files.ca {
            tls = tls.ca_certificate(Certificate::from_pem(read(ca)?));
        }
        if let (Some(cert), Some(key)) = (&files.cert, &files.key) {
            tls = tls.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        Ok(Some(tls))
    }

    /// Connects a client to exactly one endpoint, with timeouts set for `request_timeout`.
    ///
    /// The connection itself is lazy: an unreachable endpoint fails on the first call.
    pub async fn connect_one(
        &self,
        endpoint: &str,
        request_timeout: Duration,
    ) -> Result<Client, EtcdError> {
        let mut options = ConnectOptions::new()
            .with_connect_timeout(self.connect_timeout)
            .with_timeout(request_timeout);
        if endpoint.starts_with("https://")
            && let Some(tls) = self.read_tls()?
        {
            options = options.with_tls(tls);
        }
        let deadline = self.connect_timeout + request_timeout;
        bounded(
            "connect",
            endpoint,
            deadline,
            Client::connect([endpoint], Some(options)),
        )
        .await
    }
}

/// Runs one etcd call under an overall deadline, mapping its error with the endpoint named.
pub(crate) async fn bounded<T>(
    operation: &'static str,
    endpoint: &str,
    deadline: Duration,
    call: impl Future<Output = Result<T, etcd_client::Error>>,
) -> Result<T, EtcdError> {
    match tokio::time::timeout(deadline, call).await {
        Ok(Ok(value)) => Ok(value),
        Ok(Err(source)) => Err(EtcdError::Call {
            operation,
            endpoint: endpoint.to_owned(),
            kind: classify_client_error(&source),
            source,
        }),
        Err(_) => Err(EtcdError::Deadline {
            operation,
            endpoint: endpoint.to_owned(),
            timeout: deadline,
        }),
    }
}
