//! A builder of small synthetic histories for the checker's and the report's tests.

use crate::soak::history::{Entry, Event, FaultKind, MemberSample, Power};

/// The lab's control-plane hosts.
pub(crate) const HOSTS: [&str; 5] = ["cp-1", "cp-2", "cp-3", "cp-4", "cp-5"];

/// Seconds as the history's milliseconds.
pub(crate) fn s(secs: u64) -> u64 {
    secs * 1000
}

/// Pushes events with their times; [`HistoryBuilder::build`] puts them in time order (stably,
/// so events pushed for the same time keep their order).
#[derive(Debug, Default)]
pub(crate) struct HistoryBuilder {
    entries: Vec<Entry>,
}

impl HistoryBuilder {
    /// A history that starts (seed 7, standalone, five hosts, two controllers, 600 s).
    pub fn new() -> Self {
        let mut b = Self::default();
        b.push(
            0,
            Event::Start {
                seed: 7,
                backend: "standalone".into(),
                hosts: HOSTS.iter().map(ToString::to_string).collect(),
                controllers: vec!["ctl-1".into(), "ctl-2".into()],
                duration_s: 600,
            },
        );
        b
    }

    /// Any event at `t`.
    pub fn push(&mut self, t: u64, event: Event) -> &mut Self {
        self.entries.push(Entry { t, event });
        self
    }

    /// The nemesis injects fault `id` of `fault` on `target`.
    pub fn fault(&mut self, t: u64, id: u64, fault: FaultKind, target: &str) -> &mut Self {
        self.push(
            t,
            Event::FaultStart {
                id,
                fault,
                target: target.into(),
            },
        )
    }

    /// The nemesis heals fault `id`.
    pub fn heal(&mut self, t: u64, id: u64) -> &mut Self {
        self.push(
            t,
            Event::FaultEnd {
                id,
                how: "healed".into(),
            },
        )
    }

    /// `host`'s BMC records a power change.
    pub fn power(&mut self, t: u64, host: &str, state: Power) -> &mut Self {
        self.push(
            t,
            Event::Power {
                host: host.into(),
                state,
            },
        )
    }

    /// A sample of the five voters, all healthy but `unhealthy`.
    pub fn sample(&mut self, t: u64, unhealthy: &[&str], quorum: bool) -> &mut Self {
        let members = HOSTS
            .iter()
            .map(|h| MemberSample {
                name: (*h).into(),
                voter: true,
                healthy: !unhealthy.contains(h),
            })
            .collect();
        self.push(t, Event::EtcdSample { members, quorum })
    }

    /// Samples every second in `[from, to]`.
    pub fn samples(&mut self, from: u64, to: u64, unhealthy: &[&str], quorum: bool) -> &mut Self {
        for t in (from..=to).step_by(1000) {
            self.sample(t, unhealthy, quorum);
        }
        self
    }

    /// The lab judges `host` healthy or not.
    pub fn health(&mut self, t: u64, host: &str, healthy: bool) -> &mut Self {
        self.push(
            t,
            Event::HostHealth {
                host: host.into(),
                healthy,
            },
        )
    }

    /// `controller` begins leading in `term`.
    pub fn leader(&mut self, t: u64, controller: &str, term: u64) -> &mut Self {
        self.push(
            t,
            Event::Leader {
                controller: controller.into(),
                term,
            },
        )
    }

    /// `agent` sees `term`.
    pub fn term_seen(&mut self, t: u64, agent: &str, term: u64) -> &mut Self {
        self.push(
            t,
            Event::TermSeen {
                agent: agent.into(),
                term,
            },
        )
    }

    /// `controller` persists the intent of op `op` (a decision).
    pub fn intent(&mut self, t: u64, controller: &str, op: &str) -> &mut Self {
        self.push(
            t,
            Event::Intent {
                controller: controller.into(),
                op: op.into(),
                reason: "host unhealthy".into(),
            },
        )
    }

    /// A fence of `target` (`off`) executed by `agent` in `term`.
    pub fn executed(
        &mut self,
        t: u64,
        agent: &str,
        op: &str,
        term: u64,
        target: &str,
    ) -> &mut Self {
        self.push(
            t,
            Event::CommandExecuted {
                agent: agent.into(),
                op: op.into(),
                command: "fence".into(),
                term,
                target: Some(target.into()),
                action: Some("off".into()),
            },
        )
    }

    /// `agent` refuses op `op` of `term`, having seen `seen`.
    pub fn refused(&mut self, t: u64, agent: &str, op: &str, term: u64, seen: u64) -> &mut Self {
        self.push(
            t,
            Event::CommandRefused {
                agent: agent.into(),
                op: op.into(),
                term,
                seen,
            },
        )
    }

    /// A remediation of `target` enters `phase`.
    pub fn remediation(&mut self, t: u64, id: &str, target: &str, phase: &str) -> &mut Self {
        self.push(
            t,
            Event::Remediation {
                id: id.into(),
                target: target.into(),
                phase: phase.into(),
            },
        )
    }

    /// The workload's result.
    pub fn workload(&mut self, t: u64, acked: u64, failed: u64, lost: &[&str]) -> &mut Self {
        self.push(
            t,
            Event::Workload {
                acked,
                failed,
                lost: lost.iter().map(ToString::to_string).collect(),
            },
        )
    }

    /// The soak ends.
    pub fn end(&mut self, t: u64) -> &mut Self {
        self.push(t, Event::End)
    }

    /// The entries in time order.
    pub fn build(&self) -> Vec<Entry> {
        let mut entries = self.entries.clone();
        entries.sort_by_key(|e| e.t);
        entries
    }
}
