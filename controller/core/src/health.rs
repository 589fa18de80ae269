//! Machine health with `MachineHealthCheck` semantics (seed 003, DOMAIN.md §3).
//!
//! A target is unhealthy when any unhealthy condition (type, status) has held for its timeout
//! (OR-ed), its Node is missing after having existed, it has no Node after
//! `nodeStartupTimeout` (`0` disables), its agent has been silent for the heartbeat timeout,
//! its phase is Failed, or it is already under remediation. `maxUnhealthy` short-circuits
//! remediation for the whole check.
//!
//! Rounding: a percentage is rounded **down** (MAO and seed 003: 40% of 6 is 2). medik8s NHC
//! rounds up; metalguard follows MAO because it is the stricter of the two.
//!
//! Control-plane checks: `maxUnhealthy` defaults to what etcd tolerates — (voters − 1) / 2,
//! so 1 for 3 members and 2 for 5 (seed 002: the value the controller *sets*). A value an
//! administrator writes is honoured as written, larger or not: seed 004's scenario 2
//! remediates one of two marked machines of three while at most one etcd member is
//! unhealthy. What protects quorum is the per-host quorum guard (`quorum::may_fence`, the
//! judgement's `QuorumAfterPlan`), not this threshold.
//!
//! A grace after every fence: from the moment a remediation verified the host powered on
//! (its boot) — or, once it ended after the power-on, from its end, when it saw the host
//! Ready — evidence older than that — a condition that last changed before it, a
//! heartbeat from before it, a Node missing since before it — is not held against the host
//! until `nodeStartupTimeout` after the boot (or the evidence's own timeout, if longer): the
//! host is starting, as MHC treats a machine without a Node yet.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::time::Duration;

use metalguard_api::duration::Timestamp;
use metalguard_api::policy::{
    DEFAULT_CONTROL_PLANE_MAX_UNHEALTHY, DEFAULT_NODE_STARTUP_TIMEOUT, HealthCheck, MaxUnhealthy,
    Policy, Selector,
};
use metalguard_api::remediation::RemediationPhase as P;
use metalguard_api::snapshot::{Host, Role, Snapshot};

use crate::quorum::EtcdView;
use crate::seeds;

/// `maxUnhealthy` could not be understood; remediation is blocked for the check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaxUnhealthyError {
    /// Neither an integer nor a percentage.
    #[error("maxUnhealthy {0:?} is neither an integer nor a percentage")]
    Malformed(String),
}

/// How many unhealthy control-plane hosts etcd with `voters` voting members tolerates:
/// (voters − 1) / 2 — 1 for 3, 2 for 5 (seed 002). With no voter known, the seed-000 default.
pub fn control_plane_tolerance(voters: usize) -> usize {
    if voters == 0 {
        DEFAULT_CONTROL_PLANE_MAX_UNHEALTHY as usize
    } else {
        (voters - 1) / 2
    }
}

/// Resolves `maxUnhealthy` against the number of targets.
///
/// `None` means the default: 100% of targets, or, when `control_plane` is
/// `Some(tolerance)`, that tolerance (see [`control_plane_tolerance`]). Percentages round
/// down. A written value is returned as written: the tolerance is a default, not a cap.
pub fn resolve_max_unhealthy(
    value: Option<&MaxUnhealthy>,
    targets: usize,
    control_plane: Option<usize>,
) -> Result<usize, MaxUnhealthyError> {
    let text = match value {
        None => return Ok(control_plane.unwrap_or(targets)),
        Some(MaxUnhealthy::Count(n)) => return Ok(*n as usize),
        Some(MaxUnhealthy::Text(t)) => t.trim(),
    };
    let malformed = || MaxUnhealthyError::Malformed(text.to_owned());
    if let Some(pct) = text.strip_suffix('%') {
        let pct: usize = pct.trim().parse().map_err(|_| malformed())?;
        Ok(targets.saturating_mul(pct) / 100)
    } else {
        text.parse().map_err(|_| malformed())
    }
}

/// Why a target is unhealthy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum UnhealthyReason {
    /// A Node existed and is gone.
    NodeMissing,
    /// No Node registered within `nodeStartupTimeout`.
    NodeStartupTimeout(Duration),
    /// A condition held for its timeout.
    Condition {
        /// Condition type.
        type_: String,
        /// The status that held.
        status: String,
        /// The configured timeout.
        timeout: Duration,
    },
    /// The agent has been silent for the heartbeat timeout.
    HeartbeatLost(Duration),
    /// The machine phase is Failed.
    PhaseFailed,
    /// The target is already under remediation.
    UnderRemediation,
}

impl fmt::Display for UnhealthyReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use metalguard_api::duration::format_duration as d;
        match self {
            UnhealthyReason::NodeMissing => f.write_str("node is missing"),
            UnhealthyReason::NodeStartupTimeout(t) => {
                write!(f, "no node within nodeStartupTimeout {}", d(*t))
            }
            UnhealthyReason::Condition {
                type_,
                status,
                timeout,
            } => write!(f, "{type_}={status} for at least {}", d(*timeout)),
            UnhealthyReason::HeartbeatLost(t) => write!(f, "agent silent for at least {}", d(*t)),
            UnhealthyReason::PhaseFailed => f.write_str("machine phase is Failed"),
            UnhealthyReason::UnderRemediation => f.write_str("under remediation"),
        }
    }
}

/// One unhealthy target.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Unhealthy<'a> {
    /// The host.
    pub host: &'a Host,
    /// Why (the first matching rule).
    pub reason: UnhealthyReason,
    /// When it became unhealthy (oldest are remediated first).
    pub since: Timestamp,
}

/// The verdict of one health check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckVerdict<'a> {
    /// The check.
    pub check: &'a HealthCheck,
    /// Targets covered.
    pub targets: usize,
    /// Unhealthy targets, sorted by host name.
    pub unhealthy: Vec<Unhealthy<'a>>,
    /// The effective threshold.
    pub max_unhealthy: Result<usize, MaxUnhealthyError>,
    /// Set when remediation is short-circuited, with the reason.
    pub short_circuit: Option<String>,
    /// The earliest time a target's verdict can change by time alone.
    pub next_change: Option<Timestamp>,
}

/// True when `host` is covered by `selector`.
pub fn selects(selector: &Selector, host: &Host) -> bool {
    selector.role.is_none_or(|r| r == host.role)
        && selector
            .match_labels
            .iter()
            .all(|(k, v)| host.labels.get(k) == Some(v))
}

/// How long `host`'s agent may be silent: the shortest `agent_heartbeat_timeout` of the
/// health checks that select it, else the executor heartbeat timeout (the planner's other
/// bound on an agent's silence). Past it the agent is silent: its host is judged by that, and
/// an adapter no longer believes the etcd view the agent last sent.
pub fn agent_heartbeat_timeout(policy: &Policy, host: &Host) -> Duration {
    policy
        .health_checks
        .iter()
        .filter(|c| selects(&c.selector, host))
        .filter_map(|c| c.agent_heartbeat_timeout)
        .min()
        .unwrap_or(policy.remediation.executor_heartbeat_timeout)
}

/// The shortest and the longest [`agent_heartbeat_timeout`] a host can have under `policy`
/// (each is one of the checks' timeouts or the executor heartbeat timeout): an agent silent
/// for less than the first is not silent, one silent for more than the second is, whichever
/// checks select its host.
pub fn agent_heartbeat_timeout_bounds(policy: &Policy) -> (Duration, Duration) {
    let default = policy.remediation.executor_heartbeat_timeout;
    policy
        .health_checks
        .iter()
        .filter_map(|c| c.agent_heartbeat_timeout)
        .fold((default, default), |(lo, hi), t| (lo.min(t), hi.max(t)))
}

#[allow(clippy::unnecessary_wraps)] // folds into an Option accumulator
fn earliest(a: Option<Timestamp>, b: Timestamp) -> Option<Timestamp> {
    Some(a.map_or(b, |a| a.min(b)))
}

/// What every check's verdict depends on besides the check: the hosts, which are under
/// remediation, when each was last booted by a remediation, and what etcd tolerates.
#[derive(Debug, Clone)]
pub struct HealthInputs<'a> {
    /// Every host.
    pub hosts: &'a [Host],
    /// Targets of active remediations.
    pub remediating: BTreeSet<&'a str>,
    /// The latest verified power-on of each host by a remediation (its boot).
    pub boots: BTreeMap<&'a str, Timestamp>,
    /// How many unhealthy control-plane hosts etcd tolerates now: the default `maxUnhealthy`
    /// of a control-plane check.
    pub control_plane_tolerance: usize,
    /// etcd's voters now (named in the reason of a default threshold).
    pub voters: usize,
}

impl<'a> HealthInputs<'a> {
    /// The inputs of `snapshot`.
    pub fn from_snapshot(snapshot: &'a Snapshot, view: &EtcdView<'_>) -> Self {
        HealthInputs {
            hosts: &snapshot.hosts,
            remediating: snapshot
                .remediations
                .iter()
                .filter(|r| r.phase.is_active())
                .map(|r| r.target.as_str())
                .collect(),
            boots: boots(snapshot),
            control_plane_tolerance: control_plane_tolerance(view.voter_count()),
            voters: view.voter_count(),
        }
    }
}

/// The latest boot of each host by a remediation (the grace rule of this module).
fn boots(snapshot: &Snapshot) -> BTreeMap<&str, Timestamp> {
    let mut boots: BTreeMap<&str, Timestamp> = BTreeMap::new();
    for r in &snapshot.remediations {
        let Some(on) = r.powered_on_at else {
            continue;
        };
        // A remediation that ended after its power-on (done, or cancelled once the host was
        // back) saw the host Ready when it ended: evidence older than that end is stale (a
        // report kept from before, read again by a new leader), so the grace runs from the end.
        let at = match r.phase {
            P::Done | P::Cancelled { .. } => on.max(r.phase_since),
            _ => on,
        };
        let e = boots.entry(r.target.as_str()).or_insert(at);
        *e = (*e).max(at);
    }
    boots
}

/// How a host stands on the evidence of one snapshot alone, whether or not a remediation
/// runs for it ([`evidence_of`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Evidence {
    /// A check that selects it judges it unhealthy: why.
    Unhealthy(String),
    /// Its Node holds none of the unhealthy conditions of the checks that select it, and no
    /// check judges it unhealthy.
    Healthy,
    /// Neither: a condition holds but not yet for its timeout, it has no Node, or no check
    /// selects it.
    Undecided,
}

/// How `host` stands on `snapshot`'s evidence at `now`, judged as if no remediation ran for
/// it (a running one makes every host "unhealthy: under remediation"). The controller asks
/// this before it offers a power cut an older leadership decided: the snapshot of a new
/// leadership counts what it heard before it began from when it began, so an `Unhealthy`
/// here is this leadership's own judgement.
pub fn evidence_of(policy: &Policy, snapshot: &Snapshot, host: &str, now: Timestamp) -> Evidence {
    let Some(h) = snapshot.hosts.iter().find(|h| h.name == host) else {
        return Evidence::Undecided;
    };
    let boot = boots(snapshot).get(host).copied();
    let checks: Vec<&HealthCheck> = policy
        .health_checks
        .iter()
        .filter(|c| selects(&c.selector, h))
        .collect();
    for check in &checks {
        if let (Some((reason, since)), _) = judge_host(check, h, false, boot, now) {
            return Evidence::Unhealthy(format!("{reason} (since {since})"));
        }
    }
    let holds_none = |node: &metalguard_api::snapshot::NodeStatus| {
        checks.iter().all(|c| {
            c.unhealthy_conditions.iter().all(|uc| {
                !node
                    .conditions
                    .iter()
                    .any(|n| n.type_ == uc.type_ && n.status == uc.status)
            })
        })
    };
    match &h.node {
        Some(node) if !checks.is_empty() && holds_none(node) => Evidence::Healthy,
        _ => Evidence::Undecided,
    }
}

/// When evidence dated `at` with timeout `timeout` makes a host unhealthy, given its last
/// `boot`: evidence from before the boot counts only from `boot + max(timeout, startup)`.
fn evidence_due(
    at: Timestamp,
    timeout: Duration,
    boot: Option<Timestamp>,
    startup: Duration,
) -> Timestamp {
    match boot {
        Some(b) if at < b => b.after(timeout.max(startup)),
        _ => at.after(timeout),
    }
}

/// Judges one host against one check. Returns the unhealthy reason and since-time, and the
/// earliest future time the verdict could flip. `boot` is the host's last verified power-on
/// by a remediation (see the module's grace rule).
pub fn judge_host(
    check: &HealthCheck,
    host: &Host,
    under_remediation: bool,
    boot: Option<Timestamp>,
    now: Timestamp,
) -> (Option<(UnhealthyReason, Timestamp)>, Option<Timestamp>) {
    let mut next: Option<Timestamp> = None;
    if under_remediation {
        return (Some((UnhealthyReason::UnderRemediation, now)), None);
    }
    if host.phase_failed {
        return (Some((UnhealthyReason::PhaseFailed, now)), None);
    }
    let startup = check
        .node_startup_timeout
        .unwrap_or(DEFAULT_NODE_STARTUP_TIMEOUT);
    match &host.node {
        None if host.node_seen => {
            // Missing since before the boot at the latest: the host is starting.
            if let Some(b) = boot {
                let at = b.after(startup);
                if now < at {
                    return (None, Some(at));
                }
            }
            return (Some((UnhealthyReason::NodeMissing, now)), None);
        }
        None => {
            let timeout = check
                .node_startup_timeout
                .unwrap_or(DEFAULT_NODE_STARTUP_TIMEOUT);
            if !timeout.is_zero() {
                let at = host.created_at.after(timeout);
                if now >= at {
                    return (
                        Some((UnhealthyReason::NodeStartupTimeout(timeout), at)),
                        None,
                    );
                }
                next = earliest(next, at);
            }
        }
        Some(node) => {
            for uc in &check.unhealthy_conditions {
                let held = node
                    .conditions
                    .iter()
                    .find(|c| c.type_ == uc.type_ && c.status == uc.status);
                if let Some(c) = held {
                    let at = evidence_due(c.last_transition, uc.timeout, boot, startup);
                    if now >= at {
                        let reason = UnhealthyReason::Condition {
                            type_: uc.type_.clone(),
                            status: format!("{:?}", uc.status),
                            timeout: uc.timeout,
                        };
                        return (Some((reason, at)), None);
                    }
                    next = earliest(next, at);
                }
            }
        }
    }
    // A host still starting (no Node yet, none ever seen) is judged by nodeStartupTimeout alone.
    let starting = host.node.is_none() && !host.node_seen;
    if let Some(timeout) = check.agent_heartbeat_timeout.filter(|_| !starting) {
        let last = host
            .agent
            .as_ref()
            .map_or(host.created_at, |a| a.last_heartbeat);
        let at = evidence_due(last, timeout, boot, startup);
        if now >= at {
            return (Some((UnhealthyReason::HeartbeatLost(timeout), at)), None);
        }
        next = earliest(next, at);
    }
    (None, next)
}

/// Evaluates one check over all hosts.
pub fn evaluate_check<'a>(
    check: &'a HealthCheck,
    inputs: &HealthInputs<'a>,
    now: Timestamp,
) -> CheckVerdict<'a> {
    let mut targets = 0usize;
    let mut unhealthy = Vec::new();
    let mut next_change: Option<Timestamp> = None;
    for host in inputs.hosts.iter().filter(|h| selects(&check.selector, h)) {
        targets += 1;
        let name = host.name.as_str();
        let (verdict, next) = judge_host(
            check,
            host,
            inputs.remediating.contains(name),
            inputs.boots.get(name).copied(),
            now,
        );
        if let Some((reason, since)) = verdict {
            unhealthy.push(Unhealthy {
                host,
                reason,
                since,
            });
        }
        if let Some(n) = next {
            next_change = earliest(next_change, n);
        }
    }
    unhealthy.sort_by(|a, b| a.host.name.cmp(&b.host.name));
    let tolerance =
        (check.selector.role == Some(Role::ControlPlane)).then_some(inputs.control_plane_tolerance);
    let max_unhealthy = resolve_max_unhealthy(check.max_unhealthy.as_ref(), targets, tolerance);
    // The default of a control-plane check says where it comes from, and that it is one.
    let default_note = match (&check.max_unhealthy, tolerance) {
        (None, Some(t)) if inputs.voters == 0 => {
            format!("; maxUnhealthy is unset and no etcd voter is known: {t} (seed 000)")
        }
        (None, Some(t)) => format!(
            "; maxUnhealthy is unset: {t} is the control-plane default for {} etcd voters ({}); a value written in the check is honoured, the quorum guard still refuses any fence that costs quorum",
            inputs.voters,
            seeds::CONTROL_PLANE_MAX_UNHEALTHY_DEFAULT
        ),
        _ => String::new(),
    };
    let short_circuit = match &max_unhealthy {
        Err(e) => Some(format!("{e}; remediation is blocked")),
        Ok(max) if unhealthy.len() > *max => Some(format!(
            "{} unhealthy > maxUnhealthy {max} ({}){default_note}",
            unhealthy.len(),
            unhealthy
                .iter()
                .map(|u| u.host.name.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        Ok(_) => None,
    };
    CheckVerdict {
        check,
        targets,
        unhealthy,
        max_unhealthy,
        short_circuit,
        next_change,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    proptest::proptest! {
        /// Whatever checks select a host, its heartbeat timeout lies within the bounds (the
        /// controller decides most hosts' silence by the bounds alone).
        #[test]
        fn every_hosts_heartbeat_timeout_lies_within_the_bounds(
            checks in proptest::collection::vec(
                (proptest::option::of(0u64..600), proptest::option::of(0u8..2), proptest::bool::ANY),
                0..5,
            ),
            default in 0u64..600,
            role in 0u8..2,
            labelled in proptest::bool::ANY,
        ) {
            let role_of = |r: u8| if r == 0 { Role::ControlPlane } else { Role::Worker };
            let policy = Policy {
                health_checks: checks
                    .iter()
                    .enumerate()
                    .map(|(i, (timeout, role, label))| HealthCheck {
                        name: format!("c{i}"),
                        selector: metalguard_api::policy::Selector {
                            match_labels: if *label {
                                BTreeMap::from([("pool".to_owned(), "a".to_owned())])
                            } else {
                                BTreeMap::new()
                            },
                            role: role.map(role_of),
                        },
                        unhealthy_conditions: Vec::new(),
                        max_unhealthy: None,
                        node_startup_timeout: None,
                        agent_heartbeat_timeout: timeout.map(Duration::from_secs),
                    })
                    .collect(),
                remediation: metalguard_api::policy::RemediationSettings {
                    executor_heartbeat_timeout: Duration::from_secs(default),
                    ..metalguard_api::policy::RemediationSettings::default()
                },
            };
            let mut host: Host = serde_json::from_value(serde_json::json!({
                "name": "h", "role": "worker", "created_at": 0,
            }))
            .unwrap();
            host.role = role_of(role);
            if labelled {
                host.labels.insert("pool".to_owned(), "a".to_owned());
            }
            let (shortest, longest) = agent_heartbeat_timeout_bounds(&policy);
            let timeout = agent_heartbeat_timeout(&policy, &host);
            proptest::prop_assert!(shortest <= timeout && timeout <= longest);
        }
    }

    #[allow(clippy::unnecessary_wraps)]
    fn mu(s: &str) -> Option<MaxUnhealthy> {
        Some(MaxUnhealthy::Text(s.to_owned()))
    }

    #[test]
    fn seed_003_max_unhealthy_40_percent_of_25_is_10() {
        assert_eq!(resolve_max_unhealthy(mu("40%").as_ref(), 25, None), Ok(10));
    }

    #[test]
    fn seed_003_max_unhealthy_40_percent_of_6_rounds_down_to_2() {
        assert_eq!(resolve_max_unhealthy(mu("40%").as_ref(), 6, None), Ok(2));
    }

    #[test]
    fn seed_003_max_unhealthy_absolute_2_is_independent_of_pool_size() {
        let two = Some(MaxUnhealthy::Count(2));
        assert_eq!(resolve_max_unhealthy(two.as_ref(), 25, None), Ok(2));
        assert_eq!(resolve_max_unhealthy(two.as_ref(), 3, None), Ok(2));
        assert_eq!(resolve_max_unhealthy(mu("2").as_ref(), 100, None), Ok(2));
    }

    #[test]
    fn seed_003_default_is_100_percent_and_seed_002_control_plane_default_is_the_tolerance() {
        assert_eq!(resolve_max_unhealthy(None, 7, None), Ok(7));
        assert_eq!(
            resolve_max_unhealthy(None, 3, Some(control_plane_tolerance(3))),
            Ok(1)
        );
        assert_eq!(
            resolve_max_unhealthy(None, 5, Some(control_plane_tolerance(5))),
            Ok(2)
        );
        assert_eq!(control_plane_tolerance(1), 0);
        assert_eq!(
            control_plane_tolerance(0),
            1,
            "no voter known: seed 000's 1"
        );
    }

    fn check(timeout_s: u64) -> HealthCheck {
        use metalguard_api::policy::UnhealthyCondition;
        use metalguard_api::snapshot::ConditionStatus;
        let cond = |type_: &str, status| UnhealthyCondition {
            type_: type_.into(),
            status,
            timeout: Duration::from_secs(timeout_s),
        };
        HealthCheck {
            name: "c".into(),
            selector: Selector::default(),
            unhealthy_conditions: vec![
                cond("Ready", ConditionStatus::False),
                cond("DiskPressure", ConditionStatus::True),
            ],
            max_unhealthy: None,
            node_startup_timeout: None,
            agent_heartbeat_timeout: Some(Duration::from_secs(60)),
        }
    }

    #[test]
    fn conditions_are_ored_and_timeouts_give_the_next_change() {
        use crate::testkit::{NOW, worker};
        use metalguard_api::snapshot::{ConditionStatus, NodeCondition};
        let mut h = worker("w", 0);
        let node = h.node.as_mut().unwrap();
        node.conditions.push(NodeCondition {
            type_: "DiskPressure".into(),
            status: ConditionStatus::True,
            last_transition: Timestamp(NOW.0 - 10_000),
        });
        let (verdict, next) = judge_host(&check(30), &h, false, None, NOW);
        assert_eq!(verdict, None);
        assert_eq!(next, Some(Timestamp(NOW.0 + 20_000)));
        let (verdict, _) = judge_host(&check(5), &h, false, None, NOW);
        assert!(
            matches!(verdict, Some((UnhealthyReason::Condition { .. }, t)) if t == Timestamp(NOW.0 - 5_000))
        );
    }

    #[test]
    fn heartbeat_loss_counts_but_not_while_the_host_is_still_starting() {
        use crate::testkit::{NOW, worker};
        let mut h = worker("w", 0);
        h.agent.as_mut().unwrap().last_heartbeat = Timestamp(NOW.0 - 61_000);
        let (verdict, _) = judge_host(&check(300), &h, false, None, NOW);
        assert!(matches!(
            verdict,
            Some((UnhealthyReason::HeartbeatLost(_), _))
        ));
        h.node = None;
        h.node_seen = false;
        h.created_at = Timestamp(NOW.0 - 120_000);
        let (verdict, next) = judge_host(&check(300), &h, false, None, NOW);
        assert_eq!(
            verdict, None,
            "a starting host waits for nodeStartupTimeout"
        );
        assert_eq!(next, Some(Timestamp(NOW.0 + 480_000)));
    }

    #[test]
    fn selector_matches_role_and_every_label() {
        use crate::testkit::worker;
        let mut h = worker("w", 0);
        h.labels.insert("pool".into(), "a".into());
        let mut sel = Selector::default();
        assert!(selects(&sel, &h));
        sel.match_labels.insert("pool".into(), "a".into());
        assert!(selects(&sel, &h));
        sel.match_labels.insert("rack".into(), "1".into());
        assert!(!selects(&sel, &h));
        sel.match_labels.remove("rack");
        sel.role = Some(Role::ControlPlane);
        assert!(!selects(&sel, &h));
    }

    #[test]
    fn malformed_max_unhealthy_is_an_error() {
        for bad in ["forty%", "4.5%", "-1", "", "%"] {
            assert!(
                resolve_max_unhealthy(mu(bad).as_ref(), 10, None).is_err(),
                "{bad}"
            );
        }
    }
}
