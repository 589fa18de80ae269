//! The etcd quorum guard (seed 001, seed 004 KCP, DOMAIN.md §1).
//!
//! Rules, each enforced here and checked by the property tests:
//! - voters equal the desired replicas, or desired + 1 only while a replacement is in progress;
//! - one membership change per plan, and at most one learner;
//! - a dead voter on a leaving host is removed before its replacement learner is added
//!   (etcd rejects adding a learner while a voter is down, DOMAIN §1);
//! - a learner is promoted only when caught up, its host is not being deleted, and its host
//!   already carries the preDrain hook;
//! - a healthy voter on a leaving host is removed only after its replacement is promoted, and
//!   never if the healthy voters left would be fewer than the quorum of the new size;
//! - the leader is moved off a voter before that voter is removed;
//! - a host's hook is removed only after its member is gone, and is never re-added to a host
//!   being deleted (the escape hatch);
//! - a voluntary disruption budget of control-plane machines − 1 (seed 001);
//! - a control-plane fence is allowed only if it cannot cost quorum, and one at a time.
//!
//! When healthy voters are already below quorum the guard reports "degraded" and does nothing.

use metalguard_api::snapshot::{EtcdMember, Host, Role, Snapshot};

/// Why the guard refuses a quorum-affecting change.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum QuorumError {
    /// No voting member is known.
    #[error("no etcd voting member is known")]
    NoVoters,
    /// Healthy voters are already below quorum.
    #[error("etcd quorum lost: {healthy} of {voters} voters healthy, quorum needs {need}")]
    QuorumLost {
        /// Healthy voters.
        healthy: usize,
        /// All voters.
        voters: usize,
        /// The quorum.
        need: usize,
    },
    /// The member is not a voter.
    #[error("member {0:x} is not a voter")]
    NotAVoter(u64),
    /// Removing the member would leave too few healthy voters.
    #[error("removing {member} would leave {left} healthy voters, quorum of {voters} needs {need}")]
    RemovalCostsQuorum {
        /// The member (label).
        member: String,
        /// Healthy voters left.
        left: usize,
        /// Voters after removal.
        voters: usize,
        /// Quorum of that size.
        need: usize,
    },
    /// Fencing the host would leave too few healthy voters.
    #[error("fencing {host} would leave {left} of {voters} voters healthy, quorum needs {need}")]
    FenceCostsQuorum {
        /// The host.
        host: String,
        /// Healthy voters left.
        left: usize,
        /// Voters.
        voters: usize,
        /// The quorum.
        need: usize,
    },
    /// The desired replica count is not odd.
    #[error("desired control-plane replicas {0} is not an odd number ≥ 1")]
    DesiredNotOdd(u32),
}

/// True when `host` guards etcd quorum: a control-plane host, or any host that carries an
/// etcd member (a "worker" label does not make a voter safe to fence).
pub fn guards_quorum(host: &Host) -> bool {
    host.role == Role::ControlPlane || host.etcd.is_some()
}

/// The quorum of a cluster of `voters` voting members.
pub const fn quorum(voters: usize) -> usize {
    voters / 2 + 1
}

/// One etcd member and the host that claims it (if any).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MemberRef<'a> {
    /// The member.
    pub member: &'a EtcdMember,
    /// The host it runs on; `None` for an orphan member.
    pub host: Option<&'a Host>,
}

impl MemberRef<'_> {
    /// True when the member is leaving: its host is being deleted, or no host claims it.
    pub fn leaving(&self) -> bool {
        self.host.is_none_or(Host::is_deleting)
    }

    /// Name used in reasons.
    pub fn label(&self) -> String {
        match self.host {
            Some(h) => format!("{} (member {:x})", h.name, self.member.id),
            None => format!("orphan member {:x}", self.member.id),
        }
    }
}

/// The etcd cluster as the guard sees it.
#[derive(Debug, Clone)]
pub struct EtcdView<'a> {
    /// Every member, sorted by member id.
    pub members: Vec<MemberRef<'a>>,
    /// Control-plane hosts, sorted by name.
    pub control_plane: Vec<&'a Host>,
}

impl<'a> EtcdView<'a> {
    /// Builds the view from a snapshot.
    pub fn from_snapshot(snapshot: &'a Snapshot) -> Self {
        let mut members: Vec<MemberRef<'a>> = snapshot
            .hosts
            .iter()
            .filter_map(|h| {
                h.etcd.as_ref().map(|m| MemberRef {
                    member: m,
                    host: Some(h),
                })
            })
            .chain(snapshot.orphan_members.iter().map(|m| MemberRef {
                member: m,
                host: None,
            }))
            .collect();
        members.sort_by_key(|m| m.member.id);
        let mut control_plane: Vec<&Host> = snapshot
            .hosts
            .iter()
            .filter(|h| h.role == Role::ControlPlane)
            .collect();
        control_plane.sort_by(|a, b| a.name.cmp(&b.name));
        EtcdView {
            members,
            control_plane,
        }
    }

    /// Voting members.
    pub fn voters(&self) -> impl Iterator<Item = &MemberRef<'a>> {
        self.members.iter().filter(|m| m.member.is_voter())
    }

    /// Learner members.
    pub fn learners(&self) -> impl Iterator<Item = &MemberRef<'a>> {
        self.members.iter().filter(|m| m.member.learner)
    }

    /// Number of voters.
    pub fn voter_count(&self) -> usize {
        self.voters().count()
    }

    /// Number of healthy voters.
    pub fn healthy_voter_count(&self) -> usize {
        self.voters().filter(|m| m.member.healthy).count()
    }

    /// The leader, if one is reported.
    pub fn leader(&self) -> Option<&MemberRef<'a>> {
        self.voters().find(|m| m.member.leader)
    }

    /// The member on `host`.
    pub fn member_of(&self, host: &str) -> Option<&MemberRef<'a>> {
        self.members
            .iter()
            .find(|m| m.host.is_some_and(|h| h.name == host))
    }

    /// Set when healthy voters are below quorum (or there are none): the reason.
    pub fn quorum_lost(&self) -> Option<QuorumError> {
        let voters = self.voter_count();
        let healthy = self.healthy_voter_count();
        if voters == 0 {
            return Some(QuorumError::NoVoters);
        }
        (healthy < quorum(voters)).then_some(QuorumError::QuorumLost {
            healthy,
            voters,
            need: quorum(voters),
        })
    }

    /// True while a membership change is under way: a learner exists, a member is leaving, or
    /// a control-plane host is being deleted.
    pub fn membership_in_flux(&self) -> bool {
        self.learners().next().is_some()
            || self.members.iter().any(MemberRef::leaving)
            || self.control_plane.iter().any(|h| h.is_deleting())
    }

    /// Whether removing voter `id` keeps healthy voters ≥ quorum of the new size.
    pub fn may_remove_voter(&self, id: u64) -> Result<(), QuorumError> {
        let voters = self.voter_count();
        let Some(m) = self.voters().find(|m| m.member.id == id) else {
            return Err(QuorumError::NotAVoter(id));
        };
        let left = self.healthy_voter_count() - usize::from(m.member.healthy);
        let need = quorum(voters - 1);
        if left < need {
            return Err(QuorumError::RemovalCostsQuorum {
                member: m.label(),
                left,
                voters: voters - 1,
                need,
            });
        }
        Ok(())
    }

    /// Whether fencing (powering off) control-plane host `host` cannot cost quorum: its member
    /// is already unhealthy, or the other healthy voters still make quorum.
    pub fn may_fence(&self, host: &Host) -> Result<(), QuorumError> {
        if let Some(reason) = self.quorum_lost() {
            return Err(reason);
        }
        let Some(m) = self.member_of(&host.name).filter(|m| m.member.is_voter()) else {
            return Ok(());
        };
        if !m.member.healthy {
            return Ok(());
        }
        let voters = self.voter_count();
        let left = self.healthy_voter_count() - 1;
        if left < quorum(voters) {
            return Err(QuorumError::FenceCostsQuorum {
                host: host.name.clone(),
                left,
                voters,
                need: quorum(voters),
            });
        }
        Ok(())
    }

    /// The voluntary disruption budget (seed 001's quorum-guard PDB): control-plane machines
    /// that must stay available, `machines − 1`. During a replacement (one machine more) it
    /// keeps every healthy old member until the new one is healthy.
    pub fn min_available(&self) -> usize {
        self.control_plane.len().saturating_sub(1)
    }
}

/// Validates the desired control-plane replica count (odd, at least 1).
pub fn validate_desired(desired: u32) -> Result<usize, QuorumError> {
    if desired == 0 || desired.is_multiple_of(2) {
        return Err(QuorumError::DesiredNotOdd(desired));
    }
    Ok(desired as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testkit::{cluster, member};

    #[test]
    fn quorum_sizes() {
        assert_eq!([1, 2, 3, 4, 5].map(quorum), [1, 2, 2, 3, 3]);
    }

    #[test]
    fn fence_gate_follows_quorum_math() {
        let mut s = cluster(3, 0);
        let view = EtcdView::from_snapshot(&s);
        assert!(view.may_fence(&s.hosts[0]).is_ok());
        s.hosts[1].etcd = Some(member(2, false, false));
        let view = EtcdView::from_snapshot(&s);
        // cp-1's member is already down: fencing it costs nothing.
        assert!(view.may_fence(&s.hosts[1]).is_ok());
        // Fencing a healthy one would leave 1 of 3.
        let err = view.may_fence(&s.hosts[0]).unwrap_err();
        assert!(err.to_string().contains("1 of 3 voters healthy"), "{err}");
        assert!(matches!(
            err,
            QuorumError::FenceCostsQuorum {
                left: 1,
                voters: 3,
                need: 2,
                ..
            }
        ));
    }

    #[test]
    fn removal_math() {
        let mut s = cluster(3, 0);
        s.hosts[2].etcd = Some(member(3, false, false));
        let view = EtcdView::from_snapshot(&s);
        assert!(view.may_remove_voter(3).is_ok());
        assert!(view.may_remove_voter(1).is_err());
        assert!(validate_desired(4).is_err());
        assert!(validate_desired(0).is_err());
        assert_eq!(validate_desired(5), Ok(5));
    }
}
