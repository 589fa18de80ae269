//! `metalguard-controller retire HOST --kubeconfig FILE`: declares the retirement in the
//! `GuardedHost`'s `spec.retirement` (when, who, why). The leader maps it to the same
//! retirement the standalone store holds, so the quorum guard replaces the member, and the
//! retirement planner powers the host off only once its member is gone, exactly as there.
//!
//! `retire HOST --cancel --kubeconfig FILE` withdraws it with the standalone command's rules
//! (refused once the host's power-off was issued, its member is gone or being removed, or
//! its replacement already votes), read from what the leader wrote: every `GuardedHost`'s
//! `status.operations` and `status.etcdMember`, and the `GuardedControlPlane`'s voters.

use anyhow::Context as _;
use kube::api::{Api, ListParams};
use metalguard_api::duration::Timestamp;
use metalguard_api::k8s::host::{HostRetirement, HostRole};
use metalguard_api::k8s::{GuardedControlPlane, GuardedHost};
use serde_json::json;

use super::{Decided, Target};
use crate::cli::retire::RetireError;
use crate::kube::record;

/// What a person declares.
#[derive(Debug, Clone)]
pub struct Declare {
    /// The control-plane host.
    pub host: String,
    /// Why.
    pub reason: String,
    /// Who asks, when not the person running the command.
    pub requested_by: Option<String>,
}

/// The retirement to write, made at `now` (to the second: Kubernetes keeps times so) by
/// `user` (the API server's name for the kubeconfig's user).
fn retirement(declare: &Declare, user: &str, now: Timestamp) -> HostRetirement {
    let requested_by = match &declare.requested_by {
        Some(who) => format!("{who} (cli, run by {user})"),
        None => format!("{user} (cli)"),
    };
    HostRetirement {
        requested_at: record::time(Timestamp(now.0 - now.0 % 1000)),
        requested_by: Some(requested_by),
        reason: declare.reason.clone(),
    }
}

/// Declares the retirement unless one is in force; refuses workers and unknown hosts as the
/// standalone command does.
pub async fn retire(target: &Target, declare: &Declare) -> anyhow::Result<()> {
    let client = super::connect(&target.kubeconfig).await?;
    let ns = &target.namespace;
    let host = &declare.host;
    let api: Api<GuardedHost> = Api::namespaced(client.clone(), ns);
    let user = super::who_am_i(&client).await?;
    let declared = super::write_host_spec(&api, host, "the retirement", async || {
        let current = api
            .get_opt(host)
            .await
            .with_context(|| format!("GuardedHost {ns}/{host} could not be read"))?
            .ok_or_else(|| RetireError::UnknownHost(host.clone()))?;
        if current.spec.role == HostRole::Worker {
            return Err(RetireError::Worker(host.clone()).into());
        }
        if let Some(r) = &current.spec.retirement {
            let kept = format!(
                "{host} was already retired at {} ({}); that request stays in force",
                r.requested_at.0, r.reason
            );
            return Ok((current, Decided::Stop(Some(kept))));
        }
        let request = retirement(declare, &user, crate::clock::now());
        Ok((
            current,
            Decided::Write(json!({"retirement": request}), None),
        ))
    })
    .await?;
    match declared {
        Some(kept) => println!("{kept}"),
        None => println!(
            "retirement of {host} declared by {user}; the leader replaces its etcd member once a new control-plane GuardedHost joins, then powers it off (see status)"
        ),
    }
    Ok(())
}

/// Checks that the retirement of `host` may be withdrawn, from the resources as the leader
/// last wrote them (the standalone rules of [`crate::cli::retire::check_cancellable`]).
/// `hosts` are every `GuardedHost` of the namespace (a member's removal is recorded on the
/// host whose agent runs it); `control_plane` the namespace's `GuardedControlPlane`.
pub fn check_cancellable(
    host: &GuardedHost,
    hosts: &[GuardedHost],
    control_plane: Option<&GuardedControlPlane>,
) -> Result<(), RetireError> {
    let name = host.metadata.name.clone().unwrap_or_default();
    let too_late = |why: String| RetireError::TooLate {
        host: name.clone(),
        why,
    };
    if host.spec.role == HostRole::Worker {
        return Err(RetireError::Worker(name));
    }
    let Some(retirement) = &host.spec.retirement else {
        return Err(RetireError::NotRetired(name));
    };
    let operations = || {
        hosts
            .iter()
            .filter_map(|h| h.status.as_ref())
            .flat_map(|s| s.operations.iter())
    };
    let power_off = metalguard_core::retire::decommission_id(
        &name,
        record::timestamp(&retirement.requested_at),
    );
    if operations().any(|op| op.id == power_off.0) {
        return Err(too_late(format!(
            "its power-off ({power_off}) was already issued"
        )));
    }
    let Some(member) = host.status.as_ref().and_then(|s| s.etcd_member.as_ref()) else {
        return Err(too_late(
            "the leader shows no etcd member on it (removed: wipe its etcd data and add it back as a new host)"
                .to_owned(),
        ));
    };
    if let Some(op) = operations()
        .find(|op| op.type_ == "etcd-remove" && op.member_id.as_deref() == Some(member.id.as_str()))
    {
        return Err(too_late(format!(
            "the leader has started removing its member ({})",
            op.id
        )));
    }
    if !member.learner
        && let Some(cp) = control_plane
    {
        let voters = cp.status.as_ref().map_or(0, |s| s.etcd_voters);
        let desired = cp.spec.replicas;
        if voters > desired {
            return Err(too_late(format!(
                "its replacement already votes ({voters} voters, desired {desired}); let the replacement finish"
            )));
        }
    }
    Ok(())
}

/// Withdraws the retirement of `host` if [`check_cancellable`] allows it. The write is a
/// compare-and-swap on the host's resource version, which the leader's status writes move
/// too: a power-off or member removal recorded on the host meanwhile makes it conflict, and
/// the checks run again on what was written.
pub async fn cancel(target: &Target, host: &str) -> anyhow::Result<()> {
    let client = super::connect(&target.kubeconfig).await?;
    let ns = &target.namespace;
    let api: Api<GuardedHost> = Api::namespaced(client.clone(), ns);
    let planes: Api<GuardedControlPlane> = Api::namespaced(client.clone(), ns);
    super::write_host_spec(&api, host, "the withdrawal of the retirement", async || {
        let hosts = api
            .list(&ListParams::default())
            .await
            .with_context(|| format!("the GuardedHosts of {ns} could not be listed"))?
            .items;
        let current = hosts
            .iter()
            .find(|h| h.metadata.name.as_deref() == Some(host))
            .ok_or_else(|| RetireError::UnknownHost(host.to_owned()))?;
        let control_planes = planes
            .list(&ListParams::default())
            .await
            .with_context(|| format!("the GuardedControlPlane of {ns} could not be read"))?
            .items;
        check_cancellable(current, &hosts, control_planes.first())?;
        Ok((
            current.clone(),
            Decided::Write(json!({"retirement": null}), ()),
        ))
    })
    .await?;
    println!("retirement of {host} withdrawn");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_retirement_records_who_asked_and_is_kept_to_the_second() {
        let declare = Declare {
            host: "cp-2".to_owned(),
            reason: "motherboard replaced".to_owned(),
            requested_by: Some("ticket 4711".to_owned()),
        };
        let r = retirement(&declare, "alice", Timestamp(1_700_000_123_456));
        assert_eq!(
            record::timestamp(&r.requested_at),
            Timestamp(1_700_000_123_000)
        );
        assert_eq!(
            r.requested_by.as_deref(),
            Some("ticket 4711 (cli, run by alice)")
        );
        assert_eq!(r.reason, "motherboard replaced");
        let own = Declare {
            requested_by: None,
            ..declare
        };
        assert_eq!(
            retirement(&own, "alice", Timestamp(0))
                .requested_by
                .as_deref(),
            Some("alice (cli)")
        );
    }

    fn host(name: &str, status: &serde_json::Value) -> GuardedHost {
        serde_json::from_value(json!({
            "apiVersion": "metalguard.io/v1alpha1",
            "kind": "GuardedHost",
            "metadata": {"name": name, "namespace": "metalguard-system"},
            "spec": {
                "role": "ControlPlane",
                "nodeName": name,
                "retirement": {"requestedAt": "2026-11-25T10:00:00Z", "reason": "swap"},
            },
            "status": status,
        }))
        .unwrap()
    }

    fn member(id: &str, learner: bool) -> serde_json::Value {
        json!({"id": id, "name": "m", "learner": learner, "healthy": true})
    }

    fn op(id: &str, type_: &str, member: Option<&str>) -> serde_json::Value {
        let mut op =
            json!({"id": id, "agent": "cp-2", "type": type_, "createTime": "2026-11-25T10:00:01Z"});
        if let Some(m) = member {
            op["memberId"] = json!(m);
        }
        op
    }

    fn plane(replicas: u32, voters: u32) -> GuardedControlPlane {
        serde_json::from_value(json!({
            "apiVersion": "metalguard.io/v1alpha1",
            "kind": "GuardedControlPlane",
            "metadata": {"name": "cp", "namespace": "metalguard-system"},
            "spec": {
                "replicas": replicas,
                "hostSelector": {},
                "etcd": {"endpoints": ["https://10.0.0.11:2379"]},
            },
            "status": {"etcdVoters": voters},
        }))
        .unwrap()
    }

    #[test]
    fn a_retirement_is_withdrawn_only_while_its_member_stays_and_no_replacement_votes() {
        let retiring = host("cp-1", &json!({"etcdMember": member("a1", false)}));
        let others = vec![retiring.clone(), host("cp-2", &json!({}))];
        assert_eq!(
            check_cancellable(&retiring, &others, Some(&plane(3, 3))),
            Ok(())
        );
        // The replacement votes: too late.
        let err = check_cancellable(&retiring, &others, Some(&plane(3, 4))).unwrap_err();
        assert!(
            err.to_string()
                .contains("already votes (4 voters, desired 3)"),
            "{err}"
        );
        // The removal of its member is recorded on the host whose agent runs it.
        let removing = vec![
            retiring.clone(),
            host(
                "cp-2",
                &json!({"operations": [op("quorum/remove-member/a1", "etcd-remove", Some("a1"))]}),
            ),
        ];
        let err = check_cancellable(&retiring, &removing, Some(&plane(3, 3))).unwrap_err();
        assert!(
            err.to_string().contains("started removing its member"),
            "{err}"
        );
        // Another member's removal is not this one's.
        let other_removal = vec![
            retiring.clone(),
            host(
                "cp-2",
                &json!({"operations": [op("quorum/remove-member/b2", "etcd-remove", Some("b2"))]}),
            ),
        ];
        assert_eq!(
            check_cancellable(&retiring, &other_removal, Some(&plane(3, 3))),
            Ok(())
        );
        // No member shown: gone (or never reported), refused.
        let memberless = host("cp-1", &json!({}));
        let err = check_cancellable(&memberless, &others, None).unwrap_err();
        assert!(err.to_string().contains("no etcd member"), "{err}");
        // Its power-off was issued.
        let at = record::timestamp(&retiring.spec.retirement.as_ref().unwrap().requested_at);
        let off = metalguard_core::retire::decommission_id("cp-1", at).0;
        let issued = host(
            "cp-1",
            &json!({"etcdMember": member("a1", false), "operations": [op(&off, "fence", None)]}),
        );
        let err = check_cancellable(&issued, std::slice::from_ref(&issued), None).unwrap_err();
        assert!(err.to_string().contains("power-off"), "{err}");
        // Nothing to withdraw; workers are never retired.
        let mut plain = host("cp-1", &json!({}));
        plain.spec.retirement = None;
        assert_eq!(
            check_cancellable(&plain, &[], None),
            Err(RetireError::NotRetired("cp-1".to_owned()))
        );
        let mut worker = retiring.clone();
        worker.spec.role = HostRole::Worker;
        assert!(matches!(
            check_cancellable(&worker, &[], None),
            Err(RetireError::Worker(_))
        ));
    }
}
