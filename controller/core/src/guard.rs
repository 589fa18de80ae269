//! Plans quorum-hook changes, at most one etcd membership change, and then control-plane
//! scaling ([`crate::scaling`]) (seeds 001, 002, 004), using the rules in [`crate::quorum`].

use metalguard_api::plan::{Action, ActionKind, OperationId, ReasonKind, Refusal};
use metalguard_api::snapshot::{Host, Role, Snapshot};

use crate::quorum::{EtcdView, MemberRef, quorum, validate_desired};
use crate::scaling::plan_scaling;

/// What the guard decided.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuardOutput {
    /// Hook, membership and scaling actions, in order.
    pub actions: Vec<Action>,
    /// Refusals with reasons.
    pub refusals: Vec<Refusal>,
    /// Set when the control plane is degraded beyond repair by the guard.
    pub degraded: Option<String>,
    /// The voluntary disruption budget.
    pub min_available: Option<usize>,
}

impl GuardOutput {
    pub(crate) fn act(&mut self, id: String, kind: ActionKind, reason: String) {
        self.actions.push(Action {
            id: OperationId(id),
            kind,
            reason,
        });
    }

    pub(crate) fn refuse(&mut self, subject: &str, kind: ReasonKind, reason: String) {
        let refused = if subject == "etcd" {
            "changing the membership of"
        } else {
            "scaling"
        };
        self.refusals.push(Refusal {
            refused: refused.to_owned(),
            subject: subject.to_owned(),
            reason,
            kind,
        });
    }

    /// True when a membership change was planned.
    pub fn has_membership_change(&self) -> bool {
        self.actions.iter().any(|a| a.kind.is_membership_change())
    }
}

/// Control-plane activity the guard must respect.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ControlPlaneActivity {
    /// A control-plane remediation is active.
    pub remediation_active: bool,
    /// Some control-plane host that stays (is not being deleted) is unhealthy by a health
    /// check.
    pub unhealthy: bool,
}

/// Plans hooks, one membership change and scaling for the control plane.
pub fn plan_guard(
    snapshot: &Snapshot,
    view: &EtcdView<'_>,
    activity: ControlPlaneActivity,
) -> GuardOutput {
    let mut out = GuardOutput::default();
    let desired = match validate_desired(snapshot.control_plane.desired_replicas) {
        Ok(d) => d,
        Err(e) => {
            out.degraded = Some(format!("{e}; the quorum guard takes no action"));
            return out;
        }
    };
    if let Some(reason) = view.quorum_lost() {
        out.degraded = Some(format!(
            "{reason}; the quorum guard takes no action and a person must recover etcd"
        ));
        return out;
    }
    out.min_available = Some(view.min_available());
    plan_hooks(view, &mut out);
    plan_membership(view, desired, &mut out);
    if !out.has_membership_change() {
        plan_scaling(snapshot, view, desired, activity, &mut out);
    }
    out
}

fn plan_hooks(view: &EtcdView<'_>, out: &mut GuardOutput) {
    for m in &view.members {
        if let Some(h) = m.host
            && !h.is_deleting()
            && !h.has_quorum_hook()
        {
            let what = if m.member.learner { "learner" } else { "voter" };
            out.act(
                format!("quorum/add-hook/{}", h.name),
                ActionKind::AddQuorumHook {
                    host: h.name.clone(),
                },
                format!(
                    "{} hosts etcd {what} {:x}: protect it with the preDrain hook before it votes",
                    h.name, m.member.id
                ),
            );
        }
    }
    for h in &view.control_plane {
        if h.is_deleting() && h.has_quorum_hook() && view.member_of(&h.name).is_none() {
            out.act(
                format!("quorum/remove-hook/{}", h.name),
                ActionKind::RemoveQuorumHook {
                    host: h.name.clone(),
                },
                format!(
                    "{} is being deleted and its etcd member is gone: release the hook",
                    h.name
                ),
            );
        }
    }
}

fn remove_member(out: &mut GuardOutput, m: &MemberRef<'_>, reason: String) {
    out.act(
        format!("quorum/remove-member/{:x}", m.member.id),
        ActionKind::RemoveMember {
            host: m.host.map(|h| h.name.clone()),
            member_id: m.member.id,
        },
        reason,
    );
}

/// True when more control-plane hosts stay than desired: the surge of a rollout (or a host
/// added beyond the desired count). A scale-down is coming, and it waits until machines and
/// members are equal in number (seed 004's preflight, [`crate::scaling`]): the staying host
/// without a member gets one first, and a learner there is kept, not removed as a spare.
fn surplus_of_hosts(view: &EtcdView<'_>, desired: usize) -> bool {
    view.control_plane
        .iter()
        .filter(|h| !h.is_deleting())
        .count()
        > desired
}

fn plan_membership(view: &EtcdView<'_>, desired: usize, out: &mut GuardOutput) {
    let voters = view.voter_count();
    let keep_voters = view.voters().filter(|m| !m.leaving()).count();
    // (a) A learner whose host is leaving is never promoted: remove it (seed 001).
    if let Some(l) = view.learners().find(|m| m.leaving()) {
        return remove_member(
            out,
            l,
            format!(
                "{} is leaving before promotion: remove the learner",
                l.label()
            ),
        );
    }
    // (b) A dead voter on a leaving host is removed before its replacement is added (KCP).
    if let Some(v) = view.voters().find(|m| m.leaving() && !m.member.healthy) {
        match view.may_remove_voter(v.member.id) {
            Ok(()) => {
                return remove_member(
                    out,
                    v,
                    format!(
                        "{} is leaving and unhealthy: remove it before adding its replacement",
                        v.label()
                    ),
                );
            }
            Err(e) => out.refuse("etcd", ReasonKind::Quorum, e.to_string()),
        }
    }
    // (c) At most one learner: promote it when it may be promoted, else wait.
    if let Some(l) = view.learners().next() {
        let name = l.label();
        let surge =
            l.host.is_some_and(|h| h.role == Role::ControlPlane) && surplus_of_hosts(view, desired);
        if keep_voters >= desired && !surge {
            return remove_member(
                out,
                l,
                format!("{name} is not needed: {keep_voters} voters already stay"),
            );
        }
        if !l.member.caught_up() {
            let p = l.member.progress_permille;
            return out.refuse(
                "etcd",
                ReasonKind::Waiting,
                format!("learner {name} is catching up ({p}‰ of the leader, needs 900‰)"),
            );
        }
        if !l.host.is_some_and(Host::has_quorum_hook) {
            return out.refuse(
                "etcd",
                ReasonKind::Waiting,
                format!("learner {name} waits for its preDrain hook before promotion"),
            );
        }
        if voters + 1 > desired + 1 {
            return out.refuse(
                "etcd",
                ReasonKind::Quorum,
                format!(
                    "promoting {name} would make {} voters > desired {desired} + 1; it stays a learner until a scale-down removes a voter",
                    voters + 1
                ),
            );
        }
        if view.healthy_voter_count() + 1 < quorum(voters + 1) {
            return out.refuse(
                "etcd",
                ReasonKind::Quorum,
                format!(
                    "promoting {name} would leave quorum of {} unmet",
                    voters + 1
                ),
            );
        }
        let host = l.host.map(|h| h.name.clone()).unwrap_or_default();
        out.act(
            format!("quorum/promote/{:x}", l.member.id),
            ActionKind::PromoteLearner { host, member_id: l.member.id },
            format!("learner {name} is caught up and protected: promote it to replace a leaving or missing voter"),
        );
        return;
    }
    // (d) A healthy voter on a leaving host goes only once its replacement is promoted.
    if let Some(v) = view.voters().find(|m| m.leaving()) {
        if voters > desired {
            if v.member.leader {
                let target = view
                    .voters()
                    .find(|m| !m.leaving() && m.member.healthy && !m.member.leader);
                match target {
                    Some(t) => out.act(
                        format!("quorum/move-leader/{:x}", v.member.id),
                        ActionKind::MoveLeader {
                            from_member: v.member.id,
                            to_member: t.member.id,
                        },
                        format!(
                            "{} leads and is leaving: move leadership to {} before removing it",
                            v.label(),
                            t.label()
                        ),
                    ),
                    None => out.refuse(
                        "etcd",
                        ReasonKind::Quorum,
                        format!("{} leads and no healthy voter can take over", v.label()),
                    ),
                }
                return;
            }
            match view.may_remove_voter(v.member.id) {
                Ok(()) => {
                    return remove_member(
                        out,
                        v,
                        format!(
                            "{} is leaving and its replacement votes ({voters} voters > desired {desired})",
                            v.label()
                        ),
                    );
                }
                Err(e) => return out.refuse("etcd", ReasonKind::Quorum, e.to_string()),
            }
        }
        out.refuse(
            "etcd",
            ReasonKind::Waiting,
            format!(
                "keeping {} until its replacement is promoted ({voters} voters, desired {desired})",
                v.label()
            ),
        );
    }
    // (e) Add a learner when voters that stay are short of the desired count, or on the
    // surge host of a scale-down to come (machines and members equal first, seed 004).
    let short = keep_voters < desired && voters <= desired;
    let surge = surplus_of_hosts(view, desired)
        && view
            .control_plane
            .iter()
            .any(|h| !h.is_deleting() && h.etcd.is_none());
    if short || surge {
        if let Some(down) = view.voters().find(|m| !m.member.healthy) {
            return out.refuse(
                "etcd",
                ReasonKind::Quorum,
                format!(
                    "not adding a learner while voter {} is down (etcd rejects it)",
                    down.label()
                ),
            );
        }
        let candidates: Vec<&Host> = view
            .control_plane
            .iter()
            .copied()
            .filter(|h| !h.is_deleting() && h.etcd.is_none() && h.node_ready())
            .collect();
        let with_members: Vec<&Host> = view.members.iter().filter_map(|m| m.host).collect();
        let pick = candidates
            .iter()
            .min_by_key(|h| {
                let pop = with_members
                    .iter()
                    .filter(|o| !o.is_deleting() && o.failure_domain == h.failure_domain)
                    .count();
                (pop, h.failure_domain.clone(), h.name.clone())
            })
            .copied();
        let why = if short {
            format!("{keep_voters} voters stay, desired {desired}")
        } else {
            format!(
                "more control-plane hosts than desired {desired}: the surge host gets its member before a host is removed ({})",
                crate::seeds::MACHINES_EQUAL_MEMBERS
            )
        };
        match pick {
            Some(h) => out.act(
                format!("quorum/add-learner/{}", h.name),
                ActionKind::AddLearner {
                    host: h.name.clone(),
                },
                format!(
                    "{why}: add {} as a learner (never a voter directly)",
                    h.name
                ),
            ),
            None => out.refuse(
                "etcd",
                ReasonKind::Waiting,
                format!("{why}: no ready control-plane host without a member"),
            ),
        }
    }
}
