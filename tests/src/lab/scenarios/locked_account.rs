//! `locked-account`: the account of a healthy host's BMC is locked on the BMC (as its
//! administrator, or its lockout policy after failed logins, would). A person asks
//! `metalguard-controller check-bmc HOST` (in Kubernetes mode with `--kubeconfig`): the agent
//! that would fence the host logs in at once, is refused, and the command fails naming a locked
//! account, well within one check period; `status` says a fence of the host would fail
//! (`account-locked`) while the host is healthy, and no power changes anywhere. Unlocked, the
//! next on-demand check passes (the agent tries a person's request once even while its logins
//! back off, but at most once a period: the command waits for it).

use std::time::{Duration, Instant};

use super::{Report, unix_ms};
use crate::Result;
use crate::lab::Lab;

/// The scenario.
pub fn locked_account(lab: &mut Lab) -> Result<Report> {
    lab.new_scenario();
    let started = Instant::now();
    let since = unix_ms();
    let period = lab.options().timings.bmc_check_period;
    // The last host in service (a spare on standby is not in the inventory): a Redfish BMC.
    let target = lab.in_service().last().copied().unwrap_or(0);
    let name = lab.hosts()[target].name.clone();
    // A person's check goes at once; the wait covers a controller that is still handing out
    // its first grants.
    let (before_ok, before) = lab.check_bmc_cli(&name, Duration::from_secs(60))?;
    lab.timeline.add(
        "admin",
        format!("metalguard-controller check-bmc {name}"),
        last_line(&before),
    );
    lab.lock_bmc_account(target, true)?;
    let asked = Instant::now();
    let (locked_ok, locked) = lab.check_bmc_cli(&name, period * 2 + Duration::from_secs(10))?;
    let answered = asked.elapsed();
    lab.timeline.add(
        "admin",
        format!("metalguard-controller check-bmc {name} (account locked)"),
        last_line(&locked),
    );
    let named = locked.contains("account-locked") || locked.contains("AccountLocked");
    let reported = lab
        .wait_for(
            &format!("status to say a fence of {name} would fail (account-locked)"),
            Duration::from_secs(15),
            |lab| {
                Ok(lab
                    .last_status()
                    .is_some_and(|s| s["fencing"][&name]["failure"] == "account-locked"))
            },
        )
        .is_ok();
    let healthy_meanwhile = lab.host_healthy(target);
    lab.lock_bmc_account(target, false)?;
    // The agent tried this host's login a moment ago: a new request waits for the period.
    let (after_ok, after) = lab.check_bmc_cli(&name, period * 2 + Duration::from_secs(10))?;
    lab.timeline.add(
        "admin",
        format!("metalguard-controller check-bmc {name} (unlocked)"),
        last_line(&after),
    );
    let events = lab.power_events_since(since)?;
    let ok = before_ok
        && !locked_ok
        && named
        && answered < period
        && reported
        && healthy_meanwhile
        && after_ok
        && events.is_empty();
    Ok(Report {
        name: "locked-account",
        expected: format!(
            "check-bmc {name}: passes; account locked: fails naming the lock within one check period ({period:?}), status not ready (account-locked), host healthy; unlocked: passes; no power events"
        ),
        seen: format!(
            "before: passed {before_ok}; locked: failed {}, named the lock {named}, answered in {:.1}s: {:?}; status account-locked: {reported}; healthy meanwhile: {healthy_meanwhile}; unlocked: passed {after_ok}; {} power events",
            !locked_ok,
            answered.as_secs_f64(),
            last_line(&locked),
            events.len()
        ),
        ok,
        took: started.elapsed(),
        timings: vec![("check-bmc asked → answered (locked)".into(), answered)],
    })
}

/// The last non-empty line of a command's output (its verdict).
pub(super) fn last_line(out: &str) -> String {
    out.lines()
        .rev()
        .find(|l| !l.trim().is_empty())
        .unwrap_or_default()
        .trim()
        .to_owned()
}
