//! `status`'s view of every etcd endpoint: each asked on its own (a status call on a client of
//! its own, under a deadline of its own, all at once), so that one endpoint that never
//! answers costs one timeout and hides nothing about the others. A failure says how the
//! endpoint failed ([`crate::standalone::diagnosis`]).

use std::fmt::Write as _;

use serde::Serialize;

use crate::standalone::access::EtcdAccess;
use crate::standalone::diagnosis::{EndpointFailure, describe};

/// What one member said about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberAnswer {
    /// The member's id, hex as `etcdctl` prints it.
    pub member_id: String,
    /// The leader it sees, hex; `None` without a leader (no quorum).
    pub leader: Option<String>,
    /// etcd's version.
    pub version: String,
    /// Whether the member is a learner.
    pub is_learner: bool,
    /// The member's errors (alarms).
    pub errors: Vec<String>,
}

/// One endpoint's answer or failure.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EndpointReport {
    /// The endpoint.
    pub endpoint: String,
    /// What it said, when it answered.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<MemberAnswer>,
    /// How it failed, when it did not.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<EndpointFailure>,
}

/// Asks every endpoint at once; the reports come back in the order of `endpoints`.
pub async fn ask_each(endpoints: &[String], access: &EtcdAccess) -> Vec<EndpointReport> {
    let mut tasks = tokio::task::JoinSet::new();
    for (i, endpoint) in endpoints.iter().enumerate() {
        let (endpoint, access) = (endpoint.clone(), access.clone());
        tasks.spawn(async move { (i, ask(&endpoint, &access).await) });
    }
    let mut reports: Vec<Option<EndpointReport>> = vec![None; endpoints.len()];
    while let Some(joined) = tasks.join_next().await {
        if let Ok((i, report)) = joined {
            reports[i] = Some(report);
        }
    }
    reports
        .into_iter()
        .zip(endpoints)
        .map(|(report, endpoint)| {
            report.unwrap_or_else(|| EndpointReport {
                endpoint: endpoint.clone(),
                answer: None,
                failure: Some(EndpointFailure {
                    endpoint: endpoint.clone(),
                    kind: crate::standalone::diagnosis::FailureKind::Other,
                    detail: "the probe task failed".to_owned(),
                }),
            })
        })
        .collect()
}

async fn ask(endpoint: &str, access: &EtcdAccess) -> EndpointReport {
    let outcome = status_of(endpoint, access).await;
    let (answer, failure) = match outcome {
        Ok(answer) => (Some(answer), None),
        Err(failure) => (None, Some(failure)),
    };
    EndpointReport {
        endpoint: endpoint.to_owned(),
        answer,
        failure,
    }
}

async fn status_of(endpoint: &str, access: &EtcdAccess) -> Result<MemberAnswer, EndpointFailure> {
    let deadline = access.timeout();
    let connect = etcd_client::Client::connect([endpoint], Some(access.options()));
    let mut client = match tokio::time::timeout(deadline, connect).await {
        Err(_) => return Err(EndpointFailure::timeout(endpoint, deadline)),
        Ok(Err(error)) => return Err(describe(endpoint, &error, access).await),
        Ok(Ok(client)) => client,
    };
    let status = match tokio::time::timeout(deadline, client.status()).await {
        Err(_) => return Err(EndpointFailure::timeout(endpoint, deadline)),
        Ok(Err(error)) => return Err(describe(endpoint, &error, access).await),
        Ok(Ok(status)) => status,
    };
    Ok(MemberAnswer {
        member_id: format!(
            "{:x}",
            status
                .header()
                .map_or(0, etcd_client::ResponseHeader::member_id)
        ),
        leader: (status.leader() != 0).then(|| format!("{:x}", status.leader())),
        version: status.version().to_owned(),
        is_learner: status.is_learner(),
        errors: status
            .errors()
            .iter()
            .map(|e| e.trim().to_owned())
            .collect(),
    })
}

/// The text block of `status`: one line per endpoint.
pub fn render(reports: &[EndpointReport], access: &EtcdAccess) -> String {
    let mut out = format!("etcd endpoints (as {}):\n", access.identity());
    for report in reports {
        let _ = match (&report.answer, &report.failure) {
            (Some(a), _) => writeln!(
                out,
                "  {}: member {}{}, {}, etcd {}{}",
                report.endpoint,
                a.member_id,
                if a.is_learner { " (learner)" } else { "" },
                a.leader.as_ref().map_or_else(
                    || "sees no leader (no quorum)".to_owned(),
                    |l| format!("leader {l}")
                ),
                a.version,
                if a.errors.is_empty() {
                    String::new()
                } else {
                    format!(", errors: {}", a.errors.join("; "))
                }
            ),
            (None, Some(f)) => writeln!(
                out,
                "  {}: {}: {}",
                report.endpoint,
                f.kind.label(),
                f.detail
            ),
            (None, None) => writeln!(out, "  {}: no report", report.endpoint),
        };
    }
    out
}

/// Whether every endpoint that answered sees no leader, and at least one answered: the
/// cluster has no quorum (as opposed to the store being unreachable or refusing us).
pub fn no_quorum(reports: &[EndpointReport]) -> bool {
    let answers: Vec<&MemberAnswer> = reports.iter().filter_map(|r| r.answer.as_ref()).collect();
    !answers.is_empty() && answers.iter().all(|a| a.leader.is_none())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::standalone::diagnosis::FailureKind;

    fn answered(leader: Option<&str>) -> EndpointReport {
        EndpointReport {
            endpoint: "https://10.0.0.1:2379".into(),
            answer: Some(MemberAnswer {
                member_id: "8e9e05c52164694d".into(),
                leader: leader.map(str::to_owned),
                version: "3.4.23".into(),
                is_learner: false,
                errors: vec![],
            }),
            failure: None,
        }
    }

    #[test]
    fn quorum_is_lost_only_when_every_answering_member_sees_no_leader() {
        let failed = EndpointReport {
            endpoint: "https://10.0.0.2:2379".into(),
            answer: None,
            failure: Some(EndpointFailure {
                endpoint: "https://10.0.0.2:2379".into(),
                kind: FailureKind::Timeout,
                detail: "no answer".into(),
            }),
        };
        assert!(no_quorum(&[answered(None), failed.clone()]));
        assert!(!no_quorum(&[answered(Some("1")), answered(None)]));
        assert!(!no_quorum(std::slice::from_ref(&failed)));
    }
}
