//! Safety on any state: property tests over snapshots generated directly — any mix of roles,
//! members, learners, orphans, leaders, silent or blind agents, holds, remediations in any
//! phase (stale, contradictory, half-finished, written by someone else), random policies and
//! a random `now` — not only histories the planner produced.
//!
//! Each case plans once, applies the whole plan to a small model of the cluster (which
//! members end up down, removed or promoted, which hosts are fenced) and checks every
//! invariant on the plan as a whole. The invariants are written here from the seeds' rules,
//! independently of the planner and of [`crate::judge`], so that neither can pass by
//! agreeing with itself.
//!
//! `METALGUARD_PROPTEST_CASES` sets the number of states (default 2000); the long run is in
//! `docs/benchmarks.md`.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use proptest::prelude::*;

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::{Action, ActionKind, RemediationStep};
use metalguard_api::policy::{
    HealthCheck, MaxUnhealthy, Policy, RemediationSettings, Selector, UnhealthyCondition,
};
use metalguard_api::remediation::{Remediation, RemediationPhase as P, remediation_id};
use metalguard_api::snapshot::{
    AgentReport, ConditionStatus, ControlPlaneSpec, EtcdMember, FenceRequest, Hold, Host,
    NodeCondition, NodeStatus, QUORUM_HOOK, Retirement, Role, Snapshot,
};

use crate::testkit::NOW;

fn cases() -> u32 {
    std::env::var("METALGUARD_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2000)
}

fn ago(secs: u64) -> Timestamp {
    Timestamp(NOW.0.saturating_sub(secs * 1000))
}

// ---- generation ------------------------------------------------------------------------

fn phase() -> impl Strategy<Value = P> {
    let r = || "r".to_owned();
    prop_oneof![
        Just(P::Detected),
        Just(P::Gated),
        Just(P::Gated),
        Just(P::Gated),
        Just(P::PoweringOff),
        Just(P::VerifiedOff),
        Just(P::BackedUp),
        Just(P::NodeRemoved),
        Just(P::PoweringOn),
        Just(P::WaitingForNode),
        Just(P::Restored),
        Just(P::Done),
        Just(P::Failed { reason: r() }),
        Just(P::NeedsPerson { reason: r() }),
        Just(P::Reprovisioning),
        Just(P::Cancelled { reason: r() }),
    ]
}

fn member(id: u64) -> impl Strategy<Value = EtcdMember> {
    (
        proptest::bool::weighted(0.15),
        proptest::bool::weighted(0.85),
        proptest::bool::weighted(0.3),
        prop_oneof![0u16..900, 900u16..=1000],
    )
        .prop_map(move |(learner, healthy, leader, progress)| EtcdMember {
            id,
            name: format!("m{id}"),
            learner,
            healthy,
            leader: leader && !learner,
            progress_permille: if learner { progress } else { 1000 },
        })
}

fn node() -> impl Strategy<Value = Option<NodeStatus>> {
    let status = prop_oneof![
        12 => Just(ConditionStatus::True),
        2 => Just(ConditionStatus::False),
        1 => Just(ConditionStatus::Unknown),
    ];
    prop_oneof![
        1 => Just(None),
        8 => (status, 0u64..3600, 0u64..7200)
            .prop_map(|(status, since, created)| Some(NodeStatus {
                created_at: ago(created),
                conditions: vec![NodeCondition {
                    type_: "Ready".into(),
                    status,
                    last_transition: ago(since),
                }],
                ..NodeStatus::default()
            })),
    ]
}

fn agent(hosts: usize) -> impl Strategy<Value = Option<AgentReport>> {
    let silent = prop_oneof![4 => 0u64..20, 1 => 0u64..300];
    prop_oneof![
        1 => Just(None),
        8 => (
            silent,
            proptest::bool::weighted(0.95),
            proptest::collection::btree_map(0..hosts, proptest::bool::weighted(0.7), 0..3),
        )
            .prop_map(|(silent, can_fence, reach)| Some(AgentReport {
                last_heartbeat: ago(silent),
                can_fence,
                bmc_reachable: reach.into_iter().map(|(i, r)| (format!("h-{i}"), r)).collect(),
                boot_id: None,
                boot_reported_at: None,
            })),
    ]
}

#[derive(Debug, Clone)]
#[allow(clippy::struct_excessive_bools)] // independent random facts about one host
struct HostBits {
    control_plane: bool,
    domain: u8,
    created: u64,
    node: Option<NodeStatus>,
    node_seen: bool,
    agent: Option<AgentReport>,
    etcd: Option<EtcdMember>,
    deleting: bool,
    retiring: bool,
    hook: bool,
    /// A fence request: 0 an administrator's, 1 forced, 2 a drill.
    fence: Option<u8>,
    hold: bool,
    /// Another actor holds its node lease.
    leased: bool,
    bmc: bool,
    external: bool,
    up_to_date: bool,
    phase_failed: bool,
}

fn host_bits(index: usize, hosts: usize) -> impl Strategy<Value = HostBits> {
    (proptest::bool::weighted(0.55), 0u8..3).prop_flat_map(move |(control_plane, domain)| {
        let has_member = if control_plane { 0.85 } else { 0.05 };
        (
            (0u64..20_000, node(), any::<bool>(), agent(hosts)),
            (
                proptest::option::weighted(has_member, member(index as u64 + 1)),
                (
                    proptest::bool::weighted(0.08),
                    proptest::bool::weighted(0.08),
                    proptest::bool::weighted(0.8),
                    proptest::bool::weighted(0.95),
                ),
                proptest::option::weighted(0.1, 0u8..3),
                (
                    proptest::bool::weighted(0.06),
                    proptest::bool::weighted(0.05),
                ),
                (
                    proptest::bool::weighted(0.2),
                    proptest::bool::weighted(0.1),
                    proptest::bool::weighted(0.03),
                ),
            ),
        )
            .prop_map(
                move |(
                    (created, node, node_seen, agent),
                    (
                        etcd,
                        (deleting, retiring, hook, bmc),
                        fence,
                        (hold, leased),
                        (external, stale, failed),
                    ),
                )| HostBits {
                    control_plane,
                    domain,
                    created,
                    node,
                    node_seen,
                    agent,
                    etcd,
                    deleting,
                    retiring: retiring && !deleting,
                    hook,
                    fence,
                    hold,
                    leased,
                    bmc,
                    external,
                    up_to_date: !stale,
                    phase_failed: failed,
                },
            )
    })
}

fn to_host(i: usize, b: HostBits) -> Host {
    let name = format!("h-{i}");
    Host {
        name: name.clone(),
        role: if b.control_plane {
            Role::ControlPlane
        } else {
            Role::Worker
        },
        failure_domain: ["a", "b"]
            .get(usize::from(b.domain))
            .map(|d| (*d).to_owned()),
        created_at: Timestamp(b.created * 1000),
        labels: BTreeMap::new(),
        annotations: BTreeMap::new(),
        externally_provisioned: b.external,
        bmc_configured: b.bmc,
        up_to_date: b.up_to_date,
        deletion_requested_at: b.deleting.then(|| ago(60)),
        pre_drain_hooks: if b.hook {
            [QUORUM_HOOK.to_owned()].into()
        } else {
            BTreeSet::new()
        },
        fence_request: b.fence.map(|kind| FenceRequest {
            requested_at: ago(30),
            requested_by: Some("admin".into()),
            force_reason: (kind == 1).then(|| "test".to_owned()),
            stay_off: false,
            nonce: None,
            drill: kind == 2,
        }),
        retirement: b.retiring.then(|| Retirement {
            requested_at: ago(90),
            requested_by: None,
            reason: String::new(),
        }),
        phase_failed: b.phase_failed,
        node_seen: b.node_seen || b.node.is_some(),
        node: b.node,
        agent: b.agent,
        etcd: b.etcd,
        lease_held_by: b.leased.then(|| "node-maintenance".to_owned()),
        hold: b.hold.then(|| Hold {
            id: format!("x/{i}"),
            target: name,
            since: ago(100),
            by: "someone".into(),
            reason: "test".into(),
            action: "off".into(),
        }),
    }
}

#[derive(Debug, Clone)]
struct RemBits {
    target: usize,
    executor: usize,
    seq: u32,
    attempt: u32,
    phase: P,
    flag: bool,
    forced: bool,
    cancel: bool,
    since: u64,
    booted: Option<u64>,
}

fn rem_bits() -> impl Strategy<Value = RemBits> {
    (
        (any::<usize>(), any::<usize>(), 1u32..4, 1u32..5, phase()),
        (
            any::<bool>(),
            proptest::bool::weighted(0.2),
            proptest::bool::weighted(0.1),
        ),
        (0u64..4000, proptest::option::weighted(0.4, 0u64..4000)),
    )
        .prop_map(
            |((target, executor, seq, attempt, phase), (flag, forced, cancel), (since, booted))| {
                RemBits {
                    target,
                    executor,
                    seq,
                    attempt,
                    phase,
                    flag,
                    forced,
                    cancel,
                    since,
                    booted,
                }
            },
        )
}

fn to_remediation(hosts: &[Host], b: RemBits) -> Remediation {
    let target = &hosts[b.target % hosts.len()];
    let executor = &hosts[b.executor % hosts.len()];
    Remediation {
        id: remediation_id(&target.name, b.seq),
        target: target.name.clone(),
        seq: b.seq,
        attempt: b.attempt,
        executor: executor.name.clone(),
        strategy: metalguard_api::policy::Strategy::ExternalBaremetal,
        node_handling: metalguard_api::policy::NodeHandling::Delete,
        phase: b.phase,
        started_at: ago(b.since + 100),
        phase_since: ago(b.since),
        // Contradictory on purpose half of the time.
        control_plane: if b.flag {
            target.role == Role::ControlPlane
        } else {
            target.role != Role::ControlPlane
        },
        cause: "arbitrary".into(),
        forced: b.forced.then(|| "test".to_owned()),
        cancel_requested: b.cancel.then(|| "test".to_owned()),
        backup: None,
        powered_on_at: b.booted.map(ago),
        // Some stay-off remediations, in every phase.
        stay_off: b.cancel != b.forced,
        boot_before: None,
    }
}

fn policy() -> impl Strategy<Value = Policy> {
    let max = prop_oneof![
        Just(None),
        Just(None),
        Just(None),
        (0u32..4).prop_map(|n| Some(MaxUnhealthy::Count(n))),
        Just(Some(MaxUnhealthy::Text("50%".into()))),
        Just(Some(MaxUnhealthy::Text("100%".into()))),
        Just(Some(MaxUnhealthy::Text("lots".into()))),
    ];
    (
        (max.clone(), max, 0u64..300, 0u64..900),
        (1u32..3, 0u32..3, 0u64..900, 0u64..7200, any::<bool>()),
    )
        .prop_map(
            |((cp_max, w_max, timeout, startup), (conc, retry, period, healthy, reprov))| {
                let check = |name: &str, role, max_unhealthy| HealthCheck {
                    name: name.into(),
                    selector: Selector {
                        match_labels: BTreeMap::new(),
                        role: Some(role),
                    },
                    unhealthy_conditions: [ConditionStatus::False, ConditionStatus::Unknown]
                        .into_iter()
                        .map(|status| UnhealthyCondition {
                            type_: "Ready".into(),
                            status,
                            timeout: Duration::from_secs(timeout),
                        })
                        .collect(),
                    max_unhealthy,
                    node_startup_timeout: Some(Duration::from_secs(startup)),
                    agent_heartbeat_timeout: Some(Duration::from_secs(60)),
                };
                Policy {
                    health_checks: vec![
                        check("control-plane", Role::ControlPlane, cp_max),
                        check("workers", Role::Worker, w_max),
                    ],
                    remediation: RemediationSettings {
                        max_concurrent: conc,
                        max_retry: retry,
                        retry_period: Duration::from_secs(period),
                        min_healthy_period: Duration::from_secs(healthy),
                        allow_reprovision: reprov,
                        ..RemediationSettings::default()
                    },
                }
            },
        )
}

fn state() -> impl Strategy<Value = (Snapshot, Policy)> {
    (2usize..10)
        .prop_flat_map(|n| {
            let hosts: Vec<_> = (0..n).map(|i| host_bits(i, n)).collect();
            (
                hosts,
                proptest::collection::vec(rem_bits(), 0..4),
                proptest::collection::vec(member(0), 0..2).prop_map(|mut v| {
                    v.truncate(usize::from(v.len() > 1));
                    v
                }),
                prop_oneof![Just(3u32), Just(3), Just(5), 1u32..7],
                policy(),
            )
        })
        .prop_map(|(hosts, rems, orphans, desired, policy)| {
            let hosts: Vec<Host> = hosts
                .into_iter()
                .enumerate()
                .map(|(i, b)| to_host(i, b))
                .collect();
            let remediations = rems
                .into_iter()
                .map(|b| to_remediation(&hosts, b))
                .collect();
            let orphan_members = orphans
                .into_iter()
                .enumerate()
                .map(|(k, mut m)| {
                    m.id = 100 + k as u64;
                    m
                })
                .collect();
            let snapshot = Snapshot {
                observed_at: NOW,
                control_plane: ControlPlaneSpec {
                    desired_replicas: desired,
                    failure_domains: if desired == 5 {
                        vec!["a".into(), "b".into()]
                    } else {
                        Vec::new()
                    },
                },
                hosts,
                orphan_members,
                remediations,
            };
            (snapshot, policy)
        })
}

// ---- the model -------------------------------------------------------------------------

/// The cluster as the invariants see it, before and after the plan.
#[derive(Debug, Clone, Default)]
struct Model {
    /// Member id → (host, learner, up).
    members: BTreeMap<u64, (Option<String>, bool, bool)>,
}

impl Model {
    fn of(s: &Snapshot) -> Self {
        let off: BTreeSet<&str> = s
            .remediations
            .iter()
            .filter(|r| r.phase.power_may_be_off())
            .map(|r| r.target.as_str())
            .chain(
                s.hosts
                    .iter()
                    .filter(|h| h.hold.is_some())
                    .map(|h| h.name.as_str()),
            )
            .collect();
        let mut members = BTreeMap::new();
        for h in &s.hosts {
            if let Some(m) = &h.etcd {
                let up = m.healthy && !off.contains(h.name.as_str());
                members.insert(m.id, (Some(h.name.clone()), m.learner, up));
            }
        }
        for m in &s.orphan_members {
            members.insert(m.id, (None, m.learner, m.healthy));
        }
        Model { members }
    }

    fn quorum_holds(&self) -> bool {
        let voters: Vec<bool> = self
            .members
            .values()
            .filter(|(_, learner, _)| !learner)
            .map(|(_, _, up)| *up)
            .collect();
        let up = voters.iter().filter(|u| **u).count();
        !voters.is_empty() && up > voters.len() / 2
    }

    fn fence(&mut self, host: &str) {
        for m in self.members.values_mut() {
            if m.0.as_deref() == Some(host) {
                m.2 = false;
            }
        }
    }
}

fn guarded(h: &Host) -> bool {
    h.role == Role::ControlPlane || h.etcd.is_some()
}

/// The host an action fences (powers off, or intends to).
fn fenced_host(a: &Action) -> Option<&str> {
    match &a.kind {
        ActionKind::StartRemediation { remediation } => Some(&remediation.target),
        ActionKind::Remediate {
            target,
            step: RemediationStep::PowerOff,
            ..
        }
        | ActionKind::DecommissionHost { host: target, .. } => Some(target),
        _ => None,
    }
}

fn executor_of(a: &Action) -> Option<(&str, &str, bool)> {
    match &a.kind {
        ActionKind::StartRemediation { remediation: r } => Some((&r.target, &r.executor, true)),
        ActionKind::Remediate {
            target,
            executor,
            step,
            ..
        } => match step {
            RemediationStep::PowerOff => Some((target, executor, true)),
            RemediationStep::PowerOn => Some((target, executor, false)),
            _ => None,
        },
        ActionKind::DecommissionHost { host, executor } => Some((host, executor, true)),
        _ => None,
    }
}

fn is_scaling(k: &ActionKind) -> bool {
    matches!(
        k,
        ActionKind::RequestHost { .. }
            | ActionKind::RequestHostDeletion { .. }
            | ActionKind::Rebalance { .. }
    )
}

fn latest(s: &Snapshot) -> BTreeMap<&str, &Remediation> {
    let mut out: BTreeMap<&str, &Remediation> = BTreeMap::new();
    for r in &s.remediations {
        let e = out.entry(r.target.as_str()).or_insert(r);
        if r.seq > e.seq {
            *e = r;
        }
    }
    out
}

fn selected(check: &HealthCheck, h: &Host) -> bool {
    check.selector.role.is_none_or(|r| r == h.role)
}

#[allow(clippy::too_many_lines)] // one invariant after another, each with its reason
fn check(s: &Snapshot, pol: &Policy, now: Timestamp) -> Result<(), String> {
    let p = crate::plan(s, pol, now);
    let fail = |why: String| Err(format!("{why}\n{p}"));
    // Determinism, also through the wire format (a restarted controller's copy).
    let copy: Snapshot =
        serde_json::from_str(&serde_json::to_string(s).map_err(|e| e.to_string())?)
            .map_err(|e| e.to_string())?;
    if crate::plan(&copy, pol, now) != p {
        return fail("plan differs for the same snapshot".into());
    }
    let hosts: BTreeMap<&str, &Host> = s.hosts.iter().map(|h| (h.name.as_str(), h)).collect();
    let mut ids = BTreeSet::new();
    if s.remediations.iter().any(|r| !ids.insert(r.id.as_str())) {
        return if p.actions.is_empty() {
            Ok(())
        } else {
            fail("an invalid snapshot was planned from".into())
        };
    }
    let before = Model::of(s);
    let mut after = before.clone();
    let latest = latest(s);
    let short_circuited = |h: &Host| {
        pol.health_checks
            .iter()
            .zip(&p.health)
            .any(|(c, v)| v.short_circuit.is_some() && selected(c, h))
    };
    // Seed 004, "Previous remediation MUST have been completed ... while the replacement for
    // the previous machine is not yet created": a failed attempt whose host is back (no check
    // finds it unhealthy, its node ready, its member healthy, not held) is its own
    // replacement, created, and holds nothing back (docs/design-core.md, the judgement's
    // `OneControlPlaneRemediation`).
    let back = |h: &Host| {
        h.hold.is_none()
            && h.node_ready()
            && h.etcd.as_ref().is_none_or(|m| m.healthy)
            && !p.health.iter().any(|v| v.unhealthy.contains(&h.name))
    };
    let in_progress_guarded: BTreeSet<&str> = s
        .remediations
        .iter()
        .filter(|r| {
            (r.phase.is_active() && !matches!(r.phase, P::Detected | P::Gated))
                || (matches!(r.phase, P::Failed { .. })
                    && latest.get(r.target.as_str()).is_some_and(|l| l.id == r.id)
                    && !hosts.get(r.target.as_str()).is_some_and(|h| back(h)))
        })
        .filter(|r| {
            hosts
                .get(r.target.as_str())
                .map_or(r.control_plane, |h| guarded(h))
        })
        .map(|r| r.target.as_str())
        .collect();
    let mut guarded_fences = Vec::new();
    let mut membership = 0;
    for a in &p.actions {
        if a.kind.is_membership_change() {
            membership += 1;
        }
        // Holds: nothing touches a held host's power, and a held host drives nothing.
        if let Some((target, executor, destructive)) = executor_of(a) {
            let t = hosts.get(target).copied();
            let e = hosts.get(executor).copied();
            if t.is_some_and(|h| h.hold.is_some()) {
                return fail(format!("{} touches held {target}", a.id));
            }
            let Some(e) = e else {
                return fail(format!("{} executed by unknown {executor}", a.id));
            };
            if executor == target || e.hold.is_some() {
                return fail(format!("{} executed by {executor}", a.id));
            }
            let hb = pol.remediation.executor_heartbeat_timeout;
            let alive = e
                .agent
                .as_ref()
                .is_some_and(|ag| ag.can_fence && ag.last_heartbeat.after(hb) > now);
            let blind = e
                .agent
                .as_ref()
                .is_some_and(|ag| ag.bmc_reachable.get(target) == Some(&false));
            if !alive || (destructive && blind) {
                return fail(format!("{} given to an executor that cannot do it", a.id));
            }
        }
        match &a.kind {
            ActionKind::StartRemediation { remediation: r } => {
                if s.remediations
                    .iter()
                    .any(|o| o.target == r.target && o.phase.is_active())
                {
                    return fail(format!("second remediation of {}", r.target));
                }
                if s.remediations.iter().any(|o| o.id == r.id) {
                    return fail(format!("id {} reused", r.id));
                }
                if let Some(l) = latest.get(r.target.as_str()) {
                    let window = pol
                        .remediation
                        .min_healthy_period
                        .max(pol.remediation.retry_period);
                    let clean_cancel =
                        matches!(l.phase, P::Cancelled { .. }) && l.powered_on_at.is_none();
                    let fresh = l.phase.is_terminal() || matches!(l.phase, P::Failed { .. });
                    if fresh
                        && !clean_cancel
                        && now < l.phase_since.after(window)
                        && r.attempt <= l.attempt
                    {
                        return fail(format!(
                            "{} within the retry window is not counted as a retry",
                            r.id
                        ));
                    }
                }
                let h = hosts[r.target.as_str()];
                if r.forced.is_none() && short_circuited(h) {
                    return fail(format!("{} past a short-circuit", r.id));
                }
            }
            ActionKind::Remediate {
                remediation_id,
                target,
                step,
                ..
            } => {
                let Some(r) = s.remediations.iter().find(|r| &r.id == remediation_id) else {
                    return fail(format!("step of unknown {remediation_id}"));
                };
                if !r.may_step_to(&step.resulting_phase()) {
                    return fail(format!("illegal {} from {}", step.name(), r.phase));
                }
                let h = hosts.get(target.as_str()).copied();
                if *step == RemediationStep::PowerOff
                    && r.forced.is_none()
                    && h.is_some_and(short_circuited)
                {
                    return fail(format!("{remediation_id} powered off past a short-circuit"));
                }
                if *step == RemediationStep::Reprovision
                    && h.is_some_and(|h| guarded(h) || h.externally_provisioned)
                {
                    return fail(format!("{target} reprovisioned"));
                }
            }
            ActionKind::RemoveMember { member_id, .. } => {
                let Some((host, learner, up)) = before.members.get(member_id).cloned() else {
                    return fail(format!("unknown member {member_id:x} removed"));
                };
                if !learner {
                    let leaving = host
                        .as_deref()
                        .and_then(|h| hosts.get(h))
                        .is_none_or(|h| h.is_deleting());
                    let voters = before.members.values().filter(|m| !m.1).count();
                    let leads = host
                        .as_deref()
                        .and_then(|h| hosts.get(h))
                        .and_then(|h| h.etcd.as_ref())
                        .is_some_and(|m| m.leader);
                    if !leaving
                        || (up && voters <= s.control_plane.desired_replicas as usize)
                        || (up && leads)
                    {
                        return fail(format!("voter {member_id:x} removed against seed 001"));
                    }
                }
                after.members.remove(member_id);
            }
            ActionKind::AddLearner { .. }
                if before.members.values().any(|m| m.1)
                    || before.members.values().any(|m| !m.1 && !m.2) =>
            {
                return fail("learner added next to a learner or a down voter".into());
            }
            ActionKind::PromoteLearner { member_id, .. } => {
                if let Some(m) = after.members.get_mut(member_id) {
                    m.1 = false;
                }
            }
            ActionKind::AddQuorumHook { host }
                if hosts.get(host.as_str()).is_some_and(|h| h.is_deleting()) =>
            {
                return fail(format!("hook re-added to deleting {host}"));
            }
            // Seed 004: scale-up and scale-down alike are blocked unless machines and members
            // are equal in number; seed 002 step 6 / seed 004 scale up: unless every member
            // is healthy (a member whose host may be off or is held is not).
            k if is_scaling(k) => {
                let disagree = !s.orphan_members.is_empty()
                    || s.hosts.iter().any(|h| {
                        (h.role != Role::ControlPlane && h.etcd.is_some())
                            || (h.role == Role::ControlPlane
                                && !h.is_deleting()
                                && h.etcd.is_none())
                    });
                let member_down = before.members.values().any(|m| !m.2);
                if disagree || member_down || !before.quorum_holds() {
                    return fail(format!(
                        "{} while machines and members disagree, a member is down or quorum is lost",
                        a.id
                    ));
                }
            }
            _ => {}
        }
        if let Some(target) = fenced_host(a)
            && let Some(h) = hosts.get(target)
            && guarded(h)
            && !matches!(a.kind, ActionKind::DecommissionHost { .. })
        {
            guarded_fences.push(target.to_owned());
            if in_progress_guarded.iter().any(|o| *o != target) {
                return fail(format!(
                    "{} while another control-plane remediation is in progress",
                    a.id
                ));
            }
            if !before.quorum_holds() {
                return fail(format!("{} fences a guarded host without quorum", a.id));
            }
            after.fence(target);
        }
    }
    if membership > 1 {
        return fail("two membership changes".into());
    }
    if guarded_fences.len() > 1 {
        return fail(format!(
            "{} guarded fences in one plan",
            guarded_fences.len()
        ));
    }
    if !guarded_fences.is_empty() && membership > 0 {
        return fail("a guarded fence next to a membership change".into());
    }
    if (membership > 0 || !guarded_fences.is_empty()) && !before.quorum_holds() {
        return fail("quorum-affecting action without quorum".into());
    }
    if before.quorum_holds() && !after.quorum_holds() {
        return fail("the plan as a whole leaves etcd without quorum".into());
    }
    let rejected = crate::judge::judge_plan(s, pol, now, &p.actions);
    if !rejected.is_empty() {
        return fail(format!(
            "the plan breaks its own judgement: {}",
            rejected[0]
        ));
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn any_state_gives_a_plan_that_keeps_every_safety_rule(
        (s, pol) in state(),
        later in 0u64..1200,
    ) {
        let now = NOW.after(Duration::from_secs(later));
        let r = check(&s, &pol, now);
        prop_assert!(r.is_ok(), "{}", r.err().unwrap_or_default());
    }
}

/// The checker itself can fail: a plan that fences two control-plane hosts of three, or a
/// held host, is caught.
#[test]
fn the_model_catches_a_plan_that_costs_quorum() {
    let mut s = crate::testkit::cluster(3, 0);
    let before = Model::of(&s);
    let mut after = before.clone();
    after.fence("cp-0");
    after.fence("cp-1");
    assert!(before.quorum_holds() && !after.quorum_holds());
    s.hosts[2].hold = Some(crate::testkit::hold("cp-2", "x"));
    let held = Model::of(&s);
    let mut one_more = held.clone();
    one_more.fence("cp-0");
    assert!(held.quorum_holds() && !one_more.quorum_holds());
}

/// The generator is not vacuous: over a few thousand states the planner reaches every kind
/// of decision the invariants are about (guarded fences, membership changes, scaling,
/// holds, short-circuits, actions the judgement drops).
#[test]
fn the_generator_reaches_every_kind_of_decision() {
    use proptest::strategy::ValueTree;
    use proptest::test_runner::TestRunner;
    let mut runner = TestRunner::deterministic();
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for _ in 0..3000 {
        let (s, pol) = state().new_tree(&mut runner).unwrap().current();
        let p = crate::plan(&s, &pol, NOW);
        let guarded_target = |t: &str| s.hosts.iter().any(|h| h.name == t && guarded(h));
        for a in &p.actions {
            let kind = match &a.kind {
                ActionKind::StartRemediation { remediation }
                    if guarded_target(&remediation.target) =>
                {
                    "guarded start"
                }
                ActionKind::Remediate {
                    step: RemediationStep::PowerOff,
                    target,
                    ..
                } if guarded_target(target) => "guarded power-off",
                k if k.is_membership_change() => "membership change",
                k if is_scaling(k) => "scaling",
                _ => "other",
            };
            *seen.entry(kind).or_default() += 1;
        }
        for r in &p.refusals {
            let kind = match r.kind {
                metalguard_api::plan::ReasonKind::Hold => "hold refusal",
                metalguard_api::plan::ReasonKind::ShortCircuit => "short-circuit refusal",
                _ if r.refused == "carrying out" => "dropped by the judgement",
                _ => "other refusal",
            };
            *seen.entry(kind).or_default() += 1;
        }
    }
    for kind in [
        "guarded start",
        "guarded power-off",
        "membership change",
        "scaling",
        "hold refusal",
        "short-circuit refusal",
        "dropped by the judgement",
    ] {
        assert!(
            seen.get(kind).copied().unwrap_or(0) >= 3,
            "{kind}: {seen:?}"
        );
    }
}
