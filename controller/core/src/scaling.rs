//! Control-plane scaling (seeds 002, 004): requesting a host (scale-up, a replacement, the
//! surge of a rollout), requesting the deletion of one (scale-down), or proposing a
//! rebalance. Planned by [`crate::guard`] only when no membership change is.
//!
//! Preconditions, each with the seed its reason quotes ([`crate::seeds`]):
//! - every scaling action waits until control-plane machines and etcd members are equal in
//!   number (seed 004 preflight) — a scale-down too: the surge host of a rollout gets its
//!   member (learner, promotion) before a host is removed, as KCP's joining machine does;
//! - a host is requested — scale-up *and* replacement — only while every etcd member is
//!   healthy and every staying machine with a member has a ready node (seed 004 scale up,
//!   seed 002 scale out step 6), and no staying control-plane host is unhealthy or under
//!   remediation; a host being deleted is on its way out and is not judged;
//! - a scale-down goes under the same preflight, one host at a time, and removes the host
//!   [`choose_host_to_remove`] picks: marked with Cluster API's `delete-machine` annotation
//!   first (seed 004), then outdated, then the most populated domain's oldest.

use metalguard_api::plan::{ActionKind, ReasonKind};
use metalguard_api::snapshot::{Host, Role, Snapshot};

use crate::domains::{
    choose_failure_domain, choose_host_to_remove, propose_rebalance, why_removed_first,
};
use crate::guard::{ControlPlaneActivity, GuardOutput};
use crate::quorum::EtcdView;
use crate::seeds;

/// What is refused, in the plan's refusals.
const SUBJECT: &str = "control-plane";

/// Plans at most one scaling action (or says why none goes).
pub(crate) fn plan_scaling(
    snapshot: &Snapshot,
    view: &EtcdView<'_>,
    desired: usize,
    activity: ControlPlaneActivity,
    out: &mut GuardOutput,
) {
    if let Some(why) = machines_and_members_disagree(snapshot, view) {
        return out.refuse(
            SUBJECT,
            ReasonKind::ControlPlaneBusy,
            format!(
                "scaling waits until control-plane machines and etcd members agree: {why} ({})",
                seeds::MACHINES_EQUAL_MEMBERS
            ),
        );
    }
    let domains = &snapshot.control_plane.failure_domains;
    let keep: Vec<&Host> = view
        .control_plane
        .iter()
        .copied()
        .filter(|h| !h.is_deleting())
        .collect();
    let deleting = view.control_plane.len() - keep.len();
    let preflight = check_preflight(view, activity);
    let request_host = |out: &mut GuardOutput, why: String| {
        let d = choose_failure_domain(domains, &keep);
        let where_ = d.map_or_else(
            || "the only failure domain".to_owned(),
            |d| format!("failure domain {d}"),
        );
        out.act(
            format!(
                "control-plane/request-host/{}",
                view.control_plane.len() + 1
            ),
            ActionKind::RequestHost {
                failure_domain: d.map(str::to_owned),
            },
            format!("{why}: request a control-plane host in {where_}"),
        );
    };
    if keep.len() < desired {
        let what = if deleting > 0 {
            format!("{} hosts stay, desired {desired} (replacement)", keep.len())
        } else {
            format!("scale up: {} hosts, desired {desired}", keep.len())
        };
        match &preflight {
            Ok(()) => request_host(out, what),
            Err(e) => {
                let which = if deleting > 0 {
                    "replacement"
                } else {
                    "scale-up"
                };
                out.refuse(
                    SUBJECT,
                    ReasonKind::ControlPlaneBusy,
                    format!(
                        "{which} short-circuited: {e} ({})",
                        seeds::SCALE_UP_PREFLIGHT
                    ),
                );
            }
        }
    } else if keep.len() > desired {
        // One at a time; a learner that will be promoted (the surge member) goes first.
        let promotable_learner = view.learners().next().is_some() && view.voter_count() <= desired;
        if deleting > 0 || promotable_learner {
            return;
        }
        if let Err(e) = &preflight {
            return out.refuse(
                SUBJECT,
                ReasonKind::ControlPlaneBusy,
                format!("scale-down short-circuited: {e}"),
            );
        }
        if let Some(victim) = choose_host_to_remove(domains, &keep) {
            out.act(
                format!("control-plane/delete-host/{}", victim.name),
                ActionKind::RequestHostDeletion {
                    host: victim.name.clone(),
                },
                format!(
                    "{} hosts, desired {desired}: remove {}: {} ({})",
                    keep.len(),
                    victim.name,
                    why_removed_first(victim),
                    seeds::DELETE_ANNOTATION_FIRST
                ),
            );
        }
    } else if deleting == 0 && !view.membership_in_flux() && preflight.is_ok() {
        if let Some(old) = keep
            .iter()
            .filter(|h| !h.up_to_date)
            .min_by_key(|h| (h.created_at, h.name.clone()))
        {
            request_host(
                out,
                format!(
                    "rollout: {} is outdated, surge one host before removing it",
                    old.name
                ),
            );
        } else if let Some(p) = propose_rebalance(domains, &keep) {
            out.act(
                format!("control-plane/rebalance/{}", p.host.name),
                ActionKind::Rebalance {
                    host: p.host.name.clone(),
                    from: p.host.failure_domain.clone(),
                    to: p.to.to_owned(),
                },
                format!(
                    "failure domains are unbalanced: replace {} into {}",
                    p.host.name, p.to
                ),
            );
        }
    }
}

/// Seed 002's scale out/in step 6 and seed 004's scale-up preflight: every etcd member
/// healthy, every staying control-plane machine with a member backed by a ready node, and no
/// staying control-plane host unhealthy or under remediation (`activity`). A host being
/// deleted is not judged by its node: it is on its way out (its dead member, if any, is
/// still one of "all etcd members" and is removed first by the guard).
fn check_preflight(view: &EtcdView<'_>, activity: ControlPlaneActivity) -> Result<(), String> {
    if let Some(m) = view.members.iter().find(|m| !m.member.healthy) {
        return Err(format!("etcd member {} is unhealthy", m.label()));
    }
    if let Some(h) = view
        .control_plane
        .iter()
        .find(|h| !h.is_deleting() && h.etcd.is_some() && !h.node_ready())
    {
        return Err(format!("{} has no ready node", h.name));
    }
    if activity.remediation_active || activity.unhealthy {
        return Err("a control-plane host is unhealthy or under remediation".to_owned());
    }
    Ok(())
}

/// Seed 004's preflight: as many control-plane machines as etcd members. Set, with the
/// first disagreement, when a member belongs to no host, a staying control-plane host has
/// no member yet (still provisioning, or a surge host before its learner joins), or a host
/// that is not control-plane runs a member. A host being deleted whose member is already
/// gone is on its way out and does not count. This holds for every scaling action, a
/// scale-down included.
pub fn machines_and_members_disagree(snapshot: &Snapshot, view: &EtcdView<'_>) -> Option<String> {
    if let Some(m) = view.members.iter().find(|m| m.host.is_none()) {
        return Some(format!("etcd member {:x} belongs to no host", m.member.id));
    }
    snapshot.hosts.iter().find_map(|h| {
        let cp = h.role == Role::ControlPlane;
        if cp && !h.is_deleting() && h.etcd.is_none() {
            Some(format!(
                "control-plane host {} has no etcd member yet",
                h.name
            ))
        } else if !cp && h.etcd.is_some() {
            Some(format!(
                "{} runs an etcd member but is not a control-plane host",
                h.name
            ))
        } else {
            None
        }
    })
}
