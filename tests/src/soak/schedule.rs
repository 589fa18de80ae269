//! The nemesis' schedule: a seeded random plan of faults, made before the soak starts, so the
//! same seed replays the same faults at the same times whatever the system does.
//!
//! It never takes more etcd members than quorum tolerates: a fault that takes a member (a
//! host hang, an etcd hang, a partition, an agent down long enough to be fenced) reserves its
//! host from its start to its end plus a recovery allowance (the fence, the boot, the
//! rejoin), and a fault is planned only while fewer than `(voters - 1) / 2` hosts are
//! reserved. One fault per host at a time; a BMC fault never overlaps a fault of its own host
//! unless the plan draws a lying BMC for a hung host on purpose (then the remediation meets
//! a BMC that says yes and does nothing). One controller fault at a time, and never both
//! controllers down.

use std::time::Duration;

use super::history::FaultKind;

/// What a fault is aimed at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Target {
    /// A host, by index.
    Host(usize),
    /// Whichever controller leads when the fault starts.
    Leader,
    /// The Kubernetes API server.
    Apiserver,
}

/// One planned fault.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Planned {
    /// When it starts, from the soak's start.
    pub at: Duration,
    /// What it is.
    pub fault: FaultKind,
    /// What it hits.
    pub target: Target,
    /// How long it lasts before the nemesis undoes it (a hung host fenced earlier is over
    /// sooner).
    pub lasts: Duration,
}

/// What the plan must respect.
#[derive(Debug, Clone)]
pub struct Shape {
    /// Control-plane hosts (all voters).
    pub hosts: usize,
    /// How long faults are planned for.
    pub duration: Duration,
    /// Kubernetes mode: API server freezes, no partitions, slower recoveries.
    pub kubernetes: bool,
    /// Network namespaces are available (partitions).
    pub netns: bool,
    /// A silent agent's host is judged after this long (an agent down longer may be fenced).
    pub heartbeat_timeout: Duration,
    /// The controllers' lease (a pause must outlast it).
    pub lease: Duration,
    /// How long after a member-taking fault ends its host may still be away (fenced, booting,
    /// rejoining).
    pub recovery: Duration,
    /// The agents reach the controllers through relays that can hold bytes: the controller
    /// lane plans `leader-lag` faults too (a third of them). Off, the schedule of a seed is
    /// the one it was before the fault existed.
    pub lag: bool,
}

/// A small deterministic generator (SplitMix64): the schedule must not depend on anything
/// but the seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    /// A generator for `seed`.
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    pub fn below(&mut self, n: u64) -> u64 {
        self.next_u64() % n.max(1)
    }

    /// A duration in `[lo, hi]`, to the millisecond.
    pub fn between(&mut self, lo: Duration, hi: Duration) -> Duration {
        let (lo_ms, hi_ms) = (millis(lo), millis(hi.max(lo)));
        Duration::from_millis(lo_ms + self.below(hi_ms - lo_ms + 1))
    }

    /// True with probability `percent`/100.
    pub fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

/// Per host, the windows during which it is busy with a fault (and, for a member-taking
/// one, its recovery), and whether the window takes its member.
#[derive(Debug, Default, Clone)]
struct Busy {
    windows: Vec<(Duration, Duration, bool)>,
}

impl Busy {
    fn free(&self, from: Duration, to: Duration) -> bool {
        self.windows.iter().all(|&(a, b, _)| to <= a || b <= from)
    }

    fn takes_member_during(&self, from: Duration, to: Duration) -> bool {
        self.windows
            .iter()
            .any(|&(a, b, takes)| takes && !(to <= a || b <= from))
    }
}

/// A host with no fault planned between `at` and `end`, drawn at random; `None` when every
/// host is busy then.
fn pick_free(
    rng: &mut Rng,
    shape: &Shape,
    busy: &[Busy],
    at: Duration,
    end: Duration,
) -> Option<usize> {
    let free: Vec<usize> = (0..shape.hosts)
        .filter(|&h| busy[h].free(at, end))
        .collect();
    if free.is_empty() {
        return None;
    }
    Some(free[usize::try_from(rng.below(free.len() as u64)).unwrap_or(0)])
}

/// Plans the faults of a soak of `shape` from `seed`, in time order.
pub fn plan(seed: u64, shape: &Shape) -> Vec<Planned> {
    let mut rng = Rng::new(seed);
    let tolerance = (shape.hosts.saturating_sub(1)) / 2;
    let mut busy = vec![Busy::default(); shape.hosts];
    let mut out = Vec::new();
    let mut lanes = Lanes::new(shape);
    while let Some((at, lane)) = lanes.next(&mut rng) {
        if at >= shape.duration {
            break;
        }
        match lane {
            Lane::Member => plan_member_fault(&mut rng, shape, tolerance, &mut busy, at, &mut out),
            Lane::AgentBlip => plan_agent_blip(&mut rng, shape, &mut busy, at, &mut out),
            Lane::Bmc => plan_bmc_fault(&mut rng, shape, &mut busy, at, &mut out),
            Lane::Controller => {
                let fault = if shape.lag && rng.chance(33) {
                    FaultKind::LeaderLag
                } else if rng.chance(50) {
                    FaultKind::ControllerPause
                } else {
                    FaultKind::ControllerKill
                };
                let extra = rng.between(Duration::from_secs(1), Duration::from_secs(8));
                out.push(Planned {
                    at,
                    fault,
                    target: Target::Leader,
                    // A lag lasts long enough to meet a decision of the leader (it crashes
                    // then), 7-35 s.
                    lasts: shape.lease
                        + if fault == FaultKind::LeaderLag {
                            extra * 4
                        } else {
                            extra
                        },
                });
            }
            Lane::Apiserver => out.push(Planned {
                at,
                fault: FaultKind::ApiserverFreeze,
                target: Target::Apiserver,
                lasts: rng.between(Duration::from_secs(3), Duration::from_secs(10)),
            }),
        }
    }
    out.sort_by_key(|p| p.at);
    out
}

/// The kinds of faults, each arriving on its own random clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lane {
    Member,
    AgentBlip,
    Bmc,
    Controller,
    Apiserver,
}

/// The next arrival time of every lane.
struct Lanes {
    next: Vec<(Duration, Lane, Duration, Duration)>,
}

impl Lanes {
    fn new(shape: &Shape) -> Self {
        let s = Duration::from_secs;
        // (next, lane, shortest gap, longest gap)
        let mut next = vec![
            (s(5), Lane::Member, s(4), s(20)),
            (s(7), Lane::AgentBlip, s(8), s(25)),
            (s(9), Lane::Bmc, s(8), s(25)),
            (s(11), Lane::Controller, s(15), s(40)),
        ];
        if shape.kubernetes {
            next.push((s(30), Lane::Apiserver, s(60), s(150)));
        }
        Self { next }
    }

    fn next(&mut self, rng: &mut Rng) -> Option<(Duration, Lane)> {
        let i = (0..self.next.len()).min_by_key(|&i| self.next[i].0)?;
        let (at, lane, lo, hi) = self.next[i];
        self.next[i].0 = at + rng.between(lo, hi);
        Some((at, lane))
    }
}

/// A hang of a host (or two at once), an etcd-only hang, or a partition, if the budget of
/// members allows it.
fn plan_member_fault(
    rng: &mut Rng,
    shape: &Shape,
    tolerance: usize,
    busy: &mut [Busy],
    at: Duration,
    out: &mut Vec<Planned>,
) {
    let mut kinds = vec![
        FaultKind::HostHang,
        FaultKind::HostHang,
        FaultKind::EtcdHang,
    ];
    if shape.netns && !shape.kubernetes {
        kinds.push(FaultKind::Partition);
    }
    let fault = kinds[usize::try_from(rng.below(kinds.len() as u64)).unwrap_or(0)];
    let lasts = rng.between(Duration::from_secs(8), Duration::from_secs(40));
    let how_many = if fault == FaultKind::HostHang && tolerance >= 2 && rng.chance(15) {
        2
    } else {
        1
    };
    for _ in 0..how_many {
        let end = at + lasts + shape.recovery;
        let taken = busy
            .iter()
            .filter(|b| b.takes_member_during(at, end))
            .count();
        if taken >= tolerance {
            return;
        }
        let Some(host) = pick_free(rng, shape, busy, at, end) else {
            return;
        };
        busy[host].windows.push((at, end, true));
        out.push(Planned {
            at,
            fault,
            target: Target::Host(host),
            lasts,
        });
        // Now and then the hung host's BMC lies too: the fence meets a BMC that says yes.
        if fault == FaultKind::HostHang && rng.chance(5) {
            out.push(Planned {
                at,
                fault: FaultKind::BmcLying,
                target: Target::Host(host),
                lasts: lasts + shape.recovery,
            });
        }
    }
}

/// An agent killed and started again: mostly for less than the heartbeat timeout (nobody may
/// act on it), sometimes long enough that its host is judged silent (then it counts as taking
/// its member: it may be fenced).
fn plan_agent_blip(
    rng: &mut Rng,
    shape: &Shape,
    busy: &mut [Busy],
    at: Duration,
    out: &mut Vec<Planned>,
) {
    let long = rng.chance(30);
    let lasts = if long {
        shape.heartbeat_timeout + rng.between(Duration::from_secs(2), Duration::from_secs(15))
    } else {
        rng.between(
            Duration::from_millis(500),
            shape.heartbeat_timeout.mul_f64(0.6),
        )
    };
    let end = at
        + lasts
        + if long {
            shape.recovery
        } else {
            Duration::from_secs(2)
        };
    let tolerance = (shape.hosts.saturating_sub(1)) / 2;
    if long
        && busy
            .iter()
            .filter(|b| b.takes_member_during(at, end))
            .count()
            >= tolerance
    {
        return;
    }
    let Some(host) = pick_free(rng, shape, busy, at, end) else {
        return;
    };
    busy[host].windows.push((at, end, long));
    out.push(Planned {
        at,
        fault: FaultKind::AgentKill,
        target: Target::Host(host),
        lasts,
    });
}

/// A BMC that does not answer, answers slowly, or lies, on a host with no other fault.
fn plan_bmc_fault(
    rng: &mut Rng,
    shape: &Shape,
    busy: &mut [Busy],
    at: Duration,
    out: &mut Vec<Planned>,
) {
    let fault = match rng.below(3) {
        0 => FaultKind::BmcFail,
        1 => FaultKind::BmcSlow,
        _ => FaultKind::BmcLying,
    };
    let lasts = rng.between(Duration::from_secs(5), Duration::from_secs(30));
    let end = at + lasts;
    let Some(host) = pick_free(rng, shape, busy, at, end) else {
        return;
    };
    busy[host].windows.push((at, end, false));
    out.push(Planned {
        at,
        fault,
        target: Target::Host(host),
        lasts,
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape() -> Shape {
        Shape {
            hosts: 5,
            duration: Duration::from_secs(3600),
            kubernetes: false,
            netns: true,
            heartbeat_timeout: Duration::from_secs(5),
            lease: Duration::from_secs(3),
            recovery: Duration::from_secs(40),
            lag: false,
        }
    }

    #[test]
    fn the_same_seed_plans_the_same_faults_and_another_seed_others() {
        assert_eq!(plan(7, &shape()), plan(7, &shape()));
        assert_ne!(plan(7, &shape()), plan(8, &shape()));
    }

    #[test]
    fn an_hour_plans_hundreds_of_faults_of_every_kind_within_the_member_budget() {
        let s = shape();
        let faults = plan(42, &s);
        assert!(faults.len() > 400, "{}", faults.len());
        for kind in [
            FaultKind::HostHang,
            FaultKind::EtcdHang,
            FaultKind::Partition,
            FaultKind::AgentKill,
            FaultKind::BmcFail,
            FaultKind::BmcSlow,
            FaultKind::BmcLying,
            FaultKind::ControllerPause,
            FaultKind::ControllerKill,
        ] {
            assert!(faults.iter().any(|f| f.fault == kind), "no {kind:?}");
        }
        // At every fault's start, at most two hosts have a member-taking fault (or its
        // recovery) under way.
        for f in &faults {
            let taking = faults
                .iter()
                .filter(|g| {
                    let takes = g.fault.takes_member()
                        || (g.fault == FaultKind::AgentKill && g.lasts > s.heartbeat_timeout);
                    takes && g.at <= f.at && f.at < g.at + g.lasts + s.recovery
                })
                .filter_map(|g| match g.target {
                    Target::Host(h) => Some(h),
                    _ => None,
                })
                .collect::<std::collections::BTreeSet<_>>();
            assert!(taking.len() <= 2, "at {:?}: {taking:?}", f.at);
        }
    }
}
