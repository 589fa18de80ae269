//! One Redfish HTTP exchange: headers, authentication, bounded body, error mapping and the
//! retry policy for idempotent reads.

use std::time::Duration;

use reqwest::{Method, StatusCode, header};
use serde::de::DeserializeOwned;

use super::models::ErrorBody;
use crate::error::bmc_text;
use crate::{BmcError, Credentials, Timeline};

/// Largest answer body read from a BMC; anything longer is refused as undecodable.
pub(crate) const MAX_BODY_BYTES: usize = 1024 * 1024;
/// Longest `Retry-After` honoured; longer values are cut to this (the deadline still rules).
pub(crate) const MAX_RETRY_AFTER: Duration = Duration::from_secs(5);

/// How requests are authenticated.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Auth {
    /// HTTP basic authentication on every request.
    Basic,
    /// A Redfish session token (`X-Auth-Token`), and the session URI to delete on logout.
    Session {
        token: zeroize::Zeroizing<String>,
        location: Option<String>,
    },
}

/// An answer: status, selected headers and the (bounded) body.
#[derive(Debug)]
pub(crate) struct Answer {
    pub status: StatusCode,
    pub body: Vec<u8>,
    pub auth_token: Option<zeroize::Zeroizing<String>>,
    pub location: Option<String>,
    pub retry_after: Option<Duration>,
}

impl Answer {
    pub(crate) fn decode<T: DeserializeOwned>(&self, bmc: &str, what: &str) -> Result<T, BmcError> {
        serde_json::from_slice(&self.body).map_err(|source| BmcError::Decode {
            bmc: bmc.to_owned(),
            what: bmc_text(what),
            source: Box::new(source),
        })
    }

    /// What the BMC said when it refused a login, prefixed with `: `, or empty: its most
    /// specific message and every `MessageId` (an account lock may be named only there).
    pub(crate) fn refusal_detail(&self) -> String {
        let Ok(body) = serde_json::from_slice::<ErrorBody>(&self.body) else {
            return String::new();
        };
        let summary = body.summary();
        let ids: Vec<String> = body
            .error
            .iter()
            .flat_map(|e| e.extended_info.iter())
            .filter_map(|info| info.message_id.clone())
            .filter(|id| summary.as_deref() != Some(id.as_str()))
            .collect();
        let text = match (summary, ids.is_empty()) {
            (Some(summary), true) => summary,
            (Some(summary), false) => format!("{summary} ({})", ids.join(", ")),
            (None, false) => ids.join(", "),
            (None, true) => return String::new(),
        };
        format!(": {}", bmc_text(&text))
    }

    /// Maps a failure status to an error; `Ok` for 2xx.
    pub(crate) fn check(&self, bmc: &str, what: &str) -> Result<(), BmcError> {
        if self.status.is_success() {
            return Ok(());
        }
        Err(match self.status {
            StatusCode::UNAUTHORIZED => BmcError::Authentication {
                bmc: bmc.to_owned(),
                detail: self.refusal_detail(),
            },
            StatusCode::FORBIDDEN => BmcError::Privilege {
                bmc: bmc.to_owned(),
                what: bmc_text(what),
            },
            status => BmcError::HttpStatus {
                bmc: bmc.to_owned(),
                what: bmc_text(what),
                status: status.as_u16(),
                detail: serde_json::from_slice::<ErrorBody>(&self.body)
                    .ok()
                    .and_then(|body| body.summary())
                    .map(|text| format!(": {}", bmc_text(&text)))
                    .unwrap_or_default(),
            },
        })
    }
}

/// The HTTP side of a Redfish client.
#[derive(Debug)]
pub(crate) struct Http {
    pub client: reqwest::Client,
    pub base_url: String,
    pub bmc: String,
    pub request_timeout: Duration,
    pub credentials: Credentials,
    pub auth: Auth,
    /// Attempts for idempotent reads (1 = no retry).
    pub read_attempts: u32,
    /// First pause between attempts; doubles each time.
    pub retry_backoff: Duration,
}

impl Http {
    /// Sends one request once. `body` is JSON; `secret_body` keeps it out of the timeline.
    pub(crate) async fn send_once(
        &self,
        timeline: &mut Timeline,
        method: Method,
        path: &str,
        body: Option<&serde_json::Value>,
        authenticate: bool,
    ) -> Result<Answer, BmcError> {
        // The path may come from the BMC (a member's `@odata.id`): quoted escaped and cut.
        let what = format!("{method} {}", bmc_text(path));
        timeline.sent(what.clone());
        let mut request = self
            .client
            .request(method, format!("{}{path}", self.base_url))
            .header(header::ACCEPT, "application/json")
            .header("OData-Version", "4.0");
        if authenticate {
            request = match &self.auth {
                Auth::Basic => request.basic_auth(
                    self.credentials.username(),
                    Some(self.credentials.password()),
                ),
                Auth::Session { token, .. } => request.header("X-Auth-Token", token.as_str()),
            };
        }
        if let Some(body) = body {
            request = request.json(body);
        }
        let mut response = request.send().await.map_err(|error| {
            let error = self.transport_error(&what, error);
            timeline.seen(format!("{what}: {error}"));
            error
        })?;
        let status = response.status();
        let headers = response.headers();
        let text = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_owned)
        };
        let auth_token = text("x-auth-token").map(zeroize::Zeroizing::new);
        let location = text("location");
        let retry_after = text("retry-after")
            .and_then(|v| v.trim().parse::<u64>().ok())
            .map(|secs| Duration::from_secs(secs).min(MAX_RETRY_AFTER));
        let mut body = Vec::new();
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > MAX_BODY_BYTES {
                        timeline.seen(format!("{status} with a body over {MAX_BODY_BYTES} bytes"));
                        return Err(BmcError::Protocol {
                            bmc: self.bmc.clone(),
                            detail: format!(
                                "answer to {what} is larger than {MAX_BODY_BYTES} bytes"
                            ),
                        });
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(error) => {
                    let error = self.transport_error(&what, error);
                    timeline.seen(format!("{what}: {error}"));
                    return Err(error);
                }
            }
        }
        timeline.seen(format!("{} ({} bytes)", status.as_u16(), body.len()));
        Ok(Answer {
            status,
            body,
            auth_token,
            location,
            retry_after,
        })
    }

    /// GET with retries on connect errors and 5xx (honouring `Retry-After`), then status check.
    pub(crate) async fn get(
        &self,
        timeline: &mut Timeline,
        path: &str,
    ) -> Result<Answer, BmcError> {
        let what = format!("GET {path}");
        let mut pause = self.retry_backoff;
        let mut attempt = 1;
        loop {
            let result = self
                .send_once(timeline, Method::GET, path, None, true)
                .await;
            let (retry, wait) = match &result {
                Err(BmcError::Connect { .. } | BmcError::Transport { .. }) => (true, None),
                Ok(answer) if answer.status.is_server_error() => (true, answer.retry_after),
                _ => (false, None),
            };
            if !retry || attempt >= self.read_attempts {
                let answer = result?;
                answer.check(&self.bmc, &what)?;
                return Ok(answer);
            }
            let wait = wait.unwrap_or(pause);
            timeline.note(format!(
                "transient failure, attempt {attempt} of {}; retrying in {wait:?}",
                self.read_attempts
            ));
            tokio::time::sleep(wait).await;
            pause *= 2;
            attempt += 1;
        }
    }

    fn transport_error(&self, what: &str, error: reqwest::Error) -> BmcError {
        if error.is_timeout() {
            BmcError::Timeout {
                bmc: self.bmc.clone(),
                what: what.to_owned(),
                timeout: self.request_timeout,
            }
        } else if let Some(tls) = rustls_cause(&error) {
            BmcError::Tls {
                bmc: self.bmc.clone(),
                detail: tls.to_string(),
            }
        } else if error.is_connect() {
            BmcError::Connect {
                bmc: self.bmc.clone(),
                source: Box::new(error.without_url()),
            }
        } else {
            BmcError::Transport {
                bmc: self.bmc.clone(),
                what: what.to_owned(),
                source: Box::new(error.without_url()),
            }
        }
    }
}

/// The rustls error somewhere in a transport error's chain (a refused certificate, an alert).
fn rustls_cause<'a>(error: &'a (dyn std::error::Error + 'static)) -> Option<&'a rustls::Error> {
    let mut current = Some(error);
    while let Some(error) = current {
        if let Some(tls) = error.downcast_ref::<rustls::Error>() {
            return Some(tls);
        }
        // `io::Error::source` skips the wrapped error itself: step into it explicitly.
        if let Some(inner) = error
            .downcast_ref::<std::io::Error>()
            .and_then(|io| io.get_ref())
        {
            current = Some(inner);
            continue;
        }
        current = error.source();
    }
    None
}
