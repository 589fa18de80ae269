//! Fencing readiness (issue 25): whether a fence of each host would work now, from the
//! credentialed read-only checks the agents report (`BmcReachability::check`).
//!
//! The agent that would execute a host's fence gets that BMC's credentials for its checks
//! (`Hub::bmc_targets_for`); it logs in, reads the power state and the system's identity, and
//! reports the verdict. A host's readiness is that agent's latest verdict, with when: only
//! the agent the plan would send the fence to (`Plan::fence_executors`) speaks for it, so
//! another agent's certificate can neither hide a failing check nor raise a false alarm, and
//! a verdict is about the path a fence would take.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use metalguard_api::bmc::CheckFailure;
use metalguard_api::duration::{Timestamp, format_duration};

use crate::backend::State;
use crate::inventory::Inventory;

/// Whether a fence of one host would work, by its latest credentialed check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Readiness {
    /// The latest check passed.
    Ready {
        /// When it ran (the agent's clock).
        at: Timestamp,
        /// The agent that ran it.
        by: String,
    },
    /// The latest check failed.
    NotReady {
        /// How.
        failure: CheckFailure,
        /// The check's one line (never credentials).
        detail: String,
        /// When it ran.
        at: Timestamp,
        /// The agent that ran it.
        by: String,
    },
    /// No agent has reported a credentialed check of its BMC.
    Unchecked,
}

/// The readiness of every inventory host with a BMC, by the latest check of the agent in
/// `executors` (the plan's `fence_executors`) for it; [`Readiness::Unchecked`] when none.
pub fn readiness(
    inventory: &Inventory,
    state: &State,
    executors: &BTreeMap<String, String>,
) -> BTreeMap<String, Readiness> {
    let hosts = inventory
        .hosts
        .iter()
        .filter(|h| h.bmc.is_some())
        .map(|h| h.name.as_str());
    readiness_of(hosts, state, executors)
}

/// Per inventory host with a BMC, its readiness as the `fencing_ready` gauge has it: the
/// failure's name (empty unless a check failed) and the value: 1 ready, 0 not ready, -1 not
/// checked. Nothing is copied per host: the gauges take it every round.
pub fn gauges<'a>(
    inventory: &'a Inventory,
    state: &State,
    executors: &BTreeMap<String, String>,
) -> BTreeMap<&'a str, (&'static str, i64)> {
    let checks = latest_checks(state, executors);
    inventory
        .hosts
        .iter()
        .filter(|h| h.bmc.is_some())
        .map(|h| {
            let gauge = match checks.get(h.name.as_str()) {
                None => ("", -1),
                Some((_, _, check)) => match check.failure {
                    None => ("", 1),
                    Some(failure) => (failure.name(), 0),
                },
            };
            (h.name.as_str(), gauge)
        })
        .collect()
}

/// Per target, the latest credentialed check of its BMC by its executor in `executors`: the
/// agent, when, and the check. One pass over the reports (each agent reports on every BMC it
/// was told of), so a round at thousands of hosts does not search a list per host.
fn latest_checks<'s>(
    state: &'s State,
    executors: &BTreeMap<String, String>,
) -> BTreeMap<&'s str, (&'s str, Timestamp, &'s metalguard_api::protocol::BmcCheck)> {
    let mut checks = BTreeMap::new();
    for (agent, stored) in &state.reports {
        for probe in &stored.report.bmc_reachability {
            let Some(check) = probe.check.as_ref() else {
                continue;
            };
            if probe.host != *agent && executors.get(&probe.host) == Some(agent) {
                checks.insert(
                    probe.host.as_str(),
                    (agent.as_str(), probe.checked_at, check),
                );
            }
        }
    }
    checks
}

/// As [`readiness`], for `hosts`.
pub fn readiness_of<'a>(
    hosts: impl Iterator<Item = &'a str>,
    state: &State,
    executors: &BTreeMap<String, String>,
) -> BTreeMap<String, Readiness> {
    let checks = latest_checks(state, executors);
    hosts
        .map(|host| {
            let readiness = match checks.get(host) {
                None => Readiness::Unchecked,
                Some(&(by, at, check)) => match check.failure {
                    None => Readiness::Ready {
                        at,
                        by: by.to_owned(),
                    },
                    Some(failure) => Readiness::NotReady {
                        failure,
                        detail: check.detail.clone(),
                        at,
                        by: by.to_owned(),
                    },
                },
            };
            (host.to_owned(), readiness)
        })
        .collect()
}

/// The latest credentialed check of `host`'s BMC by the agent the plan would send its fence
/// to (`executors`), with that agent's name. Only this check speaks for the host: a rotation's
/// new credentials are taken (`control::credentials`) and a person's request is answered by it
/// alone, whatever other agents report.
pub fn executor_check<'a>(
    state: &'a State,
    executors: &BTreeMap<String, String>,
    host: &str,
) -> Option<(&'a str, &'a metalguard_api::protocol::BmcReachability)> {
    let executor = executors.get(host)?;
    let (agent, stored) = state.reports.get_key_value(executor)?;
    stored
        .report
        .bmc_reachability
        .iter()
        .find(|p| p.host == host && p.check.is_some())
        .map(|p| (agent.as_str(), p))
}

/// The check that answered a person's on-demand request `id` for `host`
/// (`metalguard-controller check-bmc`): the executor's latest check ([`executor_check`]), when
/// it echoes `id`. Another agent's check never answers: the request went with the
/// credentials, to the executor only.
pub fn answer<'a>(
    state: &'a State,
    executors: &BTreeMap<String, String>,
    host: &str,
    id: &str,
) -> Option<(&'a str, &'a metalguard_api::protocol::BmcReachability)> {
    executor_check(state, executors, host).filter(|(_, p)| {
        p.check
            .as_ref()
            .is_some_and(|c| c.request.as_deref() == Some(id))
    })
}

/// The id of `host`'s on-demand check request when the executor's latest check answered it.
#[cfg(feature = "kubernetes")]
pub fn answered<'a>(
    state: &'a State,
    executors: &BTreeMap<String, String>,
    host: &str,
) -> Option<&'a str> {
    let request = state.bmc_check_requests.get(host)?;
    answer(state, executors, host, &request.id).map(|_| request.id.as_str())
}

/// A failure class as a Kubernetes condition reason (CamelCase: `credentials-refused` is
/// `CredentialsRefused`).
#[cfg(feature = "kubernetes")]
pub fn reason_of(failure: CheckFailure) -> String {
    failure
        .name()
        .split('-')
        .map(|word| {
            let mut chars = word.chars();
            chars.next().map_or_else(String::new, |first| {
                first.to_uppercase().chain(chars).collect::<String>()
            })
        })
        .collect()
}

/// The failure class a condition reason names ([`reason_of`]), if any.
#[cfg(feature = "kubernetes")]
pub fn failure_of_reason(reason: &str) -> Option<CheckFailure> {
    CheckFailure::ALL
        .iter()
        .copied()
        .find(|f| reason_of(*f) == reason)
}

/// `status --json`: per host, `state` (`ready`, `not-ready`, `unchecked`) and, once checked,
/// `checked_at`, `by`, and for a failure `failure` and `detail`.
pub fn to_json(readiness: &BTreeMap<String, Readiness>) -> serde_json::Value {
    readiness
        .iter()
        .map(|(host, r)| {
            let value = match r {
                Readiness::Ready { at, by } => {
                    serde_json::json!({ "state": "ready", "checked_at": at, "by": by })
                }
                Readiness::NotReady {
                    failure,
                    detail,
                    at,
                    by,
                } => serde_json::json!({
                    "state": "not-ready",
                    "failure": failure.name(),
                    "detail": detail,
                    "checked_at": at,
                    "by": by,
                }),
                Readiness::Unchecked => serde_json::json!({ "state": "unchecked" }),
            };
            (host.clone(), value)
        })
        .collect::<serde_json::Map<_, _>>()
        .into()
}

/// `status`: one line per inventory host with a BMC.
pub fn render(
    inventory: &Inventory,
    state: &State,
    executors: &BTreeMap<String, String>,
    now: Timestamp,
) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "fencing readiness (credentialed read-only checks by the agent that would fence):"
    );
    let ago = |at: Timestamp| format_duration(now.since(at));
    for (host, readiness) in readiness(inventory, state, executors) {
        let _ = match readiness {
            Readiness::Ready { at, by } => {
                writeln!(out, "  {host}: ready (checked by {by}, {} ago)", ago(at))
            }
            Readiness::NotReady {
                failure,
                detail,
                at,
                by,
            } => writeln!(
                out,
                "  {host}: NOT READY: {} (checked by {by}, {} ago): {detail}; {}",
                failure.name(),
                ago(at),
                failure.remedy()
            ),
            Readiness::Unchecked => writeln!(
                out,
                "  {host}: not checked yet by {} (its agent may predate the check, or not have run it yet)",
                executors
                    .get(&host)
                    .map_or("any agent (none is eligible to fence it)", String::as_str)
            ),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use metalguard_api::protocol::{BmcCheck, BmcReachability};

    use super::*;
    use crate::backend::StoredReport;

    fn inventory() -> Inventory {
        crate::testkit::inventory(
            &[
                ("cp-1", "control-plane", false),
                ("cp-2", "control-plane", true),
                ("cp-3", "control-plane", true),
            ],
            "",
        )
    }

    fn probe(host: &str, at: u64, failure: Option<CheckFailure>) -> BmcReachability {
        BmcReachability {
            host: host.into(),
            reachable: true,
            checked_at: Timestamp(at),
            error: None,
            check: Some(BmcCheck {
                failure,
                power_state: Some("on".into()),
                identity: None,
                detail: "the BMC refused the login: 401".into(),
                credentials_id: None,
                request: None,
            }),
        }
    }

    fn reporting(state: &mut State, agent: &str, probes: Vec<BmcReachability>) {
        let mut stored: StoredReport = crate::testkit::stored_report(agent, 1, None);
        stored.report.bmc_reachability = probes;
        state.reports.insert(agent.into(), stored);
    }

    #[cfg(feature = "kubernetes")]
    #[test]
    fn every_failure_class_is_a_condition_reason_and_back() {
        assert_eq!(
            reason_of(CheckFailure::CredentialsRefused),
            "CredentialsRefused"
        );
        assert_eq!(reason_of(CheckFailure::Tls), "Tls");
        for failure in CheckFailure::ALL {
            assert_eq!(failure_of_reason(&reason_of(failure)), Some(failure));
        }
        assert_eq!(failure_of_reason("CheckPassed"), None);
    }

    #[test]
    fn only_the_agent_that_would_fence_a_host_speaks_for_its_readiness() {
        let inventory = inventory();
        let mut state = State::default();
        reporting(
            &mut state,
            "cp-1",
            vec![
                probe("cp-2", 10_000, None),
                probe("cp-3", 10_000, Some(CheckFailure::CredentialsRefused)),
            ],
        );
        // cp-2 checked cp-3 later and says it passed: cp-2 would not fence cp-3.
        reporting(&mut state, "cp-2", vec![probe("cp-3", 30_000, None)]);
        let executors = BTreeMap::from([
            ("cp-2".to_owned(), "cp-1".to_owned()),
            ("cp-3".to_owned(), "cp-1".to_owned()),
        ]);
        let got = readiness(&inventory, &state, &executors);
        assert_eq!(
            got["cp-2"],
            Readiness::Ready {
                at: Timestamp(10_000),
                by: "cp-1".into()
            }
        );
        assert!(matches!(
            &got["cp-3"],
            Readiness::NotReady { failure: CheckFailure::CredentialsRefused, by, .. } if by == "cp-1"
        ));
        assert_eq!(got.len(), 2, "cp-1 has no BMC");
        assert_eq!(
            gauges(&inventory, &state, &executors),
            BTreeMap::from([("cp-2", ("", 1)), ("cp-3", ("credentials-refused", 0))]),
            "the gauge says the same"
        );
        let text = render(&inventory, &state, &executors, Timestamp(50_000));
        assert!(
            text.contains("cp-3: NOT READY: credentials-refused (checked by cp-1, 40s ago)"),
            "{text}"
        );
        // The executor changes: its own check decides, none yet.
        let executors = BTreeMap::from([("cp-3".to_owned(), "cp-2".to_owned())]);
        let got = readiness(&inventory, &state, &executors);
        assert!(matches!(got["cp-3"], Readiness::Ready { .. }));
        assert_eq!(gauges(&inventory, &state, &executors)["cp-3"], ("", 1));
        assert_eq!(got["cp-2"], Readiness::Unchecked, "no executor");
        let mut plain = probe("cp-3", 40_000, None);
        plain.check = None;
        reporting(&mut state, "cp-2", vec![plain]);
        let text = render(&inventory, &state, &executors, Timestamp(50_000));
        assert!(text.contains("cp-3: not checked yet by cp-2"), "{text}");
        assert!(
            text.contains("cp-2: not checked yet by any agent"),
            "{text}"
        );
    }

    #[test]
    fn only_the_executors_check_answers_a_persons_request() {
        let echoing = |id: &str| {
            let mut p = probe("cp-3", 10, None);
            p.check.as_mut().unwrap().request = Some(id.into());
            p
        };
        let mut state = State::default();
        state.bmc_check_requests.insert(
            "cp-3".into(),
            crate::backend::BmcCheckRequest {
                id: "r1".into(),
                at: Timestamp(5),
                by: "alice (cli)".into(),
            },
        );
        let executors = BTreeMap::from([("cp-3".to_owned(), "cp-1".to_owned())]);
        // Another agent echoing the id (it was never given it) answers nothing.
        reporting(&mut state, "cp-2", vec![echoing("r1")]);
        assert!(answer(&state, &executors, "cp-3", "r1").is_none());
        // The executor's check of an earlier request does not answer this one.
        reporting(&mut state, "cp-1", vec![echoing("r0")]);
        assert!(answer(&state, &executors, "cp-3", "r1").is_none());
        reporting(&mut state, "cp-1", vec![echoing("r1")]);
        let (by, probe) = answer(&state, &executors, "cp-3", "r1").unwrap();
        assert_eq!((by, probe.host.as_str()), ("cp-1", "cp-3"));
        #[cfg(feature = "kubernetes")]
        assert_eq!(answered(&state, &executors, "cp-3"), Some("r1"));
        assert!(
            answer(&state, &BTreeMap::new(), "cp-3", "r1").is_none(),
            "no executor"
        );
    }

    /// A rotation's new credentials are taken from the executor's check only: another agent
    /// that reports a passing check with the candidate's id (it was never given the id or
    /// the credentials; say it guessed) is not read.
    #[test]
    fn a_rotation_is_taken_from_the_executors_check_only() {
        use crate::control::credentials::CredentialBook;
        let creds = |p: &str| metalguard_api::protocol::BmcCredentials {
            username: "admin".into(),
            password: metalguard_api::protocol::Secret::new(p),
        };
        let address = "redfish+https://10.0.1.3";
        let mut book = CredentialBook::with_key([3; 32]);
        book.read("cp-3", address, creds("old"));
        book.read("cp-3", address, creds("new"));
        let candidate = book.for_check("cp-3").unwrap().id;
        let passing = |id: &str| {
            let mut p = probe("cp-3", 10, None);
            p.check.as_mut().unwrap().credentials_id = Some(id.into());
            p
        };
        let executors = BTreeMap::from([("cp-3".to_owned(), "cp-1".to_owned())]);
        let mut state = State::default();
        reporting(&mut state, "cp-2", vec![passing(&candidate)]);
        let take = |book: &mut CredentialBook, state: &State| {
            executor_check(state, &executors, "cp-3")
                .and_then(|(by, p)| Some((by, p.check.as_ref()?)))
                .is_some_and(|(by, check)| book.take_check("cp-3", by, check))
        };
        assert!(!take(&mut book, &state), "not the executor");
        assert!(book.rotating("cp-3"));
        reporting(&mut state, "cp-1", vec![passing(&candidate)]);
        assert!(take(&mut book, &state));
        assert!(!book.rotating("cp-3"));
    }
}
