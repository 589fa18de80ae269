//! `partition`: one host's link goes down (netns mode) → its agent falls silent and its etcd
//! member is cut off, while both keep running → the majority keeps serving writes → the
//! controller fences the partitioned host through its BMC (on the management network, still
//! reachable) with another host's agent → once the fence took effect (and the majority took
//! writes after its election), the link is repaired → the host is healthy again → no data
//! lost.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::{OVERHEAD, Report, fence_executor, unix_ms};
use crate::etcd::{ClientTls, etcdctl_with};
use crate::lab::Lab;
use crate::{HarnessError, Result};

/// Pause between two writes through the majority during the partition.
const WRITE_PERIOD: Duration = Duration::from_millis(200);
/// Timeout of one write through the majority: a write stuck on the lost leader must not hide
/// the writes after the election.
const WRITE_TIMEOUT: Duration = Duration::from_secs(2);

/// Writes through the majority while one host was partitioned.
#[derive(Debug, Clone, Default)]
pub struct MajorityWrites {
    /// Writes that succeeded.
    pub succeeded: usize,
    /// Of those, the writes issued after the grace period.
    pub succeeded_after_grace: usize,
    /// Writes that failed while the majority may still have been electing a leader (issued
    /// within the grace period after the partition).
    pub failed_in_grace: usize,
    /// Writes that failed after the grace period: each one means the majority did not serve.
    pub failed_after_grace: Vec<String>,
    /// The grace period: two election timeouts, as etcd randomises a follower's election
    /// timeout between one and two of them before it campaigns.
    pub grace: Duration,
}

/// What the `partition` scenario saw, for tests that assert more than [`Report::ok`].
#[derive(Debug, Clone)]
pub struct PartitionOutcome {
    /// The summary the lab prints.
    pub report: Report,
    /// The partitioned host's name.
    pub target: String,
    /// Power-offs of the partitioned host's BMC.
    pub power_offs: usize,
    /// Power events of every other host's BMC, as `(host, event)`.
    pub other_power_events: Vec<(String, String)>,
    /// The host whose agent executed the fence (`None` if the status did not show one).
    pub executor: Option<String>,
    /// Partition → verified off, by the BMC's own power record.
    pub fenced_after: Duration,
    /// The configured detection timeout plus [`OVERHEAD`]: the bound on `fenced_after`.
    pub fence_budget: Duration,
    /// Writes through the majority during the partition.
    pub writes: MajorityWrites,
    /// Keys written (before and during the partition) that are missing or wrong at the end.
    pub missing: Vec<String>,
    /// Keys written in all.
    pub keys: usize,
}

/// Runs the `partition` scenario on host `target` and returns its summary.
pub fn partition(lab: &mut Lab, target: usize) -> Result<Report> {
    observe_partition(lab, target).map(|o| o.report)
}

/// Runs the `partition` scenario on host `target` and returns everything it saw.
pub fn observe_partition(lab: &mut Lab, target: usize) -> Result<PartitionOutcome> {
    if lab.network().is_none() {
        return Err(HarnessError::Other(
            "the partition scenario needs a lab in netns mode (metalguard-lab --netns, as root)"
                .into(),
        ));
    }
    lab.new_scenario();
    let name = lab.hosts()[target].name.clone();
    let t = lab.options().timings.clone();
    let mut data = lab.write_data("/lab/partition", 20)?;
    lab.timeline
        .add("lab", "wrote 20 keys to etcd", "checked after recovery");
    let majority = lab.endpoints_except(target);
    let tls = lab.etcd().client_tls();
    let grace = lab.etcd().options().election_timeout * 2;
    let mut writes = MajorityWrites {
        grace,
        ..MajorityWrites::default()
    };
    let since = unix_ms();
    let started = Instant::now();
    lab.partition(target)?;
    let detect = t.heartbeat_timeout.max(t.unhealthy_timeout);
    let fence_budget = detect + OVERHEAD;
    // The writes run on their own thread, so a slow tick (the lab's status reads still try
    // the partitioned member) does not thin them out.
    let stop = AtomicBool::new(false);
    let waited = std::thread::scope(|s| {
        let writing =
            s.spawn(|| write_until_stopped(&majority, tls.as_ref(), started, &mut writes, &stop));
        let waited = lab.wait_for(&format!("{name} to be powered off"), fence_budget, |lab| {
            Ok(lab.power_offs_since(target, since)? > 0)
        });
        // Writes issued from now on would not be "during the partition".
        stop.store(true, Ordering::Relaxed);
        let healed = waited.and_then(|waited| {
            // The lab's BMCs switch power at once, so the host may already be on: apply the
            // power change to its processes, then repair the link before it can be judged
            // again (in a real data centre the boot takes longer than the repair).
            lab.tick()?;
            let why = if lab.hosts()[target].powered() {
                "the host was fenced and is booting; an operator fixed the switch port"
            } else {
                "the host was fenced and is off; an operator fixed the switch port"
            };
            lab.heal(target, why)?;
            Ok(waited)
        });
        let written = writing
            .join()
            .map_err(|_| HarnessError::Other("the majority writer panicked".into()))?;
        data.extend(written);
        healed
    })?;
    lab.timeline.add(
        "lab",
        format!(
            "{} writes through the majority during the partition",
            writes.succeeded
        ),
        format!(
            "{} failed within the {:.1}s election grace, {} after it",
            writes.failed_in_grace,
            writes.grace.as_secs_f64(),
            writes.failed_after_grace.len()
        ),
    );
    let super::Recovery {
        fenced: fenced_after,
        healthy,
        offs: power_offs,
        others: other_power_events,
    } = super::recover(lab, target, since, started, waited)?;
    let missing = lab.check_data(&data)?;
    let executor = fence_executor(lab, &name);
    let ok = power_offs == 1
        && other_power_events.is_empty()
        && executor.as_ref().is_some_and(|e| *e != name)
        && fenced_after <= fence_budget
        && writes.succeeded_after_grace > 0
        && writes.failed_after_grace.is_empty()
        && missing.is_empty();
    let report = Report {
        name: "partition",
        expected: format!(
            "{name} fenced once by another host's agent within {}s; the majority keeps \
             accepting writes; healthy again after the repair; no data lost",
            fence_budget.as_secs()
        ),
        seen: format!(
            "fenced by agent {} after {:.1}s ({power_offs} power-off), healthy after {:.1}s, \
             other hosts' power events {}, majority writes {} ok ({} after the {:.1}s election \
             grace) / {} failed after the grace ({} within it), {} of {} keys missing",
            executor.as_deref().unwrap_or("?"),
            fenced_after.as_secs_f64(),
            healthy.as_secs_f64(),
            other_power_events.len(),
            writes.succeeded,
            writes.succeeded_after_grace,
            writes.grace.as_secs_f64(),
            writes.failed_after_grace.len(),
            writes.failed_in_grace,
            missing.len(),
            data.len()
        ),
        ok,
        took: started.elapsed(),
        timings: vec![
            ("partition → verified off".into(), fenced_after),
            ("partition → healthy".into(), healthy),
        ],
    };
    Ok(PartitionOutcome {
        report,
        target: name,
        power_offs,
        other_power_events,
        executor,
        fenced_after,
        fence_budget,
        writes,
        missing,
        keys: data.len(),
    })
}

/// Writes a key through `majority` every [`WRITE_PERIOD`] until `stop`; returns the keys
/// written and counts the outcomes in `writes`.
fn write_until_stopped(
    majority: &[String],
    tls: Option<&ClientTls>,
    started: Instant,
    writes: &mut MajorityWrites,
    stop: &AtomicBool,
) -> Vec<(String, String)> {
    let mut written = Vec::new();
    while !stop.load(Ordering::Relaxed) {
        let issued = started.elapsed();
        let key = format!("/lab/partition/during/{:06}", issued.as_millis());
        let value = format!("written-through-the-majority-at-{}ms", issued.as_millis());
        match etcdctl_with(majority, tls, WRITE_TIMEOUT, &["put", &key, &value]) {
            Ok(_) => {
                writes.succeeded += 1;
                if issued >= writes.grace {
                    writes.succeeded_after_grace += 1;
                }
                written.push((key, value));
            }
            Err(_) if issued < writes.grace => writes.failed_in_grace += 1,
            Err(e) => writes
                .failed_after_grace
                .push(format!("{key} at {:.1}s: {e}", issued.as_secs_f64())),
        }
        std::thread::sleep(WRITE_PERIOD);
    }
    written
}
