//! The agent's release on every request ([`VERSION_HEADER`]), judged against ours by the skew
//! policy (`metalguard_api::skew`), and bodies read as that judgement allows: a newer agent's
//! unknown fields left out, anyone else's refused. Every answer carries our release.
//!
//! Outside the policy no authority crosses: an agent outside it is given no command (its
//! long-poll is answered 426 naming both versions). What it tells is still read, strictly:
//! reports (a host is never fenced for running an unsupported release), results (a fence's
//! verified outcome) and holds (a person's break-glass fence). It shows in the log and in
//! `metalguard_controller_agent_release{supported="false"}`.

use axum::extract::{FromRequest, FromRequestParts, Request};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use metalguard_api::skew::{self, Skew, SkewError, Tolerance, VERSION_HEADER, Version, decode};
use serde::de::DeserializeOwned;

use super::refuse;
use crate::api::hub::Hub;

/// Records the release a reporting agent sent (the per-host gauge) and says once, when it
/// changes, that it is outside the policy.
pub fn note(hub: &Hub, host: &str, agent: &AgentVersion) {
    let release = agent
        .version
        .map_or_else(|| "unknown".to_owned(), |version| version.to_string());
    let supported = agent.skew.is_ok();
    if hub.note_release(host, release, supported) {
        match &agent.skew {
            Ok(skew) => {
                tracing::info!(%host, release = ?agent.version.map(|v| v.to_string()), ?skew, "agent release");
            }
            Err(error) => {
                tracing::warn!(%host, %error, "agent release outside the skew policy: its reports are read, it is given no command");
            }
        }
    }
}

/// Adds our release to every answer (a layer over the whole router).
pub async fn announce(mut response: Response) -> Response {
    let (name, release) = skew::our_header();
    // A version is digits and dots: always a header value.
    if let Ok(value) = HeaderValue::from_str(&release) {
        response.headers_mut().insert(name, value);
    }
    response
}

/// The requesting agent's release and where it stands.
#[derive(Debug, Clone)]
pub struct AgentVersion {
    /// What the header said (or [`skew::UNVERSIONED`] without one).
    pub version: Option<Version>,
    /// Within the policy: how it stands; outside: why not.
    pub skew: Result<Skew, SkewError>,
}

impl AgentVersion {
    /// Judges a request's header.
    pub fn of(parts: &Parts) -> Self {
        let header = parts
            .headers
            .get(VERSION_HEADER)
            .map(|value| value.to_str().unwrap_or("<not text>"));
        match skew::judge(Version::ours(), "controller", header, "agent") {
            Ok((version, skew)) => Self {
                version: Some(version),
                skew: Ok(skew),
            },
            Err(error) => Self {
                version: match &error {
                    SkewError::Unsupported { peer, .. } => Some(*peer),
                    SkewError::Malformed(_) => None,
                },
                skew: Err(error),
            },
        }
    }

    /// 426 for an agent outside the policy, for the request that carries authority: its
    /// commands.
    #[allow(clippy::result_large_err)] // the refusal is the answer itself
    pub fn within_policy(&self, host: &str, what: &str) -> Result<Skew, Response> {
        self.skew.clone().map_err(|error| {
            tracing::warn!(%host, %error, "agent {what} refused: its release is outside the skew policy");
            refuse(StatusCode::UPGRADE_REQUIRED, format!("{what}: {error}"))
        })
    }

    /// How its bodies are read: a newer agent's unknown fields are left out; outside the
    /// policy, strictly.
    pub fn tolerance(&self) -> Tolerance {
        self.skew
            .as_ref()
            .map_or(Tolerance::Strict, |skew| skew.tolerance())
    }
}

impl<S: Send + Sync> FromRequestParts<S> for AgentVersion {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, _state: &S) -> Result<Self, Response> {
        Self::read(parts)
    }
}

impl AgentVersion {
    /// [`AgentVersion::of`], with 400 for a header that is not a version.
    #[allow(clippy::result_large_err)] // the refusal is the answer itself
    fn read(parts: &Parts) -> Result<Self, Response> {
        let agent = Self::of(parts);
        if let Err(error @ SkewError::Malformed(_)) = &agent.skew {
            return Err(refuse(
                StatusCode::BAD_REQUEST,
                format!("header {VERSION_HEADER}: {error}"),
            ));
        }
        Ok(agent)
    }
}

/// A JSON body read as the agent's release allows ([`AgentVersion::tolerance`]), with that
/// release: 415 without a JSON content type, 400 for bytes that are not JSON, 422 for JSON
/// that is not the message (the answers of axum's `Json` it replaces).
#[derive(Debug)]
pub struct Peer<T> {
    /// The message.
    pub body: T,
    /// The sender's release.
    pub agent: AgentVersion,
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for Peer<T> {
    type Rejection = Response;

    async fn from_request(request: Request, state: &S) -> Result<Self, Response> {
        let (parts, body) = request.into_parts();
        let agent = AgentVersion::read(&parts)?;
        let json = parts
            .headers
            .get(header::CONTENT_TYPE)
            .and_then(|value| value.to_str().ok())
            .and_then(|value| value.split(';').next())
            .is_some_and(|mime| {
                let mime = mime.trim().to_ascii_lowercase();
                mime == "application/json"
                    || (mime.starts_with("application/") && mime.ends_with("+json"))
            });
        if !json {
            return Err(refuse(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                "expected request with `Content-Type: application/json`".to_owned(),
            ));
        }
        let request = Request::from_parts(parts, body);
        let bytes = axum::body::Bytes::from_request(request, state)
            .await
            .map_err(axum::response::IntoResponse::into_response)?;
        match decode::<T>(&bytes, agent.tolerance()) {
            Ok(decoded) => {
                if !decoded.ignored.is_empty() {
                    tracing::debug!(
                        agent = ?agent.version.map(|v| v.to_string()),
                        ignored = ?decoded.ignored,
                        "fields of a newer agent left out"
                    );
                }
                Ok(Self {
                    body: decoded.value,
                    agent,
                })
            }
            Err(error) => {
                let status = if error.malformed {
                    StatusCode::BAD_REQUEST
                } else {
                    StatusCode::UNPROCESSABLE_ENTITY
                };
                Err(refuse(status, format!("request body: {error}")))
            }
        }
    }
}
