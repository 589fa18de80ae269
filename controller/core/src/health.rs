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

use std::collections::BTreeSet;
use std::fmt;
use std::time::Duration;

use metalguard_api::duration::Timestamp;
use metalguard_api::policy::{
    DEFAULT_CONTROL_PLANE_MAX_UNHEALTHY, DEFAULT_NODE_STARTUP_TIMEOUT, HealthCheck, MaxUnhealthy,
    Selector,
};
use metalguard_api::snapshot::{Host, Role};

/// `maxUnhealthy` could not be understood; remediation is blocked for the check.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MaxUnhealthyError {
    /// Neither an integer nor a percentage.
    #[error("maxUnhealthy {0:?} is neither an integer nor a percentage")]
    Malformed(String),
}

/// Resolves `maxUnhealthy` against the number of targets.
///
/// `None` means the default: 100% of targets, or [`DEFAULT_CONTROL_PLANE_MAX_UNHEALTHY`] when
/// `control_plane` is set (seed 000). Percentages round down.
pub fn resolve_max_unhealthy(
    value: Option<&MaxUnhealthy>,
    targets: usize,
    control_plane: bool,
) -> Result<usize, MaxUnhealthyError> {
    let text = match value {
        None if control_plane => return Ok(DEFAULT_CONTROL_PLANE_MAX_UNHEALTHY as usize),
        None => return Ok(targets),
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

#[allow(clippy::unnecessary_wraps)] // folds into an Option accumulator
fn earliest(a: Option<Timestamp>, b: Timestamp) -> Option<Timestamp> {
    Some(a.map_or(b, |a| a.min(b)))
}

/// Judges one host against one check. Returns the unhealthy reason and since-time, and the
/// earliest future time the verdict could flip.
pub fn judge_host(
    check: &HealthCheck,
    host: &Host,
    under_remediation: bool,
    now: Timestamp,
) -> (Option<(UnhealthyReason, Timestamp)>, Option<Timestamp>) {
    let mut next: Option<Timestamp> = None;
    if under_remediation {
        return (Some((UnhealthyReason::UnderRemediation, now)), None);
    }
    if host.phase_failed {
        return (Some((UnhealthyReason::PhaseFailed, now)), None);
    }
    match &host.node {
        None if host.node_seen => return (Some((UnhealthyReason::NodeMissing, now)), None),
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
                    let at = c.last_transition.after(uc.timeout);
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
        let at = last.after(timeout);
        if now >= at {
            return (Some((UnhealthyReason::HeartbeatLost(timeout), at)), None);
        }
        next = earliest(next, at);
    }
    (None, next)
}

/// Evaluates one check over all hosts. `remediating` holds targets with an active remediation.
pub fn evaluate_check<'a>(
    check: &'a HealthCheck,
    hosts: &'a [Host],
    remediating: &BTreeSet<&str>,
    now: Timestamp,
) -> CheckVerdict<'a> {
    let mut targets = 0usize;
    let mut unhealthy = Vec::new();
    let mut next_change: Option<Timestamp> = None;
    for host in hosts.iter().filter(|h| selects(&check.selector, h)) {
        targets += 1;
        let (verdict, next) =
            judge_host(check, host, remediating.contains(host.name.as_str()), now);
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
    let control_plane = check.selector.role == Some(Role::ControlPlane);
    let max_unhealthy = resolve_max_unhealthy(check.max_unhealthy.as_ref(), targets, control_plane);
    let short_circuit = match &max_unhealthy {
        Err(e) => Some(format!("{e}; remediation is blocked")),
        Ok(max) if unhealthy.len() > *max => Some(format!(
            "{} unhealthy > maxUnhealthy {max} ({})",
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

    #[allow(clippy::unnecessary_wraps)]
    fn mu(s: &str) -> Option<MaxUnhealthy> {
        Some(MaxUnhealthy::Text(s.to_owned()))
    }

    #[test]
    fn seed_003_max_unhealthy_40_percent_of_25_is_10() {
        assert_eq!(resolve_max_unhealthy(mu("40%").as_ref(), 25, false), Ok(10));
    }

    #[test]
    fn seed_003_max_unhealthy_40_percent_of_6_rounds_down_to_2() {
        assert_eq!(resolve_max_unhealthy(mu("40%").as_ref(), 6, false), Ok(2));
    }

    #[test]
    fn seed_003_max_unhealthy_absolute_2_is_independent_of_pool_size() {
        let two = Some(MaxUnhealthy::Count(2));
        assert_eq!(resolve_max_unhealthy(two.as_ref(), 25, false), Ok(2));
        assert_eq!(resolve_max_unhealthy(two.as_ref(), 3, false), Ok(2));
        assert_eq!(resolve_max_unhealthy(mu("2").as_ref(), 100, false), Ok(2));
    }

    #[test]
    fn seed_003_default_is_100_percent_and_seed_000_control_plane_default_is_1() {
        assert_eq!(resolve_max_unhealthy(None, 7, false), Ok(7));
        assert_eq!(resolve_max_unhealthy(None, 3, true), Ok(1));
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
        let (verdict, next) = judge_host(&check(30), &h, false, NOW);
        assert_eq!(verdict, None);
        assert_eq!(next, Some(Timestamp(NOW.0 + 20_000)));
        let (verdict, _) = judge_host(&check(5), &h, false, NOW);
        assert!(
            matches!(verdict, Some((UnhealthyReason::Condition { .. }, t)) if t == Timestamp(NOW.0 - 5_000))
        );
    }

    #[test]
    fn heartbeat_loss_counts_but_not_while_the_host_is_still_starting() {
        use crate::testkit::{NOW, worker};
        let mut h = worker("w", 0);
        h.agent.as_mut().unwrap().last_heartbeat = Timestamp(NOW.0 - 61_000);
        let (verdict, _) = judge_host(&check(300), &h, false, NOW);
        assert!(matches!(
            verdict,
            Some((UnhealthyReason::HeartbeatLost(_), _))
        ));
        h.node = None;
        h.node_seen = false;
        h.created_at = Timestamp(NOW.0 - 120_000);
        let (verdict, next) = judge_host(&check(300), &h, false, NOW);
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
                resolve_max_unhealthy(mu(bad).as_ref(), 10, false).is_err(),
                "{bad}"
            );
        }
    }
}
