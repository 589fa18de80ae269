//! `metalguard-controller fence HOST --kubeconfig FILE`: creates a `FenceRequest`
//! (`generateName`, the reason, who asked) and waits, bounded, for the leader's verdict in
//! its status.

use std::collections::BTreeMap;
use std::time::Duration;

use anyhow::Context as _;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt as _;
use kube::api::{Api, PostParams};
use metalguard_api::k8s::fence::{FenceAction, FencePhase, FenceRequestSpec};
use metalguard_api::k8s::{FenceRequest, GuardedHost};

use super::{REQUESTED_BY, Target};

/// How often the request is read back while waiting for the verdict.
const POLL: Duration = Duration::from_millis(500);

/// What a person asks.
#[derive(Debug, Clone)]
pub struct Ask {
    /// The `GuardedHost`.
    pub host: String,
    /// Why.
    pub reason: String,
    /// Skip the policy gates (never the safety rules).
    pub force: bool,
    /// Power off and leave off (`action: PowerOff`).
    pub power_off: bool,
    /// A fence drill (`action: Drill`).
    pub drill: bool,
    /// How long to wait for the verdict.
    pub wait: Duration,
}

/// The leader's answer to a request, as read from its status.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Not answered yet.
    Pending,
    /// Accepted: a remediation runs (or ran) for it.
    Accepted(String),
    /// Refused by a rule; nothing was done.
    Rejected(String),
}

/// The verdict in `request`'s status: the first timeline entry of an accepted request, the
/// `Accepted=False` condition's reason and message of a rejected one.
pub fn verdict(request: &FenceRequest) -> Verdict {
    let Some(status) = &request.status else {
        return Verdict::Pending;
    };
    match status.phase {
        None | Some(FencePhase::Pending) => Verdict::Pending,
        Some(FencePhase::Rejected) => {
            let why = status
                .conditions
                .iter()
                .find(|c| c.type_ == "Accepted" && c.status == "False")
                .map_or_else(
                    || "no reason recorded".to_owned(),
                    |c| format!("{} ({})", c.message, c.reason),
                );
            Verdict::Rejected(why)
        }
        Some(phase) => Verdict::Accepted(
            status
                .timeline
                .first()
                .map_or_else(|| format!("{phase:?}"), |t| t.message.clone()),
        ),
    }
}

/// Creates the request and waits for the verdict; an error when it is refused or none came
/// within `ask.wait` (the request then stays, and the leader answers it later).
pub async fn fence(target: &Target, ask: &Ask) -> anyhow::Result<()> {
    let client = super::connect(&target.kubeconfig).await?;
    let ns = &target.namespace;
    let hosts: Api<GuardedHost> = Api::namespaced(client.clone(), ns);
    anyhow::ensure!(
        hosts
            .get_opt(&ask.host)
            .await
            .with_context(|| format!("GuardedHost {ns}/{} could not be read", ask.host))?
            .is_some(),
        "host {} is not a GuardedHost in namespace {ns}",
        ask.host
    );
    let who = super::who_am_i(&client).await?;
    let request = FenceRequest {
        metadata: ObjectMeta {
            generate_name: Some(format!("fence-{}-", ask.host)),
            namespace: Some(ns.clone()),
            annotations: Some(BTreeMap::from([(REQUESTED_BY.to_owned(), who.clone())])),
            ..ObjectMeta::default()
        },
        spec: FenceRequestSpec {
            target: ask.host.clone(),
            action: if ask.drill {
                FenceAction::Drill
            } else if ask.power_off {
                FenceAction::PowerOff
            } else {
                FenceAction::Remediate
            },
            reason: ask.reason.clone(),
            force: ask.force,
        },
        status: None,
    };
    let api: Api<FenceRequest> = Api::namespaced(client, ns);
    let created = api
        .create(&PostParams::default(), &request)
        .await
        .with_context(|| format!("FenceRequest for {} could not be created in {ns}", ask.host))?;
    let name = created.name_any();
    println!(
        "FenceRequest {ns}/{name} created by {who}: {} {}{}{}",
        if ask.drill { "fence drill of" } else { "fence" },
        ask.host,
        if ask.power_off {
            ", power off and leave off"
        } else {
            ""
        },
        if ask.force { " (forced)" } else { "" }
    );
    let deadline = tokio::time::Instant::now() + ask.wait;
    loop {
        let current = api
            .get(&name)
            .await
            .with_context(|| format!("FenceRequest {ns}/{name} could not be read back"))?;
        match verdict(&current) {
            Verdict::Accepted(message) => {
                println!("verdict: accepted — {message}");
                println!("follow it with `metalguard-controller status --kubeconfig …`");
                return Ok(());
            }
            Verdict::Rejected(why) => {
                println!("verdict: refused — {why}");
                anyhow::bail!("fence of {} refused; nothing was done", ask.host);
            }
            Verdict::Pending if tokio::time::Instant::now() >= deadline => anyhow::bail!(
                "no verdict on FenceRequest {ns}/{name} within {:?}: is a controller leading? the request stays and is answered when one does",
                ask.wait
            ),
            Verdict::Pending => tokio::time::sleep(POLL).await,
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
    use k8s_openapi::jiff::Timestamp;
    use metalguard_api::k8s::fence::{FenceRequestStatus, TimelineEntry};

    use super::*;

    fn request(status: Option<FenceRequestStatus>) -> FenceRequest {
        let mut r = FenceRequest::new(
            "fence-w-2-abcde",
            FenceRequestSpec {
                target: "w-2".to_owned(),
                action: FenceAction::Remediate,
                reason: "hung".to_owned(),
                force: false,
            },
        );
        r.status = status;
        r
    }

    #[test]
    fn a_request_without_a_phase_is_pending() {
        assert_eq!(verdict(&request(None)), Verdict::Pending);
        let pending = FenceRequestStatus {
            phase: Some(FencePhase::Pending),
            ..FenceRequestStatus::default()
        };
        assert_eq!(verdict(&request(Some(pending))), Verdict::Pending);
    }

    #[test]
    fn the_verdict_is_the_first_timeline_entry_or_the_refusing_condition() {
        let accepted = FenceRequestStatus {
            phase: Some(FencePhase::Succeeded),
            timeline: vec![TimelineEntry {
                time: Time(Timestamp::UNIX_EPOCH),
                phase: FencePhase::InProgress,
                remediation_phase: None,
                message: "accepted by controller-0".to_owned(),
            }],
            ..FenceRequestStatus::default()
        };
        assert_eq!(
            verdict(&request(Some(accepted))),
            Verdict::Accepted("accepted by controller-0".to_owned())
        );
        let rejected = FenceRequestStatus {
            phase: Some(FencePhase::Rejected),
            conditions: vec![Condition {
                type_: "Accepted".to_owned(),
                status: "False".to_owned(),
                reason: "ShortCircuit".to_owned(),
                message: "check workers short-circuited".to_owned(),
                last_transition_time: Time(Timestamp::UNIX_EPOCH),
                observed_generation: None,
            }],
            ..FenceRequestStatus::default()
        };
        assert_eq!(
            verdict(&request(Some(rejected))),
            Verdict::Rejected("check workers short-circuited (ShortCircuit)".to_owned())
        );
    }
}
