//! The executing agent's own quorum check before it cuts a host's power (off or reboot).
//!
//! The controller plans a fence only when it leaves etcd's quorum; this check does not trust
//! it. With its own etcd client certificate, within a bounded time, the agent observes every
//! member, confirms the membership with a quorum read (`observe_confirmed`), and counts the
//! healthy voters other than the target's member ([`metalguard_etcd::power_gate`]). It
//! refuses when they are fewer than quorum, or when it cannot tell. A person's forced fence
//! (`fence --force` with a reason, carried in the command) is the only override, and the
//! result says so.

use std::time::Duration;

use metalguard_api::protocol::FenceCommand;
use metalguard_etcd::ClientSettings;
use metalguard_etcd::power_gate::{PowerTarget, may_cut_power};

use super::execute::error_chain;

/// The whole check's deadline: an observation probes every member in parallel (probe
/// timeout) and confirms through at most a few voters.
pub const CHECK_DEADLINE: Duration = Duration::from_secs(10);

/// Checks that `command`'s power cut leaves quorum: `Ok` with what was counted (a line for
/// the result's timeline), `Err` with the refusal.
pub async fn check_power_cut(
    command: &FenceCommand,
    etcd: Option<&ClientSettings>,
) -> Result<String, String> {
    let target = &command.target;
    if let Some(forced) = &command.forced {
        tracing::warn!(target_host = %target, by = %forced.by, reason = %forced.reason, "power cut forced by a person: this agent's quorum check is skipped");
        return Ok(format!(
            "quorum check skipped: the fence of {target} was forced by {} ({})",
            forced.by, forced.reason
        ));
    }
    let Some(settings) = etcd else {
        return match command.etcd_member {
            Some(member) => Err(format!(
                "cannot tell whether cutting {target}'s power leaves etcd's quorum: the controller says it holds member {member:x}, and this agent has no [etcd] access to check; refused"
            )),
            None => Ok(format!(
                "no quorum check: this agent has no [etcd] access and the controller names no etcd member for {target}"
            )),
        };
    };
    let observed = tokio::time::timeout(
        CHECK_DEADLINE,
        metalguard_etcd::observe::observe_confirmed(settings),
    )
    .await;
    let view = match observed {
        Ok(Ok(view)) => view,
        Ok(Err(err)) => {
            return Err(format!(
                "cannot tell whether cutting {target}'s power leaves etcd's quorum: {}; refused",
                error_chain(&err)
            ));
        }
        Err(_) => {
            return Err(format!(
                "cannot tell whether cutting {target}'s power leaves etcd's quorum: no observation within {CHECK_DEADLINE:?}; refused"
            ));
        }
    };
    let target = PowerTarget {
        host: target,
        member: command.etcd_member,
    };
    match may_cut_power(&view, target) {
        Ok(count) => Ok(format!("quorum checked by this agent: {count}")),
        Err(refusal) => Err(refusal.to_string()),
    }
}
