//! The agent API server: a TLS accept loop that requires a client certificate, and the four
//! versioned routes of [`metalguard_api::protocol`].
//!
//! The host a request may speak for is the one its client certificate names ([`PeerHost`]);
//! a path naming any other host is answered 403, and so is every request of a certificate the
//! hub does not admit (a host outside the inventory in force, a retired host verified off, a
//! revoked certificate: [`Hub::admits`]). A controller that is not the leader answers 503 so
//! the agent tries again (or another controller).
//!
//! Bounded everywhere (`[controller.limits]`): connections, TLS handshakes in progress and each
//! host's connections ([`conn`]); the handshake, the request headers, the body and idle time;
//! each host's posts (token bucket, 429 with `Retry-After`) and long-polls ([`guard`]); the
//! size and the lists and strings of what is posted (`metalguard_api::limits`, 413 and 422).
//! Every error answer is the documented [`ErrorBody`].

pub mod conn;
pub mod guard;
pub mod http;
pub mod skew;

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Json, Router};
use metalguard_api::limits::{
    MAX_HOLD_BYTES, MAX_REPORT_BYTES, MAX_RESULT_BYTES, check_hold, check_report, check_result,
};
use metalguard_api::protocol::{
    AgentReport, COMMANDS_PATH, CommandBatch, CommandResult, ErrorBody, HOLDS_PATH, MAX_WAIT,
    REPORT_PATH, RESULTS_PATH, ReportAck,
};
use metalguard_api::snapshot::Hold;
use serde::Deserialize;
use tokio::net::TcpListener;
use tokio_rustls::LazyConfigAcceptor;
use tokio_util::sync::CancellationToken;

use self::conn::{ConnectionSlot, Connections, HandshakeSlot};
use self::guard::{BodyBound, Guards};
use self::skew::{AgentVersion, Peer};
use crate::api::hub::{HoldError, Hub, Inbound, ResultError};
use crate::clock::now;
use crate::inventory::ApiLimits;
use crate::pki::revocation::CertIdentity;

/// The connection's verified client certificate: the host it names, its serial and
/// fingerprint.
#[derive(Debug, Clone)]
pub struct PeerHost(pub CertIdentity);

/// The routes, to be served per connection with a [`PeerHost`] extension (and an
/// [`Activity`] one for the idle timeout), each behind its guards: posts rate-limited per host
/// and their bodies read within their bound, long-polls counted per host, every error answer
/// the documented JSON body.
pub fn router(hub: Arc<Hub>, guards: &Arc<Guards>, limits: &ApiLimits) -> Router {
    let body = |max| {
        axum::middleware::from_fn_with_state(
            BodyBound {
                max,
                timeout: limits.body_read_timeout,
            },
            guard::bounded_body,
        )
    };
    let rate = axum::middleware::from_fn_with_state(guards.clone(), guard::rate_limit);
    let polls = axum::middleware::from_fn_with_state(guards.clone(), guard::long_poll_cap);
    // The protocol constants use `{host}`, which is also axum 0.8's capture syntax. Of two
    // layers, the later runs first: the rate is checked before any body is read.
    Router::new()
        .route(
            REPORT_PATH,
            post(report)
                .layer(body(MAX_REPORT_BYTES))
                .layer(rate.clone()),
        )
        .route(COMMANDS_PATH, get(commands).layer(polls))
        .route(
            RESULTS_PATH,
            post(results)
                .layer(body(MAX_RESULT_BYTES))
                .layer(rate.clone()),
        )
        .route(
            HOLDS_PATH,
            post(holds).layer(body(MAX_HOLD_BYTES)).layer(rate),
        )
        // Before any route's layers: a certificate the hub does not admit is answered 403
        // before its body is read or parsed (it got a 422 listing the schema first).
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&hub),
            admit_certificate,
        ))
        .layer(axum::middleware::from_fn(conn::track_activity))
        .layer(axum::middleware::map_response(guard::json_errors))
        .layer(axum::middleware::map_response(skew::announce))
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&hub),
            count_refusals,
        ))
        .with_state(hub)
}

/// 403 for a request whose certificate the hub does not admit (a host outside the inventory
/// in force, retired and verified off, or revoked), before anything else reads the request.
async fn admit_certificate(
    State(hub): State<Arc<Hub>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let refusal = request
        .extensions()
        .get::<PeerHost>()
        .and_then(|peer| hub.admits(&peer.0).err().map(|why| (peer.0.clone(), why)));
    if let Some((certificate, why)) = refusal {
        tracing::warn!(certificate = %certificate.host, serial = %certificate.serial, reason = %why, "agent certificate refused");
        return refuse(StatusCode::FORBIDDEN, why);
    }
    next.run(request).await
}

/// Counts every error answer by status (`metalguard_controller_api_refusals_total`).
async fn count_refusals(
    State(hub): State<Arc<Hub>>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let response = next.run(request).await;
    let status = response.status();
    if status.is_client_error() || status.is_server_error() {
        hub.count_refusal(status.as_u16());
    }
    response
}

fn refuse(status: StatusCode, error: String) -> Response {
    (status, Json(ErrorBody { error })).into_response()
}

/// 503 from a controller that does not lead, or is stopping, with `Connection: close`. An
/// agent that reached it through the leader-only Service (a kube-proxy NodePort) then opens a
/// new connection for its next try, which kube-proxy sends to the Service's endpoints of now;
/// a kept-alive connection stays with this replica as long as both ends live (seen in the
/// Kubernetes lab with the controller as Pods: 90 s of 503s from a follower after a new
/// leader was labelled). Direct URLs lose nothing: the agent tries its next one.
fn unavailable(error: String) -> Response {
    let mut response = refuse(StatusCode::SERVICE_UNAVAILABLE, error);
    response.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    response
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
        return Err(Box::new(unavailable(
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
    Peer {
        body: report,
        agent,
    }: Peer<AgentReport>,
) -> Response {
    if let Err(refusal) = admit(&hub, &peer, &host) {
        return *refusal;
    }
    // Read even outside the skew policy: a host is never fenced for its agent's release.
    skew::note(&hub, &host, &agent);
    if report.host != host {
        return refuse(
            StatusCode::FORBIDDEN,
            format!(
                "report for host {} sent to the path of host {host}",
                report.host
            ),
        );
    }
    if let Err(error) = check_report(&report) {
        return refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("report of host {host}: {error}"),
        );
    }
    let received_at = now();
    hub.report_accepted(&host, received_at);
    let ack = ReportAck {
        sequence: report.sequence,
        received_at,
        // Only to agents that ask: older ones refuse an answer with fields they do not know.
        bmc_targets: if query.bmc_targets {
            hub.bmc_targets_for(&host, query.bmc_checks)
        } else {
            Vec::new()
        },
        released_holds: hub.released_among(&report),
        // Only to agents that know terms (older ones refuse the field).
        term: if query.terms { hub.term() } else { 0 },
        // This controller takes the host's identity; said only to agents that ask.
        host_identity: query.host_identity,
    };
    if !hub
        .send(Inbound::Report {
            report,
            received_at,
        })
        .await
    {
        return unavailable("controller is stopping".to_owned());
    }
    Json(ack).into_response()
}

/// The report's query.
#[derive(Debug, Deserialize)]
#[allow(clippy::struct_excessive_bools)] // one flag per query parameter of the protocol
struct ReportQuery {
    /// The agent asks for the BMC targets in the answer (`BMC_TARGETS_PARAM`).
    #[serde(default)]
    bmc_targets: bool,
    /// The agent knows leadership terms (`TERMS_PARAM`).
    #[serde(default)]
    terms: bool,
    /// The agent runs credentialed BMC checks (`BMC_CHECKS_PARAM`).
    #[serde(default)]
    bmc_checks: bool,
    /// The agent can send its host's identity (`HOST_IDENTITY_PARAM`).
    #[serde(default)]
    host_identity: bool,
}

/// The long-poll query.
#[derive(Debug, Deserialize)]
struct WaitQuery {
    /// Seconds to wait for a command; 0 or absent answers at once.
    #[serde(default)]
    wait: u64,
    /// The agent knows leadership terms (`TERMS_PARAM`): commands keep their term and the
    /// fields that came with it; without it they are left out (an agent that predates them
    /// refuses unknown fields).
    #[serde(default)]
    terms: bool,
    /// The agent checks a fence target's identity (`HOST_IDENTITY_PARAM`): fences keep
    /// `expected_identity`.
    #[serde(default)]
    host_identity: bool,
}

async fn commands(
    State(hub): State<Arc<Hub>>,
    Extension(peer): Extension<PeerHost>,
    Path(host): Path<String>,
    Query(query): Query<WaitQuery>,
    agent: AgentVersion,
) -> Response {
    if let Err(refusal) = admit(&hub, &peer, &host) {
        return *refusal;
    }
    if let Err(refusal) = agent.within_policy(&host, "commands") {
        return refusal;
    }
    let wait = Duration::from_secs(query.wait).min(MAX_WAIT);
    let mut commands = hub.poll(&host, wait).await;
    if !query.terms {
        commands
            .iter_mut()
            .for_each(metalguard_api::protocol::Command::strip_terms);
    }
    if !query.host_identity {
        commands
            .iter_mut()
            .for_each(metalguard_api::protocol::Command::strip_identity);
    }
    Json(CommandBatch { commands }).into_response()
}

async fn results(
    State(hub): State<Arc<Hub>>,
    Extension(peer): Extension<PeerHost>,
    Path(host): Path<String>,
    // Results and holds are facts from the agent, read strictly outside the skew policy too:
    // a fence's verified outcome and a person's hold must never be lost to a version.
    Peer { body: result, .. }: Peer<CommandResult>,
) -> Response {
    if let Err(refusal) = admit(&hub, &peer, &host) {
        return *refusal;
    }
    if let Err(error) = check_result(&result) {
        return refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!(
                "result of {} from host {host}: {error}",
                result.operation_id
            ),
        );
    }
    ask(
        &hub,
        "result",
        |reply| Inbound::Result {
            host,
            certificate: peer.0,
            result,
            reply,
        },
        |error| match error {
            ResultError::Rejected(error) => refuse(StatusCode::CONFLICT, error),
            ResultError::Unavailable(error) => unavailable(error),
        },
    )
    .await
}

/// A break-glass hold recorded on the certificate's host: its id must be `<host>/<ms>`; its
/// target is checked against the inventory by the loop (422 when unknown).
async fn holds(
    State(hub): State<Arc<Hub>>,
    Extension(peer): Extension<PeerHost>,
    Path(host): Path<String>,
    Peer { body: hold, .. }: Peer<Hold>,
) -> Response {
    if let Err(refusal) = admit(&hub, &peer, &host) {
        return *refusal;
    }
    if let Err(error) = check_hold(&hold) {
        return refuse(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("hold from host {host}: {error}"),
        );
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
    ask(
        &hub,
        "hold",
        |reply| Inbound::Hold { host, hold, reply },
        |error| match error {
            HoldError::Invalid(error) => refuse(StatusCode::UNPROCESSABLE_ENTITY, error),
            HoldError::Released(error) => refuse(StatusCode::CONFLICT, error),
            HoldError::Unavailable(error) => unavailable(error),
        },
    )
    .await
}

/// Hands `message` (made with its reply channel) to the controller loop and answers with
/// its acknowledgement, its refusal (`refused`), or 503 when the loop is stopping or stopped
/// before it persisted the `what`.
async fn ask<A: serde::Serialize, E>(
    hub: &Hub,
    what: &str,
    message: impl FnOnce(tokio::sync::oneshot::Sender<Result<A, E>>) -> Inbound,
    refused: impl FnOnce(E) -> Response,
) -> Response {
    let (tx, rx) = tokio::sync::oneshot::channel();
    if !hub.send(message(tx)).await {
        return unavailable("controller is stopping".to_owned());
    }
    match rx.await {
        Ok(Ok(ack)) => Json(ack).into_response(),
        Ok(Err(error)) => refused(error),
        Err(_) => unavailable(format!("controller stopped before persisting the {what}")),
    }
}

/// Accepts TLS connections until `cancel`, at most `max_connections` at once; each
/// connection is served with the host its client certificate names.
pub async fn serve(
    listener: TcpListener,
    tls: rustls::ServerConfig,
    hub: Arc<Hub>,
    limits: ApiLimits,
    max_connections: usize,
    cancel: CancellationToken,
) {
    let tls = Arc::new(tls);
    let guards = Guards::new(limits.clone(), Arc::clone(&hub));
    let app = router(hub, &guards, &limits);
    let connections = Connections::new(&limits, max_connections);
    let limits = Arc::new(limits);
    let mut refusals = http::Refusals::default();
    while let Some((tcp, remote, slot)) =
        http::accept_admitted(&listener, &connections, "agent api", &mut refusals, &cancel).await
    {
        let hello = connections.await_hello();
        tokio::spawn(serve_one(
            tcp,
            remote,
            Arc::clone(&tls),
            app.clone(),
            Arc::clone(&connections),
            Arc::clone(&limits),
            (slot, hello),
            cancel.clone(),
        ));
    }
}

/// One connection: the handshake in its two evictable stages under one deadline, the host's
/// share of connections, then HTTP/1 with the header timeout, closed after the idle timeout.
#[allow(clippy::too_many_arguments)]
async fn serve_one(
    tcp: tokio::net::TcpStream,
    remote: std::net::SocketAddr,
    tls: Arc<rustls::ServerConfig>,
    app: Router,
    connections: Arc<Connections>,
    limits: Arc<ApiLimits>,
    (_slot, hello): (ConnectionSlot, HandshakeSlot),
    cancel: CancellationToken,
) {
    let deadline = tokio::time::Instant::now() + limits.handshake_timeout;
    // Stage 1: the complete ClientHello. Biased: a hello that has arrived wins over eviction.
    let accepted = tokio::select! {
        biased;
        started = tokio::time::timeout_at(
            deadline,
            LazyConfigAcceptor::new(rustls::server::Acceptor::default(), tcp),
        ) => started,
        () = hello.evicted() => {
            tracing::debug!(%remote, "agent api connection evicted before its ClientHello arrived");
            return;
        }
    };
    drop(hello);
    let start = match accepted {
        Ok(Ok(start)) => start,
        Ok(Err(error)) => {
            tracing::info!(%remote, %error, "agent api handshake refused");
            return;
        }
        Err(_) => {
            tracing::debug!(%remote, "agent api ClientHello did not arrive in time");
            return;
        }
    };
    // Stage 2: the rest of the handshake (client certificate verified).
    let handshake = connections.begin_handshake();
    let stream = tokio::select! {
        biased;
        done = tokio::time::timeout_at(deadline, start.into_stream(tls)) => match done {
            Ok(Ok(stream)) => stream,
            Ok(Err(error)) => {
                tracing::info!(%remote, %error, "agent api handshake refused");
                return;
            }
            Err(_) => {
                tracing::debug!(%remote, "agent api handshake timed out");
                return;
            }
        },
        () = handshake.evicted() => {
            tracing::debug!(%remote, "agent api handshake evicted by a newer connection");
            return;
        }
    };
    drop(handshake);
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
    let Some(_host_slot) = connections.join_host(&host.host) else {
        tracing::warn!(%remote, host = %host.host, max = limits.max_connections_per_host, "agent api connection closed: the host holds its share of connections");
        return;
    };
    let app = app.layer(Extension(PeerHost(host)));
    http::serve_connection(stream, app, &limits, remote, "agent api", &cancel).await;
}
