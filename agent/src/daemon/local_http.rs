//! The agent's local HTTP endpoint (loopback by default): `GET /metrics` (Prometheus text) and
//! `GET /status` (the local view as JSON, read by `metalguard-agent status`). Deliberately tiny:
//! two read-only routes do not justify a web framework in the agent.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::metrics::AgentMetrics;

/// How long a client may take to send its request line.
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest request head read.
const MAX_REQUEST: usize = 8 * 1024;

/// Produces the `/status` body on demand.
pub type StatusFn = std::sync::Arc<dyn Fn() -> String + Send + Sync>;

/// Binds `addr`; returns the bound address (useful with port 0).
pub async fn bind(addr: SocketAddr) -> std::io::Result<(TcpListener, SocketAddr)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    Ok((listener, local))
}

/// Serves until `cancel`.
pub async fn serve(
    listener: TcpListener,
    metrics: AgentMetrics,
    status: StatusFn,
    cancel: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else {
            continue;
        };
        let metrics = metrics.clone();
        let status = status.clone();
        tokio::spawn(async move {
            let _ = tokio::time::timeout(READ_TIMEOUT, answer(stream, &metrics, &status)).await;
        });
    }
}

async fn answer(
    mut stream: TcpStream,
    metrics: &AgentMetrics,
    status: &StatusFn,
) -> std::io::Result<()> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_REQUEST {
        let n = stream.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&buf[..n]);
    }
    let line = String::from_utf8_lossy(&head);
    let mut parts = line.split_whitespace();
    let (method, path) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
    let (code, content_type, body) = match (method, path) {
        ("GET", "/metrics") => (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.encode(),
        ),
        ("GET", "/status") => ("200 OK", "application/json", status()),
        ("GET", _) => ("404 Not Found", "text/plain", "not found\n".to_owned()),
        _ => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n".to_owned(),
        ),
    };
    let response = format!(
        "HTTP/1.1 {code}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(response.as_bytes()).await?;
    stream.shutdown().await
}
