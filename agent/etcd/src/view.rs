//! The cluster view: what each member answered to our own probe, and the summary derived from
//! it. Plain data, built by [`crate::observe`] and read by the gate, the catch-up tracker and
//! the controller.

use serde::Serialize;

/// One member as the member list names it and as it answered our probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberView {
    /// Member ID (etcd shows it in hex; JSON carries the number).
    pub id: u64,
    /// Member name; empty while the member has never started.
    pub name: String,
    /// Peer URLs.
    pub peer_urls: Vec<String>,
    /// Client URLs; empty while the member has never started.
    pub client_urls: Vec<String>,
    /// Whether the member is a raft learner (from the member list).
    pub is_learner: bool,
    /// Whether the member has ever started (it has a name and client URLs).
    pub started: bool,
    /// What our probe of the member's client URL returned, if it was probed.
    pub probe: Option<Probe>,
}

/// The answer of one member to our status probe.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Probe {
    /// The endpoint probed.
    pub endpoint: String,
    /// Whether the status call answered within the probe timeout.
    pub reachable: bool,
    /// Reachable, sees a leader and raises no alarm.
    pub healthy: bool,
    /// The status answer, when reachable.
    pub status: Option<MemberStatus>,
    /// Why the probe failed, when it did.
    pub error: Option<String>,
    /// How long the probe took, in milliseconds.
    pub latency_ms: u64,
}

/// The fields of etcd's status answer that metalguard uses.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct MemberStatus {
    /// The ID of the member that answered.
    pub member_id: u64,
    /// The leader this member sees (0 = none).
    pub leader: u64,
    /// Whether the answering member is a learner (etcd ≥ 3.4).
    pub is_learner: bool,
    /// The raft term.
    pub raft_term: u64,
    /// The raft index (last entry in the log).
    pub raft_index: u64,
    /// The applied index.
    pub raft_applied_index: u64,
    /// Database size in bytes.
    pub db_size: i64,
    /// The server version.
    pub version: String,
    /// Alarms this member reports; etcd lists every member's alarms on every member (a
    /// NOSPACE on one member shows on all of them).
    pub alarms: Vec<Alarm>,
    /// Errors the member reported, verbatim.
    pub errors: Vec<String>,
}

/// etcd's name of the space-quota alarm.
pub const NOSPACE: &str = "NOSPACE";

/// One alarm from etcd's status `errors[]`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Alarm {
    /// The member the alarm is raised for (0 if etcd's text did not say).
    pub member_id: u64,
    /// The alarm, e.g. `NOSPACE` or `CORRUPT`.
    pub name: String,
}

impl MemberStatus {
    /// The distinct alarm names, comma-separated (empty without alarms).
    pub fn alarm_names(&self) -> String {
        let mut names: Vec<&str> = self.alarms.iter().map(|a| a.name.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        names.join(",")
    }

    /// A member that answered is healthy when it sees a leader and raises no alarm.
    pub fn is_healthy(&self) -> bool {
        self.leader != 0 && self.alarms.is_empty()
    }

    /// Whether a NOSPACE alarm is active (etcd lists it on every member, whichever raised it).
    pub fn has_nospace(&self) -> bool {
        self.alarms.iter().any(|a| a.name == NOSPACE)
    }

    /// Like [`Self::is_healthy`], but a NOSPACE alarm does not count: a member under NOSPACE
    /// refuses writes yet still serves reads and votes, so for quorum it is not lost, and
    /// fencing it would not cure the alarm (compaction, defragmentation and
    /// `etcdctl alarm disarm` do). Any other alarm (CORRUPT) still makes it unhealthy.
    pub fn is_healthy_despite_nospace(&self) -> bool {
        self.leader != 0 && self.alarms.iter().all(|a| a.name == NOSPACE)
    }
}

impl MemberView {
    /// Whether this member answered our probe.
    pub fn reachable(&self) -> bool {
        self.probe.as_ref().is_some_and(|p| p.reachable)
    }

    /// Whether this member answered our probe healthy.
    pub fn healthy(&self) -> bool {
        self.probe.as_ref().is_some_and(|p| p.healthy)
    }

    /// The status this member answered, if any.
    pub fn status(&self) -> Option<&MemberStatus> {
        self.probe.as_ref().and_then(|p| p.status.as_ref())
    }

    /// A short label for messages: the name, or the peer URL when unstarted.
    pub fn label(&self) -> String {
        if self.name.is_empty() {
            format!("{:x} ({})", self.id, self.peer_urls.join(","))
        } else {
            format!("{:x} ({})", self.id, self.name)
        }
    }
}

/// The cluster as observed at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ClusterView {
    /// The members, ordered by ID.
    pub members: Vec<MemberView>,
    /// Configured endpoints that answered no probe and match no member.
    pub stray_endpoints: Vec<Probe>,
    /// The summary.
    pub summary: Summary,
}

/// Counts derived from the members.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Summary {
    /// Voting members.
    pub voters: usize,
    /// Learners.
    pub learners: usize,
    /// Members added but never started.
    pub unstarted: usize,
    /// Voters that answered our probe healthy.
    pub healthy_voters: usize,
    /// Votes needed for a decision: `voters / 2 + 1`.
    pub quorum: usize,
    /// How many more healthy voters may fail before quorum is lost:
    /// `healthy_voters - quorum`, or 0 when quorum is already lost.
    pub failure_tolerance: usize,
    /// Whether the healthy voters make a quorum.
    pub has_quorum: bool,
    /// The leader, as the leader itself reports it (or the view of the majority of answers).
    pub leader: Option<u64>,
}

impl ClusterView {
    /// Builds the view and its summary from the members.
    pub fn new(mut members: Vec<MemberView>, stray_endpoints: Vec<Probe>) -> Self {
        members.sort_by_key(|m| m.id);
        let summary = summarize(&members);
        Self {
            members,
            stray_endpoints,
            summary,
        }
    }

    /// The member with this ID.
    pub fn member(&self, id: u64) -> Option<&MemberView> {
        self.members.iter().find(|m| m.id == id)
    }

    /// The member that has this peer URL.
    pub fn member_by_peer_url(&self, peer_url: &str) -> Option<&MemberView> {
        let want = normalize_url(peer_url);
        self.members
            .iter()
            .find(|m| m.peer_urls.iter().any(|u| normalize_url(u) == want))
    }

    /// The voting members.
    pub fn voters(&self) -> impl Iterator<Item = &MemberView> {
        self.members.iter().filter(|m| !m.is_learner)
    }

    /// The current leader's view, if known.
    pub fn leader(&self) -> Option<&MemberView> {
        self.summary.leader.and_then(|id| self.member(id))
    }
}

fn normalize_url(url: &str) -> &str {
    url.trim_end_matches('/')
}

/// Derives the summary counts from the members.
pub fn summarize(members: &[MemberView]) -> Summary {
    let voters = members.iter().filter(|m| !m.is_learner).count();
    let learners = members.len() - voters;
    let unstarted = members.iter().filter(|m| !m.started).count();
    let healthy_voters = members
        .iter()
        .filter(|m| !m.is_learner && m.healthy())
        .count();
    let quorum = voters / 2 + 1;
    Summary {
        voters,
        learners,
        unstarted,
        healthy_voters,
        quorum,
        failure_tolerance: healthy_voters.saturating_sub(quorum),
        has_quorum: voters > 0 && healthy_voters >= quorum,
        leader: find_leader(members),
    }
}

/// The leader is the member that reports itself as leader; failing that, the leader most
/// answering members name (ties: the highest raft term wins).
fn find_leader(members: &[MemberView]) -> Option<u64> {
    let statuses: Vec<&MemberStatus> = members.iter().filter_map(MemberView::status).collect();
    if let Some(me) = statuses
        .iter()
        .filter(|s| s.leader != 0 && s.leader == s.member_id)
        .max_by_key(|s| s.raft_term)
    {
        return Some(me.leader);
    }
    let mut votes: Vec<(u64, usize, u64)> = Vec::new();
    for s in statuses.iter().filter(|s| s.leader != 0) {
        match votes.iter_mut().find(|(id, _, _)| *id == s.leader) {
            Some(entry) => {
                entry.1 += 1;
                entry.2 = entry.2.max(s.raft_term);
            }
            None => votes.push((s.leader, 1, s.raft_term)),
        }
    }
    votes
        .into_iter()
        .max_by_key(|&(_, count, term)| (count, term))
        .map(|(id, _, _)| id)
}

/// Reads the alarms out of etcd's status `errors[]`: entries look like
/// `memberID:<decimal id> alarm:NOSPACE ` (with a trailing space).
pub fn parse_alarms(errors: &[String]) -> Vec<Alarm> {
    errors
        .iter()
        .filter_map(|e| {
            let name = e
                .split_whitespace()
                .find_map(|word| word.strip_prefix("alarm:"))?;
            let member_id = e
                .split_whitespace()
                .find_map(|word| word.strip_prefix("memberID:"))
                .and_then(|id| id.parse().ok())
                .unwrap_or(0);
            Some(Alarm {
                member_id,
                name: name.to_owned(),
            })
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod testing {
    //! Builders for views in unit tests.
    use super::*;

    /// A started, healthy voter whose status names `leader`.
    pub(crate) fn voter(id: u64, leader: u64, applied: u64) -> MemberView {
        member(id, false, Some(status(id, leader, applied)))
    }

    /// A started learner answering with `applied`.
    pub(crate) fn learner(id: u64, leader: u64, applied: u64) -> MemberView {
        let mut s = status(id, leader, applied);
        s.is_learner = true;
        member(id, true, Some(s))
    }

    /// A started member that did not answer.
    pub(crate) fn dead(id: u64, is_learner: bool) -> MemberView {
        let mut m = member(id, is_learner, None);
        m.probe = Some(Probe {
            endpoint: format!("http://127.0.0.1:{id}"),
            reachable: false,
            healthy: false,
            status: None,
            error: Some("deadline".into()),
            latency_ms: 1500,
        });
        m
    }

    /// A member added but never started.
    pub(crate) fn unstarted(id: u64, is_learner: bool) -> MemberView {
        MemberView {
            id,
            name: String::new(),
            peer_urls: vec![format!("http://127.0.0.1:{}", 20000 + id)],
            client_urls: vec![],
            is_learner,
            started: false,
            probe: None,
        }
    }

    pub(crate) fn status(id: u64, leader: u64, applied: u64) -> MemberStatus {
        MemberStatus {
            member_id: id,
            leader,
            is_learner: false,
            raft_term: 2,
            raft_index: applied,
            raft_applied_index: applied,
            db_size: 1,
            version: "3.4.23".into(),
            alarms: vec![],
            errors: vec![],
        }
    }

    fn member(id: u64, is_learner: bool, status: Option<MemberStatus>) -> MemberView {
        MemberView {
            id,
            name: format!("m{id}"),
            peer_urls: vec![format!("http://127.0.0.1:{}", 20000 + id)],
            client_urls: vec![format!("http://127.0.0.1:{id}")],
            is_learner,
            started: true,
            probe: Some(Probe {
                endpoint: format!("http://127.0.0.1:{id}"),
                reachable: status.is_some(),
                healthy: status.as_ref().is_some_and(MemberStatus::is_healthy),
                status,
                error: None,
                latency_ms: 1,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::testing::*;
    use super::*;

    #[test]
    fn summary_counts_quorum_and_tolerance() {
        let view = ClusterView::new(
            vec![
                voter(1, 1, 9),
                voter(2, 1, 9),
                dead(3, false),
                unstarted(4, true),
            ],
            vec![],
        );
        let s = &view.summary;
        assert_eq!(
            (s.voters, s.learners, s.unstarted, s.healthy_voters),
            (3, 1, 1, 2)
        );
        assert_eq!((s.quorum, s.failure_tolerance, s.has_quorum), (2, 0, true));
        assert_eq!(s.leader, Some(1));
    }

    #[test]
    fn lost_quorum_has_zero_tolerance() {
        let view = ClusterView::new(vec![voter(1, 0, 9), dead(2, false), dead(3, false)], vec![]);
        assert!(!view.summary.has_quorum);
        assert_eq!(view.summary.failure_tolerance, 0);
        assert_eq!(view.summary.leader, None);
    }

    #[test]
    fn leader_falls_back_to_what_followers_name() {
        let view = ClusterView::new(vec![dead(1, false), voter(2, 1, 9), voter(3, 1, 9)], vec![]);
        assert_eq!(view.summary.leader, Some(1));
    }

    #[test]
    fn alarms_are_parsed_from_status_errors() {
        let errors = vec![
            "memberID:6064730125526598891 alarm:NOSPACE ".to_owned(),
            "memberID:15682327328059813343 alarm:NOSPACE ".to_owned(),
            "something else".to_owned(),
        ];
        let alarms = parse_alarms(&errors);
        assert_eq!(
            alarms,
            vec![
                Alarm {
                    member_id: 6_064_730_125_526_598_891,
                    name: "NOSPACE".into()
                },
                Alarm {
                    member_id: 15_682_327_328_059_813_343,
                    name: "NOSPACE".into()
                },
            ]
        );
        let mut status = testing::status(1, 1, 1);
        status.alarms = alarms;
        assert_eq!(status.alarm_names(), "NOSPACE");
        assert!(!status.is_healthy());
        assert!(status.has_nospace() && status.is_healthy_despite_nospace());
    }

    #[test]
    fn only_nospace_is_forgiven_and_only_with_a_leader() {
        let alarm = |name: &str| Alarm {
            member_id: 1,
            name: name.into(),
        };
        let mut status = testing::status(1, 1, 1);
        assert!(status.is_healthy_despite_nospace() && !status.has_nospace());
        status.alarms = vec![alarm("NOSPACE"), alarm("CORRUPT")];
        assert!(status.has_nospace() && !status.is_healthy_despite_nospace());
        status.alarms = vec![alarm("CORRUPT")];
        assert!(!status.has_nospace() && !status.is_healthy_despite_nospace());
        status.alarms = vec![alarm("NOSPACE")];
        status.leader = 0;
        assert!(!status.is_healthy_despite_nospace());
    }

    #[test]
    fn peer_url_lookup_ignores_trailing_slash() {
        let view = ClusterView::new(vec![voter(1, 1, 1)], vec![]);
        assert!(view.member_by_peer_url("http://127.0.0.1:20001/").is_some());
        assert!(view.member_by_peer_url("http://127.0.0.1:20002").is_none());
    }
}
