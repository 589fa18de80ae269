//! The agent API server: a TLS accept loop that requires a client certificate, and the four
//! versioned routes of [`metalguard_api::protocol`].
//!
//! The host a request may speak for is the one its client certificate names ([`PeerHost`]);
//! a path naming any other host is answered 403, and so is every request of a certificate the
//! hub does not admit (a host outside the inventory in force, a retired host verified off, a
//! revoked certificate: [`Hub::admits`]). A controller that is not the leader answers 503 so
//! the agent tries again (or another controller).

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use hyper_util::rt::TokioIo;
use metalguard_api::protocol::{
    AgentReport, COMMANDS_PATH, CommandBatch, CommandResult, ErrorBody, HOLDS_PATH, MAX_WAIT,
    REPORT_PATH, RESULTS_PATH, ReportAck,
};
use metalguard_api::snapshot::Hold;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::clock::now;
use crate::hub::{HoldError, Hub, Inbound, ResultError};
use crate::revocation::CertIdentity;

/// How long a client may take to complete the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The connection's verified client certificate: the host it names, its serial and
/// fingerprint.
#[derive(Debug, Clone)]
pub struct PeerHost(pub CertIdentity);

/// The routes, to be served per connection with a [`PeerHost`] extension.
pub fn router(hub: Arc<Hub>) -> Router {
    // The protocol constants use `{host}`, which is also axum 0.8's capture syntax.
    Router::new()
        .route(REPORT_PATH, post(report))
        .route(COMMANDS_PATH, get(commands))
        .route(RESULTS_PATH, post(results))
        .route(HOLDS_PATH, post(holds))
        .with_state(hub)
}

fn refuse(status: StatusCode, error: String) -> Response {
    (status, Json(ErrorBody { error })).into_response()
}

/// 403 unless the path's host is the certificate's host and the hub admits the certificate;
/// 503 unless leader.
fn admit(hub: &Hub, peer: &PeerHost, host: &str) -> Result<(), Box<Response>> {
    if peer.0.host != host {
        tracing::warn!(certificate = %peer.0.host, path_host = %host, "agent spoke for another host");
        return Err(Box::new(refuse(
            StatusCode::FORBIDDEN,
            format!(
                "client certificate for {} may not act for host {host}",
                peer.0.host
            ),
        )));
    }
    if let Err(why) = hub.admits(&peer.0) {
        tracing::warn!(certificate = %peer.0.host, serial = %peer.0.serial, reason = %why, "agent certificate refused");
        return Err(Box::new(refuse(StatusCode::FORBIDDEN, why)));
    }
    if !hub.is_leader() {
        return Err(Box::new(refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "this controller is not the leader".to_owned(),
        )));
    }
    Ok(())
}

async fn report(
    State(hub): State<Arc<Hub>>,
    Extension(peer): Extension<PeerHost>,
    Path(host): Path<String>,
    Query(query): Query<ReportQuery>,
    Json(report): Json<AgentReport>,
) -> Response {
    if let Err(refusal) = admit(&hub, &peer, &host) {
        return *refusal;
    }
    if report.host != host {
        return refuse(
            StatusCode::FORBIDDEN,
            format!(
                "report for host {} sent to the path of host {host}",
                report.host
            ),
        );
    }
    let ack = ReportAck {
        sequence: report.sequence,
        received_at: now(),
        // Only to agents that ask: older ones refuse an answer with fields they do not know.
        bmc_targets: if query.bmc_targets {
            hub.bmc_targets_for(&host)
        } else {
            Vec::new()
        },
        released_holds: hub.released_among(&report),
    };
    if !hub.send(Inbound::Report(report)).await {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "controller is stopping".to_owned(),
        );
    }
    Json(ack).into_response()
}

/// The report's query.
#[derive(Debug, Deserialize)]
struct ReportQuery {
    /// The agent asks for the BMC targets in the answer (`BMC_TARGETS_PARAM`).
    #[serde(default)]
    bmc_targets: bool,
}

/// The long-poll query.
#[derive(Debug, Deserialize)]
struct WaitQuery {
    /// Seconds to wait for a command; 0 or absent answers at once.
    #[serde(default)]
    wait: u64,
}

async fn commands(
    State(hub): State<Arc<Hub>>,
    Extension(peer): Extension<PeerHost>,
    Path(host): Path<String>,
    Query(query): Query<WaitQuery>,
) -> Response {
    if let Err(refusal) = admit(&hub, &peer, &host) {
        return *refusal;
    }
    let wait = Duration::from_secs(query.wait).min(MAX_WAIT);
    let commands = hub.poll(&host, wait).await;
    Json(CommandBatch { commands }).into_response()
}

async fn results(
    State(hub): State<Arc<Hub>>,
    Extension(peer): Extension<PeerHost>,
    Path(host): Path<String>,
    Json(result): Json<CommandResult>,
) -> Response {
    if let Err(refusal) = admit(&hub, &peer, &host) {
        return *refusal;
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let sent = hub
        .send(Inbound::Result {
            host,
            certificate: peer.0,
            result,
            reply: tx,
        })
        .await;
    if !sent {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "controller is stopping".to_owned(),
        );
    }
    match rx.await {
        Ok(Ok(ack)) => Json(ack).into_response(),
        Ok(Err(ResultError::Rejected(error))) => refuse(StatusCode::CONFLICT, error),
        Ok(Err(ResultError::Unavailable(error))) => refuse(StatusCode::SERVICE_UNAVAILABLE, error),
        Err(_) => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "controller stopped before persisting the result".to_owned(),
        ),
    }
}

/// A break-glass hold recorded on the certificate's host: its id must be `<host>/<ms>`; its
/// target is checked against the inventory by the loop (422 when unknown).
async fn holds(
    State(hub): State<Arc<Hub>>,
    Extension(peer): Extension<PeerHost>,
    Path(host): Path<String>,
    Json(hold): Json<Hold>,
) -> Response {
    if let Err(refusal) = admit(&hub, &peer, &host) {
        return *refusal;
    }
    if !crate::backend::state::hold_made_by(&hold, &host) {
        return refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "hold id {} is not {host}/<milliseconds>: host {host} records only its own holds",
                hold.id
            ),
        );
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let sent = hub
        .send(Inbound::Hold {
            host,
            hold,
            reply: tx,
        })
        .await;
    if !sent {
        return refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "controller is stopping".to_owned(),
        );
    }
    match rx.await {
        Ok(Ok(ack)) => Json(ack).into_response(),
        Ok(Err(HoldError::Invalid(error))) => refuse(StatusCode::UNPROCESSABLE_ENTITY, error),
        Ok(Err(HoldError::Released(error))) => refuse(StatusCode::CONFLICT, error),
        Ok(Err(HoldError::Unsupported(error))) => refuse(StatusCode::NOT_IMPLEMENTED, error),
        Ok(Err(HoldError::Unavailable(error))) => refuse(StatusCode::SERVICE_UNAVAILABLE, error),
        Err(_) => refuse(
            StatusCode::SERVICE_UNAVAILABLE,
            "controller stopped before persisting the hold".to_owned(),
        ),
    }
}

/// Accepts TLS connections until `cancel`; each connection is served with the host its
/// client certificate names.
pub async fn serve(
    listener: TcpListener,
    tls: rustls::ServerConfig,
    hub: Arc<Hub>,
    cancel: CancellationToken,
) {
    let acceptor = TlsAcceptor::from(Arc::new(tls));
    let app = router(hub);
    loop {
        let (tcp, remote) = tokio::select! {
            () = cancel.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(pair) => pair,
                Err(error) => {
                    tracing::warn!(%error, "agent api accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let acceptor = acceptor.clone();
        let app = app.clone();
        let cancel = cancel.clone();
        tokio::spawn(async move {
            let stream = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
                Ok(Ok(stream)) => stream,
                Ok(Err(error)) => {
                    tracing::info!(%remote, %error, "agent api handshake refused");
                    return;
                }
                Err(_) => {
                    tracing::info!(%remote, "agent api handshake timed out");
                    return;
                }
            };
            let host = stream
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|certs| certs.first())
                .and_then(CertIdentity::of);
            let Some(host) = host else {
                tracing::warn!(%remote, "client certificate names no host");
                return;
            };
            let service =
                hyper_util::service::TowerToHyperService::new(app.layer(Extension(PeerHost(host))));
            let connection = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service);
            tokio::pin!(connection);
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(error) = result {
                        tracing::debug!(%remote, %error, "agent api connection ended with an error");
                    }
                }
                () = cancel.cancelled() => {}
            }
        });
    }
}
