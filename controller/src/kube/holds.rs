//! Break-glass holds in the Kubernetes backend. A hold is recorded in the held host's
//! `GuardedHost` `status.holds` (only the controller writes status: RBAC), and a person
//! releases it by naming it in the host's `spec.holdRelease` (`metalguard-controller release
//! HOST --kubeconfig`, a write the API server authorizes). The leader reads a named hold as
//! released at once and records the release in status, so it stays released whatever later
//! happens to the spec. Released holds stay listed, so their ids are never honoured again;
//! the list keeps every hold in force and the newest released ones up to [`MAX_HOLDS`].

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Patch, PatchParams};
use metalguard_api::k8s::GuardedHost;
use metalguard_api::k8s::host::{HoldReleaseRequest, HoldReleased, HoldStatus};
use metalguard_api::snapshot::Hold;

use super::{FIELD_MANAGER, KubeBackend, observe, record};
use crate::backend::{BackendError, HoldRelease, StoredHold};

/// Entries `status.holds` keeps (its schema's `maxItems`): the per-host bound both backends
/// apply to holds in force.
pub const MAX_HOLDS: usize = crate::backend::holds::MAX_HOLDS_PER_TARGET;

/// A stored hold as a `status.holds` entry.
pub fn hold_status(r: &StoredHold) -> HoldStatus {
    HoldStatus {
        id: r.hold.id.clone(),
        since: record::time(r.hold.since),
        by: r.hold.by.clone(),
        reason: r.hold.reason.clone(),
        action: r.hold.action.clone(),
        reported_by: r.reported_by.clone(),
        record_time: record::time(r.recorded_at),
        released: r.released.as_ref().map(|release| HoldReleased {
            time: record::time(release.at),
            by: release.by.clone(),
            reason: release.reason.clone(),
        }),
    }
}

/// A `status.holds` entry of GuardedHost `target` as the stored hold it records.
pub fn stored_hold(target: &str, s: &HoldStatus) -> StoredHold {
    StoredHold {
        hold: Hold {
            id: s.id.clone(),
            target: target.to_owned(),
            since: record::timestamp(&s.since),
            by: s.by.clone(),
            reason: s.reason.clone(),
            action: s.action.clone(),
        },
        reported_by: s.reported_by.clone(),
        recorded_at: record::timestamp(&s.record_time),
        released: s.released.as_ref().map(|r| HoldRelease {
            at: record::timestamp(&r.time),
            by: r.by.clone(),
            reason: r.reason.clone(),
        }),
    }
}

/// The release a person asked for in `spec.holdRelease`.
pub fn requested_release(request: &HoldReleaseRequest) -> HoldRelease {
    HoldRelease {
        at: record::timestamp(&request.requested_at),
        by: request
            .requested_by
            .clone()
            .unwrap_or_else(|| "an unnamed user (spec.holdRelease)".to_owned()),
        reason: request.reason.clone(),
    }
}

/// Marks released every hold of `holds` that `request` names and that is still in force;
/// true when one changed.
pub fn apply_release(holds: &mut [HoldStatus], request: Option<&HoldReleaseRequest>) -> bool {
    let Some(request) = request else {
        return false;
    };
    let release = requested_release(request);
    let mut changed = false;
    for hold in holds
        .iter_mut()
        .filter(|h| h.released.is_none() && request.holds.contains(&h.id))
    {
        hold.released = Some(HoldReleased {
            time: record::time(release.at),
            by: release.by.clone(),
            reason: release.reason.clone(),
        });
        changed = true;
    }
    changed
}

/// Keeps every hold in force and the newest released ones, [`MAX_HOLDS`] in all, in the
/// order they were recorded.
pub fn trim(holds: &mut Vec<HoldStatus>) {
    let in_force = holds.iter().filter(|h| h.released.is_none()).count();
    let mut released: Vec<(Time, String)> = holds
        .iter()
        .filter(|h| h.released.is_some())
        .map(|h| (h.record_time.clone(), h.id.clone()))
        .collect();
    released.sort();
    let drop = (in_force + released.len()).saturating_sub(MAX_HOLDS);
    let dropped: Vec<String> = released.into_iter().take(drop).map(|(_, id)| id).collect();
    holds.retain(|h| !dropped.contains(&h.id));
    holds.sort_by(|a, b| (&a.record_time, &a.id).cmp(&(&b.record_time, &b.id)));
}

impl KubeBackend {
    /// Records `record` in its target's `status.holds`; refused when that id is listed
    /// already (in force or released: a released id is never recorded again), the target
    /// has no `GuardedHost` or [`MAX_HOLDS`] holds in force.
    pub(super) async fn create_hold(&mut self, record: &StoredHold) -> Result<(), BackendError> {
        let target = &record.hold.target;
        let refused = |why: &str| BackendError::Refused {
            what: format!("hold {} ({why})", record.hold.id),
        };
        let Some(object): Option<GuardedHost> = self.host(target) else {
            return Err(refused("its target has no GuardedHost"));
        };
        let mut status = object.status.unwrap_or_default();
        if status.holds.iter().any(|h| h.id == record.hold.id) {
            return Err(refused("recorded already"));
        }
        // The list is bounded by its schema: past that, a hold stays honoured from the
        // reports that carry it, unrecorded, and the host's other status writes go on.
        if status.holds.iter().filter(|h| h.released.is_none()).count() >= MAX_HOLDS {
            return Err(refused(&format!(
                "GuardedHost {target} has {MAX_HOLDS} holds in force already"
            )));
        }
        status.holds.push(hold_status(record));
        // A release named before the record existed counts too.
        apply_release(&mut status.holds, object.spec.hold_release.as_ref());
        trim(&mut status.holds);
        // The whole status goes along: one manager owns it (see `observe::host_status_apply`).
        let patch = observe::host_status_apply(&status);
        let written = self
            .hosts_api()
            .patch_status(
                target,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&patch),
            )
            .await
            .map_err(|e| Self::unavailable(format!("holds of GuardedHost {target}"), e))?;
        self.written_hosts.insert(target.clone(), written);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use metalguard_api::duration::Timestamp;

    use super::*;

    fn stored(id: &str, at: u64, released: bool) -> StoredHold {
        StoredHold {
            hold: Hold {
                id: id.to_owned(),
                target: "cp-2".to_owned(),
                since: Timestamp(at),
                by: "alice on cp-1".to_owned(),
                reason: "smoke".to_owned(),
                action: "off".to_owned(),
            },
            reported_by: "cp-1".to_owned(),
            recorded_at: Timestamp(at + 1_000),
            released: released.then(|| HoldRelease {
                at: Timestamp(at + 5_000),
                by: "bob (cli)".to_owned(),
                reason: "fixed".to_owned(),
            }),
        }
    }

    #[test]
    fn a_hold_survives_the_status_round_trip_to_the_second() {
        for released in [false, true] {
            let record = stored("cp-1/1700000000000", 1_700_000_000_000, released);
            assert_eq!(stored_hold("cp-2", &hold_status(&record)), record);
        }
    }

    fn request(ids: &[&str]) -> HoldReleaseRequest {
        HoldReleaseRequest {
            holds: ids.iter().map(|s| (*s).to_owned()).collect(),
            requested_at: record::time(Timestamp(1_700_000_100_000)),
            requested_by: Some("bob (cli)".to_owned()),
            reason: "PSU replaced".to_owned(),
        }
    }

    #[test]
    fn a_release_marks_only_the_named_holds_in_force_and_never_rewrites_one() {
        let mut holds = vec![
            hold_status(&stored("cp-1/1", 1_700_000_000_000, false)),
            hold_status(&stored("cp-1/2", 1_700_000_001_000, false)),
            hold_status(&stored("cp-3/3", 1_700_000_002_000, true)),
        ];
        let before = holds[2].clone();
        assert!(!apply_release(&mut holds, None));
        assert!(apply_release(
            &mut holds,
            Some(&request(&["cp-1/1", "cp-3/3"]))
        ));
        let released = holds[0].released.as_ref().unwrap();
        assert_eq!(released.by, "bob (cli)");
        assert_eq!(released.reason, "PSU replaced");
        assert!(holds[1].released.is_none());
        assert_eq!(holds[2], before, "an earlier release stays as it was");
        assert!(!apply_release(&mut holds, Some(&request(&["cp-1/1"]))));
    }

    #[test]
    fn trimming_keeps_every_hold_in_force_and_drops_the_oldest_released() {
        let mut holds: Vec<HoldStatus> = (0..MAX_HOLDS as u64 + 5)
            .map(|i| {
                hold_status(&stored(
                    &format!("cp-1/{i}"),
                    1_700_000_000_000 + i * 1_000,
                    i % 2 == 0,
                ))
            })
            .collect();
        holds.reverse();
        let in_force = holds.iter().filter(|h| h.released.is_none()).count();
        trim(&mut holds);
        assert_eq!(holds.len(), MAX_HOLDS);
        assert_eq!(
            holds.iter().filter(|h| h.released.is_none()).count(),
            in_force
        );
        // The oldest released went: cp-1/0, /2, /4, /6, /8.
        for gone in ["cp-1/0", "cp-1/2", "cp-1/4", "cp-1/6", "cp-1/8"] {
            assert!(holds.iter().all(|h| h.id != gone), "{gone} kept");
        }
        assert!(holds.iter().any(|h| h.id == "cp-1/10"));
        assert!(
            holds
                .windows(2)
                .all(|w| w[0].record_time <= w[1].record_time)
        );
    }
}
