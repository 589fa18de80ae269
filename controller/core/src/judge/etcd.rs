//! Rules about etcd membership, quorum hooks and scaling.

use metalguard_api::snapshot::Role;

use super::{Judge, Rule, Verdict};

impl Judge<'_> {
    pub(super) fn membership_change(&mut self) -> Verdict {
        self.degraded("etcd")?;
        if self.guarded_fences > 0 {
            return Err((
                "etcd".to_owned(),
                Rule::OneMembershipChange,
                "this plan already fences a control-plane host: membership waits".to_owned(),
            ));
        }
        if self.membership_changes > 0 {
            return Err((
                "etcd".to_owned(),
                Rule::OneMembershipChange,
                "this plan already changes the etcd membership".to_owned(),
            ));
        }
        self.membership_changes += 1;
        Ok(())
    }

    pub(super) fn add_learner(&mut self, host: &str) -> Verdict {
        self.membership_change()?;
        let fail = |why: String| Err(("etcd".to_owned(), Rule::LearnerAdd, why));
        let Some(h) = self.hosts.get(host).copied() else {
            return fail(format!("{host} is not a known host"));
        };
        if h.is_deleting() || h.role != Role::ControlPlane || self.member_of(host).is_some() {
            return fail(format!(
                "{host} must be a staying control-plane host without a member"
            ));
        }
        if self.learner_added || self.members.values().any(|m| m.learner && !m.removed) {
            return fail("etcd allows one learner at a time".to_owned());
        }
        if let Some((id, _)) = self.voters().find(|(_, m)| m.down) {
            return fail(format!(
                "voter {id:x} is down: it is removed (or recovers) before a learner is added"
            ));
        }
        self.learner_added = true;
        Ok(())
    }

    pub(super) fn promote(&mut self, host: &str, member_id: u64) -> Verdict {
        self.membership_change()?;
        let fail = |why: String| Err(("etcd".to_owned(), Rule::Promotion, why));
        let Some(m) = self.members.get(&member_id).cloned() else {
            return fail(format!("member {member_id:x} is not known"));
        };
        if !m.learner || m.removed || !m.caught_up || m.down {
            return fail(format!("member {member_id:x} is not a caught-up learner"));
        }
        let staying_hooked = m
            .host
            .as_deref()
            .and_then(|n| self.hosts.get(n))
            .is_some_and(|h| {
                h.name == host && !h.is_deleting() && h.has_quorum_hook() && h.hold.is_none()
            });
        if !staying_hooked {
            return fail(format!(
                "the host of learner {member_id:x} must stay and carry the quorum hook"
            ));
        }
        let voters = self.voters().count();
        if let Some(desired) = self.desired
            && voters + 1 > desired + 1
        {
            return fail(format!(
                "{} voters would exceed desired {desired} + 1",
                voters + 1
            ));
        }
        if let Some(x) = self.members.get_mut(&member_id) {
            x.learner = false;
        }
        if let Some(why) = self.quorum_shortfall() {
            return Err((
                "etcd".to_owned(),
                Rule::QuorumAfterPlan,
                format!("promoting {member_id:x} leaves {why}"),
            ));
        }
        Ok(())
    }

    pub(super) fn remove_member(&mut self, member_id: u64) -> Verdict {
        self.membership_change()?;
        let fail = |why: String| Err(("etcd".to_owned(), Rule::VoterRemoval, why));
        let Some(m) = self.members.get(&member_id).cloned() else {
            return fail(format!("member {member_id:x} is not known"));
        };
        if m.removed {
            return fail(format!("member {member_id:x} is already removed"));
        }
        if !m.learner {
            let leaving = m
                .host
                .as_deref()
                .and_then(|n| self.hosts.get(n))
                .is_none_or(|h| h.is_deleting());
            if !leaving {
                return fail(format!(
                    "voter {member_id:x} is on a host that stays: only a leaving host's voter is removed"
                ));
            }
            if !m.down && m.leader {
                return fail(format!(
                    "voter {member_id:x} leads: leadership moves off it first"
                ));
            }
            let voters = self.voters().count();
            if !m.down && self.desired.is_some_and(|d| voters <= d) {
                return fail(format!(
                    "healthy voter {member_id:x} goes only once its replacement votes ({voters} voters)"
                ));
            }
        }
        if let Some(x) = self.members.get_mut(&member_id) {
            x.removed = true;
        }
        if !m.learner
            && let Some(why) = self.quorum_shortfall()
        {
            return Err((
                "etcd".to_owned(),
                Rule::QuorumAfterPlan,
                format!("removing {member_id:x} leaves {why}"),
            ));
        }
        Ok(())
    }

    /// Scaling waits for machines and members to agree (seed 004's preflight), a scale-down
    /// too (see `scaling::machines_and_members_disagree`), and for every etcd member to be
    /// up — with what is in flight or held counted (seed 004 scale up, seed 002 scale out/in
    /// step 6).
    pub(super) fn scaling(&mut self) -> Verdict {
        self.degraded("control-plane")?;
        let fail = |rule: Rule, why: String| Err(("control-plane".to_owned(), rule, why));
        if let Some((id, _)) = self
            .members
            .iter()
            .find(|(_, m)| m.host.is_none() && !m.removed)
        {
            return fail(
                Rule::ScalingWhileDisagreeing,
                format!("etcd member {id:x} belongs to no host"),
            );
        }
        for h in &self.snapshot.hosts {
            let member = self.member_of(&h.name).is_some();
            if h.role == Role::ControlPlane && !h.is_deleting() && !member {
                return fail(
                    Rule::ScalingWhileDisagreeing,
                    format!("control-plane host {} has no etcd member yet", h.name),
                );
            }
            if h.role != Role::ControlPlane && member {
                return fail(
                    Rule::ScalingWhileDisagreeing,
                    format!(
                        "{} runs an etcd member but is not a control-plane host",
                        h.name
                    ),
                );
            }
        }
        if let Some((id, m)) = self.members.iter().find(|(_, m)| m.down && !m.removed) {
            let on = m
                .host
                .as_deref()
                .map_or_else(String::new, |h| format!(" on {h}"));
            return fail(
                Rule::ScalingWithMemberDown,
                format!("etcd member {id:x}{on} is down, in flight or held"),
            );
        }
        Ok(())
    }
}
