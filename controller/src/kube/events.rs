//! Kubernetes Events for decisions and refusals, and the `HostHealthCheck` status written from
//! each round's check summaries.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff;
use kube::api::{Api, Patch, PatchParams, PostParams};
use metalguard_api::k8s::HostHealthCheck;
use serde_json::json;

use super::{FIELD_MANAGER, KubeBackend, REPORTING_CONTROLLER, record};

/// An Event a round tells: its key (what is announced once), the host, type, reason,
/// action and note.
pub(super) type Announcement = (String, String, String, String, String, String);

impl KubeBackend {
    pub(super) async fn event(
        &self,
        regarding: ObjectReference,
        type_: &str,
        reason: &str,
        action: &str,
        note: &str,
    ) {
        let mut note = note.to_owned();
        if note.len() > 1000 {
            let mut cut = 1000;
            while !note.is_char_boundary(cut) {
                cut -= 1;
            }
            note.truncate(cut);
        }
        let event = Event {
            metadata: ObjectMeta {
                // A generateName must itself be a valid name prefix: `w-1-`, never `w-1.`.
                generate_name: Some(format!(
                    "{}-",
                    regarding
                        .name
                        .clone()
                        .unwrap_or_else(|| "metalguard".to_owned())
                )),
                namespace: Some(self.ns().to_owned()),
                ..ObjectMeta::default()
            },
            event_time: Some(MicroTime(jiff::Timestamp::now())),
            action: Some(action.to_owned()),
            reason: Some(reason.to_owned()),
            note: Some(note),
            type_: Some(type_.to_owned()),
            regarding: Some(regarding),
            reporting_controller: Some(REPORTING_CONTROLLER.to_owned()),
            reporting_instance: Some(self.settings.identity.clone()),
            ..Event::default()
        };
        let api: Api<Event> = Api::namespaced(self.client.clone(), self.ns());
        if let Err(error) = api.create(&PostParams::default(), &event).await {
            tracing::warn!(%error, reason, "event could not be written");
        }
    }

    /// Writes `events` on their `GuardedHost`s while `deadline` allows ([`super::budget`]);
    /// returns the keys of those not written.
    pub(super) async fn announce(
        &self,
        events: Vec<Announcement>,
        deadline: tokio::time::Instant,
    ) -> Vec<String> {
        let (_, unsent) = super::budget::within(
            events,
            super::budget::CONCURRENCY,
            deadline,
            |(_, host, type_, reason, action, note): Announcement| async move {
                let regarding = self.reference("GuardedHost", &host);
                self.event(regarding, &type_, &reason, &action, &note).await;
            },
        )
        .await;
        unsent.into_iter().map(|(key, ..)| key).collect()
    }

    pub(super) fn reference(&self, kind: &str, name: &str) -> ObjectReference {
        ObjectReference {
            api_version: Some("metalguard.io/v1alpha1".to_owned()),
            kind: Some(kind.to_owned()),
            name: Some(name.to_owned()),
            namespace: Some(self.ns().to_owned()),
            ..ObjectReference::default()
        }
    }

    /// Writes a health check's verdict (`RemediationAllowed` and the counts) when it changed.
    pub(super) async fn check_status(&mut self, check: &metalguard_api::plan::CheckSummary) {
        let allowed = check.short_circuit.is_none();
        let message = check.short_circuit.clone().unwrap_or_else(|| {
            format!(
                "{} of {} hosts unhealthy; within maxUnhealthy",
                check.unhealthy.len(),
                check.targets
            )
        });
        let verdict = format!("{allowed}:{message}");
        if self.check_verdicts.get(&check.name) == Some(&verdict) {
            return;
        }
        let expected = u32::try_from(check.targets).unwrap_or(u32::MAX);
        let unhealthy = u32::try_from(check.unhealthy.len()).unwrap_or(u32::MAX);
        let remaining = check
            .max_unhealthy
            .map_or(0, |m| m.saturating_sub(check.unhealthy.len()));
        let patch = json!({
            "apiVersion": "metalguard.io/v1alpha1",
            "kind": "HostHealthCheck",
            "status": {
                "expectedHosts": expected,
                "currentHealthy": expected.saturating_sub(unhealthy),
                "remediationsAllowed": if allowed { u32::try_from(remaining).unwrap_or(u32::MAX) } else { 0 },
                "conditions": [{
                    "type": "RemediationAllowed",
                    "status": if allowed { "True" } else { "False" },
                    "reason": if allowed { "WithinMaxUnhealthy" } else { "TooManyUnhealthy" },
                    "message": message,
                    "lastTransitionTime": record::time(crate::clock::now()),
                }],
            },
        });
        let api: Api<HostHealthCheck> = Api::namespaced(self.client.clone(), self.ns());
        match api
            .patch_status(
                &check.name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
        {
            Ok(_) => {
                if !allowed {
                    let regarding = self.reference("HostHealthCheck", &check.name);
                    self.event(
                        regarding,
                        "Warning",
                        "RemediationShortCircuited",
                        "Evaluate",
                        &message,
                    )
                    .await;
                }
                self.check_verdicts.insert(check.name.clone(), verdict);
            }
            Err(error) => {
                tracing::warn!(check = %check.name, %error, "health check status not written");
            }
        }
    }
}
