//! The executing agent's own quorum check before it cuts a host's power: pure checks of a
//! [`ClusterView`] the agent took itself, with its own etcd client certificate.
//!
//! The controller decides a fence only when it leaves quorum; this is the last line of
//! defence against any controller bug (a stale leader, stale views, a stalled store): the
//! agent that would press the button counts the healthy voters other than the target's
//! member and refuses when they are fewer than quorum, or when it cannot tell which member
//! is the target's. A person's forced fence is the only override (decided by the caller).

use crate::view::{ClusterView, MemberView};

/// The target of a power action, as the command describes it.
#[derive(Debug, Clone, Copy)]
pub struct PowerTarget<'a> {
    /// The host whose power is cut (etcd member names are host names in kubeadm's layout
    /// and metalguard's).
    pub host: &'a str,
    /// The target's member id as the controller knows it, if it says.
    pub member: Option<u64>,
}

/// What the check counted (for the result's timeline and for refusals).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct QuorumCount {
    /// The target's voting member, if it holds one.
    pub target_voter: Option<String>,
    /// Voting members.
    pub voters: usize,
    /// Voters other than the target's that answered the agent's probe healthy.
    pub healthy_others: usize,
    /// Votes needed: `voters / 2 + 1`.
    pub quorum: usize,
}

impl std::fmt::Display for QuorumCount {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.target_voter {
            Some(member) => write!(
                f,
                "{} healthy voters besides the target's member {member}, of {} voters; quorum {}",
                self.healthy_others, self.voters, self.quorum
            ),
            None => write!(
                f,
                "the target holds no voting member; {} healthy of {} voters; quorum {}",
                self.healthy_others, self.voters, self.quorum
            ),
        }
    }
}

/// Why the agent refuses to cut the power.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PowerRefusal {
    /// Too few healthy voters would remain.
    #[error(
        "powering off {host} would leave fewer healthy voters than quorum: {count}; refused by the executing agent's own check"
    )]
    WouldLoseQuorum {
        /// The target host.
        host: String,
        /// What was counted.
        count: QuorumCount,
    },
    /// The command and etcd disagree on which member is the target's.
    #[error(
        "cannot tell which etcd member is {host}'s: the command names member {claimed:x}, etcd lists {named} under that name"
    )]
    AmbiguousTarget {
        /// The target host.
        host: String,
        /// The member the command names.
        claimed: u64,
        /// The member etcd lists under the host's name.
        named: String,
    },
}

/// May `target`'s power be cut (off or reboot)? Yes when the target holds no voting member,
/// or when the healthy voters other than its member make a quorum of all voters (the
/// target's member stays a member while its host is off).
pub fn may_cut_power(
    view: &ClusterView,
    target: PowerTarget<'_>,
) -> Result<QuorumCount, PowerRefusal> {
    let by_name = view.members.iter().find(|m| m.name == target.host);
    let by_id = target.member.and_then(|id| view.member(id));
    let member: Option<&MemberView> = match (by_id, by_name) {
        (Some(a), Some(b)) if a.id != b.id => {
            return Err(PowerRefusal::AmbiguousTarget {
                host: target.host.to_owned(),
                claimed: a.id,
                named: b.label(),
            });
        }
        (Some(m), _) | (None, Some(m)) => Some(m),
        (None, None) => None,
    };
    let target_voter = member.filter(|m| !m.is_learner);
    let voters = view.voters().count();
    let healthy_others = view
        .voters()
        .filter(|v| v.healthy() && target_voter.is_none_or(|t| t.id != v.id))
        .count();
    let count = QuorumCount {
        target_voter: target_voter.map(MemberView::label),
        voters,
        healthy_others,
        quorum: voters / 2 + 1,
    };
    if target_voter.is_some() && healthy_others < count.quorum {
        return Err(PowerRefusal::WouldLoseQuorum {
            host: target.host.to_owned(),
            count,
        });
    }
    Ok(count)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::view::{MemberStatus, Probe};

    fn member(id: u64, name: &str, learner: bool, healthy: bool) -> MemberView {
        MemberView {
            id,
            name: name.into(),
            peer_urls: vec![format!("https://{name}:2380")],
            client_urls: vec![format!("https://{name}:2379")],
            is_learner: learner,
            started: true,
            probe: Some(Probe {
                endpoint: format!("https://{name}:2379"),
                reachable: healthy,
                healthy,
                status: healthy.then(|| MemberStatus {
                    member_id: id,
                    leader: 1,
                    raft_index: 10,
                    raft_term: 2,
                    raft_applied_index: 10,
                    db_size: 1,
                    is_learner: learner,
                    version: "3.5.16".into(),
                    alarms: Vec::new(),
                    errors: Vec::new(),
                }),
                error: (!healthy).then(|| "timed out".to_owned()),
                latency_ms: 1,
            }),
        }
    }

    fn view(members: Vec<MemberView>) -> ClusterView {
        ClusterView::new(members, Vec::new())
    }

    fn target(host: &str, member: Option<u64>) -> PowerTarget<'_> {
        PowerTarget { host, member }
    }

    #[test]
    fn a_hung_voter_may_be_cut_while_the_others_make_quorum() {
        let v = view(vec![
            member(1, "cp-1", false, false),
            member(2, "cp-2", false, true),
            member(3, "cp-3", false, true),
        ]);
        let count = may_cut_power(&v, target("cp-1", Some(1))).unwrap();
        assert_eq!(
            (count.healthy_others, count.voters, count.quorum),
            (2, 3, 2)
        );
        assert!(
            count
                .to_string()
                .contains("besides the target's member 1 (cp-1)")
        );
    }

    #[test]
    fn a_healthy_voter_is_refused_when_another_is_down() {
        let v = view(vec![
            member(1, "cp-1", false, true),
            member(2, "cp-2", false, false),
            member(3, "cp-3", false, true),
        ]);
        let err = may_cut_power(&v, target("cp-1", None)).unwrap_err();
        assert!(
            matches!(&err, PowerRefusal::WouldLoseQuorum { count, .. } if count.healthy_others == 1 && count.quorum == 2),
            "{err}"
        );
        assert!(
            err.to_string().contains("1 healthy voters besides"),
            "{err}"
        );
    }

    #[test]
    fn a_host_without_a_voter_may_always_be_cut_and_a_learner_counts_for_nothing() {
        let v = view(vec![
            member(1, "cp-1", false, true),
            member(2, "cp-2", false, false),
            member(3, "cp-3", false, false),
            member(4, "cp-4", true, true),
        ]);
        assert!(may_cut_power(&v, target("worker-7", None)).is_ok());
        let count = may_cut_power(&v, target("cp-4", Some(4))).unwrap();
        assert_eq!(count.target_voter, None);
        // Quorum is already lost: a voter is refused whatever its own health.
        assert!(may_cut_power(&v, target("cp-2", None)).is_err());
    }

    #[test]
    fn five_voters_with_two_dead_a_dead_one_may_be_cut_a_healthy_one_not() {
        let v = view(vec![
            member(1, "cp-1", false, false),
            member(2, "cp-2", false, false),
            member(3, "cp-3", false, true),
            member(4, "cp-4", false, true),
            member(5, "cp-5", false, true),
        ]);
        assert!(may_cut_power(&v, target("cp-1", Some(1))).is_ok());
        assert!(may_cut_power(&v, target("cp-3", Some(3))).is_err());
    }

    #[test]
    fn the_command_and_etcd_disagreeing_on_the_target_member_is_refused() {
        let v = view(vec![
            member(1, "cp-1", false, true),
            member(2, "cp-2", false, false),
            member(3, "cp-3", false, true),
        ]);
        // The controller names cp-2's (dead) member, but cp-1 is the host being cut.
        let err = may_cut_power(&v, target("cp-1", Some(2))).unwrap_err();
        assert!(
            matches!(err, PowerRefusal::AmbiguousTarget { claimed: 2, .. }),
            "{err}"
        );
        // An id etcd does not know: the member found by name decides.
        assert!(may_cut_power(&v, target("cp-1", Some(99))).is_err());
        assert!(may_cut_power(&v, target("cp-2", Some(99))).is_ok());
    }
}
