//! The etcd members of the standalone snapshot, judged from the agents' fresh views.
//!
//! Every agent reports the member list as its own probes see it, and a report is only as
//! honest as the agent that sent it (a stolen certificate, a confused host). So a member's
//! health is the leader's judgement over the fresh views of inventory hosts that list it: it
//! is healthy only if more than half of them saw it healthy, leads only if more than half say
//! it leads, and its catch-up is what more than half have seen at least. One lying view of
//! three cannot make a down member count as up (which would let the quorum guard accept a
//! fence it must refuse), nor an up member count as down.

use metalguard_api::protocol::EtcdView;
use metalguard_api::snapshot::EtcdMember;

/// The member named `host` as a strict majority of `views` (those that list it) sees it;
/// `None` when no view lists it.
pub fn member_of(host: &str, views: &[&EtcdView]) -> Option<EtcdMember> {
    let mut seen: Vec<EtcdMember> = Vec::new();
    for view in views {
        let leader_index = view
            .members
            .iter()
            .find(|m| Some(m.id) == view.leader_id)
            .and_then(|m| m.raft_applied_index);
        // A view lists a member once; a second entry of one name is the view's problem.
        if let Some(m) = view.members.iter().find(|m| m.name == host) {
            let progress = match (m.raft_applied_index, leader_index) {
                (Some(mine), Some(lead)) if lead > 0 => {
                    u16::try_from((mine.min(lead) * 1000) / lead).unwrap_or(1000)
                }
                _ => 0,
            };
            seen.push(EtcdMember {
                id: m.id,
                name: m.name.clone(),
                learner: m.learner,
                healthy: m.healthy,
                leader: view.leader_id == Some(m.id),
                progress_permille: if m.learner { progress } else { 1000 },
            });
        }
    }
    let first = seen.first()?.clone();
    let majority = |count: usize| count * 2 > seen.len();
    let mut progress: Vec<u16> = seen.iter().map(|m| m.progress_permille).collect();
    progress.sort_unstable();
    Some(EtcdMember {
        healthy: majority(seen.iter().filter(|m| m.healthy).count()),
        leader: majority(seen.iter().filter(|m| m.leader).count()),
        learner: majority(seen.iter().filter(|m| m.learner).count()),
        // The highest progress that more than half reached: the lower median.
        progress_permille: progress[(progress.len() - 1) / 2],
        ..first
    })
}

#[cfg(test)]
mod tests {
    use metalguard_api::duration::Timestamp;
    use metalguard_api::protocol::EtcdView;
    use metalguard_api::snapshot::FenceRequest;

    use crate::backend::State;
    use crate::inventory::Inventory;
    use crate::testkit::{member, stored_report};

    const INVENTORY: &str = r#"
[etcd]
endpoints = ["http://127.0.0.1:2379"]

[control_plane]
desired_replicas = 3

[[hosts]]
name = "cp-1"
role = "control-plane"
bmc = { address = "ipmi://10.0.0.1", credentials_dir = "/nonexistent" }

[[hosts]]
name = "cp-2"
role = "control-plane"
bmc = { address = "ipmi://10.0.0.2", credentials_dir = "/nonexistent" }

[[hosts]]
name = "cp-3"
role = "control-plane"
bmc = { address = "ipmi://10.0.0.3", credentials_dir = "/nonexistent" }
"#;

    const NOW: u64 = 10_000_000;

    /// A view from `host` in which cp-2's member is `cp2_healthy` and the others are healthy.
    fn view(host: &str, cp2_healthy: bool) -> crate::backend::StoredReport {
        let etcd = EtcdView {
            local_member_id: None,
            leader_id: Some(1),
            members: vec![
                member(1, "cp-1", false, true),
                member(2, "cp-2", false, cp2_healthy),
                member(3, "cp-3", false, true),
            ],
        };
        stored_report(host, NOW - 1_000, Some(etcd))
    }

    /// cp-1 and cp-3 see cp-2's member down; cp-2's own agent says `cp2_says`. An
    /// administrator asks to fence the healthy cp-3 with --force.
    fn state(cp2_says: bool) -> State {
        let mut state = State::default();
        state.reports.insert("cp-1".into(), view("cp-1", false));
        state.reports.insert("cp-2".into(), view("cp-2", cp2_says));
        state.reports.insert("cp-3".into(), view("cp-3", false));
        state.fence_requests.insert(
            "cp-3".into(),
            FenceRequest {
                requested_at: Timestamp(NOW - 500),
                requested_by: Some("mallory".into()),
                force_reason: Some("testing".into()),
                stay_off: false,
                nonce: None,
                drill: false,
            },
        );
        state
    }

    fn views(healthy: &[bool]) -> Vec<EtcdView> {
        healthy
            .iter()
            .map(|&up| EtcdView {
                local_member_id: None,
                leader_id: Some(1),
                members: vec![member(1, "cp-1", false, true), member(2, "cp-2", false, up)],
            })
            .collect()
    }

    fn health_of_cp2(healthy: &[bool]) -> bool {
        let views = views(healthy);
        let refs: Vec<&EtcdView> = views.iter().collect();
        super::member_of("cp-2", &refs).unwrap().healthy
    }

    #[test]
    fn a_member_is_healthy_only_when_more_than_half_of_the_views_say_so() {
        assert!(health_of_cp2(&[true]));
        assert!(!health_of_cp2(&[false]));
        assert!(!health_of_cp2(&[true, false]), "a tie is not a majority");
        assert!(health_of_cp2(&[true, true, false]));
        assert!(
            !health_of_cp2(&[true, false, false]),
            "one of three cannot say healthy"
        );
        assert!(super::member_of("cp-9", &[]).is_none());
        // Leadership and catch-up: what more than half see.
        let mut v = views(&[true, true, true]);
        v[2].leader_id = Some(2);
        for (view, applied) in v.iter_mut().zip([2, 5, 10]) {
            view.members[1].learner = true;
            view.members[1].raft_applied_index = Some(applied);
        }
        let refs: Vec<&EtcdView> = v.iter().collect();
        let cp2 = super::member_of("cp-2", &refs).unwrap();
        assert!(!cp2.leader, "one view says cp-2 leads");
        assert!(cp2.learner);
        assert_eq!(
            cp2.progress_permille, 500,
            "two views of three saw at least 5 of 10"
        );
    }

    #[test]
    fn one_lying_report_cannot_flip_a_members_health_and_let_a_refused_fence_through() {
        let inventory = Inventory::parse(std::path::Path::new("i.toml"), INVENTORY).unwrap();
        let honest =
            crate::cli::status::fence_verdict(&inventory, &state(false), "cp-3", Timestamp(NOW));
        assert!(
            honest.starts_with("verdict: refused"),
            "with cp-2's member down, fencing cp-3 would leave one healthy voter of three: {honest}"
        );
        // cp-2's agent (its certificate stolen, or the host confused) says every member is
        // healthy. One view of three cannot outvote the other two.
        let lying =
            crate::cli::status::fence_verdict(&inventory, &state(true), "cp-3", Timestamp(NOW));
        assert!(lying.starts_with("verdict: refused"), "{lying}");
        assert_eq!(lying, honest);
    }
}
