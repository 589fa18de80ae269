//! The local member as launchers that do not run etcd themselves see it: the agent hands
//! etcd's configuration to someone else (the host's supervisor, the kubelet) and then waits
//! until the member answers on its advertised client URL, or, when stopping, until nothing
//! accepts connections there any more.

use crate::client::{ClientSettings, bounded};
use std::time::{Duration, Instant};

/// Interval between two checks of the local member while waiting.
const ANSWER_POLL: Duration = Duration::from_millis(200);
/// Deadline of one check of the local member.
const ANSWER_TIMEOUT: Duration = Duration::from_secs(1);

/// How to reach the local member: its advertised client URL and the client settings (TLS).
#[derive(Debug, Clone, Default)]
pub(super) struct LocalMember {
    client: Option<ClientSettings>,
    client_url: Option<String>,
}

impl LocalMember {
    /// Remembers the member's client URL and the settings to call it with.
    pub(super) fn set(&mut self, client_url: &str, settings: &ClientSettings) {
        self.client_url = Some(client_url.to_owned());
        self.client = Some(settings.clone());
    }

    /// Remembers the member's client URL (from a start).
    pub(super) fn set_url(&mut self, client_url: &str) {
        self.client_url = Some(client_url.to_owned());
    }

    /// The member's advertised client URL, once known.
    pub(super) fn url(&self) -> Option<&str> {
        self.client_url.as_deref()
    }

    /// Waits up to `timeout` until the member at `client_url` answers a status call (a
    /// learner does); true when it did.
    pub(super) async fn wait_until_answering(&self, client_url: &str, timeout: Duration) -> bool {
        let settings = self
            .client
            .clone()
            .unwrap_or_else(|| ClientSettings::new(vec![client_url.to_owned()]));
        let started = Instant::now();
        loop {
            if answers(&settings, client_url).await {
                tracing::info!(
                    client_url,
                    waited_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
                    "local etcd answers"
                );
                return true;
            }
            if started.elapsed() >= timeout {
                return false;
            }
            tokio::time::sleep(ANSWER_POLL).await;
        }
    }

    /// Waits up to `timeout` until nothing accepts TCP connections on the member's client
    /// URL (true when so, also when no URL is known: nothing was started).
    pub(super) async fn wait_until_gone(&self, timeout: Duration) -> bool {
        let Some(url) = self.client_url.as_deref() else {
            return true;
        };
        let started = Instant::now();
        while accepts_connections(url).await {
            if started.elapsed() >= timeout {
                return false;
            }
            tokio::time::sleep(ANSWER_POLL).await;
        }
        true
    }
}

/// Whether the member at `client_url` answers a status call (a learner does).
async fn answers(settings: &ClientSettings, client_url: &str) -> bool {
    let Ok(mut client) = settings.connect_one(client_url, ANSWER_TIMEOUT).await else {
        return false;
    };
    bounded("status", client_url, ANSWER_TIMEOUT, client.status())
        .await
        .is_ok()
}

/// Whether anything accepts TCP connections on the host and port of `url`.
async fn accepts_connections(url: &str) -> bool {
    let Some(authority) = url
        .split_once("://")
        .map_or(url, |(_, rest)| rest)
        .split('/')
        .next()
    else {
        return false;
    };
    matches!(
        tokio::time::timeout(ANSWER_TIMEOUT, tokio::net::TcpStream::connect(authority)).await,
        Ok(Ok(_))
    )
}
