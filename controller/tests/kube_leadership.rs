//! Leadership on a real Lease: while another identity holds the Lease the controller decides
//! nothing (agents are told to go elsewhere, the verified result is refused, no status, Node
//! or Event write); once that holder stops renewing and its Lease runs out, the controller
//! takes the Lease back and continues the remediation from the intent it had persisted, with
//! the same operation, never a second power-off.

#![cfg(feature = "kubernetes")]
// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod kubelab;

use std::time::{Duration, Instant, SystemTime};

use kubelab::{KubeLab, LabOptions, NS};
use metalguard_api::protocol::Outcome;
use metalguard_e2e::kube::time::rfc3339_micros;
use serde_json::json;

const LEASE: &str =
    "/apis/coordination.k8s.io/v1/namespaces/metalguard-system/leases/metalguard-controller";
/// The Lease annotation that counts leaderships (`controller/src/kube/term.rs`).
const TERM: &str = "metalguard.io/leader-term";

#[test]
fn a_lost_lease_stops_every_decision_and_a_regained_one_resumes_the_remediation() {
    let mut lab = KubeLab::start(&LabOptions::default());
    lab.kubelets["w-3"].set_ready(false).unwrap();
    lab.start_controller("controller-0");
    lab.wait_leading("w-1", Duration::from_secs(60));
    let off = "remediation/w-3/1/power-off";
    let offered = lab.agents.wait_offered(off, Duration::from_secs(30));
    let lease = lab.admin().get(LEASE).unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "controller-0");
    assert_eq!(lease["metadata"]["namespace"], NS);
    // The leadership began term 1 on the Lease, and its commands carry it.
    assert_eq!(lease["metadata"]["annotations"][TERM], "1", "{lease}");
    assert_eq!(offered.command.term, 1, "{:?}", offered.command);

    // Another controller holds the Lease now (elected while this one was cut off).
    let taken = SystemTime::now();
    let taken_at = Instant::now();
    lab.admin()
        .merge_patch(
            LEASE,
            &json!({"spec": {"holderIdentity": "controller-elsewhere",
                "acquireTime": rfc3339_micros(taken), "renewTime": rfc3339_micros(taken),
                "leaseDurationSeconds": 15}}),
        )
        .unwrap();
    lab.wait(
        "the agent API stops answering as leader",
        Duration::from_secs(10),
        |lab| {
            let status = lab.agents.last_report_status("w-1");
            status != 200 && status != 0
        },
    );
    let stopped_after = taken_at.elapsed();
    // The power-off is verified now, but this controller does not lead: refused.
    lab.kubelets["w-3"].stop();
    lab.agents.set_live("w-3", false);
    assert_ne!(lab.agents.finish(off, Outcome::Succeeded), 200);
    std::thread::sleep(Duration::from_secs(4));
    let decided: Vec<_> = lab
        .controller_calls()
        .into_iter()
        .filter(|e| e.received.is_some_and(|t| t > taken + stopped_after))
        .filter(|e| {
            matches!(
                (e.verb.as_str(), e.resource.as_str()),
                (
                    "patch",
                    "guardedhosts/status"
                        | "guardedhosts"
                        | "hosthealthchecks/status"
                        | "fencerequests/status"
                        | "nodes"
                ) | ("delete", "nodes")
                    | ("create", "events")
            )
        })
        .collect();
    assert!(
        decided.is_empty(),
        "decisions while not leading: {decided:#?}"
    );
    assert!(lab.node("w-3").is_some());
    assert_eq!(lab.phase("w-3"), "PoweringOff");

    // The other holder is gone: its Lease runs out and this controller takes it back.
    lab.agents
        .finish_until_recorded(off, Outcome::Succeeded, Duration::from_secs(60));
    eprintln!(
        "[kubelab] leadership lost {stopped_after:?} after the Lease was taken; regained {:?} after",
        taken_at.elapsed()
    );
    assert!(
        taken_at.elapsed() >= Duration::from_secs(13),
        "regained before the other holder's 15 s Lease ran out: {:?}",
        taken_at.elapsed()
    );
    let lease = lab.admin().get(LEASE).unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "controller-0");
    assert!(
        lease["spec"]["leaseTransitions"].as_i64().unwrap() >= 2,
        "{lease}"
    );
    lab.wait("Node w-3 deleted", Duration::from_secs(20), |lab| {
        lab.node("w-3").is_none()
    });
    let on = lab
        .agents
        .wait_offered("remediation/w-3/1/power-on", Duration::from_secs(20));
    // The leadership regained is a new one: term 2 on the Lease and in its commands.
    let lease = lab.admin().get(LEASE).unwrap();
    assert_eq!(lease["metadata"]["annotations"][TERM], "2", "{lease}");
    assert_eq!(on.command.term, 2, "{:?}", on.command);
    let power_offs: Vec<String> = lab
        .agents
        .offered()
        .into_keys()
        .filter(|id| id.ends_with("power-off"))
        .collect();
    assert_eq!(power_offs, [off]);
    lab.assert_nothing_forbidden();
}
