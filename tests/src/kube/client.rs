//! The harness's own client of the Kubernetes API: plain HTTPS with `reqwest` (blocking) and
//! JSON, independent of the kube-rs client the code under test uses, so a bug in one cannot
//! hide itself in the other. Paths are written out (`/api/v1/nodes/w-1`); every method names
//! the request in its errors and returns the server's `Status` message on failure.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde_json::Value;

use crate::{HarnessError, Result};

/// Per-request timeout (a watch is never made through this client).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);
/// TCP connect timeout.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How a client proves who it is.
#[derive(Debug, Clone)]
pub enum Credentials {
    /// A client certificate and key (PEM files).
    Certificate {
        /// Certificate.
        cert: std::path::PathBuf,
        /// Key.
        key: std::path::PathBuf,
    },
    /// A bearer token.
    Token(String),
}

/// An answer: status and body (JSON, or the text as a JSON string when it is not JSON).
#[derive(Debug, Clone)]
pub struct Answer {
    /// HTTP status.
    pub status: u16,
    /// Body.
    pub body: Value,
}

impl Answer {
    /// The `message` of a `Status` body, else the body as text.
    pub fn message(&self) -> String {
        self.body["message"]
            .as_str()
            .map_or_else(|| self.body.to_string(), str::to_owned)
    }
}

/// A client of one API server as one identity.
#[derive(Clone)]
pub struct ApiClient {
    http: reqwest::blocking::Client,
    server: String,
    token: Option<String>,
}

impl std::fmt::Debug for ApiClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ApiClient")
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

fn tls_err(what: &str) -> impl FnOnce(rustls::Error) -> HarnessError + '_ {
    move |e| HarnessError::Other(format!("{what}: {e}"))
}

fn pem_err<E: std::fmt::Display>(path: &Path) -> impl FnOnce(E) -> HarnessError + '_ {
    move |e| HarnessError::Other(format!("reading PEM {}: {e}", path.display()))
}

impl ApiClient {
    /// A client of `server` (`https://127.0.0.1:PORT`) trusting `ca` (PEM file).
    pub fn new(server: &str, ca: &Path, credentials: &Credentials) -> Result<Self> {
        Self::with_timeout(server, ca, credentials, REQUEST_TIMEOUT)
    }

    /// [`ApiClient::new`] whose requests give up after `timeout` (for a caller that must not
    /// wait on a stalled API server, like the lab's narration).
    pub fn with_timeout(
        server: &str,
        ca: &Path,
        credentials: &Credentials,
        timeout: Duration,
    ) -> Result<Self> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut roots = rustls::RootCertStore::empty();
        for cert in CertificateDer::pem_file_iter(ca).map_err(pem_err(ca))? {
            roots
                .add(cert.map_err(pem_err(ca))?)
                .map_err(tls_err("adding the cluster CA"))?;
        }
        let builder = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(tls_err("TLS versions"))?
            .with_root_certificates(roots);
        let (config, token) = match credentials {
            Credentials::Certificate { cert, key } => {
                let chain = CertificateDer::pem_file_iter(cert)
                    .map_err(pem_err(cert))?
                    .collect::<std::result::Result<Vec<_>, _>>()
                    .map_err(pem_err(cert))?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(pem_err(key))?;
                (
                    builder
                        .with_client_auth_cert(chain, key)
                        .map_err(tls_err("client certificate"))?,
                    None,
                )
            }
            Credentials::Token(token) => (builder.with_no_client_auth(), Some(token.clone())),
        };
        let http = reqwest::blocking::Client::builder()
            .tls_backend_preconfigured(config)
            .timeout(timeout)
            .connect_timeout(CONNECT_TIMEOUT.min(timeout))
            .build()
            .map_err(|e| HarnessError::Other(format!("building the API client: {e}")))?;
        Ok(Self {
            http,
            server: server.trim_end_matches('/').to_owned(),
            token,
        })
    }

    /// The server URL.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// Sends a request and returns whatever the server answered (any status).
    pub fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        content_type: &str,
    ) -> Result<Answer> {
        let what = format!("{method} {path}");
        let method = reqwest::Method::from_bytes(method.as_bytes())
            .map_err(|_| HarnessError::Other(format!("bad method in {what}")))?;
        let mut request = self
            .http
            .request(method, format!("{}{path}", self.server))
            .header("Accept", "application/json");
        if let Some(token) = &self.token {
            request = request.bearer_auth(token);
        }
        if let Some(body) = body {
            request = request
                .header("Content-Type", content_type)
                .body(body.to_string());
        }
        let response = request
            .send()
            .map_err(|e| HarnessError::Other(format!("{what}: {e}")))?;
        let status = response.status().as_u16();
        let text = response
            .text()
            .map_err(|e| HarnessError::Other(format!("{what}: reading the answer: {e}")))?;
        let body = serde_json::from_str(&text).unwrap_or(Value::String(text));
        Ok(Answer { status, body })
    }

    /// [`ApiClient::call`] that fails on any status but 2xx.
    pub fn send(
        &self,
        method: &str,
        path: &str,
        body: Option<&Value>,
        content_type: &str,
    ) -> Result<Value> {
        // As client-go does: 429 (a watch cache still initializing after a CRD was created,
        // or priority and fairness) is waited out, within 10 s.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut answer = self.call(method, path, body, content_type)?;
        while answer.status == 429 && std::time::Instant::now() < deadline {
            std::thread::sleep(std::time::Duration::from_millis(250));
            answer = self.call(method, path, body, content_type)?;
        }
        if (200..300).contains(&answer.status) {
            Ok(answer.body)
        } else {
            Err(HarnessError::Api {
                what: format!("{method} {path}"),
                status: answer.status,
                message: answer.message(),
            })
        }
    }

    /// GET.
    pub fn get(&self, path: &str) -> Result<Value> {
        self.send("GET", path, None, "")
    }

    /// GET, `None` on 404.
    pub fn get_opt(&self, path: &str) -> Result<Option<Value>> {
        match self.get(path) {
            Ok(v) => Ok(Some(v)),
            Err(e) if e.api_status() == Some(404) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The `items` of a list.
    pub fn list(&self, path: &str) -> Result<Vec<Value>> {
        Ok(self.get(path)?["items"]
            .as_array()
            .cloned()
            .unwrap_or_default())
    }

    /// POST `object` to the collection `path`.
    pub fn create(&self, path: &str, object: &Value) -> Result<Value> {
        self.send("POST", path, Some(object), "application/json")
    }

    /// Server-side apply of `object` at `path` as `manager` (`force` takes over conflicting
    /// fields).
    pub fn apply(&self, path: &str, manager: &str, object: &Value, force: bool) -> Result<Value> {
        let path = format!("{path}?fieldManager={manager}&force={force}");
        self.send("PATCH", &path, Some(object), "application/apply-patch+yaml")
    }

    /// JSON merge patch.
    pub fn merge_patch(&self, path: &str, change: &Value) -> Result<Value> {
        self.send("PATCH", path, Some(change), "application/merge-patch+json")
    }

    /// Strategic merge patch (lists of built-in types merged by their keys).
    pub fn strategic_patch(&self, path: &str, change: &Value) -> Result<Value> {
        self.send(
            "PATCH",
            path,
            Some(change),
            "application/strategic-merge-patch+json",
        )
    }

    /// DELETE; a missing object is not an error.
    pub fn delete(&self, path: &str) -> Result<()> {
        match self.send("DELETE", path, None, "") {
            Ok(_) => Ok(()),
            Err(e) if e.api_status() == Some(404) => Ok(()),
            Err(e) => Err(e),
        }
    }
}
