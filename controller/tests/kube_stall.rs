//! The sequence that once fenced a healthy control-plane host in the Kubernetes lab
//! (docs/design-kubernetes.md, known gaps), replayed on a real kube-apiserver: just after the
//! controller's Lease was renewed, a control-plane host hangs and the API server stalls
//! (SIGSTOP, as behind a frozen etcd member) while the controller's loop is inside a round's
//! write. The round blocks past the hub's grace, so the agents are answered 503; when the API
//! server answers again the controller still holds the Lease. Every agent has been silent for
//! longer than its heartbeat timeout, and the views sent before the stall still show the hung
//! member healthy.
//!
//! What must hold: the controller starts a new leadership (the lapse was not seen by the loop,
//! only by the hub's deadline), gives every agent a heartbeat timeout from then, counts only the
//! etcd views received since, and so fences the hung host, once, through another host's agent,
//! no sooner than one heartbeat timeout after the stall, and no other host: no remediation
//! step ever names cp-1 or cp-2.

#![cfg(feature = "kubernetes")]
// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod kubelab;

use std::time::{Duration, Instant};

use kubelab::{KubeLab, LabOptions};
use metalguard_api::protocol::{CommandKind, Outcome, PowerAction};
use metalguard_e2e::kube::kubelet::NodeTemplate;
use serde_json::json;

const HOSTS: [&str; 3] = ["cp-1", "cp-2", "cp-3"];
/// The host that hangs: the last by name, so that a planner misled into taking every host
/// for unhealthy would reach a healthy one first.
const HUNG: &str = "cp-3";
const OFF: &str = "remediation/cp-3/1/power-off";
const ON: &str = "remediation/cp-3/1/power-on";
/// The controller's Lease.
const LEASE: &str =
    "/apis/coordination.k8s.io/v1/namespaces/metalguard-system/leases/metalguard-controller";
/// Longer than the hub's grace (the Lease's 15 s less one 5 s request timeout, from the last
/// good campaign, which began before the stall): agents are answered 503 during the stall,
/// and the test waits for that before it thaws. Shorter than the Lease, renewed just before
/// the stall began: the first campaign after it finds the Lease still held, with more than
/// the backend's 2 s margin left — the lapse the loop did not see. At 12 s only ~1 s of that
/// margin was left for the API server to answer after its thaw; under load it answered the
/// campaign later, with the Lease in its last 2 s, the controller stepped down and led again
/// from a clean slate, and the run did not replay the sequence (fresh clone, 2026-11-28).
/// 11 s leaves ~2 s.
const STALL: Duration = Duration::from_secs(11);
/// The agents' heartbeat timeout in the check below.
const HEARTBEAT: Duration = Duration::from_secs(3);
/// What the controller logs when a campaign finds that the leadership lapsed unobserved.
const UNOBSERVED_LAPSE: &str = "leadership had lapsed while a round or a request was blocked";

/// Every power command offered so far: (operation, target, action), by operation id.
fn fences(lab: &KubeLab) -> Vec<(String, String, PowerAction)> {
    lab.agents
        .offered()
        .into_values()
        .filter_map(|o| match &o.command.kind {
            CommandKind::Fence(f) => {
                Some((o.command.operation_id.0.clone(), f.target.clone(), f.action))
            }
            _ => None,
        })
        .collect()
}

/// The operation ids of every remediation step offered so far (any kind: power, etcd
/// leadership moves), sorted.
fn remediation_steps(lab: &KubeLab) -> Vec<String> {
    lab.agents
        .offered()
        .into_keys()
        .filter(|id| id.starts_with("remediation/"))
        .collect()
}

#[test]
fn a_stall_that_lapses_the_leadership_inside_a_round_fences_only_the_hung_host() {
    let mut lab = KubeLab::start(&LabOptions {
        workers: Vec::new(),
        control_plane: HOSTS.to_vec(),
        // The Kubernetes lab's check: an agent silent 3 s makes its host unhealthy, executes
        // nothing, and its etcd view no longer counts.
        check: json!({
            "selector": {"matchLabels": {"pool": "control-plane"}},
            "agentHeartbeatTimeout": format!("{}s", HEARTBEAT.as_secs()),
            "remediation": {"nodeAction": "Delete", "maxRetries": 1, "retryPeriod": "2s",
                "executorHeartbeatTimeout": format!("{}s", HEARTBEAT.as_secs())},
        }),
        ..LabOptions::default()
    });
    lab.agents.report_etcd_cluster(&HOSTS);
    kubelab::create_control_plane(lab.admin(), 3);
    lab.start_controller("controller-0");
    lab.wait_leading("cp-2", Duration::from_secs(60));
    lab.wait(
        "three healthy voters, one failure tolerated",
        Duration::from_secs(30),
        |lab| {
            let status = lab.control_plane()["status"].clone();
            status["etcdVoters"] == 3 && status["quorumTolerance"] == 1
        },
    );

    // Just after a renewal of the Lease, cp-3 hangs: its agent and kubelet fall silent. The
    // views the others sent until now show its member healthy.
    let renewed = |lab: &KubeLab| lab.admin().get(LEASE).unwrap()["spec"]["renewTime"].clone();
    let last = renewed(&lab);
    lab.wait("a renewal of the Lease", Duration::from_secs(20), |lab| {
        renewed(lab) != last
    });
    lab.kubelets[HUNG].stop();
    lab.agents.set_live(HUNG, false);
    // The API server stalls, and the others see cp-3's member down and say so at once: the
    // round their reports wake writes that to cp-3's status and blocks on the stalled server.
    lab.cluster.apiserver().freeze().unwrap();
    let frozen = Instant::now();
    lab.agents.set_member_healthy(HUNG, false);
    lab.agents.report_now();
    lab.wait(
        "the leadership lapses (agents answered 503)",
        Duration::from_secs(20),
        |lab| lab.agents.last_report_status("cp-2") == 503,
    );
    let lapsed_after = frozen.elapsed();
    if let Some(rest) = STALL.checked_sub(frozen.elapsed()) {
        std::thread::sleep(rest);
    }
    lab.cluster.apiserver().thaw().unwrap();
    let thawed = Instant::now();
    eprintln!(
        "[stall] API server frozen {:?}; agents answered 503 after {lapsed_after:?}",
        frozen.elapsed()
    );

    // The first remediation step offered is the hung host's power-off, and no step of any
    // other host's remediation (a move of etcd's leadership off a healthy host comes first
    // when it leads) was offered before it...
    lab.wait("a power-off", Duration::from_secs(90), |lab| {
        !fences(lab).is_empty()
    });
    let steps = remediation_steps(&lab);
    assert_eq!(steps, vec![OFF.to_owned()], "a healthy host was remediated");
    let off = lab.agents.wait_offered(OFF, Duration::from_secs(1));
    assert_ne!(off.agent, HUNG);
    // A new leadership began after the stall, and every agent got a heartbeat timeout from
    // then: cp-3 is judged silent no sooner (a leadership counted from before the stall
    // fenced within 0.1-0.7 s of the thaw, when every agent had been silent for 12 s).
    assert!(
        off.seen_at.duration_since(thawed) >= HEARTBEAT,
        "cp-3 was fenced {:?} after the stall, within the agents' heartbeat timeout",
        off.seen_at.duration_since(thawed)
    );
    let log = lab.controller_log("controller-0", 400);
    assert!(
        log.contains(UNOBSERVED_LAPSE),
        "the stall did not lapse the leadership inside a round, so this run did not replay the \
         sequence:\n{log}"
    );
    lab.agents
        .finish_until_recorded(OFF, Outcome::Succeeded, Duration::from_secs(20));
    lab.agents.wait_offered(ON, Duration::from_secs(30));
    lab.agents
        .finish_until_recorded(ON, Outcome::Succeeded, Duration::from_secs(20));
    // cp-3 boots: its member and agent are back, its Node registers again.
    lab.agents.set_member_healthy(HUNG, true);
    lab.agents.set_live(HUNG, true);
    lab.kubelets[HUNG]
        .register_again(&NodeTemplate::named(HUNG))
        .unwrap();
    lab.wait("remediation of cp-3 Done", Duration::from_secs(60), |lab| {
        lab.phase(HUNG) == "Done"
    });

    // ...and no other host was ever a target or under remediation.
    let steps = remediation_steps(&lab);
    assert!(
        steps.iter().all(|id| id.starts_with("remediation/cp-3/")),
        "a healthy host was remediated: {steps:?}"
    );
    let fences = fences(&lab);
    assert!(
        fences.iter().all(|(_, target, _)| target == HUNG),
        "a healthy host was fenced: {fences:?}"
    );
    let offs = fences
        .iter()
        .filter(|(_, _, action)| *action == PowerAction::Off)
        .count();
    assert_eq!(offs, 1, "{fences:?}");
    for host in ["cp-1", "cp-2"] {
        assert_eq!(lab.phase(host), "", "{host} was remediated");
        let operations = lab.host(host)["status"]["operations"].clone();
        assert!(
            operations.as_array().is_none_or(|ops| ops
                .iter()
                .all(|op| !op["id"].as_str().unwrap_or("").starts_with("remediation/"))),
            "{host}: {operations}"
        );
        let reasons = lab.host_event_reasons(host);
        assert!(
            !reasons.iter().any(|r| r == "PowerOff"),
            "{host}: {reasons:?}"
        );
    }
    lab.assert_nothing_forbidden();
}
