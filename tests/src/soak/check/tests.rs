//! Each rule on a small history that breaks it and on a near-identical one that does not
//! ([`fences`]: the power rules, power-offs with no decision behind them; [`decisions`]:
//! power-offs judged by their decision; [`cluster`]: quorum, terms, recovery, writes), and
//! how the checker reads a history as a whole (here).

mod cluster;
mod decisions;
mod fences;

use super::testkit::{HistoryBuilder, s};
use super::{Params, Rule, Verdict, check};
use crate::soak::history::Event;
use crate::soak::history::FaultKind::HostHang;
use crate::soak::history::Power::{Off, On};

/// A history of `secs` seconds with all five voters healthy, sampled every second.
fn quiet(secs: u64) -> HistoryBuilder {
    let mut b = HistoryBuilder::new();
    b.samples(0, s(secs), &[], true);
    b
}

fn verdict(b: &HistoryBuilder) -> Verdict {
    check(&b.build(), &Params::default())
}

/// The messages of the violations of `rule`.
fn found(b: &HistoryBuilder, rule: Rule) -> Vec<String> {
    verdict(b)
        .of_rule(rule)
        .map(|v| v.message.clone())
        .collect()
}

/// A hang of `host` from 10 s, decided to be fenced at 18 s, the fence executed by cp-1 at
/// 19 s and landing at 20 s (the hang ends with it), back on and healthy at 60 s.
fn fenced_hang(b: &mut HistoryBuilder, host: &str) {
    let op = format!("remediation/{host}/1/power-off");
    b.fault(s(10), 1, HostHang, host)
        .health(s(10), host, false)
        .intent(s(18), "ctl-1", &op)
        .executed(s(19), "cp-1", &op, 1, host)
        .power(s(20), host, Off)
        .push(
            s(20),
            Event::FaultEnd {
                id: 1,
                how: "power-cycled".into(),
            },
        )
        .power(s(30), host, On)
        .health(s(60), host, true);
}

#[test]
fn a_quiet_history_and_a_fenced_hang_break_no_rule() {
    assert_eq!(verdict(&quiet(400)).violations, vec![]);
    let mut b = quiet(400);
    fenced_hang(&mut b, "cp-2");
    let v = verdict(&b);
    assert_eq!(v.violations, vec![], "{v:#?}");
    assert_eq!(v.unjudged, Vec::<String>::new());
}

#[test]
fn a_history_out_of_time_order_is_checked_in_time_order_and_says_so() {
    let mut b = quiet(100);
    fenced_hang(&mut b, "cp-2");
    let mut history = b.build();
    // The power-off written first: in time order it still follows the fault.
    let off = history
        .iter()
        .position(|e| matches!(e.event, Event::Power { state: Off, .. }))
        .unwrap();
    let entry = history.remove(off);
    history.insert(0, entry);
    let v = check(&history, &Params::default());
    assert_eq!(v.violations, vec![]);
    assert_eq!(
        v.unjudged,
        vec![
            "history out of time order at entry 2 (0:00.000 after 0:20.000); checked in time \
             order"
        ]
    );
}

#[test]
fn violations_come_in_time_order_across_rules() {
    let mut b = quiet(100);
    b.workload(s(90), 1, 0, &["k/1"])
        .power(s(50), "cp-1", Off)
        .executed(s(30), "cp-1", "op-1", 1, "cp-3")
        .term_seen(s(20), "cp-1", 2);
    let rules: Vec<Rule> = verdict(&b).violations.iter().map(|v| v.rule).collect();
    assert_eq!(
        rules,
        vec![
            Rule::OlderTermExecuted,
            Rule::UnjustifiedPowerOff,
            Rule::AckedLost
        ]
    );
}
