//! `metalguard-controller check-bmc HOST`: a person's on-demand, read-only check of a host's
//! BMC, made by the agent that would execute the host's fence, with the credentials a fence
//! would use (issue 25). The controller never talks to a BMC itself: the command records a
//! request with a new id, the leader hands the id out with the check's credentials to that
//! agent only, the agent checks at once and echoes the id, and the command prints the verdict
//! of the check that echoes it. Exit status 0 when the check passed, 1 otherwise (failed,
//! or no answer in time).

use std::time::Duration;

use anyhow::Context as _;
use metalguard_api::protocol::BmcReachability;

use crate::backend::{Backend as _, BmcCheckRequest};
use crate::clock::now;
use crate::inventory::Inventory;

/// Between two reads of the store while waiting.
const POLL: Duration = Duration::from_millis(500);

/// The new request: a random id, now, who.
pub fn new_request(by: String) -> anyhow::Result<BmcCheckRequest> {
    Ok(BmcCheckRequest {
        id: crate::standalone::etcd::new_nonce()
            .map_err(|e| anyhow::anyhow!("no random id for the check request: {e}"))?,
        at: now(),
        by,
    })
}

fn rfc3339(at: metalguard_api::duration::Timestamp) -> String {
    humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + Duration::from_millis(at.0))
        .to_string()
}

/// Tells the person the request is recorded and how long the command waits.
pub fn announce(host: &str, request: &BmcCheckRequest, wait: Duration) {
    println!(
        "check of {host}'s bmc requested ({}); waiting up to {} for the agent that would fence it",
        request.id,
        humantime::format_duration(wait)
    );
}

/// One line for the check `by` made of `host`'s BMC; `Ok` when it passed.
pub fn verdict(host: &str, by: &str, probe: &BmcReachability) -> Result<String, String> {
    let Some(check) = &probe.check else {
        return Err(format!(
            "{by} answered for {host}'s bmc without a credentialed check"
        ));
    };
    match check.failure {
        None => Ok(format!(
            "the bmc of {host} passed the check {by} made at {}: {}",
            rfc3339(probe.checked_at),
            check.detail
        )),
        Some(failure) => Err(format!(
            "the bmc of {host} failed the check {by} made at {} ({}): {}; {}",
            rfc3339(probe.checked_at),
            failure.name(),
            check.detail,
            failure.remedy()
        )),
    }
}

/// Records the request in the standalone store and waits up to `wait` for its answer.
pub async fn check_bmc(
    inventory: &Inventory,
    host: &str,
    by: String,
    wait: Duration,
) -> anyhow::Result<()> {
    let entry = inventory
        .host(host)
        .with_context(|| format!("host {host} is not in the inventory"))?;
    anyhow::ensure!(
        entry.bmc.is_some(),
        "host {host} has no bmc in the inventory: nothing to check"
    );
    let mut backend = super::connect(inventory, "cli".to_owned())?;
    let request = new_request(by)?;
    backend.request_bmc_check(host, &request).await?;
    announce(host, &request, wait);
    let deadline = tokio::time::Instant::now() + wait;
    loop {
        let state = backend.load().await?;
        let plan = crate::cli::status::explain(inventory, &state, now());
        if let Some((by, probe)) =
            crate::control::fencing::answer(&state, &plan.fence_executors, host, &request.id)
        {
            return match verdict(host, by, probe) {
                Ok(line) => {
                    println!("{line}");
                    Ok(())
                }
                Err(line) => Err(anyhow::anyhow!(line)),
            };
        }
        if tokio::time::Instant::now() >= deadline {
            let executor = plan.fence_executors.get(host).map_or_else(
                || "no agent may execute a fence of it now (status says why)".to_owned(),
                |e| format!("the agent that would fence it is {e}"),
            );
            anyhow::bail!(
                "no answer to the check of {host}'s bmc within {}: {executor}; is a controller leading, and is that agent reporting? The request stays, answered when they are",
                humantime::format_duration(wait)
            );
        }
        tokio::time::sleep(POLL).await;
    }
}

#[cfg(test)]
mod tests {
    use metalguard_api::bmc::CheckFailure;
    use metalguard_api::duration::Timestamp;
    use metalguard_api::protocol::BmcCheck;

    use super::*;

    fn probe(failure: Option<CheckFailure>) -> BmcReachability {
        BmcReachability {
            host: "cp-2".into(),
            reachable: true,
            checked_at: Timestamp(1_764_064_800_000),
            error: None,
            check: Some(BmcCheck {
                failure,
                power_state: Some("on".into()),
                identity: None,
                detail: "the detail".into(),
                credentials_id: None,
                request: Some("r1".into()),
            }),
        }
    }

    #[test]
    fn the_verdict_names_the_host_the_agent_the_class_and_the_detail() {
        let passed = verdict("cp-2", "cp-1", &probe(None)).unwrap();
        assert!(
            passed
                .starts_with("the bmc of cp-2 passed the check cp-1 made at 2025-11-25T10:00:00Z:"),
            "{passed}"
        );
        assert!(passed.ends_with(": the detail"), "{passed}");
        let failed =
            verdict("cp-2", "cp-1", &probe(Some(CheckFailure::AccountLocked))).unwrap_err();
        assert!(failed.contains("failed the check cp-1 made"), "{failed}");
        assert!(
            failed.contains("(account-locked): the detail; "),
            "{failed}"
        );
        let mut bare = probe(None);
        bare.check = None;
        assert!(verdict("cp-2", "cp-1", &bare).is_err());
    }
}
