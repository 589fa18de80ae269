//! `metalguard-controller plan`: the decision core as a scriptable dry run.
//!
//! Reads a snapshot (and optionally a policy) from files, plans for a fixed `--now` (or the
//! clock), and prints the plan as text or as JSON. With `--now` the output is a pure
//! function of the files: the same inputs give the same bytes. Exit status: 0 planned,
//! 2 an input could not be read or parsed (nothing is printed on stdout), 3 the snapshot is
//! inconsistent (duplicate hosts, members or remediations): the plan that says so is printed
//! and nothing is planned.

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context as _;
use clap::{Args, ValueEnum};
use metalguard_api::duration::Timestamp;
use metalguard_api::plan::{Plan, ReasonKind};
use metalguard_api::policy::Policy;
use metalguard_api::snapshot::Snapshot;

/// Exit status when an input cannot be read or parsed.
pub const EXIT_BAD_INPUT: u8 = 2;
/// Exit status when the snapshot is inconsistent and nothing could be planned.
pub const EXIT_INVALID_SNAPSHOT: u8 = 3;

/// How the plan is printed.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, ValueEnum)]
pub enum PlanOutput {
    /// The explanation people read.
    #[default]
    Text,
    /// The `Plan` as JSON (documented in docs/design-core.md).
    Json,
}

/// Arguments of `metalguard-controller plan`.
#[derive(Debug, Args)]
pub struct PlanArgs {
    /// A snapshot (JSON).
    #[arg(long)]
    snapshot: PathBuf,
    /// The policy (JSON); default: no health checks, default remediation settings.
    #[arg(long)]
    policy: Option<PathBuf>,
    /// Plan as of this time instead of the clock: RFC 3339 (`2026-11-25T10:00:00Z`) or
    /// milliseconds since the Unix epoch.
    #[arg(long, value_parser = parse_now)]
    now: Option<Timestamp>,
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    output: PlanOutput,
}

/// Parses `--now`.
fn parse_now(text: &str) -> Result<Timestamp, String> {
    if let Ok(ms) = text.parse::<u64>() {
        return Ok(Timestamp(ms));
    }
    let at = humantime::parse_rfc3339_weak(text).map_err(|e| {
        format!("{text:?} is neither RFC 3339 nor milliseconds since the epoch: {e}")
    })?;
    let ms = at
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|_| format!("{text:?} is before 1970"))?
        .as_millis();
    u64::try_from(ms)
        .map(Timestamp)
        .map_err(|_| format!("{text:?} is too far in the future"))
}

fn read_json<T: serde::de::DeserializeOwned>(path: &Path, what: &str) -> anyhow::Result<T> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("{what} {} could not be read", path.display()))?;
    serde_json::from_str(&text).with_context(|| format!("{what} {} is invalid", path.display()))
}

/// The plan for the files, and whether the snapshot was inconsistent.
fn plan_for(args: &PlanArgs) -> anyhow::Result<(Plan, bool)> {
    let snapshot: Snapshot = read_json(&args.snapshot, "snapshot")?;
    let policy: Policy = match &args.policy {
        Some(path) => read_json(path, "policy")?,
        None => Policy::default(),
    };
    let now = args.now.unwrap_or_else(crate::clock::now);
    let plan = metalguard_core::plan(&snapshot, &policy, now);
    let invalid = plan.refusals.iter().any(|r| r.kind == ReasonKind::Invalid);
    Ok((plan, invalid))
}

/// Renders `plan` in `output`.
fn render(plan: &Plan, output: PlanOutput) -> anyhow::Result<String> {
    Ok(match output {
        PlanOutput::Text => plan.to_string(),
        PlanOutput::Json => {
            let mut text = serde_json::to_string_pretty(plan).context("plan as JSON")?;
            text.push('\n');
            text
        }
    })
}

/// Runs `plan`; see the module for the exit status.
pub fn run(args: &PlanArgs) -> ExitCode {
    let result =
        plan_for(args).and_then(|(plan, invalid)| Ok((render(&plan, args.output)?, invalid)));
    match result {
        Ok((text, invalid)) => {
            print!("{text}");
            if invalid {
                eprintln!("error: the snapshot is inconsistent; nothing was planned");
                ExitCode::from(EXIT_INVALID_SNAPSHOT)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(error) => {
            eprintln!("error: {}", crate::error::chain(error.as_ref()));
            ExitCode::from(EXIT_BAD_INPUT)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_reads_rfc_3339_and_milliseconds() {
        assert_eq!(parse_now("1500"), Ok(Timestamp(1500)));
        assert_eq!(
            parse_now("2026-11-25T10:00:00Z"),
            Ok(Timestamp(1_795_600_800_000))
        );
        let err = parse_now("yesterday").unwrap_err();
        assert!(err.contains("neither RFC 3339"), "{err}");
    }
}
