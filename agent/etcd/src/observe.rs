//! Builds a [`ClusterView`] from one client per endpoint, probed in parallel.
//!
//! Flow: every configured endpoint is asked for its status and the member list at once; the
//! member list of the most advanced answer (highest raft index) is taken; every started
//! member whose client URL was not probed yet is probed next, again in parallel; the answers
//! are matched to members by the member ID in the status header, or by client URL for
//! endpoints that did not answer. Each call is bounded by the probe timeout, so a hung member
//! shows as unreachable after that long and a dead endpoint only fails its own probe.

use crate::client::{ClientSettings, bounded};
use crate::error::EtcdError;
use crate::view::{ClusterView, MemberStatus, MemberView, Probe, parse_alarms};
use futures::future::join_all;
use std::time::Instant;

/// A member as the member list returned it.
#[derive(Debug, Clone)]
struct ListedMember {
    id: u64,
    name: String,
    peer_urls: Vec<String>,
    client_urls: Vec<String>,
    is_learner: bool,
}

struct EndpointAnswer {
    probe: Probe,
    members: Option<Vec<ListedMember>>,
}

/// Observes the cluster through the configured endpoints.
pub async fn observe(settings: &ClientSettings) -> Result<ClusterView, EtcdError> {
    // Boxed: the parallel probes make a large future, which callers should not inline.
    Box::pin(observe_unboxed(settings)).await
}

async fn observe_unboxed(settings: &ClientSettings) -> Result<ClusterView, EtcdError> {
    if settings.endpoints.is_empty() {
        return Err(EtcdError::NoEndpoints);
    }
    let first: Vec<EndpointAnswer> = join_all(
        settings
            .endpoints
            .iter()
            .map(|e| probe_endpoint(settings, e, true)),
    )
    .await;
    let listed = first
        .iter()
        .filter_map(|a| {
            a.members
                .as_ref()
                .map(|m| (a.probe.status.as_ref().map_or(0, |s| s.raft_index), m))
        })
        .max_by_key(|(index, _)| *index)
        .map(|(_, members)| members.clone())
        .ok_or_else(|| EtcdError::NoEndpointAnswered {
            endpoints: settings.endpoints.clone(),
        })?;

    let mut probes: Vec<Probe> = first.into_iter().map(|a| a.probe).collect();
    let missing: Vec<&str> = listed
        .iter()
        .filter(|m| !probes.iter().any(|p| probe_matches(p, m)))
        .filter_map(|m| m.client_urls.first().map(String::as_str))
        .collect();
    let second = join_all(missing.iter().map(|e| probe_endpoint(settings, e, false))).await;
    probes.extend(second.into_iter().map(|a| a.probe));

    let mut used = vec![false; probes.len()];
    let members = listed
        .into_iter()
        .map(|m| {
            let index = probes
                .iter()
                .position(|p| p.status.as_ref().is_some_and(|s| s.member_id == m.id))
                .or_else(|| {
                    probes
                        .iter()
                        .position(|p| p.status.is_none() && probe_matches(p, &m))
                });
            let probe = index.map(|i| {
                used[i] = true;
                probes[i].clone()
            });
            MemberView {
                started: !m.name.is_empty() && !m.client_urls.is_empty(),
                id: m.id,
                name: m.name,
                peer_urls: m.peer_urls,
                client_urls: m.client_urls,
                is_learner: m.is_learner,
                probe,
            }
        })
        .collect();
    let stray = probes
        .into_iter()
        .zip(used)
        .filter(|(p, used)| !used && p.status.is_none())
        .map(|(p, _)| p)
        .collect();
    Ok(ClusterView::new(members, stray))
}

fn probe_matches(probe: &Probe, member: &ListedMember) -> bool {
    let endpoint = probe.endpoint.trim_end_matches('/');
    probe
        .status
        .as_ref()
        .is_some_and(|s| s.member_id == member.id)
        || member
            .client_urls
            .iter()
            .any(|u| u.trim_end_matches('/') == endpoint)
}

/// Observes the cluster like [`observe`], then confirms its membership as of a
/// linearizable read: through the leader (or, failing it, another healthy voter) a quorum
/// read, then that member's member list, which must list the same members. etcd's member
/// list call is never linearizable on its own (DOMAIN.md §1); after a quorum read served by
/// a member, that member has applied every membership change committed before the read.
/// For decisions that must not rest on a stale membership: the executing agent's quorum
/// check before it cuts a host's power.
pub async fn observe_confirmed(settings: &ClientSettings) -> Result<ClusterView, EtcdError> {
    let view = observe(settings).await?;
    let mut servers: Vec<&MemberView> = view.leader().into_iter().collect();
    servers.extend(
        view.voters()
            .filter(|v| v.healthy() && Some(v.id) != view.summary.leader),
    );
    let mut failures = Vec::new();
    for server in servers {
        let Some(endpoint) = server.client_urls.first() else {
            continue;
        };
        match Box::pin(confirmed_member_ids(settings, endpoint)).await {
            Ok(mut ids) => {
                ids.sort_unstable();
                let seen: Vec<u64> = view.members.iter().map(|m| m.id).collect();
                if ids == seen {
                    return Ok(view);
                }
                return Err(EtcdError::MembershipUnconfirmed {
                    detail: format!(
                        "the probes saw members {seen:x?}, {endpoint} lists {ids:x?} after a quorum read"
                    ),
                });
            }
            Err(err) => failures.push(format!("{endpoint}: {}", error_chain(&err))),
        }
    }
    Err(EtcdError::MembershipUnconfirmed {
        detail: if failures.is_empty() {
            "no healthy voter to read through".to_owned()
        } else {
            failures.join("; ")
        },
    })
}

/// A linearizable (quorum) read through `endpoint`, then the member ids it lists.
async fn confirmed_member_ids(
    settings: &ClientSettings,
    endpoint: &str,
) -> Result<Vec<u64>, EtcdError> {
    let timeout = settings.probe_timeout;
    let client = settings.connect_one(endpoint, timeout).await?;
    let mut kv = client.kv_client();
    let options = etcd_client::GetOptions::new().with_count_only();
    bounded(
        "linearizable read",
        endpoint,
        timeout,
        kv.get(CONFIRM_KEY, Some(options)),
    )
    .await?;
    let mut cluster = client.cluster_client();
    let listed = bounded("member list", endpoint, timeout, cluster.member_list()).await?;
    Ok(listed
        .members()
        .iter()
        .map(etcd_client::Member::id)
        .collect())
}

/// The key of the confirming read: its value does not matter, only that a quorum served it.
const CONFIRM_KEY: &str = "/metalguard/membership-check";

/// Asks exactly one endpoint for its status (no member list), under the probe timeout: the
/// agent's `EtcdNoSpace` probe reads the alarms of the local member this way.
pub async fn endpoint_status(settings: &ClientSettings, endpoint: &str) -> Probe {
    probe_endpoint(settings, endpoint, false).await.probe
}

/// Probes one endpoint: status, and the member list when `with_members`.
async fn probe_endpoint(
    settings: &ClientSettings,
    endpoint: &str,
    with_members: bool,
) -> EndpointAnswer {
    let started = Instant::now();
    let timeout = settings.probe_timeout;
    let client = match settings.connect_one(endpoint, timeout).await {
        Ok(client) => client,
        Err(err) => return failed(endpoint, started, &err),
    };
    let mut status_client = client.maintenance_client();
    let mut cluster_client = client.cluster_client();
    let status_call = bounded("status", endpoint, timeout, status_client.status());
    let list_call = async {
        if with_members {
            Some(
                bounded(
                    "member list",
                    endpoint,
                    timeout,
                    cluster_client.member_list(),
                )
                .await,
            )
        } else {
            None
        }
    };
    let (status, list) = futures::join!(status_call, list_call);
    let members = list.and_then(Result::ok).map(|resp| {
        resp.members()
            .iter()
            .map(|m| ListedMember {
                id: m.id(),
                name: m.name().to_owned(),
                peer_urls: m.peer_urls().to_vec(),
                client_urls: m.client_urls().to_vec(),
                is_learner: m.is_learner(),
            })
            .collect()
    });
    let status = match status {
        Ok(status) => status,
        Err(err) => {
            let mut answer = failed(endpoint, started, &err);
            answer.members = members;
            return answer;
        }
    };
    let errors = status.errors().to_vec();
    let status = MemberStatus {
        member_id: status
            .header()
            .map_or(0, etcd_client::ResponseHeader::member_id),
        leader: status.leader(),
        is_learner: status.is_learner(),
        raft_term: status.raft_term(),
        raft_index: status.raft_index(),
        raft_applied_index: status.raft_applied_index(),
        db_size: status.db_size(),
        version: status.version().to_owned(),
        alarms: parse_alarms(&errors),
        errors,
    };
    let healthy = status.is_healthy();
    EndpointAnswer {
        probe: Probe {
            endpoint: endpoint.to_owned(),
            reachable: true,
            healthy,
            status: Some(status),
            error: None,
            latency_ms: elapsed_ms(started),
        },
        members,
    }
}

fn failed(endpoint: &str, started: Instant, err: &EtcdError) -> EndpointAnswer {
    tracing::debug!(endpoint, error = %err, "etcd probe failed");
    EndpointAnswer {
        probe: Probe {
            endpoint: endpoint.to_owned(),
            reachable: false,
            healthy: false,
            status: None,
            error: Some(error_chain(err)),
            latency_ms: elapsed_ms(started),
        },
        members: None,
    }
}

fn elapsed_ms(started: Instant) -> u64 {
    u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX)
}

/// An error and its causes on one line, for the view's `error` fields.
pub(crate) fn error_chain(err: &dyn std::error::Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        out.push_str(": ");
        out.push_str(&cause.to_string());
        source = cause.source();
    }
    out
}
