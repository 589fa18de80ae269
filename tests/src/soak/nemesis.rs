//! The nemesis: injects the [schedule](super::schedule)'s faults into a running lab at their
//! times and undoes each when it is due, recording both ends in the history.
//!
//! Data flow: the driver calls [`Nemesis::step`] on every tick with the soak's clock → due
//! faults start (a controller fault hits whichever replica leads then, as the logs tell) →
//! expired ones are healed → `fault-start` / `fault-end` entries. A hang whose host was
//! power-cycled meanwhile ends `power-cycled`: the fence ended it, there is nothing to thaw.

use std::collections::VecDeque;
use std::time::Duration;

use super::history::{Event, FaultKind};
use super::recorder::{Recorder, unix_ms};
use super::schedule::{Planned, Target};
use crate::lab::Lab;
use crate::{HarnessError, Result};

/// How much longer than a takeover (the leader's lease) a `leader-lag` fault holds the
/// leader's answers: its agents have seen the newer term before its last answers arrive. The
/// soak gives agents a request timeout longer than the lag ([`agent_request_timeout`]), so
/// that those answers are still read.
const LAG_PAST_LEASE: Duration = Duration::from_secs(5);

/// How long a `leader-lag` fault holds the answers of a leader whose lease is `lease`.
pub fn leader_lag(lease: Duration) -> Duration {
    lease + LAG_PAST_LEASE
}

/// The agents' request timeout in a soak with `leader-lag` faults: an answer held for
/// [`leader_lag`] still arrives within it.
pub fn agent_request_timeout(lease: Duration) -> Duration {
    leader_lag(lease) + Duration::from_secs(2)
}

/// A slow BMC is frozen this long at a time …
const SLOW_FROZEN: Duration = Duration::from_millis(2500);
/// … and answers for this long in between.
const SLOW_AWAKE: Duration = Duration::from_millis(700);

/// What an injected fault hit.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Hit {
    Host(usize),
    Controller(usize),
    Apiserver,
}

#[derive(Debug)]
struct Active {
    id: u64,
    fault: FaultKind,
    hit: Hit,
    until: Duration,
    began_unix_ms: u64,
    /// A slow BMC: when it next toggles, and whether it is frozen now.
    toggle: Option<(Duration, bool)>,
    /// A lagging leader: killed once it persisted a power-off intent after this history time
    /// (`None` once killed, or for other faults).
    kill_after_intent: Option<u64>,
}

/// Injects and heals faults.
#[derive(Debug)]
pub struct Nemesis {
    plan: VecDeque<Planned>,
    active: Vec<Active>,
    next_id: u64,
    /// Faults injected, by kind.
    pub injected: u64,
}

impl Nemesis {
    /// A nemesis that will carry out `plan` (in time order).
    pub fn new(plan: Vec<Planned>) -> Self {
        Self {
            plan: plan.into(),
            active: Vec::new(),
            next_id: 1,
            injected: 0,
        }
    }

    /// Whether nothing is planned or active any more.
    pub fn done(&self) -> bool {
        self.plan.is_empty() && self.active.is_empty()
    }

    /// Starts the faults due at `now` and heals the expired ones.
    pub fn step(&mut self, lab: &mut Lab, rec: &mut Recorder, now: Duration) -> Result<()> {
        let mut i = 0;
        while i < self.active.len() {
            if self.active[i].until <= now {
                let a = self.active.remove(i);
                heal(lab, rec, &a)?;
            } else {
                let a = &mut self.active[i];
                if let (Some(since), Hit::Controller(c)) = (a.kill_after_intent, a.hit)
                    && rec.power_off_intent_after(&lab.controller_names()[c], since)
                {
                    // Its answers (the command among them) are held in the relay: it crashes
                    // with them in flight. A power-off begins a remediation: agents are
                    // waiting on a long-poll for it (after a command, its executor is busy
                    // sending the result, and gets the next one from whoever leads next).
                    lab.kill_controller_in(c);
                    a.kill_after_intent = None;
                }
                if let (Some((at, frozen)), Hit::Host(h)) = (a.toggle, a.hit)
                    && at <= now
                {
                    lab.freeze_bmc(h, !frozen)?;
                    let next = if frozen { SLOW_AWAKE } else { SLOW_FROZEN };
                    a.toggle = Some((now + next, !frozen));
                }
                i += 1;
            }
        }
        while self.plan.front().is_some_and(|p| p.at <= now) {
            if let Some(p) = self.plan.pop_front() {
                self.inject(lab, rec, &p, now)?;
            }
        }
        Ok(())
    }

    /// Heals every active fault and drops what is still planned.
    pub fn stop(&mut self, lab: &mut Lab, rec: &mut Recorder) -> Result<()> {
        self.plan.clear();
        for a in std::mem::take(&mut self.active) {
            heal(lab, rec, &a)?;
        }
        Ok(())
    }

    fn inject(
        &mut self,
        lab: &mut Lab,
        rec: &mut Recorder,
        p: &Planned,
        now: Duration,
    ) -> Result<()> {
        let hit = match p.target {
            Target::Host(h) => Hit::Host(h),
            Target::Apiserver => Hit::Apiserver,
            Target::Leader => {
                let names = lab.controller_names();
                let slot = rec
                    .newest_leader()
                    .and_then(|n| names.iter().position(|c| c == n))
                    .unwrap_or(0);
                if !lab.controller_running(slot) {
                    return Ok(());
                }
                Hit::Controller(slot)
            }
        };
        // One fault per thing at a time (the schedule keeps to it for hosts; a leader hit
        // twice is skipped).
        if self.active.iter().any(|a| {
            a.hit == hit && !(a.fault == FaultKind::HostHang && p.fault == FaultKind::BmcLying)
        }) {
            return Ok(());
        }
        let mut toggle = None;
        let mut kill_after_intent = None;
        match (p.fault, hit) {
            (FaultKind::HostHang, Hit::Host(h)) => {
                if !lab.hosts()[h].powered() {
                    return Ok(());
                }
                lab.freeze(h)?;
            }
            (FaultKind::EtcdHang, Hit::Host(h)) => {
                if !lab.hosts()[h].powered() {
                    return Ok(());
                }
                lab.hang_etcd(h)?;
            }
            (FaultKind::AgentKill, Hit::Host(h)) => lab.kill_agent(h),
            (FaultKind::Partition, Hit::Host(h)) => lab.partition(h)?,
            (FaultKind::BmcFail, Hit::Host(h)) => lab.freeze_bmc(h, true)?,
            (FaultKind::BmcSlow, Hit::Host(h)) => {
                lab.freeze_bmc(h, true)?;
                toggle = Some((now + SLOW_FROZEN, true));
            }
            (FaultKind::BmcLying, Hit::Host(h)) => lab.set_bmc_lying(h, true),
            (FaultKind::ControllerPause, Hit::Controller(c)) => lab.freeze_controller(c)?,
            (FaultKind::ControllerKill, Hit::Controller(c)) => lab.kill_controller_in(c),
            (FaultKind::LeaderLag, Hit::Controller(c)) => {
                lab.set_controller_lag(c, leader_lag(lab.leader_lease()))?;
                kill_after_intent = Some(rec.now());
            }
            (FaultKind::ApiserverFreeze, Hit::Apiserver) => match lab.kube() {
                Some(kube) => kube.cluster().apiserver().freeze()?,
                None => return Ok(()),
            },
            (fault, hit) => {
                return Err(HarnessError::Other(format!(
                    "the schedule aimed {fault:?} at {hit:?}"
                )));
            }
        }
        let id = self.next_id;
        self.next_id += 1;
        self.injected += 1;
        rec.record(Event::FaultStart {
            id,
            fault: p.fault,
            target: target_name(lab, hit),
        });
        self.active.push(Active {
            id,
            fault: p.fault,
            hit,
            until: now + p.lasts,
            began_unix_ms: unix_ms(),
            toggle,
            kill_after_intent,
        });
        Ok(())
    }
}

fn target_name(lab: &Lab, hit: Hit) -> String {
    match hit {
        Hit::Host(h) => lab.hosts()[h].name.clone(),
        Hit::Controller(c) => lab.controller_names()[c].clone(),
        Hit::Apiserver => "apiserver".into(),
    }
}

fn heal(lab: &mut Lab, rec: &mut Recorder, a: &Active) -> Result<()> {
    let cycled = match a.hit {
        Hit::Host(h) => lab.power_offs_since(h, a.began_unix_ms)? > 0,
        _ => false,
    };
    match (a.fault, a.hit) {
        (FaultKind::HostHang, Hit::Host(h)) => lab.thaw(h)?,
        (FaultKind::EtcdHang, Hit::Host(h)) => lab.resume_etcd(h)?,
        (FaultKind::AgentKill, Hit::Host(h)) => lab.restart_agent(h)?,
        (FaultKind::Partition, Hit::Host(h)) => lab.heal(h, "the nemesis heals the partition")?,
        (FaultKind::BmcFail | FaultKind::BmcSlow, Hit::Host(h)) => lab.freeze_bmc(h, false)?,
        (FaultKind::BmcLying, Hit::Host(h)) => lab.set_bmc_lying(h, false),
        (FaultKind::ControllerPause, Hit::Controller(c)) => lab.thaw_controller(c)?,
        (FaultKind::ControllerKill, Hit::Controller(c)) => lab.start_controller_in(c)?,
        (FaultKind::LeaderLag, Hit::Controller(c)) => {
            lab.set_controller_lag(c, Duration::ZERO)?;
            if !lab.controller_running(c) {
                lab.start_controller_in(c)?;
            }
        }
        (FaultKind::ApiserverFreeze, Hit::Apiserver) => {
            if let Some(kube) = lab.kube() {
                kube.cluster().apiserver().thaw()?;
            }
        }
        _ => {}
    }
    let how = if cycled && a.fault.afflicts_host() {
        "power-cycled"
    } else {
        "healed"
    };
    rec.record(Event::FaultEnd {
        id: a.id,
        how: how.into(),
    });
    Ok(())
}
