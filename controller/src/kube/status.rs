//! What the leader observes about hosts and the control plane, as `GuardedHost` and
//! `GuardedControlPlane` status: pure functions of one judged round ([`Judged`]) and of the
//! status the object already carries, so that an unchanged observation is equal to it and
//! is not written again (times are whole seconds, as the API server stores them; a value that
//! did not change keeps its time).
//!
//! `agent.lastHeartbeatTime` is the one value that changes with every report: it is carried
//! forward unless it is older than half the agent's heartbeat timeout ([`heartbeat_refresh`]),
//! so a host costs one write per half timeout while nothing else changes, never one per round.

use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use metalguard_api::duration::Timestamp;
use metalguard_api::k8s::control_plane::GuardedControlPlaneStatus;
use metalguard_api::k8s::host::{
    AgentStatus, EtcdMemberStatus, GuardedHostStatus, PowerState, RemediationPhaseName,
};
use metalguard_api::protocol::{Outcome, PowerAction};
use metalguard_api::remediation::{Remediation, RemediationPhase};
use metalguard_api::snapshot::{Host, Role};
use metalguard_core::quorum::{EtcdView, quorum};

use crate::backend::{Judged, OperationKind};
use crate::control::fencing::Readiness;

/// `t` at whole seconds, as the API server keeps a `Time`.
pub fn second(t: Timestamp) -> Time {
    super::record::time(Timestamp(t.0 - t.0 % 1000))
}

/// How long `host`'s agent may be silent (what the planner uses).
pub use metalguard_core::health::agent_heartbeat_timeout as heartbeat_timeout;

/// How stale a written `agent.lastHeartbeatTime` may get before it is rewritten.
pub fn heartbeat_refresh(timeout: Duration) -> Duration {
    timeout / 2
}

/// True when `host`'s agent has been silent longer than `timeout` at `now`, as the planner
/// judges it: from its last report, or, with none, from when this controller started leading
/// (the snapshot's creation time of every host).
pub fn agent_silent(host: &Host, timeout: Duration, now: Timestamp) -> bool {
    silence(host, now) > timeout
}

/// How long `host`'s agent has been silent at `now`: since its last heartbeat, or since the
/// host was known when none was heard.
pub fn silence(host: &Host, now: Timestamp) -> Duration {
    let last = host
        .agent
        .as_ref()
        .map_or(host.created_at, |a| a.last_heartbeat);
    now.since(last)
}

/// The power state last verified for `host` and when: the latest power command on its BMC
/// with a result (`Unknown` when it failed), or `On` from the first report of its own agent
/// received after that result. `None` when neither exists.
pub fn power_of(judged: &Judged<'_>, host: &str) -> Option<(PowerState, Timestamp)> {
    let verified = judged
        .state
        .operations
        .values()
        .filter_map(|op| match &op.kind {
            OperationKind::Fence { target, action } if target == host => {
                op.result.as_ref().map(|r| (action, r))
            }
            _ => None,
        })
        .filter(|(_, r)| r.outcome != Outcome::Rejected)
        .max_by_key(|(_, r)| r.finished_at)
        .map(|(action, r)| {
            let power = match (r.outcome, action) {
                (Outcome::Succeeded, PowerAction::Off) => PowerState::Off,
                (Outcome::Succeeded, PowerAction::On) => PowerState::On,
                _ => PowerState::Unknown,
            };
            (power, r.finished_at)
        });
    let report = judged.state.reports.get(host).map(|r| r.received_at);
    match (verified, report) {
        (Some((_, at)), Some(seen)) if seen > at => Some((PowerState::On, seen)),
        (None, Some(seen)) => Some((PowerState::On, seen)),
        (verified, _) => verified,
    }
}

/// The remediation of `host` the status shows: the active one, else the latest.
fn remediation_of<'a>(judged: &Judged<'a>, host: &str) -> Option<&'a Remediation> {
    judged
        .snapshot
        .remediations
        .iter()
        .filter(|r| r.target == host)
        .max_by_key(|r| (r.phase.is_active(), r.started_at, r.seq))
}

/// A condition, keeping `previous`'s transition time when its status did not change.
fn condition(
    previous: &[Condition],
    type_: &str,
    status: bool,
    reason: &str,
    message: String,
    now: Timestamp,
) -> Condition {
    let status = if status { "True" } else { "False" };
    condition_of(previous, type_, status, reason, message, now)
}

/// As [`condition`], with the status as written (`True`, `False`, `Unknown`).
fn condition_of(
    previous: &[Condition],
    type_: &str,
    status: &str,
    reason: &str,
    message: String,
    now: Timestamp,
) -> Condition {
    let status = status.to_owned();
    let since = previous
        .iter()
        .find(|c| c.type_ == type_ && c.status == status)
        .map_or_else(|| second(now), |c| c.last_transition_time.clone());
    Condition {
        type_: type_.to_owned(),
        status,
        reason: reason.to_owned(),
        message,
        last_transition_time: since,
        observed_generation: None,
    }
}

pub use super::round_index::RoundIndex;

fn host_conditions(
    index: &RoundIndex<'_>,
    judged: &Judged<'_>,
    previous: &[Condition],
    host: &Host,
    now: Timestamp,
) -> Vec<Condition> {
    let unhealthy_in = index.unhealthy_in(&host.name);
    let healthy = if unhealthy_in.is_empty() {
        condition(
            previous,
            "Healthy",
            true,
            "Healthy",
            "no health check finds it unhealthy".to_owned(),
            now,
        )
    } else {
        condition(
            previous,
            "Healthy",
            false,
            "Unhealthy",
            format!("unhealthy in HostHealthCheck {}", unhealthy_in.join(", ")),
            now,
        )
    };
    let reached_by = index.reached_by(&host.name);
    let fenceable = match (host.bmc_configured, reached_by.is_empty()) {
        (false, _) => condition(
            previous,
            "Fenceable",
            false,
            "NoBmc",
            "no BMC is configured".to_owned(),
            now,
        ),
        (true, true) => condition(
            previous,
            "Fenceable",
            false,
            "NoAgentReachesBmc",
            "no reporting agent of another host reaches its BMC".to_owned(),
            now,
        ),
        (true, false) => condition(
            previous,
            "Fenceable",
            true,
            "BmcReachable",
            format!(
                "its BMC is reachable by the agent of {}",
                reached_by.join(", ")
            ),
            now,
        ),
    };
    let remediation = remediation_of(judged, &host.name);
    let remediating = match remediation.filter(|r| r.phase.is_active()) {
        Some(r) => {
            let phase: RemediationPhaseName = (&r.phase).into();
            condition(
                previous,
                "Remediating",
                true,
                &format!("{phase:?}"),
                format!("remediation {} is {}", r.id, r.phase.name()),
                now,
            )
        }
        None => condition(
            previous,
            "Remediating",
            false,
            "NotRemediating",
            "no remediation is in progress".to_owned(),
            now,
        ),
    };
    let needs_person = match remediation.map(|r| (&r.id, &r.phase)) {
        Some((id, RemediationPhase::NeedsPerson { reason })) => condition(
            previous,
            "NeedsPerson",
            true,
            "NeedsPerson",
            format!("remediation {id}: {reason}"),
            now,
        ),
        _ => condition(
            previous,
            "NeedsPerson",
            false,
            "NoPersonNeeded",
            "nothing waits for a person".to_owned(),
            now,
        ),
    };
    let fencing_ready = fencing_ready(index, previous, host, now);
    vec![healthy, fenceable, remediating, needs_person, fencing_ready]
}

/// `FencingReady` (issue 25): whether a fence of `host` would work, by the read-only check of
/// the agent that would execute it (`control::fencing`). `Unknown` until one reports.
fn fencing_ready(
    index: &RoundIndex<'_>,
    previous: &[Condition],
    host: &Host,
    now: Timestamp,
) -> Condition {
    const TYPE: &str = "FencingReady";
    if !host.bmc_configured {
        return condition(
            previous,
            TYPE,
            false,
            "NoBmc",
            "no BMC is configured".to_owned(),
            now,
        );
    }
    match index.fencing.get(&host.name) {
        Some(Readiness::Ready { by, .. }) => condition(
            previous,
            TYPE,
            true,
            "CheckPassed",
            format!("the agent of {by}, which would fence it, logged in to its BMC and read it"),
            now,
        ),
        Some(Readiness::NotReady {
            failure,
            detail,
            by,
            ..
        }) => condition(
            previous,
            TYPE,
            false,
            &crate::control::fencing::reason_of(*failure),
            format!(
                "the agent of {by}, which would fence it, checked its BMC: {detail}; {}",
                failure.remedy()
            ),
            now,
        ),
        _ => condition_of(
            previous,
            TYPE,
            "Unknown",
            "NotChecked",
            "the agent that would fence it has not reported a credentialed check of its BMC"
                .to_owned(),
            now,
        ),
    }
}

/// `previous` with the observed fields (power, agent, etcd member, conditions,
/// `observedGeneration`) of `host` replaced from `judged`; the records (remediation,
/// operations) are kept as they are. Equal to `previous` when nothing changed.
pub fn observe_host(
    index: &RoundIndex<'_>,
    judged: &Judged<'_>,
    previous: &GuardedHostStatus,
    generation: Option<i64>,
    host: &Host,
    now: Timestamp,
) -> GuardedHostStatus {
    let mut status = previous.clone();
    status.observed_generation = generation;
    if let Some((power, at)) = power_of(judged, &host.name) {
        if previous.power != Some(power) || previous.power_observed_time.is_none() {
            status.power_observed_time = Some(second(at));
        }
        status.power = Some(power);
    } else {
        status.power = None;
        status.power_observed_time = None;
    }
    let timeout = heartbeat_timeout(judged.policy, host);
    status.agent = judged.state.reports.get(&host.name).map(|stored| {
        let version = stored.report.agent_version.clone();
        let can_fence = stored.report.bmc_reachability.iter().all(|r| r.reachable);
        let heard = second(stored.received_at);
        let last_heartbeat_time = match &previous.agent {
            Some(before)
                if before.version == version
                    && before.can_fence == can_fence
                    && super::record::timestamp(&before.last_heartbeat_time)
                        .after(heartbeat_refresh(timeout))
                        > super::record::timestamp(&heard) =>
            {
                before.last_heartbeat_time.clone()
            }
            _ => heard,
        };
        AgentStatus {
            last_heartbeat_time,
            version,
            can_fence,
        }
    });
    status.etcd_member = host.etcd.as_ref().map(|m| EtcdMemberStatus {
        id: format!("{:x}", m.id),
        name: m.name.clone(),
        learner: m.learner,
        healthy: m.healthy,
        leader: m.leader,
    });
    status.conditions = host_conditions(index, judged, &previous.conditions, host, now);
    let executors = &judged.plan.fence_executors;
    if let Some(id) = crate::control::fencing::answered(judged.state, executors, &host.name) {
        status.bmc_check_answered = Some(id.to_owned());
    }
    status
}

/// The control plane as the judged snapshot shows it. Quorum tolerance and the disruption
/// budget are the core's ([`metalguard_core::health::control_plane_tolerance`], the plan's
/// `min_available_members`); nothing is derived a second time here.
pub fn observe_control_plane(
    judged: &Judged<'_>,
    previous: &GuardedControlPlaneStatus,
    generation: Option<i64>,
    now: Timestamp,
) -> GuardedControlPlaneStatus {
    let snapshot = judged.snapshot;
    let view = EtcdView::from_snapshot(snapshot);
    let count = |n: usize| u32::try_from(n).unwrap_or(u32::MAX);
    let members: Vec<&Host> = snapshot
        .hosts
        .iter()
        .filter(|h| h.role == Role::ControlPlane && !h.is_deleting())
        .collect();
    let ready = members
        .iter()
        .filter(|h| h.node_ready() && h.etcd.as_ref().is_some_and(|m| m.is_voter() && m.healthy))
        .count();
    let voters = view.voter_count();
    let healthy = view.healthy_voter_count();
    let previous_conditions = &previous.conditions;
    let quorum_safe = match view.quorum_lost() {
        Some(lost) => condition(
            previous_conditions,
            "QuorumSafe",
            false,
            "QuorumLost",
            lost.to_string(),
            now,
        ),
        None if healthy.saturating_sub(1) < quorum(voters) => condition(
            previous_conditions,
            "QuorumSafe",
            false,
            "QuorumAtRisk",
            format!(
                "{healthy} of {voters} voters healthy: one more failure loses quorum ({} needed)",
                quorum(voters)
            ),
            now,
        ),
        None => condition(
            previous_conditions,
            "QuorumSafe",
            true,
            "QuorumHeld",
            format!(
                "{healthy} of {voters} voters healthy, quorum needs {}",
                quorum(voters)
            ),
            now,
        ),
    };
    let desired = snapshot.control_plane.desired_replicas;
    let scaling = if view.membership_in_flux() {
        condition(
            previous_conditions,
            "Scaling",
            true,
            "MembershipChanging",
            format!(
                "{} learner(s); a member is leaving or a host is being replaced",
                view.learners().count()
            ),
            now,
        )
    } else if count(voters) != desired {
        condition(
            previous_conditions,
            "Scaling",
            true,
            "VotersDifferFromReplicas",
            format!("{voters} voters, {desired} replicas wanted"),
            now,
        )
    } else {
        condition(
            previous_conditions,
            "Scaling",
            false,
            "Stable",
            format!("{voters} voters as wanted"),
            now,
        )
    };
    GuardedControlPlaneStatus {
        observed_generation: generation,
        replicas: count(members.len()),
        ready_replicas: count(ready),
        updated_replicas: count(members.iter().filter(|h| h.up_to_date).count()),
        etcd_voters: count(voters),
        etcd_learners: count(view.learners().count()),
        etcd_leader: view.leader().map(|m| {
            if m.member.name.is_empty() {
                format!("{:x}", m.member.id)
            } else {
                m.member.name.clone()
            }
        }),
        quorum_tolerance: (voters > 0)
            .then(|| count(metalguard_core::health::control_plane_tolerance(voters))),
        min_available: judged.plan.min_available_members.map(count),
        conditions: vec![
            quorum_safe,
            scaling,
            control_plane_fencing(judged, &members, previous_conditions, now),
        ],
    }
}

/// `FencingReady` of the control plane (issue 25): `True` when a fence of every control-plane
/// host would work by the latest check of the agent that would execute it; `False` naming
/// each host whose check failed or that has no BMC (a hung one could not be fenced, and etcd
/// would run on the rest until a person acts); otherwise `Unknown`, naming the unchecked.
fn control_plane_fencing(
    judged: &Judged<'_>,
    members: &[&Host],
    previous: &[Condition],
    now: Timestamp,
) -> Condition {
    const TYPE: &str = "FencingReady";
    let readiness = crate::control::fencing::readiness_of(
        members
            .iter()
            .filter(|h| h.bmc_configured)
            .map(|h| h.name.as_str()),
        judged.state,
        &judged.plan.fence_executors,
    );
    let mut failing: Vec<String> = members
        .iter()
        .filter(|h| !h.bmc_configured)
        .map(|h| format!("{} (no BMC)", h.name))
        .collect();
    let mut unchecked = Vec::new();
    for (host, r) in &readiness {
        match r {
            Readiness::NotReady { failure, .. } => {
                failing.push(format!("{host} ({})", failure.name()));
            }
            Readiness::Unchecked => unchecked.push(host.as_str()),
            Readiness::Ready { .. } => {}
        }
    }
    if !failing.is_empty() {
        return condition(
            previous,
            TYPE,
            false,
            "HostCannotBeFenced",
            format!(
                "a fence of these control-plane hosts would fail: {}",
                failing.join(", ")
            ),
            now,
        );
    }
    if !unchecked.is_empty() {
        return condition_of(
            previous,
            TYPE,
            "Unknown",
            "NotChecked",
            format!("not checked yet: {}", unchecked.join(", ")),
            now,
        );
    }
    condition(
        previous,
        TYPE,
        true,
        "AllChecksPassed",
        format!(
            "a fence of each of the {} control-plane hosts passed its check",
            members.len()
        ),
        now,
    )
}

#[cfg(test)]
#[path = "status_tests.rs"]
mod tests;
