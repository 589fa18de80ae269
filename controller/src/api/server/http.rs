//! Serving one HTTP/1 connection within the agent API's bounds (the header-read timeout, the
//! read buffer, the idle timeout), and a plain-HTTP listener with the same bounds and a cap on
//! connections for the endpoints that are not the agent API (the metrics endpoint).
//!
//! The metrics listener shares the process's open-file limit with the agent API: 21,000
//! half-open connections to it, each kept until the peer left, made every reconnecting agent
//! fail with "Too many open files" (issue 28). Here it serves at most its cap at once (further
//! connections are closed as they are accepted), each closed when its headers do not arrive
//! within the header-read timeout or it stays idle past the idle timeout; the cap is part of the
//! descriptors kept out of the agent API's budget ([`crate::api::rlimit::RESERVED_FILES`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use axum::{Extension, Router};
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::conn::{Activity, ConnectionSlot, Connections};
use crate::inventory::ApiLimits;

/// hyper's read buffer per connection (headers must fit; bodies stream through it).
const MAX_BUF_SIZE: usize = 64 * 1024;
/// How often refused connections are logged at most.
const REFUSAL_LOG_INTERVAL: Duration = Duration::from_secs(10);
/// Pause after a failed accept (EMFILE and the like) before the next.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);

/// Serves `app` on the already established `io` until it ends, `cancel`, or it stays idle past
/// the idle timeout; a request's headers must arrive within the header-read timeout. `app`
/// must count its requests with [`super::conn::track_activity`].
pub async fn serve_connection<I>(
    io: I,
    app: Router,
    limits: &ApiLimits,
    remote: SocketAddr,
    endpoint: &'static str,
    cancel: &CancellationToken,
) where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let activity = Activity::new();
    let service =
        hyper_util::service::TowerToHyperService::new(app.layer(Extension(Arc::clone(&activity))));
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_buf_size(MAX_BUF_SIZE);
    let connection = builder.serve_connection(TokioIo::new(io), service);
    tokio::pin!(connection);
    let mut closing = false;
    loop {
        let idle_until = activity
            .idle_since()
            .unwrap_or_else(tokio::time::Instant::now)
            + limits.idle_timeout;
        tokio::select! {
            result = connection.as_mut() => {
                if let Err(error) = result {
                    tracing::debug!(endpoint, %remote, %error, "connection ended with an error");
                }
                return;
            }
            () = cancel.cancelled() => return,
            () = tokio::time::sleep_until(idle_until), if !closing => {
                let idle = activity.idle_since().is_some_and(|since| since.elapsed() >= limits.idle_timeout);
                if idle {
                    tracing::debug!(endpoint, %remote, "connection closed after its idle timeout");
                    connection.as_mut().graceful_shutdown();
                    closing = true;
                }
            }
        }
    }
}

/// Accepts plain-HTTP connections on `listener` until `cancel` and serves `app` on each, at
/// most `max_connections` at once, within `limits`' header-read and idle timeouts.
pub async fn serve_plain(
    listener: TcpListener,
    app: Router,
    limits: ApiLimits,
    max_connections: usize,
    endpoint: &'static str,
    cancel: CancellationToken,
) {
    let app = app.layer(axum::middleware::from_fn(super::conn::track_activity));
    let connections = Connections::new(&limits, max_connections);
    let limits = Arc::new(limits);
    let mut refusals = Refusals::default();
    while let Some((tcp, remote, slot)) =
        accept_admitted(&listener, &connections, endpoint, &mut refusals, &cancel).await
    {
        let (app, limits, cancel) = (app.clone(), Arc::clone(&limits), cancel.clone());
        tokio::spawn(async move {
            let _slot = slot;
            serve_connection(tcp, app, &limits, remote, endpoint, &cancel).await;
        });
    }
}

/// Connections closed at accept since they were last logged.
#[derive(Debug, Default)]
pub struct Refusals {
    logged: Option<tokio::time::Instant>,
    count: u64,
}

/// The next accepted connection `connections` admits, with its slot; connections beyond the
/// cap are closed at once (logged at most every [`REFUSAL_LOG_INTERVAL`]). `None` on `cancel`.
pub async fn accept_admitted(
    listener: &TcpListener,
    connections: &Arc<Connections>,
    endpoint: &'static str,
    refusals: &mut Refusals,
    cancel: &CancellationToken,
) -> Option<(TcpStream, SocketAddr, ConnectionSlot)> {
    loop {
        let (tcp, remote) = tokio::select! {
            () = cancel.cancelled() => return None,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(error) => {
                    tracing::warn!(endpoint, %error, "accept failed");
                    tokio::time::sleep(ACCEPT_RETRY).await;
                    continue;
                }
            },
        };
        if let Some(slot) = connections.admit() {
            return Some((tcp, remote, slot));
        }
        drop(tcp);
        refusals.count += 1;
        if refusals
            .logged
            .is_none_or(|at| at.elapsed() >= REFUSAL_LOG_INTERVAL)
        {
            tracing::warn!(
                endpoint,
                refused = refusals.count,
                open = connections.open(),
                "connections refused: the endpoint's connection limit is reached"
            );
            refusals.logged = Some(tokio::time::Instant::now());
            refusals.count = 0;
        }
    }
}
