//! Observation, gate and operations against real etcd processes from the harness.
//!
//! Plain HTTP on purpose (`EtcdCluster::start_plain_http`): the subject here is the membership
//! mechanics, not the transport. The same client over TLS with client certificates is tested
//! in `agent/etcd/tests/tls.rs`, and every membership step runs over TLS in the lab's
//! `replace` scenario (`tests/tests/lab_replace.rs`).
#![allow(clippy::panic)]

mod common;

use common::*;
use metalguard_e2e::etcd::EtcdCluster;
use metalguard_etcd::catchup::{CatchUp, Sample};
use metalguard_etcd::gate::Refusal;
use metalguard_etcd::observe::observe;
use metalguard_etcd::ops::{self, Removed};
use metalguard_etcd::{EtcdError, EtcdErrorKind};
use std::time::{Duration, Instant};

/// How often the leader-removal test's writer sends a put (without waiting for earlier ones).
const WRITE_EVERY: Duration = Duration::from_millis(10);

/// The longest time without an acknowledged write that the leader removal may cause: well
/// below etcd's election timeout (1 s), the least a leaderless cluster takes to elect.
const LONGEST_WITHOUT_ACK: Duration = Duration::from_millis(500);

/// The puts etcd may leave unanswered were all sent during one leader handover (about 2 ms
/// of etcd's time, measured; this allows for a loaded machine).
const HANDOVER_SPAN: Duration = Duration::from_millis(250);

fn refusal(err: &EtcdError) -> &Refusal {
    match err {
        EtcdError::Refused(r) => r,
        other => panic!("expected a gate refusal, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn observation_reports_every_member_and_a_dead_endpoint_fails_only_itself() {
    let cluster = EtcdCluster::start_plain_http(3).unwrap();
    let mut endpoints = cluster.endpoints();
    // An endpoint nobody listens on (a reserved but unused port of the harness).
    let mut c2 = EtcdCluster::start_plain_http(1).unwrap();
    let unused = c2.reserve_host().unwrap();
    endpoints.push(unused.client_url.clone());
    let view = observe(&settings(endpoints)).await.unwrap();
    let s = &view.summary;
    assert_eq!(
        (s.voters, s.learners, s.unstarted, s.healthy_voters),
        (3, 0, 0, 3)
    );
    assert_eq!((s.quorum, s.failure_tolerance, s.has_quorum), (2, 1, true));
    let leader = s.leader.expect("a leader");
    for m in &view.members {
        let status = m.status().expect("every member answered");
        assert!(m.healthy(), "{m:?}");
        assert_eq!(status.leader, leader);
        assert!(status.raft_applied_index > 0 && status.raft_index >= status.raft_applied_index);
        assert!(status.db_size > 0);
        assert!(status.version.starts_with("3."), "{}", status.version);
    }
    // The suite runs against the binary the harness was told to use (3.4, 3.5 or 3.6).
    let bin = metalguard_e2e::tools::etcd_bin().unwrap();
    let want = metalguard_e2e::tools::etcd_version().unwrap().to_string();
    let got = &view.members[0].status().unwrap().version;
    eprintln!("etcd under test: {} reports {got}", bin.display());
    assert_eq!(got, &want);
    assert_eq!(view.stray_endpoints.len(), 1);
    assert!(!view.stray_endpoints[0].reachable);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hung_voter_is_detected_within_the_probe_timeout_and_the_gate_refuses() {
    let mut cluster = EtcdCluster::start_plain_http(3).unwrap();
    let hung_id = member_id(&cluster, 2);
    cluster.hang(2).unwrap();
    let started = Instant::now();
    let view = observe(&settings(cluster.endpoints())).await.unwrap();
    let took = started.elapsed();
    assert!(
        took < PROBE + Duration::from_millis(500),
        "observation took {took:?}"
    );
    let hung = view.member(hung_id).unwrap();
    assert!(!hung.reachable() && !hung.healthy(), "{hung:?}");
    assert_eq!(view.summary.healthy_voters, 2);

    let err = ops::add_learner(&settings(cluster.endpoints()), "http://127.0.0.1:1")
        .await
        .unwrap_err();
    assert!(matches!(refusal(&err), Refusal::DeadVoter { .. }), "{err}");
    assert!(
        refusal(&err).to_string().contains("must be removed first"),
        "{err}"
    );
    cluster.resume(2).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killed_voter_must_be_removed_first_then_the_join_succeeds() {
    let mut cluster = EtcdCluster::start_plain_http(3).unwrap();
    let dead_id = member_id(&cluster, 2);
    cluster.kill(2);
    let slot = cluster.reserve_host().unwrap();
    let s = settings(cluster.endpoints());

    let err = ops::add_learner(&s, &slot.peer_url).await.unwrap_err();
    match refusal(&err) {
        Refusal::DeadVoter { member, .. } => {
            assert!(member.starts_with(&format!("{dead_id:x}")), "{member}");
        }
        other => panic!("{other:?}"),
    }
    assert!(
        refusal(&err).to_string().contains("must be removed first"),
        "{err}"
    );
    // Removing a healthy voter now would lose quorum: the gate refuses that too.
    let healthy_id = member_id(&cluster, 0);
    assert!(matches!(
        refusal(&ops::remove(&s, healthy_id).await.unwrap_err()),
        Refusal::WouldLoseQuorum { .. }
    ));

    assert_eq!(
        ops::remove(&s, dead_id).await.unwrap(),
        Removed::Removed {
            moved_leader: false
        }
    );
    assert_eq!(
        ops::remove(&s, dead_id).await.unwrap(),
        Removed::AlreadyGone
    );

    let _guard = PidGuard(pid_file(&slot));
    let mut flow = metalguard_etcd::join::JoinFlow::load(
        join_config(&cluster, &slot, Some(3)),
        exec_launcher(&slot),
    )
    .unwrap();
    let done = flow.run().await.unwrap();
    assert!(
        matches!(done, metalguard_etcd::join::state::JoinState::Member { .. }),
        "{done:?}"
    );
    let list = cluster.member_list().unwrap();
    assert_eq!(
        list.iter()
            .filter(|m| m.peer_urls.contains(&slot.peer_url))
            .count(),
        1
    );
    assert_eq!(list.iter().filter(|m| !m.is_learner).count(), 3);
    flow.launcher_mut().stop().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_learner_is_refused_clearly_by_the_gate_and_by_etcd() {
    let mut cluster = EtcdCluster::start_plain_http(3).unwrap();
    let learner = cluster.add_learner().unwrap();
    let slot = cluster.reserve_host().unwrap();
    let s = settings(cluster.endpoints());
    let err = ops::add_learner(&s, &slot.peer_url).await.unwrap_err();
    assert!(
        matches!(refusal(&err), Refusal::LearnerPresent { .. }),
        "{err}: {:?}",
        refusal(&err)
    );
    assert!(
        refusal(&err)
            .to_string()
            .contains("already exists and etcd allows one learner"),
        "{err}"
    );

    // etcd's own answer is classified by code and message.
    let mut c = client(&cluster.endpoints()[..1]).await;
    let err = c
        .member_add(
            [slot.peer_url.as_str()],
            Some(etcd_client::MemberAddOptions::new().with_is_learner()),
        )
        .await
        .unwrap_err();
    let etcd_client::Error::GRpcStatus(status) = &err else {
        panic!("{err:?}")
    };
    assert_eq!(
        metalguard_etcd::error::classify(i32::from(status.code()), status.message()),
        EtcdErrorKind::TooManyLearners
    );

    // Re-adding the existing learner's peer URL reuses it instead of duplicating.
    let existing = cluster.member(learner).peer_url().to_owned();
    let added = ops::add_learner(&s, &existing).await.unwrap();
    assert!(added.reused && !added.already_voter);
    assert_eq!(cluster.member_list().unwrap().len(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_the_leader_moves_leadership_first_with_zero_failed_writes() {
    let cluster = EtcdCluster::start_plain_http(3).unwrap();
    let s = settings(cluster.endpoints());
    let view = observe(&s).await.unwrap();
    let leader = view.summary.leader.unwrap();
    let others: Vec<String> = view
        .members
        .iter()
        .filter(|m| m.id != leader)
        .map(|m| m.client_urls[0].clone())
        .collect();
    let writer = Writer::start_paced(&others, WRITE_EVERY).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let removing = Instant::now();
    let removed = ops::remove(&s, leader).await.unwrap();
    let removal_done = Instant::now();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let written = writer.finish().await;
    assert_eq!(removed, Removed::Removed { moved_leader: true });
    assert!(
        written.errors.is_empty(),
        "failed writes: {:?}",
        written.errors
    );
    // While a leader hands over, etcd's raft drops every proposal that reaches it ("transfer
    // leadership ... is in progress; dropping proposal") and the follower that forwarded it is
    // never told (etcd-io/etcd#8975): the puts in flight at that instant get no answer and are
    // sent again, as etcd asks of every client. Only those: all sent within one handover.
    let unanswered = &written.unanswered;
    let span = match (unanswered.first(), unanswered.last()) {
        (Some((_, first)), Some((_, last))) => *last - *first,
        _ => Duration::ZERO,
    };
    assert!(
        span < HANDOVER_SPAN && unanswered.iter().all(|(_, sent)| *sent < removal_done),
        "writes other than those in flight at the handover got no answer: {unanswered:?}"
    );
    // What moving leadership first buys: the cluster kept acknowledging writes. Removing the
    // leader without the move leaves no leader for at least the election timeout (1 s).
    let gap = written.longest_without_ack(removing, removal_done + Duration::from_millis(500));
    assert!(
        gap < LONGEST_WITHOUT_ACK,
        "no write was acknowledged for {gap:?} during the removal"
    );
    let acked = written.acked;
    assert!(
        acked.len() > 20,
        "writer made too little progress: {}",
        acked.len()
    );
    let after = observe(&settings(others.clone())).await.unwrap();
    assert_eq!(after.summary.voters, 2);
    assert!(after.summary.leader.is_some_and(|l| l != leader));
    assert_all_acked_readable(&others, &acked).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stall_detection_fires_on_a_frozen_learner() {
    let mut cluster = EtcdCluster::start_plain_http(3).unwrap();
    let learner = cluster.add_learner().unwrap();
    let id = member_id(&cluster, learner);
    let s = settings(cluster.endpoints());
    let writer = Writer::start(&cluster.endpoints()[..3]).await;
    let mut tracker = CatchUp::new(Duration::from_secs(2));
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(1) {
        let view = observe(&s).await.unwrap();
        let verdict = tracker.observe(Instant::now(), Sample::from_view(&view, id));
        assert!(!verdict.stalled, "{verdict:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    cluster.hang(learner).unwrap();
    let frozen = Instant::now();
    let stalled_after = loop {
        let view = observe(&s).await.unwrap();
        let verdict = tracker.observe(Instant::now(), Sample::from_view(&view, id));
        if verdict.stalled {
            break frozen.elapsed();
        }
        assert!(
            frozen.elapsed() < Duration::from_secs(6),
            "no stall detected"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let written = writer.finish().await;
    assert!(
        written.errors.is_empty() && written.unanswered.is_empty(),
        "{written:?}"
    );
    assert!(
        stalled_after >= Duration::from_secs(1),
        "stalled too early: {stalled_after:?}"
    );
    cluster.resume(learner).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nospace_alarm_shows_on_every_member_and_blocks_the_gate() {
    let cluster =
        metalguard_e2e::etcd::EtcdCluster::start_with(metalguard_e2e::etcd::EtcdOptions {
            members: 3,
            quota_backend_bytes: Some(8 * 1024 * 1024),
            security: metalguard_e2e::etcd::EtcdSecurity::PlainHttp,
            ..Default::default()
        })
        .unwrap();
    let mut c = client(&cluster.endpoints()).await;
    let value = vec![b'x'; 512 * 1024];
    let mut nospace = None;
    for i in 0..64 {
        if let Err(err) = c.put(format!("/big/{i}"), value.clone(), None).await {
            nospace = Some(err);
            break;
        }
    }
    let Some(etcd_client::Error::GRpcStatus(status)) = nospace else {
        panic!("the quota was never reached")
    };
    assert_eq!(
        metalguard_etcd::error::classify(i32::from(status.code()), status.message()),
        EtcdErrorKind::NoSpace,
        "{status:?}"
    );
    // The alarm is raised through raft: a follower shows it once it has applied that entry, which
    // can be a moment after the put that failed. Wait (bounded) until every member has applied it.
    let deadline = Instant::now() + Duration::from_secs(10);
    let view = loop {
        let view = observe(&settings(cluster.endpoints())).await.unwrap();
        let all = view
            .members
            .iter()
            .all(|m| m.status().is_some_and(|s| s.alarm_names() == "NOSPACE"));
        if all || Instant::now() > deadline {
            break view;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for m in &view.members {
        let status = m.status().unwrap();
        assert_eq!(status.alarm_names(), "NOSPACE", "{status:?}");
        assert!(
            status
                .alarms
                .iter()
                .all(|a| view.member(a.member_id).is_some()),
            "{status:?}"
        );
        assert!(!m.healthy());
    }
    let err = ops::add_learner(&settings(cluster.endpoints()), "http://127.0.0.1:1")
        .await
        .unwrap_err();
    let text = refusal(&err).to_string();
    assert!(text.contains("alarms NOSPACE"), "{text}");
}
