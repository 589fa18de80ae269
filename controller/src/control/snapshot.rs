//! Builds the decision [`Snapshot`] of the standalone backend from the inventory and the
//! persisted state. There are no Node objects without Kubernetes: an agent's report stands in
//! for its Node (its conditions become Node conditions, its receive time the heartbeat).
//!
//! A retirement request marks its host as retiring (and so as being deleted). A retired host
//! whose power-off for that request is verified is left out, as a deleted Machine would be:
//! it is gone for the planner, and its agent's last etcd view is no longer believed.

use metalguard_api::duration::Timestamp;
use metalguard_api::protocol::{EtcdView, Outcome};
use metalguard_api::snapshot::{
    AgentReport, ConditionStatus, Host, NodeCondition, NodeStatus, Snapshot,
};

/// The Node condition the core reads for readiness.
const READY: &str = "Ready";

use crate::api::hearing::Hearing;
use crate::backend::State;
use crate::inventory::Inventory;

/// The snapshot the core plans from. `known_since` (when this controller started leading)
/// stands for every host's creation time: a host whose agent has never reported is given the
/// health checks' node startup timeout from then, instead of being judged missing at once.
pub fn build(
    inventory: &Inventory,
    state: &State,
    known_since: Timestamp,
    now: Timestamp,
) -> Snapshot {
    build_with_views_since(
        inventory,
        state,
        (known_since, &Hearing::default()),
        now,
        Timestamp(0),
    )
}

/// The leader's snapshot for a plan round: as [`build`], and the agents' etcd views count for
/// the quorum guard only if received since `known_since` (this leadership began). A view from
/// before is history: reports sent while nobody led were lost, and one taken before a stall
/// (a frozen member still healthy in it) must not speak for the cluster after it. Until fresh
/// views arrive (one report interval), control-plane remediation waits. `status`, `retire
/// --cancel` and the notes read the stored views as they are ([`build`]). An agent's silence
/// is judged on `hearing` too: reports accepted but not yet handled, and time this process
/// could not hear ([`Hearing`]).
pub fn build_for_round(
    inventory: &Inventory,
    state: &State,
    (known_since, hearing): (Timestamp, &Hearing),
    now: Timestamp,
) -> Snapshot {
    build_with_views_since(inventory, state, (known_since, hearing), now, known_since)
}

fn build_with_views_since(
    inventory: &Inventory,
    state: &State,
    (known_since, hearing): (Timestamp, &Hearing),
    now: Timestamp,
    views_since: Timestamp,
) -> Snapshot {
    let gone: Vec<&str> = inventory
        .hosts
        .iter()
        .map(|h| h.name.as_str())
        .filter(|name| powered_off_for_retirement(state, name))
        .collect();
    let mut hosts: Vec<Host> = inventory
        .hosts
        .iter()
        .filter(|h| !gone.contains(&h.name.as_str()))
        .map(|h| host_of(h, state, (known_since, hearing), now, views_since))
        .collect();
    let reporting: Vec<&Host> = hosts
        .iter()
        .filter(|h| state.reports.contains_key(&h.name))
        .collect();
    let views = fresh_views(inventory, state, &reporting, now, views_since);
    for host in &mut hosts {
        host.etcd = crate::control::members::member_of(&host.name, &views);
    }
    Snapshot {
        observed_at: now,
        control_plane: inventory.control_plane.clone(),
        hosts,
        orphan_members: Vec::new(),
        remediations: state.remediations.values().cloned().collect(),
    }
}

/// Host `h` as the core plans from it: its inventory entry, its Node (or its agent's report
/// standing for it), its agent, hooks, requests and hold. Its etcd member is set apart, from
/// every agent's view ([`fresh_views`]).
pub(crate) fn host_of(
    h: &crate::inventory::InventoryHost,
    state: &State,
    (known_since, hearing): (Timestamp, &Hearing),
    now: Timestamp,
    views_since: Timestamp,
) -> Host {
    let retirement = state.retirements.get(&h.name).cloned();
    // A report from before the host was verified off describes the host before it
    // went down: like a deleted Node, it is gone until the host reports again.
    let stored = state
        .reports
        .get(&h.name)
        .filter(|r| verified_off_at(state, &h.name).is_none_or(|off| r.received_at > off));
    Host {
        name: h.name.clone(),
        role: h.role,
        failure_domain: h.failure_domain.clone(),
        created_at: known_since,
        labels: h.labels.clone(),
        annotations: h.annotations.clone(),
        externally_provisioned: true,
        bmc_configured: h.bmc.is_some(),
        up_to_date: true,
        deletion_requested_at: retirement.as_ref().map(|r| r.requested_at),
        pre_drain_hooks: state.hooks.get(&h.name).cloned().unwrap_or_default(),
        fence_request: state.fence_requests.get(&h.name).cloned(),
        retirement,
        phase_failed: false,
        // The Kubernetes backend has the real Node (with the agent's conditions
        // mirrored onto it); a host whose Node is gone but whose agent reports was
        // seen (the Node was deleted), one with neither gets the startup timeout.
        node: match &state.nodes {
            Some(nodes) => nodes
                .get(&h.name)
                .cloned()
                .map(|n| conditions_heard_since(n, views_since)),
            None => stored.map(|s| {
                // Conditions of a report received before this leadership began
                // count from when it began: a new leader does not judge on what it
                // heard before (a report held from before a pause said the member
                // was unhealthy; the soak fenced that host 29 s after it recovered,
                // 1.8 s into the new leadership). A fresh report replaces it within a
                // report interval; a silent agent is judged by its silence.
                let heard_since = if s.received_at < views_since {
                    views_since
                } else {
                    Timestamp(0)
                };
                node_of(&s.report, known_since, heard_since)
            }),
        },
        node_seen: stored.is_some()
            || state
                .nodes
                .as_ref()
                .is_some_and(|n| n.contains_key(&h.name)),
        agent: stored.map(|s| AgentReport {
            // A new leader cannot know whether agents reported while nobody led (or
            // while the store could not record): each gets one heartbeat timeout from
            // the moment this controller started leading.
            last_heartbeat: hearing.last_heard(&h.name, s.received_at.max(known_since), now),
            can_fence: true,
            bmc_reachable: s
                .report
                .bmc_reachability
                .iter()
                .map(|r| (r.host.clone(), r.reachable && !failed_on_its_path(r)))
                .collect(),
            boot_id: Some(s.report.boot_id.clone()).filter(|b| !b.is_empty()),
            boot_reported_at: Some(s.received_at).filter(|_| !s.report.boot_id.is_empty()),
        }),
        etcd: None,
        hold: state.holds.get(&h.name).cloned(),
        lease_held_by: state.node_leases.get(&h.name).cloned(),
    }
}

/// The etcd views that vote on the members' health: those of `reporting` (the snapshot's
/// hosts with a stored report, in the snapshot's order). Only the hosts planned from vote
/// (crate::control::members), and only while their agent is not silent: a silent agent's
/// last view is history — a frozen host would go on claiming that its member is healthy and
/// leads. A view counts while it is as fresh as an executor must be, and no older than its
/// agent's heartbeat timeout (the silence after which the planner judges that host by it).
pub(crate) fn fresh_views<'a>(
    inventory: &Inventory,
    state: &'a State,
    reporting: &[&Host],
    now: Timestamp,
    views_since: Timestamp,
) -> Vec<&'a EtcdView> {
    reporting
        .iter()
        .filter_map(|h| {
            let r = state.reports.get(&h.name)?;
            let fresh_for = inventory.policy.remediation.executor_heartbeat_timeout.min(
                metalguard_core::health::agent_heartbeat_timeout(&inventory.policy, h),
            );
            (r.received_at >= views_since && now.since(r.received_at) <= fresh_for)
                .then_some(r.report.etcd.as_ref())
                .flatten()
        })
        .collect()
}

/// True when an agent's credentialed check of a BMC failed on that agent's own path to it
/// (nothing answered, or the TLS handshake failed): it counts as not reaching that BMC, so
/// the executor choice passes to another agent, which then gets the credentials and checks
/// in turn (issue 25: the quorum guard prefers executors whose check passed). A failure any
/// agent would meet (credentials refused, a locked account, too little privilege, another
/// machine behind the BMC, an odd answer) does not move the fence: another executor would
/// fail the same way, and `FencingReady` says what to fix.
fn failed_on_its_path(probe: &metalguard_api::protocol::BmcReachability) -> bool {
    use metalguard_api::bmc::CheckFailure;
    probe.check.as_ref().is_some_and(|c| {
        matches!(
            c.failure,
            Some(CheckFailure::Unreachable | CheckFailure::Tls)
        )
    })
}

/// True when `host` is retiring and the power-off that ends this retirement succeeded (the
/// agent verified the power state).
pub fn powered_off_for_retirement(state: &State, host: &str) -> bool {
    state.retirements.get(host).is_some_and(|r| {
        let id = metalguard_core::retire::decommission_id(host, r.requested_at);
        state
            .operations
            .get(&id)
            .and_then(|op| op.result.as_ref())
            .is_some_and(|result| result.outcome == Outcome::Succeeded)
    })
}

/// The Node a report stands for: the report's conditions, plus a synthesized `Ready`:
/// `False` while any health condition is `False` (since the latest of their transitions),
/// else `Unknown` while any is `Unknown` — an agent that just started and whose probes have
/// not all answered is not Ready (a report of pending probes
/// once completed a remediation of a host whose etcd had not rejoined, and its next report
/// started a second one; `lab_partition`, 1 run in 20) — else `True` (since the latest
/// transition of any). Pressure conditions (`EtcdNoSpace`) do not count, either way, as in
/// Kubernetes: a NOSPACE alarm is reported, and no fence cures it. Reserved types (`Ready`
/// and the kubelet's, [`metalguard_api::protocol::RESERVED_CONDITION_TYPES`]) are dropped:
/// an agent reporting `Ready=True` must not overrule the failing conditions next to it (the
/// loop logs them).
/// The node a standalone host's report stands for: its conditions and a synthesized
/// `Ready`. No condition has held longer than since `heard_since` (when the report is older
/// than the leadership judging it; `Timestamp(0)` otherwise).
fn node_of(
    report: &metalguard_api::protocol::AgentReport,
    known_since: Timestamp,
    heard_since: Timestamp,
) -> NodeStatus {
    let mut conditions: Vec<NodeCondition> = report
        .conditions
        .iter()
        .filter(|c| !metalguard_api::protocol::is_reserved_condition(&c.type_))
        .map(|c| NodeCondition {
            type_: c.type_.clone(),
            status: c.status,
            last_transition: c.last_transition.max(heard_since),
        })
        .collect();
    conditions.push(synthesized_ready(&conditions));
    NodeStatus {
        created_at: known_since,
        conditions,
        ..NodeStatus::default()
    }
}

/// A Node (Kubernetes backend) as a leadership that began at `views_since` may judge it: a
/// condition that is not the kubelet's ([`metalguard_api::protocol::RESERVED_CONDITION_TYPES`])
/// has held at most since then. Those are the agents' conditions as a leader mirrored them,
/// maybe the previous leader from a report since superseded (a paused leader's mirror is
/// frozen while the agent recovers), as in the standalone backend's [`node_of`]; the
/// controller cannot tell them from another writer's (node-problem-detector), whose
/// judgement a takeover delays by at most its timeout, the safe side. The kubelet's own
/// conditions keep their times, as machine health checks judge them (seed 003: "if a
/// condition is met for the duration of the timeout").
fn conditions_heard_since(mut node: NodeStatus, views_since: Timestamp) -> NodeStatus {
    for c in node
        .conditions
        .iter_mut()
        .filter(|c| !metalguard_api::protocol::is_reserved_condition(&c.type_))
    {
        c.last_transition = c.last_transition.max(views_since);
    }
    node
}

/// `Ready` from the health conditions of a report (see [`node_of`]).
fn synthesized_ready(conditions: &[NodeCondition]) -> NodeCondition {
    let health: Vec<&NodeCondition> = conditions
        .iter()
        .filter(|c| !metalguard_api::protocol::is_pressure(&c.type_))
        .collect();
    let latest = |status: Option<ConditionStatus>| {
        health
            .iter()
            .filter(|c| status.is_none_or(|s| c.status == s))
            .map(|c| c.last_transition)
            .max()
            .unwrap_or(Timestamp(0))
    };
    let (status, since) = if health.iter().any(|c| c.status == ConditionStatus::False) {
        (ConditionStatus::False, latest(Some(ConditionStatus::False)))
    } else if health.iter().any(|c| c.status == ConditionStatus::Unknown) {
        (
            ConditionStatus::Unknown,
            latest(Some(ConditionStatus::Unknown)),
        )
    } else {
        (ConditionStatus::True, latest(None))
    };
    NodeCondition {
        type_: READY.to_owned(),
        status,
        last_transition: since,
    }
}

/// When an active remediation of `host` last had its power-off verified (the agent's
/// result time), if one did.
pub(crate) fn verified_off_at(state: &State, host: &str) -> Option<Timestamp> {
    state
        .remediations
        .values()
        .filter(|r| r.target == host && r.phase.is_active())
        .filter_map(|r| {
            let op = state.operation_of(&r.id, "power-off")?;
            let result = op.result.as_ref()?;
            (result.outcome == metalguard_api::protocol::Outcome::Succeeded)
                .then_some(result.finished_at)
        })
        .max()
}

#[cfg(test)]
#[path = "snapshot_tests.rs"]
mod tests;
