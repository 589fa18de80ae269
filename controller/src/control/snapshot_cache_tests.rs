//! The kept snapshot equals the whole build ([`build_for_round`]) over random rounds: Nodes,
//! hooks, retirements and remediations change with a noted revision (as the backend notes a
//! host whose object changed); reports, holds, node leases and fence requests change without
//! one (a round lays them over the stored state); the leadership, the clock and what the agent
//! API heard move on; some rounds never hand their snapshot back.

use std::collections::BTreeSet;

use metalguard_api::duration::Timestamp;
use metalguard_api::protocol::{CommandResult, EtcdView, Outcome, PowerAction};
use metalguard_api::remediation::{Remediation, RemediationPhase};
use metalguard_api::snapshot::{
    ConditionStatus, FenceRequest, Hold, NodeCondition, NodeStatus, Retirement,
};

use super::*;
use crate::backend::revisions::HostRevisions;
use crate::backend::{OperationKind, StoredOperation};

struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d) % n
    }

    fn host(&mut self) -> String {
        format!("h-{}", self.below(8))
    }
}

fn hosts() -> Inventory {
    crate::testkit::inventory(
        &[
            ("h-0", "control-plane", true),
            ("h-1", "control-plane", true),
            ("h-2", "control-plane", true),
            ("h-3", "worker", true),
            ("h-4", "worker", false),
            ("h-5", "worker", true),
            ("h-6", "worker", true),
            ("h-7", "worker", true),
        ],
        "",
    )
}

fn node(rng: &mut Rng) -> NodeStatus {
    let status = [
        ConditionStatus::True,
        ConditionStatus::False,
        ConditionStatus::Unknown,
    ][usize::try_from(rng.below(3)).unwrap()];
    NodeStatus {
        created_at: Timestamp(rng.below(50)),
        conditions: vec![
            NodeCondition {
                type_: "Ready".into(),
                status,
                last_transition: Timestamp(rng.below(100)),
            },
            NodeCondition {
                type_: "EtcdMemberHealthy".into(),
                status,
                last_transition: Timestamp(rng.below(100)),
            },
        ],
        ..NodeStatus::default()
    }
}

fn report(rng: &mut Rng, host: &str, at: u64) -> crate::backend::StoredReport {
    let mut members = Vec::new();
    for i in 0..3 {
        if rng.below(4) != 0 {
            let learner = rng.below(5) == 0;
            let healthy = rng.below(4) != 0;
            members.push(crate::testkit::member(
                i + 1,
                &format!("h-{i}"),
                learner,
                healthy,
            ));
        }
    }
    let etcd = (rng.below(4) != 0).then(|| EtcdView {
        local_member_id: None,
        leader_id: Some(rng.below(4)),
        members,
    });
    crate::testkit::stored_report(host, at, etcd)
}

fn remediation(target: &str, phase: RemediationPhase) -> Remediation {
    crate::testkit::remediation(target, "h-0", phase)
}

fn power_off(id: OperationId, target: &str, finished: u64) -> StoredOperation {
    StoredOperation {
        id,
        agent: "h-0".into(),
        kind: OperationKind::Fence {
            target: target.into(),
            action: PowerAction::Off,
        },
        remediation_id: Some(format!("remediation/{target}/1")),
        step: Some("power-off".into()),
        created_at: Timestamp(1),
        requested_by: None,
        executed_by: None,
        result: Some(CommandResult {
            operation_id: OperationId(String::new()),
            outcome: Outcome::Succeeded,
            started_at: Timestamp(finished),
            finished_at: Timestamp(finished),
            timeline: Vec::new(),
            error: None,
            promoted_by: None,
            term: 0,
        }),
        term: 0,
    }
}

use metalguard_api::plan::OperationId;

/// One random change; `noted` collects the hosts the backend would note.
fn change(rng: &mut Rng, state: &mut State, now: u64, noted: &mut BTreeSet<String>) {
    let host = rng.host();
    match rng.below(10) {
        0 | 1 => {
            let nodes = state.nodes.get_or_insert_with(imbl::OrdMap::new);
            if rng.below(4) == 0 {
                nodes.remove(&host);
            } else {
                nodes.insert(host.clone(), node(rng));
            }
            noted.insert(host);
        }
        2 => {
            if rng.below(2) == 0 {
                state.hooks.remove(&host);
            } else {
                state
                    .hooks
                    .insert(host.clone(), BTreeSet::from(["etcd".to_owned()]));
            }
            noted.insert(host);
        }
        3 => {
            if rng.below(2) == 0 {
                state.reports.remove(&host);
            } else {
                let at = now - rng.below(20_000);
                let r = report(rng, &host, at);
                state.reports.insert(host, r);
            }
        }
        4 => {
            if rng.below(2) == 0 {
                state.holds.remove(&host);
            } else {
                state.holds.insert(
                    host.clone(),
                    Hold {
                        id: format!("h-0/{now}"),
                        target: host,
                        since: Timestamp(now),
                        by: "ops".into(),
                        reason: String::new(),
                        action: "off".into(),
                    },
                );
            }
        }
        5 => {
            if rng.below(2) == 0 {
                state.node_leases.remove(&host);
            } else {
                state.node_leases.insert(host, "other".into());
            }
        }
        6 => {
            if rng.below(2) == 0 {
                state.fence_requests.remove(&host);
            } else {
                state.fence_requests.insert(
                    host,
                    FenceRequest {
                        requested_at: Timestamp(now),
                        requested_by: None,
                        force_reason: None,
                        stay_off: false,
                        drill: false,
                        nonce: None,
                    },
                );
            }
        }
        7 => {
            // A retirement, its power-off verified or not (a verified one leaves the snapshot).
            let requested_at = Timestamp(7);
            if rng.below(3) == 0 {
                state.retirements.remove(&host);
            } else {
                state.retirements.insert(
                    host.clone(),
                    Retirement {
                        requested_at,
                        requested_by: None,
                        reason: "replace".into(),
                    },
                );
                let id = metalguard_core::retire::decommission_id(&host, requested_at);
                if rng.below(2) == 0 {
                    state
                        .operations
                        .insert(id.clone(), power_off(id, &host, now));
                } else {
                    state.operations.remove(&id);
                }
            }
            noted.insert(host);
        }
        _ => {
            // A remediation, active with its power-off verified, or over.
            let r = if rng.below(2) == 0 {
                remediation(&host, RemediationPhase::VerifiedOff)
            } else {
                remediation(&host, RemediationPhase::Done)
            };
            let id = OperationId(format!("{}/power-off", r.id));
            state
                .operations
                .insert(id.clone(), power_off(id, &host, now - rng.below(10_000)));
            state.remediations.insert(r.id.clone(), r);
            noted.insert(host);
        }
    }
}

#[test]
fn the_kept_snapshot_equals_the_whole_build_over_random_rounds() {
    let inventory = hosts();
    for seed in 1..=60_u64 {
        let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let mut state = State {
            nodes: Some(imbl::OrdMap::new()),
            ..State::default()
        };
        let mut revisions = HostRevisions::default();
        revisions.reset();
        let mut cache = SnapshotCache::default();
        let mut hearing = Hearing::default();
        let mut known_since = Timestamp(1_000);
        let mut now = 100_000;
        for round in 0..120 {
            now += rng.below(3_000);
            let mut noted = BTreeSet::new();
            for _ in 0..rng.below(4) {
                change(&mut rng, &mut state, now, &mut noted);
            }
            for host in &noted {
                revisions.note(host);
            }
            if rng.below(30) == 0 {
                known_since = Timestamp(now - 500);
            }
            if rng.below(5) == 0 {
                hearing.accepted(&rng.host(), Timestamp(now - rng.below(2_000)));
            }
            state.changes = Some(revisions.clone());
            let kept = cache.build(&inventory, &state, (known_since, &hearing), Timestamp(now));
            let whole =
                build_for_round(&inventory, &state, (known_since, &hearing), Timestamp(now));
            assert_eq!(kept, whole, "seed {seed}, round {round}");
            if rng.below(8) != 0 {
                cache.keep(kept);
            }
        }
    }
}

#[test]
fn a_round_after_one_node_changed_builds_that_host_and_the_reporting_ones() {
    let names: Vec<String> = (0..300).map(|i| format!("w-{i:03}")).collect();
    let spec: Vec<(&str, &str, bool)> = names
        .iter()
        .enumerate()
        .map(|(i, n)| {
            (
                n.as_str(),
                if i < 3 { "control-plane" } else { "worker" },
                true,
            )
        })
        .collect();
    let inventory = crate::testkit::inventory(&spec, "");
    let mut rng = Rng(3);
    let mut state = State {
        nodes: Some(names.iter().map(|n| (n.clone(), node(&mut rng))).collect()),
        ..State::default()
    };
    for cp in &names[..3] {
        state
            .reports
            .insert(cp.clone(), report(&mut rng, cp, 99_000));
    }
    let mut revisions = HostRevisions::default();
    revisions.reset();
    state.changes = Some(revisions.clone());
    let hearing = Hearing::default();
    let mut cache = SnapshotCache::default();
    let first = cache.build(
        &inventory,
        &state,
        (Timestamp(1), &hearing),
        Timestamp(100_000),
    );
    assert_eq!(cache.visited, 300);
    cache.keep(first);
    if let Some(nodes) = state.nodes.as_mut() {
        nodes.insert("w-150".into(), node(&mut rng));
    }
    revisions.note("w-150");
    state.changes = Some(revisions.clone());
    let second = cache.build(
        &inventory,
        &state,
        (Timestamp(1), &hearing),
        Timestamp(101_000),
    );
    assert_eq!(cache.visited, 4, "w-150 and the three reporting hosts");
    assert_eq!(
        second,
        build_for_round(
            &inventory,
            &state,
            (Timestamp(1), &hearing),
            Timestamp(101_000)
        )
    );
}
