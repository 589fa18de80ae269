//! Property tests over arbitrary (not simulated) snapshots: whatever an adapter hands in —
//! orphan learners, stale `detected` records, leaders without quorum, odd hook states — the
//! planner must not panic, must be deterministic, and every action must respect the rules that
//! do not depend on history.

use proptest::prelude::*;

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::ActionKind;
use metalguard_api::remediation::{Remediation, RemediationPhase as P, remediation_id};
use metalguard_api::snapshot::{FenceRequest, QUORUM_HOOK, Role, Snapshot};

use crate::quorum::{EtcdView, validate_desired};
use crate::testkit::{NOW, host, member, policy};

fn cases() -> u32 {
    std::env::var("METALGUARD_PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(256)
}

type HostBits = (bool, u8, u8, u8, u8, u8, u16);

fn phase(i: u8) -> P {
    let r = || "r".to_owned();
    match i % 14 {
        0 => P::Detected,
        1 => P::Gated,
        2 => P::PoweringOff,
        3 => P::VerifiedOff,
        4 => P::BackedUp,
        5 => P::NodeRemoved,
        6 => P::PoweringOn,
        7 => P::WaitingForNode,
        8 => P::Restored,
        9 => P::Done,
        10 => P::Failed { reason: r() },
        11 => P::NeedsPerson { reason: r() },
        12 => P::Reprovisioning,
        _ => P::Cancelled { reason: r() },
    }
}

fn snapshot(desired: u32, hosts: &[HostBits], rems: &[(usize, u8, u8)]) -> Snapshot {
    let mut out = Vec::new();
    for (i, &(cp, a, b, c, d, _, progress)) in hosts.iter().enumerate() {
        let role = if cp { Role::ControlPlane } else { Role::Worker };
        let name = format!("h-{i}");
        let mut h = host(
            &name,
            role,
            ["a", "b", "c"].get(usize::from(a % 4)).copied(),
            u64::from(b) * 1000,
        );
        let ago = |x: u8| Timestamp(NOW.0.saturating_sub(u64::from(x) * 10_000));
        if a & 0x10 != 0 {
            crate::testkit::break_host(&mut h, ago(b));
        }
        if a & 0x20 != 0 {
            h.node = None;
            h.node_seen = b & 1 == 1;
        }
        if a & 0x40 != 0 {
            h.agent = None;
        }
        h.bmc_configured = a & 0x80 == 0;
        h.up_to_date = c & 1 == 0;
        if c & 2 != 0 {
            h.deletion_requested_at = Some(ago(c));
        }
        if c & 4 != 0 {
            h.pre_drain_hooks.insert(QUORUM_HOOK.into());
        }
        if c & 8 != 0 {
            h.fence_request = Some(FenceRequest {
                requested_at: ago(d),
                requested_by: None,
                force_reason: (c & 16 != 0).then(|| "forced".to_owned()),
                stay_off: false,
                nonce: None,
                drill: c & 16 == 0 && c & 128 != 0,
            });
        }
        if c & 128 != 0 {
            h.retirement = Some(metalguard_api::snapshot::Retirement {
                requested_at: ago(d),
                requested_by: None,
                reason: String::new(),
            });
        }
        h.externally_provisioned = c & 32 != 0;
        h.phase_failed = c & 64 != 0;
        if d & 1 != 0 {
            let mut m = member(i as u64 + 1, d & 2 != 0, d & 4 != 0);
            m.leader = d & 8 != 0;
            m.progress_permille = progress % 1001;
            h.etcd = Some(m);
        }
        out.push(h);
    }
    let mut orphan = Vec::new();
    if let Some(&(_, _, _, _, _, e, p)) = hosts.first()
        && e & 1 != 0
    {
        let mut m = member(100, e & 2 != 0, e & 4 != 0);
        m.progress_permille = p % 1001;
        orphan.push(m);
    }
    let mut remediations: Vec<Remediation> = Vec::new();
    for (k, &(t, ph, ex)) in rems.iter().enumerate() {
        if out.is_empty() {
            break;
        }
        let target = &out[t % out.len()];
        let executor = &out[usize::from(ex) % out.len()];
        let seq = k as u32 + 1;
        remediations.push(Remediation {
            id: remediation_id(&target.name, seq),
            target: target.name.clone(),
            seq,
            attempt: u32::from(ex % 4) + 1,
            executor: executor.name.clone(),
            strategy: metalguard_api::policy::Strategy::ExternalBaremetal,
            node_handling: metalguard_api::policy::NodeHandling::Delete,
            phase: phase(ph),
            started_at: Timestamp(NOW.0 - 4_000_000),
            phase_since: Timestamp(NOW.0 - u64::from(ph) * 20_000),
            control_plane: target.role == Role::ControlPlane,
            cause: "fuzz".into(),
            forced: None,
            cancel_requested: (ph & 0x40 != 0).then(|| "fuzz".to_owned()),
            backup: None,
            powered_on_at: None,
            stay_off: false,
            boot_before: None,
        });
    }
    Snapshot {
        observed_at: NOW,
        control_plane: metalguard_api::snapshot::ControlPlaneSpec {
            desired_replicas: desired,
            failure_domains: if desired.is_multiple_of(3) {
                Vec::new()
            } else {
                vec!["a".into(), "b".into()]
            },
        },
        hosts: out,
        orphan_members: orphan,
        remediations,
    }
}

fn check(s: &Snapshot) -> Result<(), String> {
    let pol = policy();
    let p = crate::plan(s, &pol, NOW);
    if crate::plan(s, &pol, NOW) != p {
        return Err("not deterministic".into());
    }
    let view = EtcdView::from_snapshot(s);
    if p.actions
        .iter()
        .filter(|a| a.kind.is_membership_change())
        .count()
        > 1
    {
        return Err(format!("two membership changes:\n{p}"));
    }
    let degraded =
        view.quorum_lost().is_some() || validate_desired(s.control_plane.desired_replicas).is_err();
    for a in &p.actions {
        match &a.kind {
            k if degraded && k.is_membership_change() => {
                return Err(format!("membership change while degraded:\n{p}"));
            }
            ActionKind::AddQuorumHook { host }
                if s.hosts.iter().any(|h| &h.name == host && h.is_deleting()) =>
            {
                return Err(format!("hook re-added to deleting {host}"));
            }
            ActionKind::DecommissionHost { host, executor } => {
                let h = s
                    .hosts
                    .iter()
                    .find(|h| &h.name == host)
                    .ok_or("power-off of an unknown host")?;
                if !h.is_retiring() || h.etcd.is_some() || !h.pre_drain_hooks.is_empty() {
                    return Err(format!("{host} powered off while not released:\n{p}"));
                }
                if executor == host || view.quorum_lost().is_some() {
                    return Err(format!("{host} powered off by itself or blind:\n{p}"));
                }
            }
            ActionKind::StartRemediation { remediation: r } => {
                if r.executor == r.target {
                    return Err(format!("{} executed by its target", r.id));
                }
                if s.remediations
                    .iter()
                    .any(|o| o.target == r.target && o.phase.is_active())
                {
                    return Err(format!("second remediation on {}", r.target));
                }
                if s.remediations.iter().any(|o| o.id == r.id) {
                    return Err(format!("id {} reused", r.id));
                }
            }
            ActionKind::Remediate {
                remediation_id,
                target,
                executor,
                step,
            } => {
                if executor == target {
                    return Err(format!("{remediation_id} executed by its target"));
                }
                let r = s
                    .remediations
                    .iter()
                    .find(|r| &r.id == remediation_id)
                    .ok_or("unknown remediation")?;
                if !r.may_step_to(&step.resulting_phase()) {
                    return Err(format!(
                        "illegal step {} from {} in {remediation_id}",
                        step.name(),
                        r.phase
                    ));
                }
            }
            ActionKind::RemoveMember { member_id, .. } => {
                let m = view
                    .members
                    .iter()
                    .find(|m| m.member.id == *member_id)
                    .ok_or("unknown member")?;
                if m.member.is_voter()
                    && m.member.healthy
                    && view.voter_count() <= s.control_plane.desired_replicas as usize
                {
                    return Err(format!(
                        "healthy voter {} removed without a replacement:\n{p}",
                        m.label()
                    ));
                }
                if view.may_remove_voter(*member_id).is_err() && m.member.is_voter() {
                    return Err(format!("removal of {} costs quorum", m.label()));
                }
            }
            _ => {}
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn arbitrary_snapshots_never_break_the_rules(
        desired in 0u32..7,
        hosts in proptest::collection::vec(any::<HostBits>(), 0..9),
        rems in proptest::collection::vec((any::<usize>(), any::<u8>(), any::<u8>()), 0..5),
    ) {
        let s = snapshot(desired, &hosts, &rems);
        let r = check(&s);
        prop_assert!(r.is_ok(), "{}", r.err().unwrap_or_default());
    }
}
