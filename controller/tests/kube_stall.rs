//! The sequence that once fenced a healthy control-plane host in the Kubernetes lab
//! (docs/design-kubernetes.md, known gaps), replayed on a real kube-apiserver: a control-plane
//! host hangs, and the API server stalls (SIGSTOP, as behind a frozen etcd member) while the
//! controller's loop is inside a round's write. The round blocks past the Lease, the agents are
//! answered 503, and when the API server answers again the controller still holds the Lease.
//! The views the agents sent before the stall still show the hung member healthy, and every
//! agent has been silent longer than its heartbeat timeout.
//!
//! What must hold: the controller starts a new leadership (the lapse was not seen by the loop,
//! only by the hub's deadline), gives every agent a heartbeat timeout from then, counts only the
//! etcd views received since, and so fences the hung host, once, through another host's agent,
//! and no other host: no power command ever names cp-2 or cp-3.

#![cfg(feature = "kubernetes")]
// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod kubelab;

use std::time::{Duration, Instant};

use kubelab::{KubeLab, LabOptions, MG};
use metalguard_api::protocol::{CommandKind, Outcome, PowerAction};
use metalguard_e2e::kube::kubelet::NodeTemplate;
use serde_json::json;

const HOSTS: [&str; 3] = ["cp-1", "cp-2", "cp-3"];
const OFF: &str = "remediation/cp-1/1/power-off";
const ON: &str = "remediation/cp-1/1/power-on";
/// Longer than the controller's 15 s Lease: the leadership lapses during the stall.
const STALL: Duration = Duration::from_secs(22);
/// What the controller logs when a campaign finds that the leadership lapsed unobserved.
const UNOBSERVED_LAPSE: &str = "leadership had lapsed while a round or a request was blocked";

#[test]
fn a_stall_that_lapses_the_leadership_inside_a_round_fences_only_the_hung_host() {
    let mut lab = KubeLab::start(&LabOptions {
        workers: Vec::new(),
        control_plane: HOSTS.to_vec(),
        // The Kubernetes lab's check: an agent silent 3 s makes its host unhealthy, executes
        // nothing, and its etcd view no longer counts.
        check: json!({
            "selector": {"matchLabels": {"pool": "control-plane"}},
            "agentHeartbeatTimeout": "3s",
            "remediation": {"nodeAction": "Delete", "maxRetries": 1, "retryPeriod": "2s",
                "executorHeartbeatTimeout": "3s"},
        }),
        ..LabOptions::default()
    });
    lab.agents.report_etcd_cluster(&HOSTS);
    kubelab::create_control_plane(lab.admin(), 3);
    lab.start_controller("controller-0");
    lab.wait_leading("cp-2", Duration::from_secs(60));
    let plane = |lab: &KubeLab| {
        lab.admin()
            .get(&format!("{MG}/guardedcontrolplanes/control-plane"))
            .unwrap()["status"]
            .clone()
    };
    lab.wait(
        "three healthy voters, one failure tolerated",
        Duration::from_secs(30),
        |lab| {
            let status = plane(lab);
            status["etcdVoters"] == 3 && status["quorumTolerance"] == 1
        },
    );

    // cp-1 hangs: its agent and kubelet fall silent. The views the others sent until now
    // show its member healthy.
    lab.kubelets["cp-1"].stop();
    lab.agents.set_live("cp-1", false);
    // The API server stalls, and the others see cp-1's member down and say so at once: the
    // round their reports wake writes that to cp-1's status and blocks on the stalled server.
    lab.cluster.apiserver().freeze().unwrap();
    let frozen = Instant::now();
    lab.agents.set_member_healthy("cp-1", false);
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
    eprintln!(
        "[stall] API server frozen {:?}; agents answered 503 after {lapsed_after:?}",
        frozen.elapsed()
    );

    // The hung host is fenced through another host's agent, as it should be...
    let off = lab.agents.wait_offered(OFF, Duration::from_secs(90));
    let CommandKind::Fence(fence) = &off.command.kind else {
        panic!("{off:?}")
    };
    assert_eq!(
        (fence.target.as_str(), fence.action),
        ("cp-1", PowerAction::Off)
    );
    assert_ne!(off.agent, "cp-1");
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
    // cp-1 boots: its member and agent are back, its Node registers again.
    lab.agents.set_member_healthy("cp-1", true);
    lab.agents.set_live("cp-1", true);
    lab.kubelets["cp-1"]
        .register_again(&NodeTemplate::named("cp-1"))
        .unwrap();
    lab.wait("remediation of cp-1 Done", Duration::from_secs(60), |lab| {
        lab.phase("cp-1") == "Done"
    });

    // ...and no other host was ever a target or under remediation.
    let fences: Vec<(String, String, PowerAction)> = lab
        .agents
        .offered()
        .into_values()
        .filter_map(|o| match &o.command.kind {
            CommandKind::Fence(f) => {
                Some((o.command.operation_id.0.clone(), f.target.clone(), f.action))
            }
            _ => None,
        })
        .collect();
    assert!(
        fences.iter().all(|(_, target, _)| target == "cp-1"),
        "a healthy host was fenced: {fences:?}"
    );
    let offs = fences
        .iter()
        .filter(|(_, _, action)| *action == PowerAction::Off)
        .count();
    assert_eq!(offs, 1, "{fences:?}");
    for host in ["cp-2", "cp-3"] {
        assert_eq!(lab.phase(host), "", "{host} was remediated");
        let reasons = lab.host_event_reasons(host);
        assert!(
            !reasons.iter().any(|r| r == "PowerOff"),
            "{host}: {reasons:?}"
        );
    }
    lab.assert_nothing_forbidden();
}
