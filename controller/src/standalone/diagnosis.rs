//! What went wrong with one etcd endpoint, in words an operator can act on.
//!
//! etcd's errors reach the client as a gRPC code and a message, and TLS failures as the text of
//! the transport error chain ([`classify`] reads both). Some failures look alike from the
//! client: with TLS 1.3 a server that rejects the client certificate does so after the
//! handshake, and the gRPC call sees only "connection closed" or "broken pipe". For those,
//! [`describe`] runs a TLS probe ([`probe_tls`]): a handshake with the same files, then the
//! HTTP/2 preface, so that etcd's alert (`BadCertificate`, …) or the server certificate's
//! rejection is read directly.
//!
//! Measured with etcd 3.4.23 and etcd-client 0.21 (`controller/tests/etcd_tls.rs`): a wrong CA
//! gives `invalid peer certificate: BadSignature`/`UnknownIssuer`; no client certificate or one
//! of another CA gives `received fatal alert: BadCertificate`, `connection closed` or
//! `broken pipe`, depending on timing; a wrong password InvalidArgument `etcdserver:
//! authentication failed, invalid user ID or password`; a user while etcd's auth is off
//! FailedPrecondition `etcdserver: authentication is not enabled`; RBAC PermissionDenied
//! `etcdserver: permission denied`; a listener that never answers no error at all (the
//! client's timeouts do not cover a TLS handshake that never ends: callers set deadlines).

use std::fmt::{self, Write as _};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use super::access::EtcdAccess;

/// How an endpoint failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailureKind {
    /// The TLS handshake or a certificate verification failed, either side.
    Tls,
    /// etcd refused the credentials (user, password, token).
    Authentication,
    /// etcd's RBAC refused the operation to this user.
    PermissionDenied,
    /// Nothing listens there, or the connection was closed.
    Unreachable,
    /// No answer in time (a hung member, or a listener that never answers).
    Timeout,
    /// The member answered but has no leader: the cluster has no quorum.
    NoQuorum,
    /// Anything else etcd answered.
    Other,
}

impl FailureKind {
    /// The label in messages and `status`.
    pub fn label(self) -> &'static str {
        match self {
            Self::Tls => "tls",
            Self::Authentication => "authentication",
            Self::PermissionDenied => "permission denied",
            Self::Unreachable => "unreachable",
            Self::Timeout => "timeout",
            Self::NoQuorum => "no quorum",
            Self::Other => "error",
        }
    }
}

/// One endpoint's failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EndpointFailure {
    /// The endpoint.
    pub endpoint: String,
    /// What kind of failure.
    pub kind: FailureKind,
    /// What happened and what to check, including etcd's or the TLS library's own words.
    pub detail: String,
}

impl fmt::Display for EndpointFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {}: {}",
            self.endpoint,
            self.kind.label(),
            self.detail
        )
    }
}

impl EndpointFailure {
    /// No answer from `endpoint` within `after`.
    pub fn timeout(endpoint: &str, after: Duration) -> Self {
        Self {
            endpoint: endpoint.to_owned(),
            kind: FailureKind::Timeout,
            detail: format!(
                "no answer within {after:?} (a hung member, or a listener that accepts connections and never answers)"
            ),
        }
    }
}

/// Every endpoint tried and how each failed; the source of a store error.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EndpointFailures(pub Vec<EndpointFailure>);

impl fmt::Display for EndpointFailures {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, failure) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{failure}")?;
        }
        Ok(())
    }
}

impl std::error::Error for EndpointFailures {}

/// What the error text alone says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reading {
    /// The kind is clear.
    Known(FailureKind),
    /// The connection was closed or reset: a TLS refusal or a dying server.
    Closed,
}

const CODE_INVALID_ARGUMENT: i32 = 3;
const CODE_DEADLINE_EXCEEDED: i32 = 4;
const CODE_PERMISSION_DENIED: i32 = 7;
const CODE_FAILED_PRECONDITION: i32 = 9;
const CODE_UNAVAILABLE: i32 = 14;
const CODE_UNAUTHENTICATED: i32 = 16;

/// Reads a gRPC `code` (if the error has one) and the whole error `text` (every cause).
pub(crate) fn classify(code: Option<i32>, text: &str) -> Reading {
    let has = |needle: &str| text.contains(needle);
    let kind = if has("invalid peer certificate") || has("received fatal alert") {
        FailureKind::Tls
    } else if code == Some(CODE_PERMISSION_DENIED) || has("etcdserver: permission denied") {
        FailureKind::PermissionDenied
    } else if has("authentication failed")
        || has("authentication is not enabled")
        || has("invalid auth token")
        || has("user name is empty")
        || code == Some(CODE_UNAUTHENTICATED)
        || (code == Some(CODE_FAILED_PRECONDITION) && has("auth"))
        || (code == Some(CODE_INVALID_ARGUMENT) && has("auth"))
    {
        FailureKind::Authentication
    } else if has("request timed out")
        || has("etcdserver: no leader")
        || has("etcdserver: leader changed")
    {
        FailureKind::NoQuorum
    } else if code == Some(CODE_DEADLINE_EXCEEDED)
        || has("Timeout expired")
        || has("had no answer within")
        || has("deadline has elapsed")
    {
        FailureKind::Timeout
    } else if has("tcp connect error") || has("Connection refused") || has("dns error") {
        FailureKind::Unreachable
    } else if has("connection closed")
        || has("broken pipe")
        || has("onnection reset")
        || has("transport error")
        || has("operation was canceled")
    {
        return Reading::Closed;
    } else if has("etcdserver: ") {
        // The member answered, in its own words.
        FailureKind::Other
    } else if code == Some(CODE_UNAVAILABLE) {
        FailureKind::Unreachable
    } else {
        FailureKind::Other
    };
    Reading::Known(kind)
}

/// The code and the text of every cause of an etcd client error.
fn parts(error: &etcd_client::Error) -> (Option<i32>, String) {
    let code = match error {
        etcd_client::Error::GRpcStatus(status) => Some(status.code() as i32),
        _ => None,
    };
    let mut text = error.to_string();
    let mut source = std::error::Error::source(error);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    // tonic's Status carries the transport error only in its Debug form.
    let _ = write!(text, " {error:?}");
    (code, text)
}

/// etcd's own message (the gRPC status message) or the error's text.
fn own_words(error: &etcd_client::Error) -> String {
    match error {
        etcd_client::Error::GRpcStatus(status) => status.message().to_owned(),
        other => other.to_string(),
    }
}

/// Describes how `endpoint` failed with `error`, probing the TLS handshake when the error
/// alone cannot tell a refused certificate from a closed connection.
pub async fn describe(
    endpoint: &str,
    error: &etcd_client::Error,
    access: &EtcdAccess,
) -> EndpointFailure {
    let (code, text) = parts(error);
    let words = own_words(error);
    let (kind, detail) = match classify(code, &text) {
        Reading::Known(FailureKind::Tls) => (FailureKind::Tls, tls_detail(&text, access)),
        Reading::Known(kind) => (kind, known_detail(kind, &words, access)),
        Reading::Closed => match access.probe_tls() {
            Some(config) if endpoint.starts_with("https://") => {
                let outcome = probe_tls(endpoint, config, access.timeout()).await;
                closed_detail(&outcome, &words, access)
            }
            _ => (
                FailureKind::Unreachable,
                format!(
                    "the server closed the connection ({words}); if etcd serves TLS there \
                     (kubeadm does), write https:// and set etcd.ca_file"
                ),
            ),
        },
    };
    EndpointFailure {
        endpoint: endpoint.to_owned(),
        kind,
        detail,
    }
}

fn known_detail(kind: FailureKind, words: &str, access: &EtcdAccess) -> String {
    match kind {
        FailureKind::PermissionDenied => format!(
            "etcd's RBAC refused it to {} ({words}): its role needs readwrite on {}/ \
             (etcdctl role grant-permission ROLE --prefix=true readwrite {}/)",
            access.identity(),
            access.prefix(),
            access.prefix()
        ),
        FailureKind::Authentication if words.contains("authentication is not enabled") => format!(
            "etcd.username is set but etcd's authentication is not enabled ({words}): \
             remove etcd.username and etcd.password_file, or enable etcd's auth"
        ),
        FailureKind::Authentication if words.contains("authentication failed") => format!(
            "etcd refused the user name or password ({words}): check etcd.username and etcd.password_file"
        ),
        FailureKind::Authentication => {
            format!("etcd did not accept {} ({words})", access.identity())
        }
        FailureKind::NoQuorum => format!(
            "the member answered but has no leader to serve the request ({words}): an election, \
             or the cluster has no quorum"
        ),
        FailureKind::Unreachable => format!("nothing answers there ({words})"),
        FailureKind::Timeout => format!("no answer in time ({words})"),
        FailureKind::Tls | FailureKind::Other => words.to_owned(),
    }
}

fn tls_detail(text: &str, access: &EtcdAccess) -> String {
    if let Some(reason) = after(text, "invalid peer certificate: ") {
        return server_not_trusted(&reason);
    }
    if let Some(alert) = after(text, "received fatal alert: ") {
        return refused_our_certificate(&alert, access);
    }
    text.to_owned()
}

fn server_not_trusted(reason: &str) -> String {
    format!(
        "etcd's server certificate is not trusted ({reason}): etcd.ca_file must be the CA that \
         signed it (kubeadm: /etc/kubernetes/pki/etcd/ca.crt), and the certificate must name the \
         endpoint's host"
    )
}

fn refused_our_certificate(alert: &str, access: &EtcdAccess) -> String {
    if access.has_client_cert() {
        format!(
            "etcd refused the client certificate of etcd.cert_file (TLS alert {alert}): it is not \
             signed by the CA etcd trusts (--trusted-ca-file), has expired, or is not for client \
             authentication"
        )
    } else {
        format!(
            "etcd requires a client certificate (--client-cert-auth; TLS alert {alert}) and none \
             is configured: set etcd.cert_file and etcd.key_file (kubeadm: \
             /etc/kubernetes/pki/etcd/healthcheck-client.crt and .key, or a client certificate of \
             metalguard's own signed by the etcd CA)"
        )
    }
}

fn closed_detail(
    outcome: &ProbeOutcome,
    words: &str,
    access: &EtcdAccess,
) -> (FailureKind, String) {
    match outcome {
        ProbeOutcome::RefusedByServer(alert) => {
            (FailureKind::Tls, refused_our_certificate(alert, access))
        }
        ProbeOutcome::ServerNotTrusted(reason) => (FailureKind::Tls, server_not_trusted(reason)),
        ProbeOutcome::NotTls(why) => (
            FailureKind::Tls,
            format!(
                "the endpoint does not speak TLS ({why}): write http:// if etcd serves plain HTTP there"
            ),
        ),
        ProbeOutcome::Accepted => (
            FailureKind::Unreachable,
            format!(
                "the server closed the connection ({words}) though the TLS handshake succeeds: etcd stopping or restarting?"
            ),
        ),
        ProbeOutcome::Unreachable(why) => (
            FailureKind::Unreachable,
            format!("nothing answers there ({why})"),
        ),
        ProbeOutcome::Timeout(stage) => (
            FailureKind::Timeout,
            format!(
                "the {stage} did not finish in time (a hung member, or a listener that accepts connections and never answers)"
            ),
        ),
        ProbeOutcome::Failed(why) => (
            FailureKind::Tls,
            format!("the TLS handshake failed ({why})"),
        ),
    }
}

/// The text after `marker` up to the next quote, bracket or line end.
fn after(text: &str, marker: &str) -> Option<String> {
    let start = text.find(marker)? + marker.len();
    let rest = &text[start..];
    let end = rest.find(['"', ')', ']', '\n', ',']).unwrap_or(rest.len());
    Some(rest[..end].trim().to_owned())
}

/// What a TLS handshake with an endpoint showed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeOutcome {
    /// Handshake done and the server answered the HTTP/2 preface.
    Accepted,
    /// The server sent a TLS alert (its name): it refused our certificate or its absence.
    RefusedByServer(String),
    /// We did not trust the server's certificate (why).
    ServerNotTrusted(String),
    /// The server does not speak TLS.
    NotTls(String),
    /// TCP connect failed.
    Unreachable(String),
    /// A stage (`TCP connect`, `TLS handshake`) did not finish in time.
    Timeout(&'static str),
    /// Any other failure.
    Failed(String),
}

/// A TLS handshake with `endpoint` (`https://host:port`) using `config` (with ALPN `h2`),
/// then the HTTP/2 client preface, each stage within `timeout`.
pub async fn probe_tls(
    endpoint: &str,
    config: Arc<rustls::ClientConfig>,
    timeout: Duration,
) -> ProbeOutcome {
    let authority = endpoint
        .trim_start_matches("https://")
        .split('/')
        .next()
        .unwrap_or_default()
        .to_owned();
    let host = authority
        .rsplit_once(':')
        .map_or(authority.as_str(), |(host, _)| host)
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_owned();
    let Ok(server_name) = rustls_pki_types::ServerName::try_from(host) else {
        return ProbeOutcome::Failed(format!("{authority} names no valid host"));
    };
    let tcp = match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(&authority)).await
    {
        Err(_) => return ProbeOutcome::Timeout("TCP connect"),
        Ok(Err(e)) => return ProbeOutcome::Unreachable(e.to_string()),
        Ok(Ok(tcp)) => tcp,
    };
    let connector = tokio_rustls::TlsConnector::from(config);
    let mut tls = match tokio::time::timeout(timeout, connector.connect(server_name, tcp)).await {
        Err(_) => return ProbeOutcome::Timeout("TLS handshake"),
        Ok(Err(e)) => return from_io(&e),
        Ok(Ok(tls)) => tls,
    };
    // With TLS 1.3 the server checks our certificate after the handshake: its verdict (an
    // alert, or its HTTP/2 SETTINGS) comes with the first read.
    let preface = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x00\x04\x00\x00\x00\x00\x00";
    let exchange = async {
        tls.write_all(preface).await?;
        tls.flush().await?;
        let mut buf = [0u8; 64];
        tls.read(&mut buf).await
    };
    match tokio::time::timeout(timeout, exchange).await {
        Ok(Ok(0)) => {
            ProbeOutcome::Failed("the server closed the connection after the handshake".to_owned())
        }
        Ok(Ok(_)) | Err(_) => ProbeOutcome::Accepted,
        Ok(Err(e)) => from_io(&e),
    }
}

fn from_io(error: &std::io::Error) -> ProbeOutcome {
    let rustls_error = error
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>());
    match rustls_error {
        Some(rustls::Error::AlertReceived(alert)) => {
            ProbeOutcome::RefusedByServer(format!("{alert:?}"))
        }
        Some(rustls::Error::InvalidCertificate(why)) => {
            ProbeOutcome::ServerNotTrusted(format!("{why:?}"))
        }
        Some(
            e @ (rustls::Error::InvalidMessage(_) | rustls::Error::InappropriateMessage { .. }),
        ) => ProbeOutcome::NotTls(e.to_string()),
        Some(other) => ProbeOutcome::Failed(other.to_string()),
        None => ProbeOutcome::Failed(error.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_texts_measured_against_etcd_are_classified() {
        let cases = [
            (
                Some(14),
                "invalid peer certificate: BadSignature",
                Reading::Known(FailureKind::Tls),
            ),
            (
                Some(2),
                "transport error: received fatal alert: BadCertificate",
                Reading::Known(FailureKind::Tls),
            ),
            (
                Some(1),
                "operation was canceled: connection closed",
                Reading::Closed,
            ),
            (
                Some(2),
                "transport error: stream closed because of a broken pipe",
                Reading::Closed,
            ),
            (
                Some(7),
                "etcdserver: permission denied",
                Reading::Known(FailureKind::PermissionDenied),
            ),
            (
                Some(3),
                "etcdserver: authentication failed, invalid user ID or password",
                Reading::Known(FailureKind::Authentication),
            ),
            (
                Some(9),
                "etcdserver: authentication is not enabled",
                Reading::Known(FailureKind::Authentication),
            ),
            (
                Some(16),
                "etcdserver: invalid auth token",
                Reading::Known(FailureKind::Authentication),
            ),
            (
                Some(14),
                "etcdserver: request timed out",
                Reading::Known(FailureKind::NoQuorum),
            ),
            (
                Some(14),
                "etcdserver: leader changed",
                Reading::Known(FailureKind::NoQuorum),
            ),
            (
                Some(14),
                "etcdserver: unhealthy cluster",
                Reading::Known(FailureKind::Other),
            ),
            (
                Some(4),
                "deadline has elapsed",
                Reading::Known(FailureKind::Timeout),
            ),
            (
                Some(1),
                "Timeout expired",
                Reading::Known(FailureKind::Timeout),
            ),
            (
                None,
                "load state had no answer within 1s",
                Reading::Known(FailureKind::Timeout),
            ),
            (
                Some(14),
                "tcp connect error: Connection refused",
                Reading::Known(FailureKind::Unreachable),
            ),
            (
                Some(8),
                "etcdserver: mvcc: database space exceeded",
                Reading::Known(FailureKind::Other),
            ),
            (
                Some(9),
                "etcdserver: requested lease not found",
                Reading::Known(FailureKind::Other),
            ),
        ];
        for (code, text, want) in cases {
            assert_eq!(classify(code, text), want, "{code:?} {text}");
        }
    }

    #[test]
    fn the_tls_reason_is_cut_out_of_the_error_chain() {
        let text = r#"status: Unavailable, message: "invalid peer certificate: UnknownIssuer", source: ..."#;
        assert_eq!(
            after(text, "invalid peer certificate: ").as_deref(),
            Some("UnknownIssuer")
        );
        let text = "transport error: received fatal alert: BadCertificate";
        assert_eq!(
            after(text, "received fatal alert: ").as_deref(),
            Some("BadCertificate")
        );
    }

    #[test]
    fn many_failures_read_as_one_line_per_endpoint_joined() {
        let failures = EndpointFailures(vec![
            EndpointFailure::timeout("https://a:1", Duration::from_secs(1)),
            EndpointFailure {
                endpoint: "https://b:1".into(),
                kind: FailureKind::NoQuorum,
                detail: "no leader".into(),
            },
        ]);
        let text = failures.to_string();
        assert!(
            text.starts_with("https://a:1: timeout: no answer within 1s"),
            "{text}"
        );
        assert!(
            text.ends_with("; https://b:1: no quorum: no leader"),
            "{text}"
        );
    }
}
