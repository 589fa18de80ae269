//! What the loop keeps current between rounds: the inventory file (taken only when it parses
//! and passes its checks), the deny list of agent certificates, the records' seals after a key
//! rotation, and the BMCs the agents probe.

use super::Controller;
use crate::backend::{Backend, Write};
use crate::control::reload::Reload;
use crate::pki::revocation::DenyListReload;

/// How often the credentials handed out for BMC checks are read again at the latest.
const GRANTS_REREAD: std::time::Duration = std::time::Duration::from_secs(10);

/// Per fence target, the agent that gets its credentials for checks and the identity the
/// target's agent reported (what the grants were last built from).
/// Per fence target: the executor, the identity its own agent reported, and a person's
/// on-demand check request (its id).
pub(super) type Granted = std::collections::BTreeMap<
    String,
    (
        String,
        Option<metalguard_api::identity::SystemIdentity>,
        Option<String>,
    ),
>;

/// Most records sealed again in one round after a key rotation.
const RESEAL_BATCH: usize = 64;

impl<B: Backend> Controller<B> {
    /// Tells the hub the hosts of the inventory in force: only their certificates may speak.
    pub(super) fn admit_inventory(&self) {
        self.hub
            .set_hosts(self.inventory.hosts.iter().map(|h| h.name.clone()));
    }

    /// Applies a changed deny list, or says why it was not taken.
    pub(super) fn reload_deny_list(&mut self) {
        let Some(file) = self.deny_list.as_mut() else {
            return;
        };
        match file.check(&self.hub.revoked()) {
            DenyListReload::Unchanged => {}
            DenyListReload::Loaded(count) => {
                self.metrics
                    .revoked_certificates
                    .set(i64::try_from(count).unwrap_or(i64::MAX));
                tracing::info!(revoked = count, "revoked certificates reloaded");
            }
            DenyListReload::Rejected(error) => {
                tracing::error!(error = %crate::error::chain(&error), "revoked certificates file changed but cannot be read; the list in force stays");
            }
        }
    }

    /// Seals records again with the signing key after a key rotation (a batch per round),
    /// each only if unchanged since it was read.
    pub(super) async fn reseal(&mut self, state: &crate::backend::State) {
        if state.stale_seals.is_empty() {
            return;
        }
        let batch: Vec<Write> = state
            .stale_seals
            .iter()
            .take(RESEAL_BATCH)
            .cloned()
            .map(Write::Reseal)
            .collect();
        let count = batch.len();
        match self.backend.apply(batch).await {
            Ok(()) => {
                self.metrics.records_resealed.inc_by(count as u64);
                tracing::info!(
                    count,
                    left = state.stale_seals.len() - count,
                    "records sealed again with the signing key"
                );
            }
            Err(error) => {
                tracing::info!(error = %crate::error::chain(&error), "records not sealed again yet (one changed meanwhile?); next round");
            }
        }
    }

    pub(super) fn count_insecure_bmcs(&self) {
        let insecure = self
            .inventory
            .hosts
            .iter()
            .filter_map(|h| h.bmc.as_ref())
            .filter(|b| b.tls.insecure)
            .count();
        self.metrics
            .insecure_bmcs
            .set(i64::try_from(insecure).unwrap_or(i64::MAX));
    }

    /// Tells the hub every BMC of the inventory (address and trust, no credentials), for the
    /// agents to probe. A BMC whose trust cannot be read (a missing CA file) is left out and
    /// logged; fencing it fails for the same reason.
    pub(super) fn publish_bmc_targets(&mut self) {
        let targets = self
            .inventory
            .hosts
            .iter()
            .filter_map(|h| Some((h, h.bmc.as_ref()?)))
            .filter_map(|(h, bmc)| match bmc.trust(&h.name) {
                Ok(tls) => Some(metalguard_api::protocol::BmcTarget {
                    host: h.name.clone(),
                    bmc_address: bmc.address.clone(),
                    tls,
                    credentials: None,
                    expected_identity: None,
                    credentials_id: None,
                    credentials_new: false,
                    check_request: None,
                }),
                Err(error) => {
                    tracing::warn!(host = %h.name, error = %crate::error::chain(&error), "bmc left out of the agents' reachability probes");
                    None
                }
            })
            .collect();
        self.hub.set_bmc_targets(targets);
        // A changed BMC entry (address, credentials source) is read for the checks at the
        // next round, not at the next periodic re-read.
        self.grants_read_at = None;
    }

    /// Hands each BMC's credentials, for its read-only checks, to the agent that would
    /// execute its fence now (the plan's `fence_executors`) and to no other (issue 25). The
    /// credentials are read again when that agent or the host's reported identity changes,
    /// and at least every [`GRANTS_REREAD`]: changed credentials are a rotation, checked
    /// before a fence uses them (`control::credentials`). A BMC whose credentials cannot be
    /// read gets no check, logged.
    pub(super) fn grant_checks(
        &mut self,
        plan: &metalguard_api::plan::Plan,
        state: &crate::backend::State,
    ) {
        let mut rotated = false;
        // Only hosts with a rotation under way: a round at thousands of hosts does not search
        // every executor's report for every target.
        let rotating: Vec<(String, String)> = self
            .credentials
            .rotating_hosts()
            .filter_map(|t| plan.fence_executors.get_key_value(t))
            .map(|(t, e)| (t.clone(), e.clone()))
            .collect();
        for (target, executor) in rotating {
            let check =
                crate::control::fencing::executor_check(state, &plan.fence_executors, &target)
                    .and_then(|(_, probe)| probe.check.as_ref());
            if let Some(check) = check {
                rotated |= self.credentials.take_check(&target, &executor, check);
            }
        }
        let identity = |target: &str| {
            state
                .reports
                .get(target)
                .and_then(|r| r.report.host_identity.as_ref())
        };
        let request = |target: &str| state.bmc_check_requests.get(target).map(|r| r.id.as_str());
        // What the grants were built from, compared in place: building it anew each round
        // copied three strings per host (a tenth of a round at 5,000 hosts).
        let unchanged = plan.fence_executors.len() == self.granted.len()
            && plan.fence_executors.iter().zip(&self.granted).all(
                |((target, executor), (was, (by, known, asked)))| {
                    target == was
                        && executor == by
                        && identity(target) == known.as_ref()
                        && request(target) == asked.as_deref()
                },
            );
        let due = self
            .grants_read_at
            .is_none_or(|at| at.elapsed() >= GRANTS_REREAD);
        if unchanged && !due && !rotated {
            return;
        }
        let wanted: Granted = plan
            .fence_executors
            .iter()
            .map(|(target, executor)| {
                (
                    target.clone(),
                    (
                        executor.clone(),
                        identity(target).cloned(),
                        request(target).map(str::to_owned),
                    ),
                )
            })
            .collect();
        let inventory = &self.inventory;
        self.credentials
            .retain(|host| inventory.host(host).is_some_and(|h| h.bmc.is_some()));
        let mut grants = std::collections::BTreeMap::new();
        for (target, (executor, identity, request)) in &wanted {
            let Some(bmc) = self.inventory.host(target).and_then(|h| h.bmc.as_ref()) else {
                continue;
            };
            match bmc.credentials(target) {
                Ok(credentials) => {
                    use crate::control::credentials::Read;
                    match self.credentials.read(target, &bmc.address, credentials) {
                        Read::Rotating => {
                            tracing::info!(host = %target, checked_by = %executor, "bmc credentials changed: a rotation; the new ones are checked before a fence uses them");
                        }
                        Read::Reverted => {
                            tracing::info!(host = %target, "bmc credentials back to the ones in use: rotation abandoned");
                        }
                        Read::First | Read::Unchanged => {}
                    }
                }
                Err(error) => {
                    tracing::warn!(host = %target, error = %crate::error::chain(&error), "bmc credentials cannot be read: no read-only check of this bmc");
                    continue;
                }
            }
            let Some(check) = self.credentials.for_check(target) else {
                continue;
            };
            grants.insert(
                target.clone(),
                crate::api::hub::CheckGrant {
                    executor: executor.clone(),
                    credentials: check.credentials,
                    expected_identity: identity.clone().map(Box::new),
                    credentials_id: check.id,
                    credentials_new: check.new,
                    check_request: request.clone(),
                },
            );
        }
        self.hub.set_check_grants(grants);
        self.granted = wanted;
        self.grants_read_at = Some(tokio::time::Instant::now());
    }

    /// Applies a changed inventory file, or reports why it was rejected.
    pub(crate) fn reload_inventory(&mut self) {
        let Some(file) = self.file.as_mut() else {
            // The Kubernetes backend builds the inventory from its resources.
            if let Some(inventory) = self.backend.inventory() {
                self.inventory = inventory;
                self.snapshots.forget();
                self.count_insecure_bmcs();
                self.publish_bmc_targets();
                self.admit_inventory();
                tracing::info!(
                    hosts = self.inventory.hosts.len(),
                    "inventory rebuilt from the cluster's resources"
                );
            }
            return;
        };
        match file.check(&self.inventory) {
            Reload::Unchanged => {}
            Reload::Accepted {
                inventory,
                restart_needed,
            } => {
                let generation = file.generation;
                self.inventory = *inventory;
                self.snapshots.forget();
                self.count_insecure_bmcs();
                self.publish_bmc_targets();
                self.admit_inventory();
                self.metrics
                    .inventory_generation
                    .set(i64::try_from(generation).unwrap_or(i64::MAX));
                self.metrics.inventory_rejected.set(0);
                tracing::info!(
                    generation,
                    hosts = self.inventory.hosts.len(),
                    "inventory reloaded"
                );
                if !restart_needed.is_empty() {
                    tracing::warn!(
                        sections = %restart_needed.join(", "),
                        "inventory sections changed that take effect only at the next start"
                    );
                }
            }
            Reload::Rejected(error) => {
                self.metrics.inventory_rejected.set(1);
                tracing::error!(%error, generation = file.generation, "inventory change rejected; the previous inventory stays in use");
            }
        }
    }
}
