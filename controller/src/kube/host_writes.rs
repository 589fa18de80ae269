//! The leader's writes to a `GuardedHost`: its remediation and operations in status by
//! server-side apply (intent before the command is offered), and metalguard's hook annotations.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::{Patch, PatchParams};
use metalguard_api::remediation::Remediation;
use serde_json::json;

use super::{FIELD_MANAGER, KEEP_OPERATIONS, KubeBackend, hooks, observe, record};
use crate::backend::{BackendError, StoredOperation, Write};

impl KubeBackend {
    /// The writes of one round, in the executor's order (the leader's lease checked by the
    /// caller).
    pub(super) async fn apply_writes(&mut self, writes: Vec<Write>) -> Result<(), BackendError> {
        // Consecutive record writes of one host become one status apply (intent and phase
        // together); everything else is one request, in the executor's order.
        let mut i = 0;
        // A remediation whose node lease could not be taken is left out, and said at the end;
        // the writes of other hosts still go (a missing lease grant must not stop the rest).
        let mut unleased: Option<BackendError> = None;
        while i < writes.len() {
            match &writes[i] {
                Write::CreateOperation(_) | Write::PutOperation(_) | Write::PutRemediation(_) => {
                    let home = |w: &Write| match w {
                        Write::CreateOperation(op) | Write::PutOperation(op) => {
                            Some(record::home_of(op).to_owned())
                        }
                        Write::PutRemediation(r) => Some(r.target.clone()),
                        _ => None,
                    };
                    let host = home(&writes[i]).unwrap_or_default();
                    let mut remediation = None;
                    let mut ops = Vec::new();
                    while i < writes.len() && home(&writes[i]).as_deref() == Some(host.as_str()) {
                        match &writes[i] {
                            Write::CreateOperation(op) | Write::PutOperation(op) => {
                                ops.push(op.clone());
                            }
                            Write::PutRemediation(r) => remediation = Some(r.clone()),
                            _ => {}
                        }
                        i += 1;
                    }
                    // A remediation about to start, or a retirement's power-off, takes the
                    // host's node lease first: no second actor disrupts it meanwhile, and none
                    // is disrupting it now.
                    let starting = remediation.as_ref().is_some_and(|r| {
                        matches!(
                            r.phase,
                            metalguard_api::remediation::RemediationPhase::Detected
                                | metalguard_api::remediation::RemediationPhase::Gated
                        )
                    });
                    let decommissioning = ops.iter().any(|op| {
                        op.in_flight() && metalguard_core::retire::is_decommission(&op.id)
                    });
                    if (starting || decommissioning)
                        && let Err(error) = self.take_node_lease(&host).await
                    {
                        tracing::warn!(%host, error = %crate::error::chain(&error), "remediation or retirement power-off not started: the host's node lease was not taken");
                        // Its fence request, if one asked for it, stays pending too.
                        if matches!(writes.get(i), Some(Write::DeleteFenceRequest(t)) if *t == host)
                        {
                            i += 1;
                        }
                        unleased.get_or_insert(error);
                        continue;
                    }
                    self.apply_host_status(&host, remediation.clone(), ops)
                        .await?;
                    if let Some(Write::DeleteFenceRequest(target)) = writes.get(i) {
                        self.accept_fence_request(target, remediation.as_ref())
                            .await?;
                        i += 1;
                    }
                    continue;
                }
                Write::DeleteFenceRequest(target) => {
                    self.accept_fence_request(target, None).await?;
                }
                Write::PutHooks(host, hooks) => self.put_hooks(host, hooks).await?,
                Write::PutNotes(notes) => self.notes = Some(notes.clone()),
                Write::Node(node) => self.node_write(node.clone()).await?,
                Write::CreateHold(record) => self.create_hold(record).await?,
                // `status.holds` keeps the newest released holds within its bound
                // (`holds::trim`): nothing to forget separately. FenceRequest objects carry no
                // nonce: RBAC is the boundary there, and a served object's status says so
                // (docs/threat-model.md).
                Write::DeleteHold(_) | Write::ConsumeFenceRequest(_) => {}
                // Never planned here: GuardedHost status is not sealed (RBAC is the boundary,
                // docs/threat-model.md), so no record is ever stale.
                Write::Reseal(stale) => {
                    tracing::warn!(key = %stale.key, "reseal ignored: the kubernetes backend does not seal records");
                }
            }
            i += 1;
        }
        unleased.map_or(Ok(()), Err)
    }

    /// Server-side applies `status.remediation` and `status.operations` of `host`.
    pub(super) async fn apply_host_status(
        &mut self,
        host: &str,
        remediation: Option<Remediation>,
        operations: Vec<StoredOperation>,
    ) -> Result<(), BackendError> {
        // Only this host's status holds its records (and every operation kept there is
        // at home there): no need to rebuild the whole state for one write.
        let status = self.host(host).and_then(|h| h.status).unwrap_or_default();
        let remediation = remediation.or_else(|| {
            status
                .remediation
                .as_ref()
                .map(|r| record::remediation(host, r))
        });
        let mut ops: BTreeMap<String, StoredOperation> = status
            .operations
            .iter()
            .filter_map(|entry| record::operation(entry).ok())
            .map(|op| (op.id.to_string(), op))
            .collect();
        for op in operations {
            ops.insert(op.id.to_string(), op);
        }
        let current_id = remediation.as_ref().map(|r| r.id.clone());
        let (mine, mut others): (Vec<_>, Vec<_>) = ops
            .into_values()
            .partition(|op| op.remediation_id.is_some() && op.remediation_id == current_id);
        // Older remediations' operations are history; membership operations stay while in
        // flight and the latest few after.
        others.retain(|op| op.remediation_id.is_none());
        others.sort_by_key(|op| std::cmp::Reverse(op.created_at));
        let mut kept: Vec<StoredOperation> = mine;
        let mut finished = 0;
        for op in others {
            if op.in_flight() || finished < KEEP_OPERATIONS {
                finished += usize::from(!op.in_flight());
                kept.push(op);
            }
        }
        kept.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        // The observed fields go along: one manager owns the whole status, and an apply
        // without a field it owns would drop that field.
        let mut status = status;
        status.operations = kept.iter().map(record::operation_status).collect();
        status.remediation = remediation.as_ref().map(record::remediation_status);
        let patch = observe::host_status_apply(&status);
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let written = self
            .hosts_api()
            .patch_status(host, &params, &Patch::Apply(&patch))
            .await
            .map_err(|e| Self::unavailable(format!("status of GuardedHost {host}"), e))?;
        self.written_hosts.insert(host.to_owned(), written);
        if let Some(r) = &remediation {
            self.follow_fence_request(r).await?;
        }
        Ok(())
    }

    /// Places or releases metalguard's preDrain hook annotations (the spec's hooks belong to
    /// their owners and are never touched).
    pub(super) async fn put_hooks(
        &mut self,
        host: &str,
        wanted: &BTreeSet<String>,
    ) -> Result<(), BackendError> {
        let Some(object) = self.host(host) else {
            return Ok(());
        };
        let from_spec: BTreeSet<&str> = object
            .spec
            .lifecycle_hooks
            .pre_drain
            .iter()
            .map(|h| h.name.as_str())
            .collect();
        let mut annotations: BTreeMap<String, String> = BTreeMap::new();
        for hook in wanted.iter().filter(|h| !from_spec.contains(h.as_str())) {
            match hooks::annotation_for(hook) {
                Some(key) => {
                    annotations.insert(key, "metalguard".to_owned());
                }
                None => {
                    return Err(BackendError::Refused {
                        what: format!(
                            "hook {hook} of GuardedHost {host}: no annotation key can carry it"
                        ),
                    });
                }
            }
        }
        let patch = json!({
            "apiVersion": "metalguard.io/v1alpha1",
            "kind": "GuardedHost",
            "metadata": { "name": host, "annotations": annotations },
        });
        let written = self
            .hosts_api()
            .patch(
                host,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(|e| Self::unavailable(format!("hooks of GuardedHost {host}"), e))?;
        self.written_hosts.insert(host.to_owned(), written);
        Ok(())
    }
}
