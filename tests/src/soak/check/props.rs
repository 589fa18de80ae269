//! Properties of the checker on generated histories: it never panics on any history; a
//! history of safe behaviour (each fault on one host at a time, only the faulted host fenced,
//! each fence decided during the fault or just after it ended, quorum kept, terms only
//! growing, every host back) breaks no rule, and one more power-off of a quiet host, decided
//! or not, breaks exactly unjustified-power-off; and interleaving the entries of one
//! millisecond from different sources differently does not change the verdict.

use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;
use proptest::sample::select;

use super::testkit::{HOSTS, HistoryBuilder};
use super::{Params, Rule, check};
use crate::soak::history::{Entry, Event, FaultKind, MemberSample, Power};
use crate::soak::schedule::Rng;

/// Cases per property (`METALGUARD_PROPTEST_CASES`, as the core crate's properties).
fn cases() -> u32 {
    std::env::var("METALGUARD_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64)
}

/// A name from a small set, so that generated entries meet each other.
fn name() -> impl Strategy<Value = String> {
    select(vec!["cp-1", "cp-2", "cp-3", "cp-4", "cp-5", "ctl-1", "x"]).prop_map(String::from)
}

fn word() -> impl Strategy<Value = String> {
    select(vec![
        "fence",
        "off",
        "on",
        "needs-person",
        "done",
        "healed",
        "",
    ])
    .prop_map(String::from)
}

/// Any event, with small ids and terms so that they collide.
fn event() -> impl Strategy<Value = Event> {
    let member =
        (name(), any::<bool>(), any::<bool>()).prop_map(|(name, voter, healthy)| MemberSample {
            name,
            voter,
            healthy,
        });
    prop_oneof![
        (0u64..6, select(FaultKind::ALL.to_vec()), name())
            .prop_map(|(id, fault, target)| Event::FaultStart { id, fault, target }),
        (0u64..6, word()).prop_map(|(id, how)| Event::FaultEnd { id, how }),
        (name(), any::<bool>()).prop_map(|(host, on)| Event::Power {
            host,
            state: if on { Power::On } else { Power::Off },
        }),
        (
            name(),
            word(),
            0u64..5,
            proptest::option::of(name()),
            proptest::option::of(word())
        )
            .prop_map(|(agent, op, term, target, action)| Event::CommandExecuted {
                agent,
                op,
                command: "fence".into(),
                term,
                target,
                action,
            }),
        (name(), 0u64..5, 0u64..5).prop_map(|(agent, term, seen)| Event::CommandRefused {
            agent,
            op: "op".into(),
            term,
            seen,
        }),
        (name(), 0u64..5).prop_map(|(agent, term)| Event::TermSeen { agent, term }),
        (name(), word(), word()).prop_map(|(controller, op, reason)| Event::Intent {
            controller,
            op,
            reason
        }),
        (name(), any::<u64>()).prop_map(|(controller, term)| Event::Leader { controller, term }),
        (
            name(),
            proptest::option::of(prop_oneof![Just(1), Just(101), any::<i32>()]),
            proptest::option::of(1i32..32),
            word()
        )
            .prop_map(
                |(controller, code, signal, last_line)| Event::ControllerExit {
                    controller,
                    code,
                    signal,
                    restart_in_ms: 10_000,
                    last_line,
                }
            ),
        (proptest::collection::vec(member, 0..7), any::<bool>())
            .prop_map(|(members, quorum)| Event::EtcdSample { members, quorum }),
        (word(), name(), word()).prop_map(|(id, target, phase)| Event::Remediation {
            id,
            target,
            phase
        }),
        (name(), any::<bool>()).prop_map(|(host, healthy)| Event::HostHealth { host, healthy }),
        (
            any::<u64>(),
            any::<u64>(),
            proptest::collection::vec(word(), 0..3)
        )
            .prop_map(|(acked, failed, lost)| Event::Workload {
                acked,
                failed,
                lost
            }),
        Just(Event::End),
    ]
}

/// Times: mostly whole seconds of a short soak (so entries share milliseconds), sometimes
/// anything.
fn time() -> impl Strategy<Value = u64> {
    prop_oneof![
        8 => (0u64..400).prop_map(|x| x * 1000),
        1 => any::<u64>(),
    ]
}

fn history() -> impl Strategy<Value = Vec<Entry>> {
    entries(time())
}

/// A history crowded into ten seconds, so that most milliseconds hold several entries.
fn crowded_history() -> impl Strategy<Value = Vec<Entry>> {
    entries((0u64..10).prop_map(|x| x * 1000))
}

fn entries(time: impl Strategy<Value = u64>) -> impl Strategy<Value = Vec<Entry>> {
    proptest::collection::vec((time, event()), 0..80).prop_map(|es| {
        es.into_iter()
            .map(|(t, event)| Entry { t, event })
            .collect()
    })
}

fn params() -> impl Strategy<Value = Params> {
    let d = || {
        prop_oneof![
            (0u64..400).prop_map(Duration::from_secs),
            any::<u64>().prop_map(Duration::from_secs)
        ]
    };
    (d(), d(), d(), d(), d()).prop_map(
        |(fault_grace, decision_grace, quorum_grace, recovery_bound, sample_window)| Params {
            fault_grace,
            decision_grace,
            quorum_grace,
            recovery_bound,
            sample_window,
        },
    )
}

/// Which log an entry comes from: the entries of one source keep their order.
fn source(event: &Event) -> String {
    match event {
        Event::Start { .. } | Event::End => "driver".into(),
        Event::FaultStart { .. } | Event::FaultEnd { .. } => "nemesis".into(),
        Event::Power { host, .. } => format!("bmc {host}"),
        Event::CommandExecuted { agent, .. }
        | Event::CommandRefused { agent, .. }
        | Event::PowerCutRefused { agent, .. }
        | Event::TermSeen { agent, .. } => format!("agent {agent}"),
        Event::Leader { controller, .. } | Event::Intent { controller, .. } => {
            format!("controller {controller}")
        }
        Event::ControllerExit { controller, .. } => format!("supervisor {controller}"),
        Event::EtcdSample { .. } => "observer".into(),
        Event::Remediation { .. } => "store".into(),
        Event::HostHealth { .. } => "health".into(),
        Event::Workload { .. } => "workload".into(),
    }
}

/// Interleaves the sources of each millisecond's entries at random (`seed`), keeping each
/// source's order.
fn interleave(history: &[Entry], seed: u64) -> Vec<Entry> {
    let mut rng = Rng::new(seed);
    let mut out = Vec::with_capacity(history.len());
    for batch in history.chunk_by(|a, b| a.t == b.t) {
        let mut queues: BTreeMap<String, Vec<&Entry>> = BTreeMap::new();
        for e in batch.iter().rev() {
            queues.entry(source(&e.event)).or_default().push(e);
        }
        while !queues.is_empty() {
            let keys: Vec<String> = queues.keys().cloned().collect();
            let key = &keys[usize::try_from(rng.below(keys.len() as u64)).unwrap()];
            let queue = queues.get_mut(key).unwrap();
            out.push(queue.pop().unwrap().clone());
            if queue.is_empty() {
                queues.remove(key);
            }
        }
    }
    out
}

/// One fault of the safe history: on which host, what, when, for how long, and whether the
/// host is fenced.
#[derive(Debug, Clone)]
struct Episode {
    host: usize,
    kind: FaultKind,
    gap_ms: u64,
    lasts_ms: u64,
    fence: Option<Fence>,
    boot_ms: u64,
    new_term: bool,
    sideshow: Option<FaultKind>,
}

/// A fence of the faulted host: decided (its intent persisted) during the fault or at most
/// the decision grace after it ended, then executed by an agent and landing on the BMC
/// within the fault grace of the decision. Times in milliseconds: the decision's after the
/// fault's start, the execution's after the decision, the power-off's after the execution.
#[derive(Debug, Clone)]
struct Fence {
    decided: u64,
    executed_after: u64,
    lands_after: u64,
}

/// The default decision grace, in milliseconds.
const DECISION_GRACE_MS: u64 = 5_000;

fn episode() -> impl Strategy<Value = Episode> {
    let afflicting = select(vec![
        FaultKind::HostHang,
        FaultKind::EtcdHang,
        FaultKind::AgentKill,
        FaultKind::Partition,
    ]);
    let harmless = select(vec![
        FaultKind::ControllerPause,
        FaultKind::ControllerKill,
        FaultKind::BmcSlow,
        FaultKind::BmcFail,
        FaultKind::ApiserverFreeze,
    ]);
    (
        0usize..5,
        afflicting,
        1u64..30_000,
        1u64..40_000,
        proptest::option::of((0u64..50_000, 0u64..=10_000, 0u64..=13_000)),
        1u64..60_000,
        any::<bool>(),
        proptest::option::of(harmless),
    )
        .prop_map(
            |(host, kind, gap_ms, lasts_ms, fence, boot_ms, new_term, sideshow)| Episode {
                host,
                kind,
                gap_ms,
                lasts_ms,
                fence: fence.map(|(decided, executed, lands)| Fence {
                    decided: decided % (lasts_ms + DECISION_GRACE_MS + 1),
                    executed_after: executed,
                    lands_after: lands,
                }),
                boot_ms,
                new_term,
                sideshow,
            },
        )
}

/// The safe history of `episodes`, one after the other, and the time it ends.
fn safe_history(episodes: &[Episode]) -> (Vec<Entry>, u64) {
    let mut b = HistoryBuilder::new();
    let mut away: Vec<(u64, u64, &str)> = Vec::new(); // a member away in [from, to)
    let (mut t, mut term, mut leader) = (0, 1, "ctl-1");
    b.leader(0, leader, term);
    for (id, e) in (0u64..).step_by(2).zip(episodes) {
        let (host, neighbour) = (HOSTS[e.host], HOSTS[(e.host + 1) % 5]);
        let start = t + e.gap_ms;
        if e.new_term {
            (term, leader) = (term + 1, "ctl-2");
            b.leader(start, leader, term)
                .term_seen(start + 1, neighbour, term);
        }
        b.fault(start, id, e.kind, host).health(start, host, false);
        if let Some(side) = e.sideshow {
            let target = match side {
                FaultKind::BmcSlow | FaultKind::BmcFail => HOSTS[(e.host + 2) % 5],
                _ => "ctl-1",
            };
            b.fault(start, id + 1, side, target)
                .heal(start + e.lasts_ms, id + 1);
        }
        let back = if let Some(f) = &e.fence {
            let (healed, decided) = (start + e.lasts_ms, start + f.decided);
            let executed = decided + f.executed_after;
            let off = executed + f.lands_after;
            let op = format!("remediation/{host}/{id}/power-off");
            b.intent(decided, leader, &op)
                .executed(executed, neighbour, &op, term, host)
                .power(off, host, Power::Off);
            if off < healed {
                b.push(
                    off,
                    Event::FaultEnd {
                        id,
                        how: "power-cycled".into(),
                    },
                );
            } else {
                b.heal(healed, id);
            }
            b.power(off + e.boot_ms, host, Power::On);
            off + e.boot_ms * 2
        } else {
            b.heal(start + e.lasts_ms, id);
            start + e.lasts_ms + e.boot_ms
        };
        if e.kind.takes_member() || e.fence.is_some() {
            away.push((start, back, host));
        }
        b.health(back, host, true);
        t = back.max(start + e.lasts_ms);
    }
    let end = t + 60_000;
    for at in (0..=end).step_by(1000) {
        let down: Vec<&str> = away
            .iter()
            .filter(|(from, to, _)| *from <= at && at < *to)
            .map(|(_, _, host)| *host)
            .collect();
        b.sample(at, &down, true);
    }
    b.workload(end, 1000, 7, &[]).end(end);
    (b.build(), end)
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn any_history_is_checked_without_panicking_and_violations_come_in_time_order(
        history in history(),
        params in params(),
    ) {
        let verdict = check(&history, &params);
        prop_assert!(verdict.violations.windows(2).all(|w| w[0].t <= w[1].t));
        let mut sorted = history.clone();
        sorted.sort_by_key(|e| e.t);
        prop_assert_eq!(check(&sorted, &params).violations, verdict.violations);
    }

    #[test]
    fn a_safe_history_breaks_no_rule(episodes in proptest::collection::vec(episode(), 0..25)) {
        let (history, _) = safe_history(&episodes);
        let verdict = check(&history, &Params::default());
        prop_assert!(verdict.passed(), "{:#?}", verdict.violations);
        prop_assert_eq!(verdict.unjudged, Vec::<String>::new());
    }

    #[test]
    fn one_more_power_off_of_a_quiet_host_breaks_exactly_unjustified_power_off(
        episodes in proptest::collection::vec(episode(), 0..10),
        host in select(HOSTS.to_vec()),
        before_end_ms in 0u64..20_000,
        decided in any::<bool>(),
    ) {
        let (mut history, end) = safe_history(&episodes);
        // Every fault is over by `end - 60 s`, more than either grace before this.
        let off = end - before_end_ms;
        let mut extra = vec![Entry { t: off, event: Event::Power { host: host.into(), state: Power::Off } }];
        if decided {
            let op = "remediation/stale/1/power-off";
            extra.push(Entry { t: off - 2000, event: Event::Intent {
                controller: "ctl-1".into(), op: op.into(), reason: "stale view".into() } });
            extra.push(Entry { t: off - 1000, event: Event::CommandExecuted {
                // No term of the safe history is newer: one per episode at most.
                agent: "cp-1".into(), op: op.into(), command: "fence".into(), term: 1 + episodes.len() as u64,
                target: Some(host.into()), action: Some("off".into()) } });
        }
        for entry in extra {
            let at = history.partition_point(|e| e.t <= entry.t);
            history.insert(at, entry);
        }
        let verdict = check(&history, &Params::default());
        let rules: Vec<Rule> = verdict.violations.iter().map(|v| v.rule).collect();
        prop_assert_eq!(rules, vec![Rule::UnjustifiedPowerOff]);
        let message = &verdict.violations[0].message;
        prop_assert!(message.starts_with(host), "{}", message);
        prop_assert_eq!(message.contains("decided at"), decided, "{}", message);
        let noted = verdict.unjudged.iter().any(|n| n.contains("could not be found"));
        prop_assert_eq!(noted, !decided, "{:?}", verdict.unjudged);
    }

    #[test]
    fn interleaving_one_millisecond_s_sources_differently_keeps_the_verdict(
        history in crowded_history(),
        episodes in proptest::collection::vec(episode(), 0..8),
        seed in any::<u64>(),
    ) {
        let params = Params::default();
        let (safe, _) = safe_history(&episodes);
        for mut h in [history, safe] {
            h.sort_by_key(|e| e.t);
            let shuffled = interleave(&h, seed);
            prop_assert_eq!(check(&shuffled, &params), check(&h, &params));
        }
    }
}
