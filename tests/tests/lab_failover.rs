//! End-to-end: two controller replicas, the leader paused past its lease. The agents must
//! reach the new leader within the heartbeat timeout, or the new leader takes their silence
//! for a host failure and fences healthy hosts (found by the nemesis soak, issue 24).
//!
//! The agents' request timeout here (10 s) is longer than the heartbeat timeout (5 s): an
//! agent that waits out a whole request on the paused controller before it asks the other is
//! silent for too long. Reports are hedged (agent `link.rs`), so none may be.

// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod labrun;

use std::time::Duration;

use metalguard_e2e::lab::{Lab, LabOptions};
use metalguard_e2e::soak::history::Event;
use metalguard_e2e::soak::logs::{Tail, Writer, parse_line};
use metalguard_e2e::soak::recorder::unix_ms;

/// The replica whose log says it leads in the newest term, the term, and when it began
/// (Unix ms), if any.
fn leader(lab: &Lab) -> Option<(usize, u64, u64)> {
    let mut best: Option<(usize, u64, u64)> = None;
    for (slot, name) in lab.controller_names().into_iter().enumerate() {
        let mut tail = Tail::new(lab.controller_log_of(slot));
        for line in tail.new_lines() {
            if let Some((at, Event::Leader { term, .. })) =
                parse_line(&Writer::Controller(name.clone()), &line)
                && best.is_none_or(|(_, t, _)| term > t)
            {
                best = Some((slot, term, at));
            }
        }
    }
    best
}

/// When host `i`'s agent first saw `term` (Unix ms), if it did.
fn term_seen_at(lab: &Lab, i: usize, term: u64) -> Option<u64> {
    let host = &lab.hosts()[i];
    let mut tail = Tail::new(host.agent_log());
    tail.new_lines().iter().find_map(|line| {
        match parse_line(&Writer::Agent(host.name.clone()), line) {
            Some((at, Event::TermSeen { term: t, .. })) if t >= term => Some(at),
            _ => None,
        }
    })
}

/// No host was powered off since `since` (Unix ms): all of them were healthy.
fn assert_no_power_off_since(lab: &Lab, since: u64) {
    let offs: Vec<usize> = (0..lab.hosts().len())
        .map(|i| lab.power_offs_since(i, since).unwrap())
        .collect();
    assert!(
        offs.iter().all(|&n| n == 0),
        "healthy hosts were powered off while the leader was paused (per host: {offs:?})\n--- timeline\n{}\n--- logs\n{}",
        lab.timeline.render(),
        lab.logs()
    );
}

#[test]
fn agents_reach_a_new_leader_in_time_when_the_old_one_is_paused_and_no_healthy_host_is_fenced() {
    let mut options = LabOptions::new(3, metalguard_e2e::lab::test_bin_dir());
    options.controllers = 2;
    options.timings.agent_request_timeout = Some(Duration::from_secs(10));
    let heartbeat = options.timings.heartbeat_timeout;
    let mut lab = labrun::start(options);
    lab.wait_all_healthy(Duration::from_secs(60)).unwrap();
    let (old, old_term, _) = leader(&lab).expect("a replica leads");
    let since = unix_ms();

    lab.freeze_controller(old).unwrap();
    let lease = lab.leader_lease();
    lab.wait_for(
        "the other replica leading in a newer term",
        lease * 4 + Duration::from_secs(10),
        |lab| Ok(leader(lab).is_some_and(|(slot, term, _)| slot != old && term > old_term)),
    )
    .unwrap();
    // Long enough for the new leader to judge every agent: a heartbeat timeout and a whole
    // request timeout of an agent stuck on the paused replica.
    lab.idle(heartbeat + Duration::from_secs(12)).unwrap();
    lab.thaw_controller(old).unwrap();
    lab.idle(Duration::from_secs(3)).unwrap();

    let (_, new_term, began) = leader(&lab).unwrap();
    let late: Vec<String> = (0..lab.hosts().len())
        .filter_map(|i| {
            let after = term_seen_at(&lab, i, new_term).map(|at| at.saturating_sub(began));
            let in_time =
                after.is_some_and(|ms| ms < u64::try_from(heartbeat.as_millis()).unwrap());
            (!in_time).then(|| format!("{}: {after:?} ms", lab.hosts()[i].name))
        })
        .collect();
    assert!(
        late.is_empty(),
        "agents reached the new leader (term {new_term}) later than the heartbeat timeout ({heartbeat:?}) after it began: {late:?}\n--- logs\n{}",
        lab.logs()
    );
    assert_no_power_off_since(&lab, since);
}

#[test]
fn an_agent_started_while_the_leader_is_paused_asks_the_next_leader_again_instead_of_waiting_out_the_paused_one()
 {
    // Found by the Kubernetes soak: an agent restarted while the leader was paused; its first
    // controller answered 503 (not leading yet), it then waited a whole request timeout on
    // the paused one, twice, and the new leader fenced its healthy host for silence.
    let mut options = LabOptions::new(3, metalguard_e2e::lab::test_bin_dir());
    options.controllers = 2;
    options.timings.agent_request_timeout = Some(Duration::from_secs(10));
    let heartbeat = options.timings.heartbeat_timeout;
    let mut lab = labrun::start(options);
    lab.wait_all_healthy(Duration::from_secs(60)).unwrap();
    let lease = lab.leader_lease();
    // The second replica must lead, so that an agent's first choice (the first URL) is the
    // one that does not lead yet when the leader pauses.
    let (first, term, _) = leader(&lab).expect("a replica leads");
    if first == 0 {
        lab.kill_controller_in(0);
        lab.wait_for(
            "the second replica leading",
            lease * 4 + Duration::from_secs(10),
            |lab| Ok(leader(lab).is_some_and(|(slot, t, _)| slot == 1 && t > term)),
        )
        .unwrap();
        lab.start_controller_in(0).unwrap();
        lab.wait_all_healthy(Duration::from_secs(60)).unwrap();
    }
    let (_, paused_term, _) = leader(&lab).unwrap();
    let since = unix_ms();
    lab.freeze_controller(1).unwrap();
    lab.kill_agent(0);
    lab.restart_agent(0).unwrap();
    lab.wait_for(
        "the first replica leading in a newer term",
        lease * 4 + Duration::from_secs(10),
        |lab| Ok(leader(lab).is_some_and(|(slot, t, _)| slot == 0 && t > paused_term)),
    )
    .unwrap();
    lab.idle(heartbeat + Duration::from_secs(12)).unwrap();
    lab.thaw_controller(1).unwrap();
    lab.idle(Duration::from_secs(3)).unwrap();

    let (_, new_term, began) = leader(&lab).unwrap();
    let after = term_seen_at(&lab, 0, new_term).map(|at| at.saturating_sub(began));
    assert!(
        after.is_some_and(|ms| ms < u64::try_from(heartbeat.as_millis()).unwrap()),
        "the restarted agent reached the new leader (term {new_term}) {after:?} ms after it began, not within the heartbeat timeout ({heartbeat:?})\n--- logs\n{}",
        lab.logs()
    );
    assert_no_power_off_since(&lab, since);
}
