//! `metalguard-controller release HOST --kubeconfig FILE`: hands a host held after a
//! break-glass fence back to metalguard by naming its holds in force in the `GuardedHost`'s
//! `spec.holdRelease` (who, when, why). The leader reads them as released at once, records
//! the release in `status.holds` and tells each agent that still carries one to delete it.

use anyhow::Context as _;
use kube::api::Api;
use metalguard_api::duration::Timestamp;
use metalguard_api::k8s::GuardedHost;
use metalguard_api::k8s::host::HoldReleaseRequest;
use serde_json::json;

use super::{Decided, Target};
use crate::backend::{State, StoredHold};
use crate::cli::holds::{ReleaseError, released_line};
use crate::kube::{record, world};

/// The holds of `host` in force, and the release request that names them: the ids a
/// release already in the spec names that the leader has not recorded as released yet stay
/// named (replacing the request must not bring them back).
pub fn release_request(
    host: &GuardedHost,
    user: &str,
    reason: &str,
    now: Timestamp,
) -> Result<(Vec<StoredHold>, HoldReleaseRequest), ReleaseError> {
    let name = host.metadata.name.clone().unwrap_or_default();
    let mut state = State::default();
    // Entries it cannot read are the leader's to report; holds are read either way.
    let _ = world::host_records(&name, host, &mut state);
    let active: Vec<StoredHold> = state
        .hold_records
        .values()
        .filter(|r| r.is_active())
        .cloned()
        .collect();
    if active.is_empty() {
        return Err(ReleaseError::NotHeld(name));
    }
    let unrecorded: Vec<String> = match (&host.spec.hold_release, &host.status) {
        (Some(previous), Some(status)) => previous
            .holds
            .iter()
            .filter(|id| {
                status
                    .holds
                    .iter()
                    .any(|h| &h.id == *id && h.released.is_none())
            })
            .cloned()
            .collect(),
        _ => Vec::new(),
    };
    let mut holds: Vec<String> = active.iter().map(|r| r.hold.id.clone()).collect();
    holds.extend(unrecorded);
    holds.sort();
    holds.dedup();
    let request = HoldReleaseRequest {
        holds,
        requested_at: record::time(Timestamp(now.0 - now.0 % 1000)),
        requested_by: Some(format!("{user} (cli)")),
        reason: reason.to_owned(),
    };
    Ok((active, request))
}

/// Names every hold of `host` in force in its `spec.holdRelease`.
pub async fn release(target: &Target, host: &str, reason: &str) -> anyhow::Result<()> {
    let client = super::connect(&target.kubeconfig).await?;
    let ns = &target.namespace;
    let api: Api<GuardedHost> = Api::namespaced(client.clone(), ns);
    let user = super::who_am_i(&client).await?;
    // A hold recorded or a release written meanwhile is read again (compare-and-swap).
    let released = super::write_host_spec(&api, host, "the release", async || {
        let current = api
            .get_opt(host)
            .await
            .with_context(|| format!("GuardedHost {ns}/{host} could not be read"))?
            .ok_or_else(|| ReleaseError::UnknownHost(host.to_owned()))?;
        let (active, request) = release_request(&current, &user, reason, crate::clock::now())?;
        Ok((
            current,
            Decided::Write(json!({"holdRelease": request}), active),
        ))
    })
    .await?;
    for record in &released {
        println!("{}", released_line(record));
    }
    println!(
        "released by {user} ({reason}); the leader records it in status.holds at its next round, and each agent that recorded a hold deletes it at its next report"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use serde_json::Value;

    use super::*;

    fn host(holds: &Value, release: Option<Value>) -> GuardedHost {
        let mut spec = json!({"role": "Worker", "nodeName": "w-1"});
        if let Some(r) = release {
            spec["holdRelease"] = r;
        }
        serde_json::from_value(json!({
            "apiVersion": "metalguard.io/v1alpha1",
            "kind": "GuardedHost",
            "metadata": {"name": "w-1", "namespace": "metalguard-system"},
            "spec": spec,
            "status": {"holds": holds},
        }))
        .unwrap()
    }

    fn hold(id: &str, released: bool) -> Value {
        let mut h = json!({
            "id": id, "since": "2026-11-25T10:00:00Z", "by": "alice on cp-1",
            "reason": "smoke", "action": "off", "reportedBy": "cp-1",
            "recordTime": "2026-11-25T10:00:01Z",
        });
        if released {
            h["released"] = json!({"time": "2026-11-25T10:05:00Z", "by": "bob (cli)"});
        }
        h
    }

    #[test]
    fn a_release_names_the_holds_in_force_and_keeps_those_named_before() {
        let now = Timestamp(1_764_064_800_123);
        let h = host(
            &json!([
                hold("cp-1/1", false),
                hold("cp-1/2", true),
                hold("cp-3/3", false)
            ]),
            Some(json!({"holds": ["cp-3/3"], "requestedAt": "2026-11-25T10:04:00Z"})),
        );
        let (active, request) = release_request(&h, "carol", "PSU swapped", now).unwrap();
        // cp-3/3 is released by the earlier request already (not in force), but the leader
        // has not recorded that: the new request names it again.
        let ids: Vec<&str> = active.iter().map(|r| r.hold.id.as_str()).collect();
        assert_eq!(ids, ["cp-1/1"]);
        assert_eq!(request.holds, ["cp-1/1", "cp-3/3"]);
        assert_eq!(request.requested_by.as_deref(), Some("carol (cli)"));
        assert_eq!(
            record::timestamp(&request.requested_at),
            Timestamp(1_764_064_800_000)
        );
        // Nothing in force: nothing to release.
        let none = host(&json!([hold("cp-1/2", true)]), None);
        assert_eq!(
            release_request(&none, "carol", "x", now).unwrap_err(),
            ReleaseError::NotHeld("w-1".to_owned())
        );
    }
}
