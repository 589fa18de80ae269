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
        .map(|h| {
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
                    Some(nodes) => nodes.get(&h.name).cloned(),
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
                    last_heartbeat: hearing.last_heard(
                        &h.name,
                        s.received_at.max(known_since),
                        now,
                    ),
                    can_fence: true,
                    bmc_reachable: s
                        .report
                        .bmc_reachability
                        .iter()
                        .map(|r| (r.host.clone(), r.reachable))
                        .collect(),
                    boot_id: Some(s.report.boot_id.clone()).filter(|b| !b.is_empty()),
                    boot_reported_at: Some(s.received_at).filter(|_| !s.report.boot_id.is_empty()),
                }),
                etcd: None,
                hold: state.holds.get(&h.name).cloned(),
            }
        })
        .collect();
    // Only the hosts planned from vote on the members' health (crate::control::members), and
    // only while their agent is not silent: a silent agent's last view is history — a frozen
    // host would go on claiming that its member is healthy and leads. A view counts while it
    // is as fresh as an executor must be, and no older than its agent's heartbeat timeout (the
    // silence after which the planner judges that host by it).
    let views: Vec<&EtcdView> = hosts
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
        .collect();
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
mod tests {
    use metalguard_api::plan::OperationId;
    use metalguard_api::protocol::{AgentReport as Report, CommandResult};
    use metalguard_api::snapshot::Retirement;

    use super::*;
    use crate::backend::StoredReport;

    const INVENTORY: &str = r#"
[etcd]
endpoints = ["http://127.0.0.1:2379"]

[control_plane]
desired_replicas = 1

[[hosts]]
name = "cp-1"
role = "control-plane"

[[hosts]]
name = "cp-2"
role = "control-plane"
"#;

    fn report(host: &str, members: &[(u64, &str, bool)]) -> StoredReport {
        let members = members
            .iter()
            .map(|&(id, name, learner)| crate::testkit::member(id, name, learner, true))
            .collect();
        let etcd = EtcdView {
            local_member_id: None,
            leader_id: Some(2),
            members,
        };
        crate::testkit::stored_report(host, 9, Some(etcd))
    }

    fn condition(type_: &str, status: ConditionStatus) -> metalguard_api::protocol::Condition {
        metalguard_api::protocol::Condition {
            type_: type_.into(),
            status,
            reason: "r".into(),
            message: String::new(),
            last_transition: Timestamp(3),
        }
    }

    fn ready(report: &Report) -> ConditionStatus {
        node_of(report, Timestamp(1), Timestamp(0))
            .conditions
            .iter()
            .find(|c| c.type_ == READY)
            .unwrap()
            .status
    }

    #[test]
    fn a_nospace_alarm_keeps_the_host_ready_and_its_member_a_healthy_voter() {
        use ConditionStatus::{False, True};
        let inventory = Inventory::parse(std::path::Path::new("i.toml"), INVENTORY).unwrap();
        let mut stored = report("cp-1", &[(1, "cp-1", false), (2, "cp-2", false)]);
        let r = &mut stored.report;
        r.conditions = vec![
            condition("EtcdMemberHealthy", True),
            condition("EtcdNoSpace", False),
        ];
        assert_eq!(ready(r), True, "no alarm: the pressure condition is False");
        r.conditions[1].status = True;
        assert_eq!(
            ready(r),
            True,
            "the alarm is reported, the host stays ready"
        );
        r.conditions[0].status = False;
        assert_eq!(
            ready(r),
            False,
            "a failing member still makes the host unready"
        );
        // The agent reports a NOSPACE member healthy (it votes) and lists the alarm.
        for m in &mut r.etcd.as_mut().unwrap().members {
            m.alarms = vec!["NOSPACE".into()];
        }
        let mut state = State::default();
        state.reports.insert("cp-1".into(), stored);
        let s = build(&inventory, &state, Timestamp(1), Timestamp(10));
        assert!(s.hosts.iter().all(|h| h.etcd.as_ref().unwrap().healthy));
    }

    #[test]
    fn a_round_counts_only_the_views_received_since_its_leadership_began() {
        let inventory = Inventory::parse(std::path::Path::new("i.toml"), INVENTORY).unwrap();
        let mut state = State::default();
        // Taken at t=9 (received_at 9): both members healthy then.
        state.reports.insert(
            "cp-1".into(),
            report("cp-1", &[(1, "cp-1", false), (2, "cp-2", false)]),
        );
        let received = state.reports["cp-1"].received_at;
        let members = |s: &Snapshot| s.hosts.iter().filter(|h| h.etcd.is_some()).count();
        // status, retire --cancel, notes: the stored views as they are.
        assert_eq!(
            members(&build(
                &inventory,
                &state,
                received.after(std::time::Duration::from_secs(1)),
                received.after(std::time::Duration::from_secs(2))
            )),
            2
        );
        // A leadership that began after the view was received does not count it...
        let later = received.after(std::time::Duration::from_secs(1));
        let now = received.after(std::time::Duration::from_secs(2));
        assert_eq!(
            members(&build_for_round(
                &inventory,
                &state,
                (later, &Hearing::default()),
                now
            )),
            0
        );
        // ...one that began before does.
        assert_eq!(
            members(&build_for_round(
                &inventory,
                &state,
                (received, &Hearing::default()),
                now
            )),
            2
        );
    }

    #[test]
    fn a_round_counts_a_condition_of_a_report_from_before_its_leadership_only_from_when_it_began() {
        use std::time::Duration;
        let inventory = Inventory::parse(std::path::Path::new("i.toml"), INVENTORY).unwrap();
        let mut state = State::default();
        let mut stored = report("cp-1", &[(1, "cp-1", false)]);
        // Unhealthy since t=3, received at t=9.
        stored.report.conditions = vec![condition("EtcdMemberHealthy", ConditionStatus::False)];
        state.reports.insert("cp-1".into(), stored);
        let received = state.reports["cp-1"].received_at;
        let ready_since = |s: &Snapshot| {
            let host = s.hosts.iter().find(|h| h.name == "cp-1").unwrap();
            let ready = host.node.as_ref().unwrap().conditions.iter();
            let ready = ready.clone().find(|c| c.type_ == READY).unwrap();
            (ready.status, ready.last_transition)
        };
        let began = received.after(Duration::from_secs(20));
        let now = began.after(Duration::from_secs(2));
        // status: the report as it is.
        assert_eq!(
            ready_since(&build(&inventory, &state, began, now)),
            (ConditionStatus::False, Timestamp(3))
        );
        // A leadership that began after the report was received: from when it began.
        assert_eq!(
            ready_since(&build_for_round(
                &inventory,
                &state,
                (began, &Hearing::default()),
                now
            )),
            (ConditionStatus::False, began)
        );
        // One that began before: the agent's own time.
        assert_eq!(
            ready_since(&build_for_round(
                &inventory,
                &state,
                (received, &Hearing::default()),
                now
            )),
            (ConditionStatus::False, Timestamp(3))
        );
    }

    #[test]
    fn a_view_stops_counting_once_its_agent_is_silent_past_its_heartbeat_timeout() {
        use std::time::Duration;
        // cp-1's check: its agent is silent after 5 s; cp-2 has no check (the executor
        // timeout, 60 s by default, bounds its view alone).
        let text = INVENTORY.replace(
            "name = \"cp-1\"\nrole = \"control-plane\"",
            "name = \"cp-1\"\nrole = \"control-plane\"\nlabels = { pool = \"one\" }",
        ) + "\n[[policy.health_checks]]\nname = \"one\"\n\
             selector = { match_labels = { pool = \"one\" } }\n\
             agent_heartbeat_timeout = \"5s\"\n";
        let inventory = Inventory::parse(std::path::Path::new("i.toml"), &text).unwrap();
        let mut state = State::default();
        let both = [(1, "cp-1", false), (2, "cp-2", false)];
        state.reports.insert("cp-1".into(), report("cp-1", &both));
        let received = state.reports["cp-1"].received_at;
        let members = |s: &Snapshot| s.hosts.iter().filter(|h| h.etcd.is_some()).count();
        let at = |secs| received.after(Duration::from_secs(secs));
        // Fresh: cp-1's view lists both members.
        assert_eq!(
            members(&build_for_round(
                &inventory,
                &state,
                (received, &Hearing::default()),
                at(5)
            )),
            2
        );
        // cp-1's agent silent past its 5 s: its view is history, though younger than 60 s.
        assert_eq!(
            members(&build_for_round(
                &inventory,
                &state,
                (received, &Hearing::default()),
                at(6)
            )),
            0
        );
        // The same view from cp-2, which no check bounds below the executor timeout, counts
        // up to that timeout and no longer.
        state.reports.clear();
        state.reports.insert("cp-2".into(), report("cp-2", &both));
        assert_eq!(
            members(&build_for_round(
                &inventory,
                &state,
                (received, &Hearing::default()),
                at(60)
            )),
            2
        );
        assert_eq!(
            members(&build_for_round(
                &inventory,
                &state,
                (received, &Hearing::default()),
                at(61)
            )),
            0
        );
    }

    #[test]
    fn a_report_accepted_but_not_yet_handled_and_deaf_time_are_not_silence_yet_views_stay_as_old_as_their_reports()
     {
        use std::time::Duration;
        let inventory = Inventory::parse(std::path::Path::new("i.toml"), INVENTORY).unwrap();
        let mut state = State::default();
        let both = [(1, "cp-1", false), (2, "cp-2", false)];
        state.reports.insert("cp-1".into(), report("cp-1", &both));
        let received = state.reports["cp-1"].received_at;
        let at = |secs| received.after(Duration::from_secs(secs));
        let heartbeat = |s: &Snapshot| s.hosts[0].agent.as_ref().map(|a| a.last_heartbeat);
        let members = |s: &Snapshot| s.hosts.iter().filter(|h| h.etcd.is_some()).count();
        let mut hearing = Hearing::default();
        let plain = build_for_round(&inventory, &state, (received, &hearing), at(70));
        assert_eq!(heartbeat(&plain), Some(received));
        // Its next report was accepted at 69 s and waits in the inbox: cp-1 is not silent...
        hearing.accepted("cp-1", at(69));
        let heard = build_for_round(&inventory, &state, (received, &hearing), at(70));
        assert_eq!(heartbeat(&heard), Some(at(69)));
        // ...but the view the quorum guard counts is still the handled one (70 s old: out).
        assert_eq!(members(&heard), 0);
        // This process could not hear from 69 s to 70 s: that second is not cp-1's silence.
        hearing.deaf(at(69), at(70));
        let deaf = build_for_round(&inventory, &state, (received, &hearing), at(71));
        assert_eq!(heartbeat(&deaf), Some(at(70)));
    }

    #[test]
    fn pending_probes_make_the_host_ready_unknown_not_ready() {
        use ConditionStatus::{False, True, Unknown};
        let mut stored = report("cp-1", &[(1, "cp-1", false)]);
        let r = &mut stored.report;
        r.conditions = vec![
            condition("EtcdMemberHealthy", Unknown),
            condition("KubeletHealthy", True),
        ];
        assert_eq!(ready(r), Unknown, "a probe has not answered yet");
        r.conditions[1].status = False;
        assert_eq!(ready(r), False, "a failing probe wins over a pending one");
        r.conditions = vec![condition("EtcdNoSpace", Unknown)];
        assert_eq!(ready(r), True, "pressure conditions do not count");
    }

    #[test]
    fn an_agent_reporting_ready_true_with_a_failing_condition_is_judged_not_ready() {
        use ConditionStatus::{False, True};
        let inventory = Inventory::parse(std::path::Path::new("i.toml"), INVENTORY).unwrap();
        let mut stored = report("cp-1", &[(1, "cp-1", false)]);
        stored.report.conditions = vec![
            condition("Ready", True),
            condition("MemoryPressure", False),
            condition("EtcdMemberHealthy", False),
        ];
        let node = node_of(&stored.report, Timestamp(1), Timestamp(0));
        let types: Vec<&str> = node.conditions.iter().map(|c| c.type_.as_str()).collect();
        assert_eq!(
            types,
            ["EtcdMemberHealthy", "Ready"],
            "reserved types dropped, Ready synthesized"
        );
        assert_eq!(ready(&stored.report), False);
        let mut state = State::default();
        state.reports.insert("cp-1".into(), stored.clone());
        let s = build(&inventory, &state, Timestamp(1), Timestamp(10));
        let cp1 = s.hosts.iter().find(|h| h.name == "cp-1").unwrap();
        assert!(!cp1.node_ready(), "{:?}", cp1.node);
        // With every other condition healthy, the host is ready whatever it says itself.
        stored.report.conditions = vec![
            condition("Ready", False),
            condition("EtcdMemberHealthy", True),
        ];
        assert_eq!(ready(&stored.report), True);
    }

    /// Seed 004: "machines with the delete annotation" go first on scale-down; in standalone
    /// mode the inventory host's annotations are the Machine's.
    #[test]
    fn an_inventory_hosts_annotations_reach_the_snapshot() {
        let text = INVENTORY.replace(
            "name = \"cp-2\"\n",
            "name = \"cp-2\"\nannotations = { \"cluster.x-k8s.io/delete-machine\" = \"\" }\n",
        );
        let inventory = Inventory::parse(std::path::Path::new("i.toml"), &text).unwrap();
        let s = build(&inventory, &State::default(), Timestamp(1), Timestamp(10));
        let marked: Vec<&str> = s
            .hosts
            .iter()
            .filter(|h| metalguard_core::domains::marked_for_deletion(h))
            .map(|h| h.name.as_str())
            .collect();
        assert_eq!(marked, ["cp-2"]);
    }

    #[test]
    fn a_retirement_marks_its_host_and_a_verified_power_off_removes_it() {
        let inventory = Inventory::parse(std::path::Path::new("i.toml"), INVENTORY).unwrap();
        let mut state = State::default();
        let retirement = Retirement {
            requested_at: Timestamp(5),
            requested_by: Some("alice (cli)".into()),
            reason: "disk".into(),
        };
        state.retirements.insert("cp-1".into(), retirement.clone());
        // cp-1's own (last) view still lists its removed member; cp-2's does not.
        state.reports.insert(
            "cp-1".into(),
            report("cp-1", &[(1, "cp-1", false), (2, "cp-2", false)]),
        );
        state
            .reports
            .insert("cp-2".into(), report("cp-2", &[(2, "cp-2", false)]));
        let s = build(&inventory, &state, Timestamp(1), Timestamp(10));
        let cp1 = s.hosts.iter().find(|h| h.name == "cp-1").unwrap();
        assert_eq!(cp1.retirement.as_ref(), Some(&retirement));
        assert_eq!(cp1.deletion_requested_at, Some(Timestamp(5)));
        assert!(cp1.is_deleting() && cp1.etcd.is_some());
        assert!(
            !s.hosts
                .iter()
                .find(|h| h.name == "cp-2")
                .unwrap()
                .is_deleting()
        );

        let mut op = crate::testkit::decommission_op("cp-1", "cp-2", Timestamp(5), Timestamp(6));
        let id = op.id.clone();
        state.operations.insert(id.clone(), op.clone());
        let s = build(&inventory, &state, Timestamp(1), Timestamp(10));
        assert!(s.hosts.iter().any(|h| h.name == "cp-1"), "not verified yet");
        op.result = Some(CommandResult {
            operation_id: OperationId(id.0.clone()),
            outcome: Outcome::Succeeded,
            started_at: Timestamp(7),
            finished_at: Timestamp(8),
            timeline: vec![],
            error: None,
            promoted_by: None,
            term: 0,
        });
        state.operations.insert(id, op);
        let s = build(&inventory, &state, Timestamp(1), Timestamp(10));
        assert_eq!(
            s.hosts.iter().map(|h| h.name.as_str()).collect::<Vec<_>>(),
            ["cp-2"]
        );
        assert!(powered_off_for_retirement(&state, "cp-1"));
        assert!(!powered_off_for_retirement(&state, "cp-2"));
    }
}
