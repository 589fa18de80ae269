//! `metalguard-soak`: the nemesis soak (issue 24). A lab of five control-plane hosts and two
//! controllers, a workload writing keys, a seeded random schedule of faults; the history is
//! checked at the end and the report printed. Exit status: 0 when no rule was broken, 1 on a
//! violation, 2 when the soak itself could not run.
//!
//! ```text
//! metalguard-soak [--kubernetes] [--seed N] [--duration SECONDS] [--out DIR] [--no-netns] [--lag] [--live]
//! metalguard-soak check HISTORY.ndjson       check a recorded history again
//! metalguard-soak plan [--kubernetes] [--seed N] [--duration SECONDS]
//!                                             print the schedule a seed makes, and run nothing
//! ```
//! The binaries `metalguard-agent` and `metalguard-controller` are taken from the directory
//! of this executable unless `--bin-dir` says otherwise.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use metalguard_e2e::lab::Timings;
use metalguard_e2e::soak::check::{Params, check};
use metalguard_e2e::soak::history::parse;
use metalguard_e2e::soak::report::render;
use metalguard_e2e::soak::run::{SoakOptions, run, shape};
use metalguard_e2e::soak::schedule;

const USAGE: &str = "usage: metalguard-soak [plan] [--kubernetes] [--seed N] [--duration SECONDS] [--out DIR] [--bin-dir DIR] [--no-netns] [--lag] [--live]\n       metalguard-soak check HISTORY.ndjson";

/// What the command line asks for.
enum Job {
    Soak(SoakOptions),
    Plan(SoakOptions),
    Check(PathBuf),
}

fn parse_args() -> Result<Job, String> {
    let mut args = std::env::args().skip(1);
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(PathBuf::from))
        .unwrap_or_default();
    let mut options = SoakOptions {
        seed: 1,
        duration: Duration::from_secs(120),
        kubernetes: false,
        netns: nix::unistd::Uid::effective().is_root(),
        bin_dir: exe_dir,
        out_dir: PathBuf::new(),
        live: false,
        lag: false,
    };
    let mut out = None;
    let mut plan_only = false;
    while let Some(arg) = args.next() {
        let mut value = |name: &str| args.next().ok_or(format!("{name} needs a value\n{USAGE}"));
        match arg.as_str() {
            "check" => return Ok(Job::Check(PathBuf::from(value("check")?))),
            "plan" => plan_only = true,
            "--kubernetes" => options.kubernetes = true,
            "--no-netns" => options.netns = false,
            "--live" => options.live = true,
            "--lag" => options.lag = true,
            "--seed" => {
                options.seed = value("--seed")?
                    .parse()
                    .map_err(|e| format!("--seed: {e}"))?;
            }
            "--duration" => {
                let secs: u64 = value("--duration")?
                    .parse()
                    .map_err(|e| format!("--duration (seconds): {e}"))?;
                options.duration = Duration::from_secs(secs);
            }
            "--out" => out = Some(PathBuf::from(value("--out")?)),
            "--bin-dir" => options.bin_dir = PathBuf::from(value("--bin-dir")?),
            "-h" | "--help" => return Err(USAGE.into()),
            other => return Err(format!("unknown argument {other}\n{USAGE}")),
        }
    }
    options.out_dir = out.unwrap_or_else(|| {
        PathBuf::from(format!(
            "target/soak/{}-seed-{}",
            if options.kubernetes {
                "kubernetes"
            } else {
                "standalone"
            },
            options.seed
        ))
    });
    Ok(if plan_only {
        Job::Plan(options)
    } else {
        Job::Soak(options)
    })
}

fn main() -> ExitCode {
    let options = match parse_args() {
        Ok(Job::Soak(options)) => options,
        Ok(Job::Plan(options)) => return print_plan(&options),
        Ok(Job::Check(history)) => return recheck(&history),
        Err(message) => {
            eprintln!("{message}");
            return ExitCode::from(2);
        }
    };
    eprintln!(
        "soak: {} backend, seed {}, {} s of faults; history in {}",
        if options.kubernetes {
            "kubernetes"
        } else {
            "standalone"
        },
        options.seed,
        options.duration.as_secs(),
        options.out_dir.display()
    );
    match run(&options) {
        Ok(outcome) => {
            println!("{}", outcome.report);
            println!(
                "faults injected: {}; settled afterwards: {}; history: {}",
                outcome.faults,
                outcome.settled,
                outcome.history.display()
            );
            if outcome.verdict.passed() {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(e) => {
            eprintln!("soak: could not run: {e}");
            ExitCode::from(2)
        }
    }
}

fn recheck(path: &PathBuf) -> ExitCode {
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            return ExitCode::from(2);
        }
    };
    let history = match parse(&text) {
        Ok(h) => h,
        Err(e) => {
            eprintln!("{}: {e}", path.display());
            return ExitCode::from(2);
        }
    };
    let (seed, backend) = history
        .iter()
        .find_map(|e| match &e.event {
            metalguard_e2e::soak::history::Event::Start { seed, backend, .. } => {
                Some((*seed, backend.clone()))
            }
            _ => None,
        })
        .unwrap_or((0, "unknown".into()));
    let verdict = check(&history, &Params::default());
    println!("{}", render(&history, &verdict, seed, &backend));
    if verdict.passed() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn print_plan(options: &SoakOptions) -> ExitCode {
    let shape = shape(options, &Timings::default());
    for p in schedule::plan(options.seed, &shape) {
        println!(
            "{:>8.1} s  {:<18} {:?} for {:.1} s",
            p.at.as_secs_f64(),
            p.fault.name(),
            p.target,
            p.lasts.as_secs_f64()
        );
    }
    ExitCode::SUCCESS
}
