//! What the lab tests of both backends share: starting a lab, running a scenario, and reading
//! a phase timing, each failing the test with what it needs to be understood (the reason the
//! lab did not start; the timeline and the processes' logs).

// Not every test binary uses every helper.
#![allow(dead_code)]

use std::time::Duration;

use metalguard_e2e::lab::scenarios::{self, Report};
use metalguard_e2e::lab::{Lab, LabOptions};

/// Starts a lab; one that does not start fails the test, saying why.
pub fn start(options: LabOptions) -> Lab {
    let backend = options.backend;
    match Lab::start(options) {
        Ok(lab) => lab,
        Err(e) => panic!("the lab ({backend:?} backend) did not start: {e}"),
    }
}

/// Runs scenario `name` and returns its report, after printing it with its timeline; an
/// error or an outcome that did not match fails the test with the timeline and the
/// processes' logs.
pub fn run(lab: &mut Lab, name: &str) -> Report {
    let report = match scenarios::run(lab, name) {
        Ok(report) => report,
        Err(e) => panic!(
            "scenario {name} failed: {e}\n--- timeline\n{}\n--- logs\n{}",
            lab.timeline.render(),
            lab.logs()
        ),
    };
    assert!(
        report.ok,
        "scenario {name} did not match its outcome\nexpected: {}\nseen:     {}\n--- timeline\n{}\n--- logs\n{}",
        report.expected,
        report.seen,
        lab.timeline.render(),
        lab.logs()
    );
    eprintln!(
        "{name}: {}\ntimings: {:?}\n{}",
        report.seen,
        report.timings,
        lab.timeline.render()
    );
    report
}

/// The phase timing `name` of `report`.
pub fn timing(report: &Report, name: &str) -> Duration {
    report.timings.iter().find(|(n, _)| n == name).map_or_else(
        || panic!("{} has no timing {name}: {:?}", report.name, report.timings),
        |(_, d)| *d,
    )
}
