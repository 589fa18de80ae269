//! `metalguard-controller check-bmc HOST --kubeconfig FILE`: writes a new
//! `spec.bmcCheckRequest` on the host's `GuardedHost` and waits until the leader names its id
//! in `status.bmcCheckAnswered`; the verdict is then the `FencingReady` condition, which holds
//! the latest check of the agent that would execute the host's fence.

use std::time::Duration;

use anyhow::Context as _;
use kube::api::{Api, Patch, PatchParams};
use metalguard_api::k8s::GuardedHost;
use serde_json::json;

use super::Target;
use crate::kube::record;

/// Between two reads of the `GuardedHost` while waiting.
const POLL: Duration = Duration::from_millis(500);

/// The `FencingReady` condition of `host` as one line; `Ok` when it is `True`.
pub fn verdict(name: &str, host: &GuardedHost) -> Result<String, String> {
    let condition = host
        .status
        .as_ref()
        .and_then(|s| s.conditions.iter().find(|c| c.type_ == "FencingReady"));
    let Some(c) = condition else {
        return Err(format!("GuardedHost {name} has no FencingReady condition"));
    };
    let line = format!("FencingReady={} ({}): {}", c.status, c.reason, c.message);
    if c.status == "True" {
        Ok(line)
    } else {
        Err(line)
    }
}

/// Requests the check and waits up to `wait` for the answer.
pub async fn check_bmc(target: &Target, host: &str, wait: Duration) -> anyhow::Result<()> {
    let client = super::connect(&target.kubeconfig).await?;
    let ns = &target.namespace;
    let api: Api<GuardedHost> = Api::namespaced(client.clone(), ns);
    let user = super::who_am_i(&client).await?;
    let request = crate::cli::check_bmc::new_request(format!("{user} (cli)"))?;
    let at = metalguard_api::duration::Timestamp(request.at.0 - request.at.0 % 1000);
    let patch = json!({"spec": {"bmcCheckRequest": {
        "id": request.id,
        "requestedAt": record::time(at),
        "requestedBy": request.by,
    }}});
    api.patch(host, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| {
            format!("the check request on GuardedHost {ns}/{host} could not be written")
        })?;
    crate::cli::check_bmc::announce(host, &request, wait);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let current = api
            .get(host)
            .await
            .with_context(|| format!("GuardedHost {ns}/{host} could not be read back"))?;
        let answered = current
            .status
            .as_ref()
            .and_then(|s| s.bmc_check_answered.as_deref());
        if answered == Some(request.id.as_str()) {
            return match verdict(host, &current) {
                Ok(line) => {
                    println!("{line}");
                    Ok(())
                }
                Err(line) => Err(anyhow::anyhow!(
                    "the bmc of {host} failed the check: {line}"
                )),
            };
        }
        if tokio::time::Instant::now() >= deadline {
            anyhow::bail!(
                "no answer to the check of {host}'s bmc within {}: is a controller leading, and is the agent that would fence {host} reporting? The request stays, answered when they are",
                humantime::format_duration(wait)
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_verdict_is_the_fencing_ready_condition() {
        let host = |status: &str| -> GuardedHost {
            serde_json::from_value(json!({
                "apiVersion": "metalguard.io/v1alpha1",
                "kind": "GuardedHost",
                "metadata": {"name": "cp-2", "namespace": "metalguard-system"},
                "spec": {"role": "ControlPlane", "nodeName": "cp-2"},
                "status": {"bmcCheckAnswered": "r1", "conditions": [{
                    "type": "FencingReady", "status": status, "reason": "AccountLocked",
                    "message": "locked", "lastTransitionTime": "2026-11-25T10:00:00Z",
                }]},
            }))
            .unwrap()
        };
        assert_eq!(
            verdict("cp-2", &host("False")).unwrap_err(),
            "FencingReady=False (AccountLocked): locked"
        );
        assert!(verdict("cp-2", &host("True")).is_ok());
        let mut bare = host("True");
        bare.status = None;
        assert!(verdict("cp-2", &bare).is_err());
    }
}
