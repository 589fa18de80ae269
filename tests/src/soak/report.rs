//! The soak's report, as plain text for a terminal or a CI log.
//!
//! Data flow: the [`Verdict`] → [`table`] (faults by kind, fences, commands, terms, the
//! workload, violations by rule); the history and each violation's time → [`around`] (the
//! history's NDJSON lines near it); [`render`] puts them together with the notes of what
//! could not be judged and, on a violation, the command that replays the seed.

use std::fmt::Write as _;

use super::check::{Rule, Verdict, format_time};
use super::history::{Entry, FaultKind};

/// How far either side of a violation [`render`] shows the history, in milliseconds.
pub const AROUND_MS: u64 = 10_000;
/// How many violations [`render`] shows with the history around them (the table counts all).
pub const SHOWN_VIOLATIONS: usize = 20;

/// The width of the table's label column.
const LABEL: usize = 28;

/// The counts of a checked soak as a plain-text table: faults by kind (every kind, zeros
/// too), fences, commands, terms, the workload's writes and the violations of every rule.
pub fn table(verdict: &Verdict, backend: &str, seed: u64) -> String {
    let stats = &verdict.stats;
    let mut out = format!(
        "soak: {backend} backend, seed {seed}, {} of history\n",
        format_time(u64::try_from(stats.duration.as_millis()).unwrap_or(u64::MAX))
    );
    section(&mut out, "faults by kind");
    let mut faults = 0u64;
    for kind in FaultKind::ALL {
        let n = stats.faults_by_kind.get(&kind).copied().unwrap_or(0);
        faults = faults.saturating_add(n);
        row(&mut out, kind.name(), n);
    }
    row(&mut out, "all faults", faults);
    section(&mut out, "fences (BMC power log)");
    row(&mut out, "power-offs", stats.power_offs_total);
    row(&mut out, "power-ons", stats.power_ons_total);
    row(
        &mut out,
        "power cuts refused (quorum)",
        stats.power_cuts_refused,
    );
    section(&mut out, "commands");
    row(&mut out, "executed", stats.commands_executed);
    row(
        &mut out,
        "refused (older term)",
        stats.commands_refused_older_term,
    );
    section(&mut out, "terms");
    row(&mut out, "leaderships", stats.leaderships);
    row(&mut out, "highest term", stats.highest_term);
    row(&mut out, "newer terms seen by agents", stats.terms_seen);
    row(
        &mut out,
        "controller exits (restarted)",
        stats.controller_exits,
    );
    section(&mut out, "workload");
    match stats.workload {
        Some(w) => {
            row(&mut out, "acked", w.acked);
            row(&mut out, "failed", w.failed);
            row(&mut out, "lost", w.lost);
        }
        None => out.push_str("  no result recorded\n"),
    }
    section(&mut out, "violations by rule");
    for rule in Rule::ALL {
        row(&mut out, rule.name(), verdict.of_rule(rule).count() as u64);
    }
    row(&mut out, "all violations", verdict.violations.len() as u64);
    row(&mut out, "not judged", verdict.unjudged.len() as u64);
    out
}

/// The history's entries with `t` within `window_ms` of `t` (both ends included), one NDJSON
/// line each, as the recorder writes them.
pub fn around(history: &[Entry], t: u64, window_ms: u64) -> String {
    let (from, to) = (t.saturating_sub(window_ms), t.saturating_add(window_ms));
    history
        .iter()
        .filter(|e| from <= e.t && e.t <= to)
        .map(|e| {
            serde_json::to_string(e).unwrap_or_else(|err| format!("(entry at {}: {err})", e.t))
                + "\n"
        })
        .collect()
}

/// The whole report: the [`table`]; then either that every rule held, or each violation (the
/// first [`SHOWN_VIOLATIONS`]) with the history [`around`] it and the command that replays
/// the seed; then what could not be judged.
pub fn render(history: &[Entry], verdict: &Verdict, seed: u64, backend: &str) -> String {
    let mut out = table(verdict, backend, seed);
    out.push('\n');
    if verdict.passed() {
        out.push_str("every rule held\n");
    } else {
        let _ = writeln!(out, "{} violations:", verdict.violations.len());
        for v in verdict.violations.iter().take(SHOWN_VIOLATIONS) {
            let _ = writeln!(
                out,
                "\n[{}] at {}: {}\nhistory from {} to {}:",
                v.rule,
                format_time(v.t),
                v.message,
                format_time(v.t.saturating_sub(AROUND_MS)),
                format_time(v.t.saturating_add(AROUND_MS)),
            );
            out.push_str(&around(history, v.t, AROUND_MS));
        }
        if let Some(more) = verdict.violations.len().checked_sub(SHOWN_VIOLATIONS)
            && more > 0
        {
            let _ = writeln!(out, "\n… and {more} more violations (see the table)");
        }
        let flag = if backend == "kubernetes" {
            " --kubernetes"
        } else {
            ""
        };
        let _ = writeln!(out, "\nreplay: scripts/soak.sh{flag} --seed {seed}");
    }
    if !verdict.unjudged.is_empty() {
        out.push_str("\nnot judged:\n");
        for note in &verdict.unjudged {
            let _ = writeln!(out, "  {note}");
        }
    }
    out
}

fn section(out: &mut String, title: &str) {
    let _ = writeln!(out, "{title}");
}

fn row(out: &mut String, label: &str, n: u64) {
    let _ = writeln!(out, "  {label:<LABEL$} {n:>8}");
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::soak::check::testkit::{HistoryBuilder, s};
    use crate::soak::check::{Params, check};
    use crate::soak::history::FaultKind::{BmcSlow, HostHang};
    use crate::soak::history::Power::{Off, On};

    /// A hang of cp-2 fenced by cp-1 in term 2, and the workload's result.
    fn fenced() -> HistoryBuilder {
        let mut b = HistoryBuilder::new();
        b.samples(0, s(60), &[], true)
            .leader(s(1), "ctl-1", 2)
            .fault(s(10), 1, HostHang, "cp-2")
            .fault(s(12), 2, BmcSlow, "cp-4")
            .term_seen(s(15), "cp-1", 2)
            .intent(s(18), "ctl-1", "op-1")
            .executed(s(19), "cp-1", "op-1", 2, "cp-2")
            .power(s(20), "cp-2", Off)
            .heal(s(20), 1)
            .power(s(30), "cp-2", On)
            .health(s(40), "cp-2", true)
            .workload(s(60), 900, 4, &[])
            .end(s(60));
        b
    }

    /// The count on the table's row `label`.
    fn count(table: &str, label: &str) -> Option<u64> {
        table.lines().find_map(|l| {
            let (name, n) = l.trim().rsplit_once(' ')?;
            (name.trim() == label).then(|| n.parse().ok())?
        })
    }

    #[test]
    fn the_table_counts_faults_fences_commands_terms_and_the_workload() {
        let history = fenced().build();
        let table = table(&check(&history, &Params::default()), "standalone", 7);
        assert!(
            table.starts_with("soak: standalone backend, seed 7, 1:00.000 of history\n"),
            "{table}"
        );
        for (label, n) in [
            ("host-hang", 1),
            ("bmc-slow", 1),
            ("partition", 0),
            ("all faults", 2),
            ("power-offs", 1),
            ("power-ons", 1),
            ("executed", 1),
            ("refused (older term)", 0),
            ("leaderships", 1),
            ("highest term", 2),
            ("newer terms seen by agents", 1),
            ("acked", 900),
            ("failed", 4),
            ("lost", 0),
            ("all violations", 0),
        ] {
            assert_eq!(count(&table, label), Some(n), "{label} in\n{table}");
        }
    }

    #[test]
    fn the_table_lists_every_rule_with_its_count_zeros_included() {
        let mut b = fenced();
        b.power(s(50), "cp-3", Off).power(s(51), "cp-5", Off);
        let table = table(&check(&b.build(), &Params::default()), "kubernetes", 9);
        for rule in Rule::ALL {
            let expected = match rule {
                Rule::UnjustifiedPowerOff => 2,
                Rule::TwoHostsOff => 1,
                _ => 0,
            };
            assert_eq!(
                count(&table, rule.name()),
                Some(expected),
                "{rule} in\n{table}"
            );
        }
        assert_eq!(count(&table, "all violations"), Some(3));
    }

    #[test]
    fn a_history_without_a_workload_result_says_so() {
        let mut b = HistoryBuilder::new();
        b.end(s(1));
        let table = table(&check(&b.build(), &Params::default()), "standalone", 1);
        assert!(
            table.contains("workload\n  no result recorded\n"),
            "{table}"
        );
    }

    #[test]
    fn around_gives_the_ndjson_lines_within_the_window_ends_included() {
        let history = fenced().build();
        let lines = around(&history, s(20), 1000);
        let times: Vec<u64> = crate::soak::history::parse(&lines)
            .unwrap()
            .iter()
            .map(|e| e.t)
            .collect();
        assert_eq!(times.first(), Some(&s(19)));
        assert_eq!(times.last(), Some(&s(21)));
        assert!(lines.contains(r#"{"t":20000,"kind":"power","host":"cp-2","state":"off"}"#));
        assert_eq!(around(&history, s(1000), 1000), "");
    }

    #[test]
    fn a_passing_soak_renders_no_replay_line() {
        let history = fenced().build();
        let out = render(
            &history,
            &check(&history, &Params::default()),
            7,
            "standalone",
        );
        assert!(out.contains("\nevery rule held\n"), "{out}");
        assert!(!out.contains("replay:"), "{out}");
    }

    #[test]
    fn a_violation_renders_with_the_history_around_it_and_the_replay_command() {
        let mut b = fenced();
        b.intent(s(48), "ctl-1", "op-2")
            .executed(s(49), "cp-1", "op-2", 2, "cp-3")
            .power(s(50), "cp-3", Off);
        let history = b.build();
        let verdict = check(&history, &Params::default());
        let out = render(&history, &verdict, 7, "standalone");
        assert!(
            out.contains("\n[unjustified-power-off] at 0:50.000: cp-3 was powered off"),
            "{out}"
        );
        assert!(
            out.contains("history from 0:40.000 to 1:00.000:\n"),
            "{out}"
        );
        assert!(out.contains(r#"{"t":50000,"kind":"power","host":"cp-3","state":"off"}"#));
        assert!(!out.contains(r#"{"t":30000,"#), "{out}");
        assert!(
            out.ends_with("\nreplay: scripts/soak.sh --seed 7\n"),
            "{out}"
        );

        let kube = render(&history, &verdict, 11, "kubernetes");
        assert!(
            kube.contains("\nreplay: scripts/soak.sh --kubernetes --seed 11\n"),
            "{kube}"
        );
    }

    #[test]
    fn many_violations_render_the_first_ones_and_count_the_rest() {
        let mut b = fenced();
        for i in 0..SHOWN_VIOLATIONS as u64 + 3 {
            b.workload(s(60), 0, 0, &[&format!("k/{i}")]);
        }
        let history = b.build();
        let out = render(
            &history,
            &check(&history, &Params::default()),
            7,
            "standalone",
        );
        assert_eq!(
            out.matches("\n[acked-lost] at").count(),
            SHOWN_VIOLATIONS,
            "{out}"
        );
        assert!(out.contains("… and 3 more violations"), "{out}");
    }

    #[test]
    fn what_could_not_be_judged_is_listed() {
        let mut b = HistoryBuilder::new();
        b.fault(s(10), 1, HostHang, "cp-2")
            .power(s(20), "cp-2", Off);
        let history = b.build();
        let out = render(
            &history,
            &check(&history, &Params::default()),
            7,
            "standalone",
        );
        let notes = out.split_once("\nnot judged:\n").map(|(_, notes)| notes);
        assert!(
            notes.is_some_and(|n| n.contains("  power-off of cp-2 at 0:20.000: no etcd sample")),
            "{out}"
        );
    }
}
