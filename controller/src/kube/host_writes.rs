//! The leader's writes to a `GuardedHost`: its remediation and operations in status by
//! server-side apply (intent before the command is offered), and metalguard's hook annotations.

use std::collections::{BTreeMap, BTreeSet};

use kube::api::{Patch, PatchParams};
use metalguard_api::remediation::Remediation;
use serde_json::json;

use super::{FIELD_MANAGER, KEEP_OPERATIONS, KubeBackend, hooks, observe, record};
use crate::backend::{BackendError, StoredOperation};

impl KubeBackend {
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
