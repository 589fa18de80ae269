//! `FenceRequest` status: accepted when the planner takes a request, then following the
//! remediation it started (its phase and timeline) until it ends.

use std::collections::BTreeSet;

use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use metalguard_api::k8s::FenceRequest;
use metalguard_api::k8s::fence::{FencePhase, FenceRequestStatus, TimelineEntry};
use metalguard_api::k8s::host::RemediationPhaseName;
use metalguard_api::remediation::{Remediation, RemediationPhase};
use serde_json::json;

use super::{FIELD_MANAGER, KubeBackend, record, world};
use crate::backend::BackendError;

impl KubeBackend {
    /// Answers the oldest pending fence request for `target`: it became `remediation`.
    pub(super) async fn accept_fence_request(
        &mut self,
        target: &str,
        remediation: Option<&Remediation>,
    ) -> Result<(), BackendError> {
        let mut pending: Vec<FenceRequest> = self
            .world
            .fences
            .state()
            .iter()
            .filter_map(|f| self.fence_request(&f.name_any()))
            .filter(|f| f.spec.target == target && world::pending_fence(f))
            .collect();
        pending.sort_by_key(|f| (f.creation_timestamp().map(|t| t.0), f.name_any()));
        let Some(request) = pending.first() else {
            return Ok(());
        };
        let now = record::time(crate::clock::now());
        let status = FenceRequestStatus {
            phase: Some(FencePhase::InProgress),
            remediation_id: remediation.map(|r| r.id.clone()),
            remediation_phase: remediation.map(|r| (&r.phase).into()),
            timeline: vec![TimelineEntry {
                time: now,
                phase: FencePhase::InProgress,
                remediation_phase: remediation.map(|r| (&r.phase).into()),
                message: format!(
                    "accepted by {}: remediation {} started",
                    self.settings.identity,
                    remediation.map_or("?", |r| r.id.as_str())
                ),
            }],
            conditions: Vec::new(),
        };
        self.put_fence_status(&request.name_any(), &status).await
    }

    pub(super) async fn put_fence_status(
        &mut self,
        name: &str,
        status: &FenceRequestStatus,
    ) -> Result<(), BackendError> {
        let patch = json!({
            "apiVersion": "metalguard.io/v1alpha1",
            "kind": "FenceRequest",
            "status": status,
        });
        let api: Api<FenceRequest> = Api::namespaced(self.client.clone(), self.ns());
        let written = api
            .patch_status(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(|e| Self::unavailable(format!("status of FenceRequest {name}"), e))?;
        self.written_fences.insert(name.to_owned(), written);
        Ok(())
    }

    /// Appends a remediation's new phase to the timeline of the fence request that started it.
    pub(super) async fn follow_fence_request(
        &mut self,
        r: &Remediation,
    ) -> Result<(), BackendError> {
        let names: BTreeSet<String> = self
            .world
            .fences
            .state()
            .iter()
            .map(|f| f.name_any())
            .chain(self.written_fences.keys().cloned())
            .collect();
        let requests: Vec<FenceRequest> =
            names.iter().filter_map(|n| self.fence_request(n)).collect();
        let Some(request) = requests.into_iter().find(|f| {
            f.status.as_ref().and_then(|s| s.remediation_id.as_deref()) == Some(r.id.as_str())
        }) else {
            return Ok(());
        };
        let mut status = request.status.clone().unwrap_or_default();
        let phase_name: RemediationPhaseName = (&r.phase).into();
        if status.remediation_phase == Some(phase_name) {
            return Ok(());
        }
        let phase = match &r.phase {
            RemediationPhase::Done => FencePhase::Succeeded,
            // Powered off and left off, as a `PowerOff` request asks: done, for a person now.
            RemediationPhase::NeedsPerson { .. } if r.stay_off => FencePhase::Succeeded,
            RemediationPhase::Failed { .. } | RemediationPhase::NeedsPerson { .. } => {
                FencePhase::Failed
            }
            RemediationPhase::Cancelled { .. } => FencePhase::Cancelled,
            _ => FencePhase::InProgress,
        };
        status.phase = Some(phase);
        status.remediation_phase = Some(phase_name);
        let detail = match &r.phase {
            RemediationPhase::Failed { reason }
            | RemediationPhase::NeedsPerson { reason }
            | RemediationPhase::Cancelled { reason } => format!(": {reason}"),
            _ => String::new(),
        };
        status.timeline.push(TimelineEntry {
            time: record::time(r.phase_since),
            phase,
            remediation_phase: Some(phase_name),
            message: format!("remediation {} is {}{detail}", r.id, r.phase.name()),
        });
        self.put_fence_status(&request.name_any(), &status).await
    }
}
