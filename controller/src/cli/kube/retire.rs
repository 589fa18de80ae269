//! `metalguard-controller retire HOST --kubeconfig FILE`: declares the retirement in the
//! `GuardedHost`'s `spec.retirement` (when, who, why). The leader maps it to the same
//! retirement the standalone store holds, so the quorum guard replaces the member, and the
//! retirement planner powers the host off only once its member is gone, exactly as there.

use anyhow::Context as _;
use kube::api::{Api, Patch, PatchParams};
use metalguard_api::duration::Timestamp;
use metalguard_api::k8s::GuardedHost;
use metalguard_api::k8s::host::{HostRetirement, HostRole};
use serde_json::json;

use super::Target;
use crate::cli::retire::RetireError;
use crate::kube::record;

/// How many times a write that conflicted with another writer is read and tried again.
const CONFLICT_TRIES: u32 = 5;

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
    // The leader writes the host's status, which moves its resource version: a conflict is
    // read again and checked again, as kubectl does, a few times.
    let mut attempt = 0;
    loop {
        attempt += 1;
        let current = api
            .get_opt(host)
            .await
            .with_context(|| format!("GuardedHost {ns}/{host} could not be read"))?
            .ok_or_else(|| RetireError::UnknownHost(host.clone()))?;
        if current.spec.role == HostRole::Worker {
            return Err(RetireError::Worker(host.clone()).into());
        }
        if let Some(r) = &current.spec.retirement {
            println!(
                "{host} was already retired at {} ({}); that request stays in force",
                r.requested_at.0, r.reason
            );
            return Ok(());
        }
        let request = retirement(declare, &user, crate::clock::now());
        // The resource version makes it a compare-and-swap: a retirement written meanwhile
        // is not overwritten (the API server answers 409 and nothing changes).
        let patch = json!({
            "metadata": {"resourceVersion": current.metadata.resource_version},
            "spec": {"retirement": request},
        });
        match api
            .patch(host, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => break,
            Err(kube::Error::Api(status)) if status.code == 409 && attempt < CONFLICT_TRIES => {
                tracing::debug!(
                    attempt,
                    "GuardedHost {ns}/{host} changed meanwhile; reading it again"
                );
            }
            Err(error) => {
                return Err(error).with_context(|| {
                    format!("the retirement of GuardedHost {ns}/{host} could not be written")
                });
            }
        }
    }
    println!(
        "retirement of {host} declared by {user}; the leader replaces its etcd member once a new control-plane GuardedHost joins, then powers it off (see status)"
    );
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
}
