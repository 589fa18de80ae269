//! One authority over a host's power (issue 25): the per-node Lease that Node Health Check
//! and Node Maintenance coordinate their disruptions with (`coordination.k8s.io/v1`,
//! namespace `medik8s-leases`, name `node-<name>`). Before a remediation of a host starts,
//! the leader takes the host's Lease when it is free (no holder, or its holder's duration ran
//! out) with holder `metalguard`; while another actor holds it the core refuses to start
//! anything (the snapshot's `lease_held_by`). A retirement's power-off takes it the same way.
//! The Lease is renewed while the host has an active remediation or a retirement power-off in
//! flight, and deleted when it has neither. Off with `--node-leases=false`.

use std::collections::BTreeMap;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, PostParams, Preconditions};

use super::KubeBackend;
use crate::backend::{BackendError, State};

/// The namespace of the node leases (Node Health Check's and Node Maintenance's).
pub const NAMESPACE: &str = metalguard_api::k8s::rbac::NODE_LEASES_NAMESPACE;
/// The holder identity metalguard takes the leases with.
pub const HOLDER: &str = "metalguard";
/// How long a taken lease lasts without renewal.
const DURATION_SECONDS: i32 = 600;
/// A lease of ours older than this is renewed.
const RENEW_AFTER_SECONDS: i64 = 120;

/// The Lease name of `host`'s Node.
pub fn lease_name(host: &str) -> String {
    format!("node-{host}")
}

/// The host a node lease is for, from its name.
fn host_of(lease: &Lease) -> Option<String> {
    lease.name_any().strip_prefix("node-").map(str::to_owned)
}

fn holder(lease: &Lease) -> Option<&str> {
    lease
        .spec
        .as_ref()?
        .holder_identity
        .as_deref()
        .filter(|h| !h.is_empty())
}

/// When the lease's holder stops holding it unless renewed (`None`: never taken, or no
/// duration: held until released).
fn expiry(lease: &Lease) -> Option<jiff::Timestamp> {
    let spec = lease.spec.as_ref()?;
    let since = spec.renew_time.as_ref().or(spec.acquire_time.as_ref())?.0;
    let seconds = spec.lease_duration_seconds?;
    since
        .checked_add(jiff::SignedDuration::from_secs(i64::from(seconds)))
        .ok()
}

/// Who holds `lease` at `now`, if anyone: a holder whose duration ran out holds nothing.
pub fn held_by(lease: &Lease, now: jiff::Timestamp) -> Option<String> {
    let holder = holder(lease)?;
    let live = expiry(lease).is_none_or(|until| now < until);
    live.then(|| holder.to_owned())
}

/// The node leases as read: another actor's, by host (its holder), and ours.
#[derive(Debug, Default)]
pub struct NodeLeases {
    pub others: BTreeMap<String, String>,
    pub ours: BTreeMap<String, Lease>,
}

/// Sorts `leases` at `now`.
pub fn sort(leases: Vec<Lease>, now: jiff::Timestamp) -> NodeLeases {
    let mut sorted = NodeLeases::default();
    for lease in leases {
        let Some(host) = host_of(&lease) else {
            continue;
        };
        match held_by(&lease, now) {
            Some(h) if h == HOLDER => {
                sorted.ours.insert(host, lease);
            }
            Some(other) => {
                sorted.others.insert(host, other);
            }
            None => {}
        }
    }
    sorted
}

fn spec(now: jiff::Timestamp, acquired: Option<MicroTime>) -> LeaseSpec {
    LeaseSpec {
        holder_identity: Some(HOLDER.to_owned()),
        lease_duration_seconds: Some(DURATION_SECONDS),
        acquire_time: Some(acquired.unwrap_or(MicroTime(now))),
        renew_time: Some(MicroTime(now)),
        ..LeaseSpec::default()
    }
}

impl KubeBackend {
    fn leases_api(&self) -> Api<Lease> {
        Api::namespaced(self.client.clone(), NAMESPACE)
    }

    /// Reads the node leases into `state.node_leases` (another actor's) and renews ours
    /// while their host has an active remediation, deleting the others. A namespace that does
    /// not exist holds no lease: nobody else coordinates through them. Leases that cannot be
    /// read (no grant: a controller upgraded before its RBAC) are logged and the round goes
    /// on; taking a lease then fails too, so no remediation starts meanwhile.
    pub(super) async fn keep_node_leases(&mut self, state: &mut State) -> Result<(), BackendError> {
        if !self.settings.node_leases {
            return Ok(());
        }
        let now = jiff::Timestamp::now();
        let listed = match self.leases_api().list(&ListParams::default()).await {
            Ok(list) => list.items,
            Err(kube::Error::Api(status)) if status.code == 404 => Vec::new(),
            Err(e) => {
                // Not a reason to stop the round (promotions, hooks, status): a remediation
                // start still takes its lease first, and without access that fails, so
                // nothing is disrupted unseen.
                if !self.node_leases_unreadable {
                    tracing::error!(error = %e, "node leases in {NAMESPACE} cannot be read (rbac.yaml applied? or run --node-leases=false): no remediation starts until they can");
                }
                self.node_leases_unreadable = true;
                return Ok(());
            }
        };
        if std::mem::take(&mut self.node_leases_unreadable) {
            tracing::info!("node leases in {NAMESPACE} readable again");
        }
        let sorted = sort(listed, now);
        state.node_leases = sorted.others;
        if !self.is_leading() {
            return Ok(());
        }
        for (host, lease) in sorted.ours {
            let active = state
                .remediations
                .values()
                .any(|r| r.target == host && !r.phase.is_terminal())
                || state.operations.values().any(|op| {
                    op.in_flight()
                        && metalguard_core::retire::is_decommission(&op.id)
                        && super::record::home_of(op) == host
                });
            let name = lease.name_any();
            if !active {
                let params = DeleteParams {
                    preconditions: Some(Preconditions {
                        resource_version: lease.resource_version(),
                        uid: lease.uid(),
                    }),
                    ..DeleteParams::default()
                };
                match self.leases_api().delete(&name, &params).await {
                    Ok(_) => {
                        tracing::info!(%host, lease = %format!("{NAMESPACE}/{name}"), "node lease released: no remediation of the host is under way");
                    }
                    Err(e) => {
                        tracing::warn!(%host, error = %e, "node lease not released (tried again next round)");
                    }
                }
                continue;
            }
            let renewed_at = lease
                .spec
                .as_ref()
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0);
            if renewed_at.is_some_and(|at| now.duration_since(at).as_secs() < RENEW_AFTER_SECONDS) {
                continue;
            }
            let mut renewed = lease.clone();
            renewed.spec = Some(spec(
                now,
                lease.spec.as_ref().and_then(|s| s.acquire_time.clone()),
            ));
            if let Err(e) = self
                .leases_api()
                .replace(&name, &PostParams::default(), &renewed)
                .await
            {
                tracing::warn!(%host, error = %e, "node lease not renewed (tried again next round)");
            }
        }
        Ok(())
    }

    /// Takes `host`'s node lease for a remediation about to start: created when absent,
    /// taken over when free (no holder, or expired), kept when ours. Refused while another
    /// actor holds it (the next round's plan then says who), or when the API says no: nothing
    /// starts without it.
    pub(super) async fn take_node_lease(&mut self, host: &str) -> Result<(), BackendError> {
        if !self.settings.node_leases {
            return Ok(());
        }
        let api = self.leases_api();
        let name = lease_name(host);
        let now = jiff::Timestamp::now();
        let what = || format!("node lease {NAMESPACE}/{name} of {host}");
        let fresh = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(NAMESPACE.to_owned()),
                ..ObjectMeta::default()
            },
            spec: Some(spec(now, None)),
        };
        // Created when absent (one request in the common case); an existing one is read and
        // taken over only when free.
        match api.create(&PostParams::default(), &fresh).await {
            Ok(_) => {}
            Err(kube::Error::Api(status)) if status.code == 409 => {
                let lease = api
                    .get(&name)
                    .await
                    .map_err(|e| Self::unavailable(what(), e))?;
                match held_by(&lease, now) {
                    Some(h) if h == HOLDER => return Ok(()),
                    Some(other) => {
                        return Err(BackendError::Refused {
                            what: format!("{} (held by {other})", what()),
                        });
                    }
                    None => {
                        let mut taken = lease.clone();
                        taken.spec = Some(spec(now, None));
                        // The read's resourceVersion makes this a compare-and-swap: an actor
                        // that took it meanwhile wins, and this remediation waits.
                        api.replace(&name, &PostParams::default(), &taken)
                            .await
                            .map_err(|e| Self::unavailable(what(), e))?;
                    }
                }
            }
            Err(e) => return Err(Self::unavailable(what(), e)),
        }
        tracing::info!(%host, lease = %format!("{NAMESPACE}/{name}"), holder = HOLDER, "node lease taken before the host is disrupted");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(name: &str, holder: Option<&str>, renewed_secs_ago: i64, duration: i32) -> Lease {
        let now = jiff::Timestamp::now();
        Lease {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..ObjectMeta::default()
            },
            spec: Some(LeaseSpec {
                holder_identity: holder.map(str::to_owned),
                lease_duration_seconds: Some(duration),
                renew_time: Some(MicroTime(
                    now - jiff::SignedDuration::from_secs(renewed_secs_ago),
                )),
                ..LeaseSpec::default()
            }),
        }
    }

    #[test]
    fn a_lease_is_held_until_its_duration_runs_out_and_sorted_by_holder() {
        let now = jiff::Timestamp::now();
        let leases = vec![
            lease("node-cp-1", Some("node-maintenance"), 10, 3600),
            lease("node-cp-2", Some("NodeHealthCheck"), 100, 30),
            lease("node-cp-3", Some(HOLDER), 5, 600),
            lease("node-w-1", Some(""), 5, 600),
            lease("other", Some("x"), 5, 600),
        ];
        let sorted = sort(leases, now);
        assert_eq!(
            sorted.others,
            BTreeMap::from([("cp-1".to_owned(), "node-maintenance".to_owned())]),
            "cp-2's ran out; w-1's has no holder; `other` is no node lease"
        );
        assert_eq!(sorted.ours.keys().collect::<Vec<_>>(), ["cp-3"]);
    }
}
