//! The agent API's request guards (axum middleware), from the outside in: every error answer
//! becomes the documented JSON [`ErrorBody`] (axum's own rejections — 400, 404, 405, 413, 415,
//! 422 — are plain text); a host posting faster than its token bucket allows is answered 429
//! with `Retry-After`; a host holding more long-polls than allowed is answered 429; a body is
//! read within its size and time bound before any handler sees it (413, 408).

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};
use metalguard_api::protocol::ErrorBody;
use tokio::time::Instant;

use super::PeerHost;
use crate::inventory::ApiLimits;

/// Longest error text taken from a rejection's body.
const MAX_ERROR_TEXT: usize = 4096;
/// A body declared too large is still read and discarded up to this size (within the body
/// timeout) before the 413, so that a client writing it sees the answer instead of a reset
/// connection; a larger one is answered at once.
const MAX_DRAINED: u64 = 1024 * 1024;

/// One host's token bucket.
#[derive(Debug)]
struct Bucket {
    tokens: f64,
    at: Instant,
}

/// The shared state of the guards: per-host buckets and long-poll counts.
#[derive(Debug)]
pub struct Guards {
    limits: ApiLimits,
    /// Only the leader does work per post (a follower answers 503 at once): only the leader
    /// spends tokens.
    hub: Arc<crate::api::hub::Hub>,
    buckets: Mutex<HashMap<String, Bucket>>,
    polls: Mutex<HashMap<String, usize>>,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    // A poisoned lock only means another thread panicked mid-update of plain counters.
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl Guards {
    /// Guards with these limits for the controller whose leadership `hub` knows.
    pub fn new(limits: ApiLimits, hub: Arc<crate::api::hub::Hub>) -> Arc<Self> {
        Arc::new(Self {
            limits,
            hub,
            buckets: Mutex::new(HashMap::new()),
            polls: Mutex::new(HashMap::new()),
        })
    }

    /// Takes a token of `host`'s bucket, or says how long until one is there.
    fn take(&self, host: &str, now: Instant) -> Result<(), Duration> {
        let rate = f64::from(self.limits.requests_per_second);
        let burst = f64::from(self.limits.request_burst);
        let mut buckets = lock(&self.buckets);
        let bucket = buckets.entry(host.to_owned()).or_insert(Bucket {
            tokens: burst,
            at: now,
        });
        let refill = now.saturating_duration_since(bucket.at).as_secs_f64() * rate;
        bucket.tokens = (bucket.tokens + refill).min(burst);
        bucket.at = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            return Ok(());
        }
        Err(Duration::from_secs_f64((1.0 - bucket.tokens) / rate))
    }

    /// Counts a long-poll of `host` until the returned guard drops; `None` when the host
    /// already holds as many as allowed.
    fn begin_poll(self: &Arc<Self>, host: &str) -> Option<PollGuard> {
        let mut polls = lock(&self.polls);
        let open = polls.entry(host.to_owned()).or_insert(0);
        if *open >= self.limits.max_long_polls_per_host {
            return None;
        }
        *open += 1;
        Some(PollGuard {
            guards: self.clone(),
            host: host.to_owned(),
        })
    }
}

/// An open long-poll, counted until dropped (also when the client goes away mid-poll).
struct PollGuard {
    guards: Arc<Guards>,
    host: String,
}

impl Drop for PollGuard {
    fn drop(&mut self) {
        let mut polls = lock(&self.guards.polls);
        if let Some(open) = polls.get_mut(&self.host) {
            *open = open.saturating_sub(1);
            if *open == 0 {
                polls.remove(&self.host);
            }
        }
    }
}

/// An error answer with the documented body.
pub fn refuse(status: StatusCode, error: String) -> Response {
    (status, Json(ErrorBody { error })).into_response()
}

/// 429 with `Retry-After` in whole seconds (at least 1).
fn too_many(error: String, retry_after: Duration) -> Response {
    let seconds = retry_after.as_secs() + u64::from(retry_after.subsec_nanos() > 0);
    let mut response = refuse(StatusCode::TOO_MANY_REQUESTS, error);
    response
        .headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from(seconds.max(1)));
    response
}

/// Posts (reports, results, holds) of one host beyond its token bucket: 429. A follower
/// answers 503 without spending a token.
pub async fn rate_limit(
    State(guards): State<Arc<Guards>>,
    Extension(peer): Extension<PeerHost>,
    request: Request,
    next: Next,
) -> Response {
    if !guards.hub.is_leader() {
        return next.run(request).await;
    }
    match guards.take(&peer.0.host, Instant::now()) {
        Ok(()) => next.run(request).await,
        Err(retry_after) => {
            tracing::debug!(host = %peer.0.host, "agent api request rate-limited");
            too_many(
                format!(
                    "host {} sent more than {} requests per second (burst {}); retry later",
                    peer.0.host, guards.limits.requests_per_second, guards.limits.request_burst
                ),
                retry_after,
            )
        }
    }
}

/// Long-polls of one host beyond the allowed number: 429.
pub async fn long_poll_cap(
    State(guards): State<Arc<Guards>>,
    Extension(peer): Extension<PeerHost>,
    request: Request,
    next: Next,
) -> Response {
    let Some(_open) = guards.begin_poll(&peer.0.host) else {
        return too_many(
            format!(
                "host {} already holds {} long-polls",
                peer.0.host, guards.limits.max_long_polls_per_host
            ),
            Duration::from_secs(1),
        );
    };
    next.run(request).await
}

/// The bound of one route's body.
#[derive(Debug, Clone, Copy)]
pub struct BodyBound {
    /// Largest body, in bytes.
    pub max: usize,
    /// Time to receive it.
    pub timeout: Duration,
}

/// Reads the body within its bound before the handler: 413 over the size (by
/// `Content-Length` or as it arrives), 408 when it takes too long. Both close the connection.
pub async fn bounded_body(
    State(bound): State<BodyBound>,
    request: Request,
    next: Next,
) -> Response {
    let (parts, body) = request.into_parts();
    let too_large = || {
        closing(refuse(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body is over {} bytes", bound.max),
        ))
    };
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if let Some(len) = declared.filter(|len| *len > bound.max as u64) {
        if len <= MAX_DRAINED {
            let drain = http_body_util::BodyExt::collect(http_body_util::Limited::new(
                body,
                usize::try_from(MAX_DRAINED).unwrap_or(usize::MAX),
            ));
            let _ = tokio::time::timeout(bound.timeout, drain).await;
        }
        return too_large();
    }
    let read = http_body_util::BodyExt::collect(http_body_util::Limited::new(body, bound.max));
    match tokio::time::timeout(bound.timeout, read).await {
        Err(_) => closing(refuse(
            StatusCode::REQUEST_TIMEOUT,
            format!("request body did not arrive within {:?}", bound.timeout),
        )),
        Ok(Err(error)) if error.is::<http_body_util::LengthLimitError>() => too_large(),
        Ok(Err(_)) => closing(refuse(
            StatusCode::BAD_REQUEST,
            "request body could not be read".to_owned(),
        )),
        Ok(Ok(collected)) => {
            let request = Request::from_parts(parts, Body::from(collected.to_bytes()));
            next.run(request).await
        }
    }
}

/// Asks hyper to close the connection after this answer.
fn closing(mut response: Response) -> Response {
    response
        .headers_mut()
        .insert(header::CONNECTION, HeaderValue::from_static("close"));
    response
}

/// Rewrites an error answer that is not JSON (axum's rejections, the router's 404 and 405)
/// into [`ErrorBody`], keeping its status and headers; its text becomes the message.
pub async fn json_errors(response: Response) -> Response {
    let status = response.status();
    if !(status.is_client_error() || status.is_server_error()) {
        return response;
    }
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if is_json {
        return response;
    }
    let (mut parts, body) = response.into_parts();
    let text = axum::body::to_bytes(body, MAX_ERROR_TEXT)
        .await
        .map(|bytes| String::from_utf8_lossy(&bytes).trim().to_owned())
        .unwrap_or_default();
    let error = if text.is_empty() {
        status
            .canonical_reason()
            .unwrap_or("request refused")
            .to_lowercase()
    } else {
        lowercase_first(&text)
    };
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    let body = serde_json::to_vec(&ErrorBody { error }).unwrap_or_default();
    Response::from_parts(parts, Body::from(body))
}

/// Messages are lowercase (`Failed to parse…` → `failed to parse…`).
fn lowercase_first(text: &str) -> String {
    let mut chars = text.chars();
    chars.next().map_or_else(String::new, |first| {
        first.to_lowercase().chain(chars).collect()
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits(rate: u32, burst: u32) -> ApiLimits {
        ApiLimits {
            requests_per_second: rate,
            request_burst: burst,
            max_long_polls_per_host: 2,
            ..ApiLimits::default()
        }
    }

    fn guards(rate: u32, burst: u32) -> Arc<Guards> {
        Guards::new(limits(rate, burst), crate::api::hub::Hub::new().0)
    }

    #[test]
    fn a_bucket_gives_its_burst_then_its_rate_per_host() {
        let guards = guards(2, 3);
        let t0 = Instant::now();
        for _ in 0..3 {
            assert_eq!(guards.take("w-1", t0), Ok(()));
        }
        let wait = guards.take("w-1", t0).unwrap_err();
        assert_eq!(wait, Duration::from_millis(500));
        assert_eq!(
            guards.take("w-2", t0),
            Ok(()),
            "another host has its own bucket"
        );
        assert_eq!(guards.take("w-1", t0 + Duration::from_millis(500)), Ok(()));
        assert!(guards.take("w-1", t0 + Duration::from_millis(600)).is_err());
        // Refilled to the burst, never beyond.
        let later = t0 + Duration::from_secs(3600);
        for _ in 0..3 {
            assert_eq!(guards.take("w-1", later), Ok(()));
        }
        assert!(guards.take("w-1", later).is_err());
    }

    #[test]
    fn long_polls_are_counted_per_host_until_they_end() {
        let guards = guards(2, 3);
        let a = guards.begin_poll("w-1").unwrap();
        let _b = guards.begin_poll("w-1").unwrap();
        assert!(guards.begin_poll("w-1").is_none());
        assert!(guards.begin_poll("w-2").is_some());
        drop(a);
        assert!(guards.begin_poll("w-1").is_some());
    }

    #[tokio::test]
    async fn plain_text_rejections_become_the_error_body() {
        let plain = (
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "Expected request with `Content-Type: application/json`",
        )
            .into_response();
        let json = json_errors(plain).await;
        assert_eq!(json.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
        let bytes = axum::body::to_bytes(json.into_body(), 1024).await.unwrap();
        let body: ErrorBody = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            body.error,
            "expected request with `Content-Type: application/json`"
        );
        let empty = json_errors(StatusCode::NOT_FOUND.into_response()).await;
        let bytes = axum::body::to_bytes(empty.into_body(), 1024).await.unwrap();
        assert_eq!(
            serde_json::from_slice::<ErrorBody>(&bytes).unwrap().error,
            "not found"
        );
        let fine = json_errors(StatusCode::OK.into_response()).await;
        assert!(fine.headers().get(header::CONTENT_TYPE).is_none());
    }
}
