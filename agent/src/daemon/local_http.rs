//! The agent's local HTTP endpoint (loopback by default): `GET /metrics` (Prometheus text) and
//! `GET /status` (the local view as JSON, read by `metalguard-agent status`). Deliberately tiny:
//! two read-only routes do not justify a web framework in the agent.

use std::net::SocketAddr;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use super::metrics::AgentMetrics;

/// How long a client may take to send its request and read the answer: an idle connection is
/// closed after it.
const READ_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections served at once; further ones are closed as they are accepted, so a flood of
/// idle connections holds at most this many descriptors (the controller's metrics endpoint has
/// the same two bounds, issue 28).
pub const MAX_CONNECTIONS: usize = 16;
/// Pause after a failed accept (EMFILE and the like) before the next.
const ACCEPT_RETRY: Duration = Duration::from_millis(50);
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
    let slots = std::sync::Arc::new(tokio::sync::Semaphore::new(MAX_CONNECTIONS));
    loop {
        let accepted = tokio::select! {
            () = cancel.cancelled() => break,
            accepted = listener.accept() => accepted,
        };
        let Ok((stream, _)) = accepted else {
            tokio::time::sleep(ACCEPT_RETRY).await;
            continue;
        };
        let Ok(slot) = std::sync::Arc::clone(&slots).try_acquire_owned() else {
            drop(stream);
            continue;
        };
        let metrics = metrics.clone();
        let status = status.clone();
        tokio::spawn(async move {
            let _slot = slot;
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

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    use super::*;

    async fn get_status(addr: SocketAddr) -> std::io::Result<String> {
        let mut stream = TcpStream::connect(addr).await?;
        stream
            .write_all(b"GET /status HTTP/1.1\r\nHost: x\r\n\r\n")
            .await?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await?;
        Ok(answer)
    }

    /// Whether the peer closed `stream` within `within`.
    async fn closed(stream: &mut TcpStream, within: Duration) -> bool {
        let mut byte = [0u8; 1];
        matches!(
            tokio::time::timeout(within, stream.read(&mut byte)).await,
            Ok(Ok(0) | Err(_))
        )
    }

    #[tokio::test]
    async fn a_flood_of_idle_connections_holds_at_most_the_cap_and_each_is_closed_in_time() {
        let (listener, addr) = bind("127.0.0.1:0".parse().unwrap()).await.unwrap();
        let cancel = CancellationToken::new();
        let status: StatusFn = std::sync::Arc::new(|| "{}".to_owned());
        let server = tokio::spawn(serve(listener, AgentMetrics::new(), status, cancel.clone()));
        let mut idle = Vec::new();
        for _ in 0..MAX_CONNECTIONS {
            idle.push(TcpStream::connect(addr).await.unwrap());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        // Beyond the cap: closed as soon as accepted, holding no descriptor.
        let mut surplus = TcpStream::connect(addr).await.unwrap();
        assert!(closed(&mut surplus, Duration::from_millis(500)).await);
        // The idle ones are closed once their read timeout passes; then /status answers.
        let started = tokio::time::Instant::now();
        for stream in &mut idle {
            assert!(closed(stream, READ_TIMEOUT * 2).await);
        }
        assert!(started.elapsed() <= READ_TIMEOUT + Duration::from_secs(1));
        let answer = get_status(addr).await.unwrap();
        assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
        cancel.cancel();
        server.await.unwrap();
    }
}
