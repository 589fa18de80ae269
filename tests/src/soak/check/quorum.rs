//! Rules quorum-lost and schedule-exceeded: etcd seen without quorum for longer than the
//! grace, blamed on metalguard while the nemesis kept within what etcd tolerates and on the
//! driver when it did not.

use super::timeline::{Sample, Timeline};
use super::{Params, Rule, Violation, format_time, millis};

/// Each run of consecutive samples without quorum that lasts (first to last sample) longer
/// than `quorum_grace`: schedule-exceeded if at one of its samples more hosts had a fault in
/// place that takes their member away than that sample's voters tolerate, else quorum-lost.
/// Both are reported at the run's first sample.
pub(super) fn find_quorum_losses(index: &Timeline<'_>, params: &Params) -> Vec<Violation> {
    let grace = millis(params.quorum_grace);
    index
        .samples
        .chunk_by(|a, b| a.quorum == b.quorum)
        .filter(|run| run.first().is_some_and(|s| !s.quorum))
        .filter_map(|run| judge_run(index, run, grace))
        .collect()
}

fn judge_run(index: &Timeline<'_>, run: &[Sample<'_>], grace: u64) -> Option<Violation> {
    let (first, last) = (run.first()?, run.last()?);
    let lasted = last.t - first.t;
    if lasted <= grace {
        return None;
    }
    let span = format!(
        "etcd had no quorum from {} to {} ({} ms, {} samples)",
        format_time(first.t),
        format_time(last.t),
        lasted,
        run.len()
    );
    let exceeded = run.iter().find_map(|s| {
        let away = index.hosts_without_member_at(s.t);
        (away.len() > s.tolerance()).then_some((s, away))
    });
    if let Some((s, away)) = exceeded {
        return Some(Violation {
            rule: Rule::ScheduleExceeded,
            t: first.t,
            message: format!(
                "{span}, and at {} the nemesis had {} members away ({}) of {} voters, which \
                 tolerate {}",
                format_time(s.t),
                away.len(),
                away.join(", "),
                s.voters(),
                s.tolerance()
            ),
        });
    }
    let most = run
        .iter()
        .map(|s| index.hosts_without_member_at(s.t).len())
        .max()
        .unwrap_or(0);
    Some(Violation {
        rule: Rule::QuorumLost,
        t: first.t,
        message: format!(
            "{span}, longer than the {grace} ms grace, while the nemesis had at most {most} \
             members away of {} voters",
            first.voters()
        ),
    })
}
