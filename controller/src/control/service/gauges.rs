//! What the loop records after each plan for the alert rules and the dashboard
//! (`packaging/prometheus/`, `packaging/grafana/`): health checks and their short-circuits,
//! remediations by phase, etcd's voters and failure tolerance, silent agents, the agents that
//! reach each BMC, and the plan's refusals by kind. Counting is pure; [`record`] only sets.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::Plan;
use metalguard_api::snapshot::{Role, Snapshot};
use metalguard_core::quorum::{EtcdView, quorum};

use crate::backend::State;
use crate::control::metrics::{Metrics, label};
use crate::inventory::Inventory;

/// The per-host series as last set: each round sets only the values that changed and
/// removes the series of hosts gone (clearing and creating every host's series each round was
/// two families of 5,000 label sets at that size).
#[derive(Debug, Default)]
pub(crate) struct HostSeries {
    reachable: BTreeMap<String, i64>,
    fencing: BTreeMap<String, (&'static str, i64)>,
}

/// Sets `family`'s per-host series to `now`, changing only what differs from `before` (a
/// host's labels are `labels(host, value)`); `before` becomes `now`. One pass over both maps
/// in name order: a round where nothing changed allocates nothing (a lookup of each host in
/// the other map, and a copy of every name, were a third of the gauges' time at 5,000 hosts).
fn set_series<V: PartialEq + Clone>(
    family: &prometheus_client::metrics::family::Family<
        crate::control::metrics::Labels,
        prometheus_client::metrics::gauge::Gauge,
    >,
    before: &mut BTreeMap<String, V>,
    now: &BTreeMap<&str, V>,
    labels: impl Fn(&str, &V) -> crate::control::metrics::Labels,
    value: impl Fn(&V) -> i64,
) {
    use std::cmp::Ordering;
    let mut gone: Vec<String> = Vec::new();
    let mut set: Vec<(&str, &V)> = Vec::new();
    let mut old = before.iter().peekable();
    let mut new = now.iter().peekable();
    loop {
        let order = match (old.peek(), new.peek()) {
            (None, None) => break,
            (Some(_), None) => Ordering::Less,
            (None, Some(_)) => Ordering::Greater,
            (Some((o, _)), Some((n, _))) => o.as_str().cmp(n),
        };
        match order {
            Ordering::Less => {
                if let Some((host, v)) = old.next() {
                    family.remove(&labels(host, v));
                    gone.push(host.clone());
                }
            }
            Ordering::Greater => {
                if let Some((host, v)) = new.next() {
                    set.push((host, v));
                }
            }
            Ordering::Equal => {
                if let (Some((host, was)), Some((name, v))) = (old.next(), new.next())
                    && was != v
                {
                    family.remove(&labels(host, was));
                    set.push((name, v));
                }
            }
        }
    }
    for host in gone {
        before.remove(&host);
    }
    for (host, v) in set {
        family.get_or_create(&labels(host, v)).set(value(v));
        before.insert(host.to_owned(), v.clone());
    }
}

/// etcd as a plan saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EtcdCounts {
    /// Voting members.
    pub voters: usize,
    /// Healthy voting members.
    pub healthy_voters: usize,
    /// Learners.
    pub learners: usize,
    /// Healthy voters beyond quorum; negative when quorum is lost (or no voter is known,
    /// which the quorum guard treats the same way).
    pub failure_tolerance: i64,
}

/// Counts the members of `snapshot`'s etcd.
pub(crate) fn count_etcd(snapshot: &Snapshot) -> EtcdCounts {
    let view = EtcdView::from_snapshot(snapshot);
    let voters = view.voter_count();
    let healthy_voters = view.healthy_voter_count();
    EtcdCounts {
        voters,
        healthy_voters,
        learners: view.learners().count(),
        failure_tolerance: gauge(healthy_voters) - gauge(quorum(voters)),
    }
}

/// Per host of `snapshot` that must have an agent, whether it is silent: no report within
/// `timeout`. Control-plane hosts must have one; another host only once it is in `reported`
/// (it has a stored report: a worker without an agent is not silent). A host that never
/// reported, and every report received before `known_since` (when this controller started
/// leading), count from `known_since`, as the snapshot does.
pub(crate) fn find_silent_agents(
    snapshot: &Snapshot,
    reported: &BTreeSet<&str>,
    known_since: Timestamp,
    (now, timeout): (Timestamp, Duration),
) -> BTreeMap<String, bool> {
    snapshot
        .hosts
        .iter()
        .filter(|h| h.role == Role::ControlPlane || reported.contains(h.name.as_str()))
        .map(|h| {
            let last = h
                .agent
                .as_ref()
                .map_or(known_since, |a| a.last_heartbeat.max(known_since));
            (h.name.clone(), now.since(last) > timeout)
        })
        .collect()
}

/// The plan's refusals per kind of reason.
pub(crate) fn count_refusals(plan: &Plan) -> BTreeMap<&'static str, usize> {
    let mut kinds = BTreeMap::new();
    for refusal in &plan.refusals {
        *kinds.entry(refusal.kind.name()).or_default() += 1;
    }
    kinds
}

/// Control-plane hosts that wait behind a failed control-plane remediation: the latest
/// remediation of each blocker host (its id) that failed, and how many control-plane hosts the
/// plan refused because one control-plane remediation runs at a time. A failed one holds that
/// slot until it is retried or a person acts, and while it does no other control-plane host is
/// remediated (issue 28: nothing said so). Empty when nothing waits.
pub(crate) fn control_plane_blocked(state: &State, plan: &Plan) -> Option<(Vec<String>, usize)> {
    let busy: Vec<&str> = plan
        .refusals
        .iter()
        .filter(|r| r.kind == metalguard_api::plan::ReasonKind::ControlPlaneBusy)
        .map(|r| r.reason.as_str())
        .collect();
    let waiting = busy.len();
    if waiting == 0 {
        return None;
    }
    let mut latest: BTreeMap<&str, &metalguard_api::remediation::Remediation> = BTreeMap::new();
    for r in state.remediations.values() {
        let entry = latest.entry(r.target.as_str()).or_insert(r);
        if r.seq > entry.seq {
            *entry = r;
        }
    }
    let failed: Vec<String> = latest
        .values()
        .filter(|r| {
            r.control_plane
                && matches!(
                    r.phase,
                    metalguard_api::remediation::RemediationPhase::Failed { .. }
                )
                // The one a waiting host was refused for (a failed attempt whose host is
                // back holds nothing: the core's start gate).
                && busy
                    .iter()
                    .any(|why| why.contains(&format!("({}'s ", r.target)))
        })
        .map(|r| r.id.clone())
        .collect();
    (!failed.is_empty()).then_some((failed, waiting))
}

fn gauge(n: usize) -> i64 {
    i64::try_from(n).unwrap_or(i64::MAX)
}

/// Sets every gauge that follows a plan over `state`.
pub(crate) fn record(
    metrics: &Metrics,
    series: &mut HostSeries,
    inventory: &Inventory,
    (state, snapshot, plan): (&State, &Snapshot, &Plan),
    known_since: Timestamp,
    now: Timestamp,
) {
    for check in &plan.health {
        metrics
            .unhealthy_targets
            .get_or_create(&label("check", &check.name))
            .set(gauge(check.unhealthy.len()));
        metrics
            .short_circuited
            .get_or_create(&label("check", &check.name))
            .set(i64::from(check.short_circuit.is_some()));
    }
    let mut phases: BTreeMap<&str, i64> = BTreeMap::new();
    for r in state.remediations.values() {
        *phases.entry(r.phase.name()).or_default() += 1;
    }
    metrics.remediations.clear();
    for (phase, count) in phases {
        metrics
            .remediations
            .get_or_create(&label("phase", phase))
            .set(count);
    }
    let etcd = count_etcd(snapshot);
    metrics.etcd_voters.set(gauge(etcd.voters));
    metrics.etcd_healthy_voters.set(gauge(etcd.healthy_voters));
    metrics.etcd_learners.set(gauge(etcd.learners));
    metrics.etcd_failure_tolerance.set(etcd.failure_tolerance);
    let timeout = inventory.policy.remediation.executor_heartbeat_timeout;
    metrics.agent_silent.clear();
    let reported = state.reports.keys().map(String::as_str).collect();
    for (host, silent) in find_silent_agents(snapshot, &reported, known_since, (now, timeout)) {
        metrics
            .agent_silent
            .get_or_create(&label("host", &host))
            .set(i64::from(silent));
    }
    metrics.agent_last_report.clear();
    for (host, stored) in state
        .reports
        .iter()
        .filter(|(host, _)| inventory.host(host).is_some())
    {
        let seconds = stored.received_at.as_millis() / 1000;
        metrics
            .agent_last_report
            .get_or_create(&label("host", host))
            .set(i64::try_from(seconds).unwrap_or(i64::MAX));
    }
    let reachable: BTreeMap<&str, i64> =
        crate::control::reachability::count_reaching_agents(inventory, state, now)
            .into_iter()
            .map(|(host, agents)| (host, gauge(agents)))
            .collect();
    set_series(
        &metrics.bmc_reachable_agents,
        &mut series.reachable,
        &reachable,
        |host, _| label("host", host),
        |agents| *agents,
    );
    let fencing = crate::control::fencing::gauges(inventory, state, &plan.fence_executors);
    set_series(
        &metrics.fencing_ready,
        &mut series.fencing,
        &fencing,
        |host, (failure, _)| {
            vec![
                ("host".to_owned(), host.to_owned()),
                ("failure".to_owned(), (*failure).to_owned()),
            ]
        },
        |(_, ready)| *ready,
    );
    metrics.control_plane_blocked_by_failed.set(gauge(
        control_plane_blocked(state, plan).map_or(0, |(_, n)| n),
    ));
    metrics.refusals.clear();
    for (kind, count) in count_refusals(plan) {
        metrics
            .refusals
            .get_or_create(&label("kind", kind))
            .set(gauge(count));
    }
}

#[cfg(test)]
mod tests {
    use metalguard_api::plan::{ReasonKind, Refusal};
    use metalguard_api::snapshot::{AgentReport, EtcdMember, Host, Role};

    use super::*;

    fn host(name: &str, member: Option<(u64, bool, bool)>) -> Host {
        let mut h: Host = serde_json::from_value(serde_json::json!({
            "name": name, "role": "control-plane", "created_at": 0,
        }))
        .unwrap();
        assert_eq!(h.role, Role::ControlPlane);
        h.etcd = member.map(|(id, learner, healthy)| EtcdMember {
            id,
            name: name.to_owned(),
            learner,
            healthy,
            leader: false,
            progress_permille: 0,
        });
        h
    }

    fn snapshot(hosts: Vec<Host>) -> Snapshot {
        Snapshot {
            hosts,
            ..Snapshot::default()
        }
    }

    #[test]
    fn tolerance_is_healthy_voters_beyond_quorum() {
        let three = snapshot(vec![
            host("cp-1", Some((1, false, true))),
            host("cp-2", Some((2, false, true))),
            host("cp-3", Some((3, false, true))),
            host("cp-4", Some((4, true, true))),
        ]);
        assert_eq!(
            count_etcd(&three),
            EtcdCounts {
                voters: 3,
                healthy_voters: 3,
                learners: 1,
                failure_tolerance: 1
            }
        );
        let one_down = snapshot(vec![
            host("cp-1", Some((1, false, true))),
            host("cp-2", Some((2, false, false))),
            host("cp-3", Some((3, false, true))),
        ]);
        assert_eq!(count_etcd(&one_down).failure_tolerance, 0, "at risk");
        let lost = snapshot(vec![
            host("cp-1", Some((1, false, true))),
            host("cp-2", Some((2, false, false))),
            host("cp-3", Some((3, false, false))),
        ]);
        assert_eq!(count_etcd(&lost).failure_tolerance, -1, "quorum lost");
        let single = snapshot(vec![host("cp-1", Some((1, false, true)))]);
        assert_eq!(count_etcd(&single).failure_tolerance, 0, "one voter");
        let unknown = snapshot(vec![host("cp-1", None)]);
        assert_eq!(
            count_etcd(&unknown),
            EtcdCounts {
                voters: 0,
                healthy_voters: 0,
                learners: 0,
                failure_tolerance: -1
            },
            "no voter known: as lost"
        );
    }

    #[test]
    fn an_agent_is_silent_after_the_heartbeat_timeout_counted_from_leadership() {
        let timeout = Duration::from_secs(60);
        let mut reported = host("cp-1", None);
        reported.agent = Some(AgentReport {
            last_heartbeat: Timestamp(100_000),
            can_fence: true,
            bmc_reachable: BTreeMap::new(),
            boot_id: None,
            boot_reported_at: None,
        });
        let never = host("cp-2", None);
        let mut worker = host("w-1", None);
        worker.role = Role::Worker;
        let mut heard_worker = host("w-2", None);
        heard_worker.role = Role::Worker;
        let snap = snapshot(vec![reported, never, worker, heard_worker]);
        let leading_since = Timestamp(50_000);
        // w-2's only report is from before it was fenced: stored, not in the snapshot.
        let stored = BTreeSet::from(["cp-1", "w-2"]);
        let at = |ms| {
            let mut silent =
                find_silent_agents(&snap, &stored, leading_since, (Timestamp(ms), timeout));
            assert_eq!(
                silent.remove("w-2"),
                Some(ms > 110_000),
                "a worker that reported must go on reporting"
            );
            silent
        };
        assert_eq!(
            at(110_000),
            BTreeMap::from([("cp-1".to_owned(), false), ("cp-2".to_owned(), false)]),
            "a host that never reported has one timeout from the start of leadership"
        );
        assert_eq!(
            at(160_000),
            BTreeMap::from([("cp-1".to_owned(), false), ("cp-2".to_owned(), true)])
        );
        assert_eq!(
            at(160_001),
            BTreeMap::from([("cp-1".to_owned(), true), ("cp-2".to_owned(), true)])
        );
        let later_leader = find_silent_agents(
            &snap,
            &stored,
            Timestamp(200_000),
            (Timestamp(230_000), timeout),
        );
        assert_eq!(
            later_leader,
            BTreeMap::from([
                ("cp-1".to_owned(), false),
                ("cp-2".to_owned(), false),
                ("w-2".to_owned(), false)
            ]),
            "a new leader gives every agent one timeout; a worker never heard of has no agent"
        );
    }

    #[test]
    fn refusals_are_counted_by_kind() {
        let refusal = |kind| Refusal {
            refused: "remediating".into(),
            subject: "cp-1".into(),
            reason: "r".into(),
            kind,
        };
        let plan = Plan {
            refusals: vec![
                refusal(ReasonKind::Quorum),
                refusal(ReasonKind::Quorum),
                refusal(ReasonKind::Executor),
            ],
            ..Plan::default()
        };
        assert_eq!(
            count_refusals(&plan),
            BTreeMap::from([("executor", 1), ("quorum", 2)])
        );
    }

    #[test]
    fn per_host_series_change_only_where_their_value_did_and_go_with_their_host() {
        use prometheus_client::encoding::text::encode;
        use prometheus_client::metrics::family::Family;
        use prometheus_client::metrics::gauge::Gauge;
        use prometheus_client::registry::Registry;

        let family: Family<crate::control::metrics::Labels, Gauge> = Family::default();
        let mut registry = Registry::default();
        registry.register("ready", "test", family.clone());
        let labels = |host: &str, (failure, _): &(&str, i64)| {
            vec![
                ("host".to_owned(), host.to_owned()),
                ("failure".to_owned(), (*failure).to_owned()),
            ]
        };
        let text = |registry: &Registry| {
            let mut out = String::new();
            encode(&mut out, registry).unwrap();
            let mut lines: Vec<String> = out
                .lines()
                .filter(|l| l.starts_with("ready{"))
                .map(str::to_owned)
                .collect();
            lines.sort();
            lines
        };
        let mut before = BTreeMap::new();
        let now = |entries: &[(&'static str, &'static str, i64)]| {
            entries
                .iter()
                .map(|(h, f, v)| (*h, (*f, *v)))
                .collect::<BTreeMap<&str, (&str, i64)>>()
        };
        let mut set = |entries: &[(&'static str, &'static str, i64)]| {
            set_series(&family, &mut before, &now(entries), labels, |v| v.1);
            let kept: Vec<(String, (&str, i64))> =
                before.iter().map(|(h, v)| (h.clone(), *v)).collect();
            let expected: Vec<(String, (&str, i64))> = entries
                .iter()
                .map(|(h, f, v)| ((*h).to_owned(), (*f, *v)))
                .collect::<BTreeMap<_, _>>()
                .into_iter()
                .collect();
            assert_eq!(kept, expected, "what is kept is what was set");
        };
        set(&[("a", "", 1), ("c", "", 1)]);
        set(&[("a", "credentials-refused", 0), ("b", "", -1), ("c", "", 1)]);
        assert_eq!(
            text(&registry),
            [
                "ready{host=\"a\",failure=\"credentials-refused\"} 0",
                "ready{host=\"b\",failure=\"\"} -1",
                "ready{host=\"c\",failure=\"\"} 1",
            ]
        );
        set(&[("b", "", 1), ("d", "", 1)]);
        assert_eq!(
            text(&registry),
            [
                "ready{host=\"b\",failure=\"\"} 1",
                "ready{host=\"d\",failure=\"\"} 1",
            ]
        );
        set(&[]);
        assert!(text(&registry).is_empty());
    }
}
