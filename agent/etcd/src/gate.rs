//! The safety gate for membership changes: pure checks of a [`ClusterView`].
//!
//! etcd's own reconfiguration check trusts TCP liveness only: with a voter hung (SIGSTOP) it
//! accepted a voting add and quorum was lost at once (DOMAIN.md §1). The gate therefore asks
//! every voter itself, and refuses any change unless the answers make the change safe.

use crate::view::{ClusterView, MemberView};

/// Why the gate refused a membership change. Each message names the member and says what
/// must happen first.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// A voter did not answer our probe (killed, hung or partitioned).
    #[error("voter {member} did not answer our probe ({reason}): it must be removed first")]
    DeadVoter {
        /// The voter.
        member: String,
        /// What the probe saw.
        reason: String,
    },
    /// A voter answered but is not healthy (no leader, alarm).
    #[error("voter {member} is unhealthy ({reason}): fix or remove it first")]
    UnhealthyVoter {
        /// The voter.
        member: String,
        /// What the probe saw.
        reason: String,
    },
    /// A learner already exists; etcd allows only one.
    #[error(
        "learner {member} already exists and etcd allows one learner: promote or remove it first"
    )]
    LearnerPresent {
        /// The learner.
        member: String,
    },
    /// A member was added but never started.
    #[error("member {member} was added but never started: start or remove it first")]
    UnstartedMember {
        /// The member.
        member: String,
    },
    /// No member that answered our probe is the leader (an election is under way).
    #[error("no leader answered our probe: wait for the election to finish")]
    NoLiveLeader,
    /// The member to change is not in the cluster.
    #[error("member {id:x} is not in the cluster")]
    UnknownMember {
        /// The member ID.
        id: u64,
    },
    /// The member to promote is already a voter.
    #[error("member {member} is already a voter")]
    NotALearner {
        /// The member.
        member: String,
    },
    /// The learner to promote did not answer our probe.
    #[error("learner {member} did not answer our probe ({reason}): it cannot be promoted")]
    LearnerUnreachable {
        /// The learner.
        member: String,
        /// What the probe saw.
        reason: String,
    },
    /// Removing the voter would leave fewer healthy voters than the new quorum.
    #[error(
        "removing voter {member} would leave {healthy_after} healthy of {voters_after} voters, below quorum {quorum_after}"
    )]
    WouldLoseQuorum {
        /// The voter.
        member: String,
        /// Healthy voters after the removal.
        healthy_after: usize,
        /// Voters after the removal.
        voters_after: usize,
        /// Quorum after the removal.
        quorum_after: usize,
    },
    /// The voter is the last one.
    #[error("member {member} is the last voter and cannot be removed")]
    LastVoter {
        /// The voter.
        member: String,
    },
    /// Leadership cannot move to a learner.
    #[error("member {member} is a learner and cannot lead: promote it first")]
    LearnerCannotLead {
        /// The learner.
        member: String,
    },
    /// Leadership should move to a voter that did not answer our probe healthy.
    #[error("voter {member} is not healthy ({reason}): leadership cannot move to it")]
    UnhealthyTarget {
        /// The voter.
        member: String,
        /// What the probe saw.
        reason: String,
    },
}

fn probe_reason(member: &MemberView) -> String {
    match &member.probe {
        None => "not probed: no client url".to_owned(),
        Some(p) if !p.reachable => p.error.clone().unwrap_or_else(|| "no answer".to_owned()),
        Some(p) => match &p.status {
            Some(s) if s.leader == 0 => "sees no leader".to_owned(),
            Some(s) if !s.alarms.is_empty() => format!("alarms {}", s.alarm_names()),
            _ => "unhealthy".to_owned(),
        },
    }
}

/// Checks that every voter answered our probe healthy and that the leader is one of them.
fn require_healthy_voters(view: &ClusterView) -> Result<(), Refusal> {
    // Dead voters first: while one is dead the others may see no leader, and the dead one
    // is what must be dealt with.
    if let Some(voter) = view.voters().find(|v| !v.reachable()) {
        return Err(Refusal::DeadVoter {
            member: voter.label(),
            reason: probe_reason(voter),
        });
    }
    if let Some(voter) = view.voters().find(|v| !v.healthy()) {
        return Err(Refusal::UnhealthyVoter {
            member: voter.label(),
            reason: probe_reason(voter),
        });
    }
    if !view.leader().is_some_and(MemberView::healthy) {
        return Err(Refusal::NoLiveLeader);
    }
    Ok(())
}

/// May a learner be added? Every voter answered our probe healthy, no learner and no
/// unstarted member exists.
pub fn may_add_learner(view: &ClusterView) -> Result<(), Refusal> {
    require_healthy_voters(view)?;
    if let Some(m) = view.members.iter().find(|m| !m.started) {
        return Err(Refusal::UnstartedMember { member: m.label() });
    }
    if let Some(m) = view.members.iter().find(|m| m.is_learner) {
        return Err(Refusal::LearnerPresent { member: m.label() });
    }
    Ok(())
}

/// May the learner `id` be promoted? It is a started learner that answers our probe, and
/// every voter answered healthy (a promotion grows the quorum).
pub fn may_promote(view: &ClusterView, id: u64) -> Result<(), Refusal> {
    let member = view.member(id).ok_or(Refusal::UnknownMember { id })?;
    if !member.is_learner {
        return Err(Refusal::NotALearner {
            member: member.label(),
        });
    }
    if !member.reachable() {
        return Err(Refusal::LearnerUnreachable {
            member: member.label(),
            reason: probe_reason(member),
        });
    }
    require_healthy_voters(view)
}

/// May the member `id` be removed? A learner always may. A voter may if the healthy voters
/// left make the new quorum and it is not the last voter.
pub fn may_remove(view: &ClusterView, id: u64) -> Result<(), Refusal> {
    let member = view.member(id).ok_or(Refusal::UnknownMember { id })?;
    if member.is_learner {
        return Ok(());
    }
    let voters_after = view.summary.voters - 1;
    if voters_after == 0 {
        return Err(Refusal::LastVoter {
            member: member.label(),
        });
    }
    let healthy_after = view.summary.healthy_voters - usize::from(member.healthy());
    let quorum_after = voters_after / 2 + 1;
    if healthy_after < quorum_after {
        return Err(Refusal::WouldLoseQuorum {
            member: member.label(),
            healthy_after,
            voters_after,
            quorum_after,
        });
    }
    Ok(())
}

/// May leadership move to `to`? It is a voter of the cluster that answered our probe healthy,
/// and a leader that answers exists to hand over (MoveLeader is served by the leader only).
pub fn may_move_leader(view: &ClusterView, to: u64) -> Result<(), Refusal> {
    let member = view.member(to).ok_or(Refusal::UnknownMember { id: to })?;
    if member.is_learner {
        return Err(Refusal::LearnerCannotLead {
            member: member.label(),
        });
    }
    if !member.healthy() {
        return Err(Refusal::UnhealthyTarget {
            member: member.label(),
            reason: probe_reason(member),
        });
    }
    if !view.leader().is_some_and(MemberView::healthy) {
        return Err(Refusal::NoLiveLeader);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::testing::*;

    fn view(members: Vec<MemberView>) -> ClusterView {
        ClusterView::new(members, vec![])
    }

    #[test]
    fn healthy_cluster_admits_a_learner() {
        assert_eq!(
            may_add_learner(&view(vec![voter(1, 1, 5), voter(2, 1, 5), voter(3, 1, 5)])),
            Ok(())
        );
    }

    #[test]
    fn dead_voter_must_be_removed_first() {
        let err = may_add_learner(&view(vec![voter(1, 1, 5), voter(2, 1, 5), dead(3, false)]))
            .unwrap_err();
        assert!(matches!(err, Refusal::DeadVoter { .. }));
        assert!(err.to_string().contains("must be removed first"), "{err}");
    }

    #[test]
    fn a_second_learner_is_refused() {
        let err = may_add_learner(&view(vec![voter(1, 1, 5), learner(2, 1, 5)])).unwrap_err();
        assert!(matches!(err, Refusal::LearnerPresent { .. }));
        let err = may_add_learner(&view(vec![voter(1, 1, 5), unstarted(2, true)])).unwrap_err();
        assert!(matches!(err, Refusal::UnstartedMember { .. }));
    }

    #[test]
    fn a_dead_voter_is_named_before_a_leaderless_one() {
        let err = may_add_learner(&view(vec![voter(1, 0, 5), dead(2, false)])).unwrap_err();
        assert!(matches!(err, Refusal::DeadVoter { .. }), "{err}");
    }

    #[test]
    fn a_voter_without_leader_is_unhealthy() {
        let err = may_add_learner(&view(vec![voter(1, 0, 5), voter(2, 1, 5)])).unwrap_err();
        assert!(matches!(err, Refusal::UnhealthyVoter { .. }), "{err}");
    }

    #[test]
    fn removal_keeps_quorum() {
        let v = view(vec![voter(1, 1, 5), voter(2, 1, 5), dead(3, false)]);
        assert_eq!(may_remove(&v, 3), Ok(()));
        assert!(matches!(
            may_remove(&v, 2),
            Err(Refusal::WouldLoseQuorum { .. })
        ));
        assert!(matches!(
            may_remove(&v, 9),
            Err(Refusal::UnknownMember { .. })
        ));
        assert!(matches!(
            may_remove(&view(vec![voter(1, 1, 5)]), 1),
            Err(Refusal::LastVoter { .. })
        ));
        assert_eq!(
            may_remove(&view(vec![voter(1, 1, 5), dead(2, true)]), 2),
            Ok(())
        );
    }

    #[test]
    fn promotion_needs_a_reachable_learner_and_healthy_voters() {
        let v = view(vec![voter(1, 1, 5), voter(2, 1, 5), learner(3, 1, 5)]);
        assert_eq!(may_promote(&v, 3), Ok(()));
        assert!(matches!(
            may_promote(&v, 2),
            Err(Refusal::NotALearner { .. })
        ));
        let v = view(vec![voter(1, 1, 5), dead(2, false), learner(3, 1, 5)]);
        assert!(matches!(may_promote(&v, 3), Err(Refusal::DeadVoter { .. })));
        let v = view(vec![voter(1, 1, 5), dead(3, true)]);
        assert!(matches!(
            may_promote(&v, 3),
            Err(Refusal::LearnerUnreachable { .. })
        ));
    }

    #[test]
    fn leadership_moves_only_to_a_healthy_voter_of_the_cluster() {
        let v = view(vec![voter(1, 1, 5), voter(2, 1, 5), learner(3, 1, 5)]);
        assert_eq!(may_move_leader(&v, 2), Ok(()));
        assert_eq!(
            may_move_leader(&v, 9),
            Err(Refusal::UnknownMember { id: 9 })
        );
        let err = may_move_leader(&v, 3).unwrap_err();
        assert!(matches!(err, Refusal::LearnerCannotLead { .. }), "{err}");
        assert!(err.to_string().contains("promote it first"), "{err}");
        let v = view(vec![voter(1, 1, 5), dead(2, false)]);
        assert!(matches!(
            may_move_leader(&v, 2),
            Err(Refusal::UnhealthyTarget { .. })
        ));
        let v = view(vec![voter(1, 0, 5), voter(2, 0, 5)]);
        assert!(matches!(
            may_move_leader(&v, 2),
            Err(Refusal::UnhealthyTarget { .. } | Refusal::NoLiveLeader)
        ));
    }
}
