//! `metalguard-controller fence|status --kubeconfig` on a real kube-apiserver, as a person
//! in group `metalguard-operators` bound by `examples/operator-rbac.yaml` (nothing else is
//! granted): `fence` creates a `FenceRequest` recording who asked and prints the leader's
//! verdict — refused by the short-circuit (exit 1, nothing done), accepted when forced
//! (exit 0, a remediation started) — and `status` prints the hosts, the remediation, the
//! requests and the leader, as text and JSON.

#![cfg(feature = "kubernetes")]
// Integration tests: helpers outside #[test] fns may unwrap (clippy.toml covers #[test] only).
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod kubelab;

use std::path::Path;
use std::process::{Command, Output};
use std::time::Duration;

use kubelab::{BIN, KubeLab, LabOptions, MG, NS, check_spec};
use serde_json::{Value, json};

const PERSON: &str = "alice";

fn cli(kubeconfig: &Path, args: &[&str]) -> Output {
    let out = Command::new(BIN)
        .args(args)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .env_remove("METALGUARD_INVENTORY")
        .env_remove("KUBECONFIG")
        .output()
        .unwrap();
    eprintln!(
        "[kube_cli] {args:?} → {:?}\n{}{}",
        out.status.code(),
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn text(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn requests_for(lab: &KubeLab, host: &str) -> Vec<Value> {
    lab.admin()
        .list(&format!("{MG}/fencerequests"))
        .unwrap()
        .into_iter()
        .filter(|r| r["spec"]["target"] == host)
        .collect()
}

#[test]
fn fence_prints_the_leaders_verdict_and_status_reads_the_resources() {
    // cp-1's agent drives the workers' BMCs once w-2 and w-3 are unhealthy (a target never
    // fences itself).
    let mut lab = KubeLab::start(&LabOptions {
        check: check_spec(&json!(1), "Delete"),
        control_plane: vec!["cp-1"],
        ..LabOptions::default()
    });
    lab.agents.report_etcd_voter("cp-1");
    lab.cluster
        .kubectl_admin(&[
            "apply",
            "-f",
            "packaging/kubernetes/examples/operator-rbac.yaml",
        ])
        .unwrap();
    let kubeconfig = lab
        .cluster
        .user_kubeconfig(PERSON, &["metalguard-operators"])
        .unwrap();
    // Two unhealthy workers with maxUnhealthy 1: the check short-circuits.
    lab.kubelets["w-2"].set_ready(false).unwrap();
    lab.kubelets["w-3"].set_ready(false).unwrap();

    // No controller yet: no verdict within --wait, the request stays Pending.
    let out = cli(
        &kubeconfig,
        &["fence", "w-2", "--reason", "kernel hung", "--wait", "2s"],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no verdict"),
        "{out:?}"
    );
    let first = requests_for(&lab, "w-2");
    assert_eq!(first.len(), 1, "{first:?}");
    let name = first[0]["metadata"]["name"].as_str().unwrap().to_owned();
    assert!(name.starts_with("fence-w-2-"), "{name}");
    assert_eq!(
        first[0]["metadata"]["annotations"]["metalguard.io/requested-by"],
        PERSON
    );
    assert_eq!(first[0]["spec"]["reason"], "kernel hung");
    assert_eq!(first[0]["spec"]["force"], false);

    lab.start_controller("controller-0");
    lab.wait_leading("w-1", Duration::from_secs(60));
    // The leader answers the waiting request: refused by the short-circuit.
    lab.wait(
        "the first request refused",
        Duration::from_secs(20),
        |lab| {
            lab.admin()
                .get(&format!("{MG}/fencerequests/{name}"))
                .unwrap()["status"]["phase"]
                == "Rejected"
        },
    );
    // And fence run now prints the refusal and fails.
    let out = cli(
        &kubeconfig,
        &["fence", "w-2", "--reason", "kernel hung", "--wait", "20s"],
    );
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let printed = text(&out);
    assert!(
        printed.contains(&format!("created by {PERSON}")),
        "{printed}"
    );
    assert!(
        printed.contains("verdict: refused") && printed.contains("short-circuited"),
        "{printed}"
    );
    assert!(printed.contains("(ShortCircuit)"), "{printed}");
    assert!(lab.host("w-2")["status"].get("remediation").is_none());
    assert!(
        lab.agents.offered().is_empty(),
        "{:?}",
        lab.agents.offered()
    );

    // Forced (the policy gates skipped, never the safety rules): accepted.
    let out = cli(
        &kubeconfig,
        &[
            "fence",
            "w-1",
            "--reason",
            "disk controller wedged",
            "--force",
            "--wait",
            "20s",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let printed = text(&out);
    assert!(
        printed.contains(
            "verdict: accepted — accepted by controller-0: remediation remediation/w-1/1 started"
        ),
        "{printed}"
    );
    let remediation = &lab.host("w-1")["status"]["remediation"];
    assert_eq!(remediation["id"], "remediation/w-1/1");
    assert_eq!(remediation["forced"], "disk controller wedged");
    assert!(
        remediation["cause"]
            .as_str()
            .unwrap()
            .contains(&format!("by {PERSON}")),
        "{remediation}"
    );
    lab.agents
        .wait_offered("remediation/w-1/1/power-off", Duration::from_secs(20));

    // status, as the same person.
    let out = cli(&kubeconfig, &["status"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let printed = text(&out);
    assert!(printed.contains("leader: controller-0"), "{printed}");
    assert!(printed.contains("remediation/w-1/1"), "{printed}");
    assert!(printed.contains("fence requests:"), "{printed}");
    // The agents as the leader wrote them: version, mirrored conditions, its judgement.
    assert!(printed.contains("w-3: agent kube-test heard "), "{printed}");
    assert!(
        printed.contains("    KubeletHealthy = True (Healthy)"),
        "{printed}"
    );
    assert!(
        printed.contains("    MetalguardAgentReady = True"),
        "{printed}"
    );
    assert!(
        printed
            .lines()
            .any(|l| l.starts_with("  w-1: ") && l.contains("Remediating=True")),
        "{printed}"
    );
    let rejected_lines = printed
        .lines()
        .filter(|l| l.contains(": w-2 Rejected by alice (kernel hung) — refused by controller-0"))
        .count();
    assert_eq!(rejected_lines, 2, "{printed}");
    assert!(
        printed
            .lines()
            .any(|l| l.contains(": w-1 InProgress forced by alice (disk controller wedged)")),
        "{printed}"
    );

    let out = cli(&kubeconfig, &["status", "--json"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let document: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(document["leader"], "controller-0");
    assert_eq!(document["remediations"][0]["id"], "remediation/w-1/1");
    assert_eq!(
        document["fence_request_objects"].as_array().unwrap().len(),
        3
    );
    assert!(document.get("plan").is_none());
    let observed = &document["observed"]["hosts"];
    let w3 = observed
        .as_array()
        .unwrap()
        .iter()
        .find(|h| h["name"] == "w-3")
        .unwrap();
    assert_eq!(w3["status"]["agent"]["version"], "kube-test", "{w3}");
    assert!(
        w3["agent_conditions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["type"] == "MetalguardAgentReady" && c["status"] == "True"),
        "{w3}"
    );
    lab.assert_nothing_forbidden();
}

#[test]
fn without_the_operator_role_fence_is_forbidden_by_the_api_server() {
    let lab = KubeLab::start(&LabOptions::default());
    let kubeconfig = lab.cluster.user_kubeconfig("mallory", &[]).unwrap();
    let out = cli(
        &kubeconfig,
        &[
            "fence", "w-2", "--reason", "because", "--force", "--wait", "2s",
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("forbidden") || stderr.contains("Forbidden"),
        "{stderr}"
    );
    assert!(
        lab.admin()
            .list(&format!("{MG}/fencerequests"))
            .unwrap()
            .is_empty()
    );
    let _ = NS;
}

fn offered_matching(lab: &KubeLab, prefix: &str) -> Vec<String> {
    lab.agents
        .offered()
        .keys()
        .filter(|id| id.starts_with(prefix))
        .cloned()
        .collect()
}

#[test]
fn retire_declares_on_the_resource_and_the_controller_acts_only_as_the_guard_allows() {
    let mut lab = KubeLab::start(&LabOptions {
        control_plane: vec!["cp-1", "cp-2"],
        ..LabOptions::default()
    });
    // One voter (cp-1's), one replica wanted: cp-2 is a spare without a member.
    lab.agents.report_etcd_voter("cp-1");
    lab.admin()
        .create(
            &format!("{MG}/guardedcontrolplanes"),
            &json!({"apiVersion": "metalguard.io/v1alpha1", "kind": "GuardedControlPlane",
                "metadata": {"name": "control-plane", "namespace": NS},
                "spec": {"replicas": 1,
                    "hostSelector": {"matchLabels": {"pool": "control-plane"}},
                    "etcd": {"endpoints": ["https://127.0.0.1:2379"]}}}),
        )
        .unwrap();
    let admin = lab.cluster.admin_kubeconfig().to_owned();
    lab.start_controller("controller-0");
    lab.wait_leading("cp-1", Duration::from_secs(60));

    // Workers and unknown hosts are refused by the command, as in standalone mode.
    let out = cli(&admin, &["retire", "w-1", "--reason", "old"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("w-1 is a worker"),
        "{out:?}"
    );
    assert!(lab.host("w-1")["spec"].get("retirement").is_none());
    let out = cli(&admin, &["retire", "cp-9", "--reason", "old"]);
    assert_eq!(out.status.code(), Some(1));

    // cp-2 has no etcd member: once declared, the leader powers it off and leaves it off.
    let out = cli(
        &admin,
        &[
            "retire",
            "cp-2",
            "--reason",
            "motherboard swap",
            "--requested-by",
            "ticket 4711",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let retirement = lab.host("cp-2")["spec"]["retirement"].clone();
    assert_eq!(retirement["reason"], "motherboard swap");
    let by = retirement["requestedBy"].as_str().unwrap();
    assert!(by.starts_with("ticket 4711 (cli, run by "), "{by}");
    // Declared once: a second retire keeps the first request.
    let out = cli(&admin, &["retire", "cp-2", "--reason", "again"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(text(&out).contains("already retired"), "{out:?}");
    assert_eq!(lab.host("cp-2")["spec"]["retirement"], retirement);

    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let off = loop {
        if let Some(id) = offered_matching(&lab, "retire/cp-2/").first() {
            break id.clone();
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no retirement power-off offered: {:?}",
            lab.agents.offered().keys().collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(off.ends_with("/power-off"), "{off}");
    assert_ne!(lab.agents.offered()[&off].agent, "cp-2");
    // One authority over power: the power-off is offered with cp-2's node lease taken, and
    // the lease is released once its result is in.
    let lease_path = "/apis/coordination.k8s.io/v1/namespaces/medik8s-leases/leases/node-cp-2";
    let lease = lab.admin().get(lease_path).unwrap();
    assert_eq!(lease["spec"]["holderIdentity"], "metalguard", "{lease}");
    lab.agents.set_live("cp-2", false);
    lab.agents.finish_until_recorded(
        &off,
        metalguard_api::protocol::Outcome::Succeeded,
        Duration::from_secs(20),
    );
    lab.wait(
        "cp-2's node lease released after its power-off",
        Duration::from_secs(20),
        |lab| lab.admin().get_opt(lease_path).unwrap().is_none(),
    );

    // cp-1 holds the only voter: declared, but the guard keeps it (no replacement exists).
    let out = cli(&admin, &["retire", "cp-1", "--reason", "old"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    lab.wait("cp-1's retirement waits", Duration::from_secs(20), |lab| {
        lab.events().iter().any(|(_, name, type_, reason, note)| {
            name == "cp-1"
                && type_ == "Warning"
                && reason == "Refused"
                && note.contains("still in the cluster")
        })
    });
    // Rounds go by: cp-2 stays off (nothing powers it on), nothing is done to cp-1. (Before
    // it was retired, cp-2, a control-plane host without a member, was offered a learner join:
    // seed 004 scales down only while machines and members are equal in number; this fake
    // agent never carried it out.)
    std::thread::sleep(Duration::from_secs(4));
    let offered: Vec<String> = lab
        .agents
        .offered()
        .into_keys()
        .filter(|id| id != "quorum/add-learner/cp-2")
        .collect();
    assert_eq!(offered, std::slice::from_ref(&off), "{offered:?}");
    let ops = lab.host("cp-2")["status"]["operations"].clone();
    let op = ops
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["id"] == off.as_str())
        .unwrap_or_else(|| panic!("{ops}"));
    assert_eq!(op["result"]["outcome"], "succeeded", "{op}");
    assert!(lab.host("cp-2")["status"].get("remediation").is_none());

    // Withdrawn with the standalone rules: cp-2's power-off was issued, too late; cp-1
    // keeps its voting member and no replacement votes, so its retirement goes.
    let out = cli(&admin, &["retire", "cp-2", "--cancel"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("cannot be withdrawn") && err.contains("power-off"),
        "{err}"
    );
    assert_eq!(lab.host("cp-2")["spec"]["retirement"], retirement);
    let member = lab.host("cp-1")["status"]["etcdMember"].clone();
    assert_eq!(member["learner"], false, "{member}");
    let out = cli(&admin, &["retire", "cp-1", "--cancel"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        text(&out).contains("retirement of cp-1 withdrawn"),
        "{out:?}"
    );
    assert!(lab.host("cp-1")["spec"].get("retirement").is_none());
    let out = cli(&admin, &["retire", "cp-1", "--cancel"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cp-1 is not retired"),
        "{out:?}"
    );
    lab.assert_nothing_forbidden();
}

#[test]
fn a_power_off_fence_leaves_the_host_off_across_rounds_and_says_why() {
    let mut lab = KubeLab::start(&LabOptions {
        check: check_spec(&json!("100%"), "OutOfServiceTaint"),
        ..LabOptions::default()
    });
    let admin = lab.cluster.admin_kubeconfig().to_owned();
    lab.start_controller("controller-0");
    lab.wait_leading("w-1", Duration::from_secs(60));
    let out = cli(
        &admin,
        &[
            "fence",
            "w-2",
            "--power-off",
            "--force",
            "--reason",
            "failing disks, keep it down",
            "--wait",
            "20s",
        ],
    );
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let printed = text(&out);
    assert!(printed.contains("power off and leave off"), "{printed}");
    assert!(printed.contains("verdict: accepted"), "{printed}");
    let request = requests_for(&lab, "w-2").remove(0);
    assert_eq!(request["spec"]["action"], "PowerOff");
    let name = request["metadata"]["name"].as_str().unwrap().to_owned();
    assert_eq!(lab.host("w-2")["status"]["remediation"]["stayOff"], true);

    let off = "remediation/w-2/1/power-off";
    lab.agents.wait_offered(off, Duration::from_secs(20));
    lab.kubelets["w-2"].stop();
    lab.agents.set_live("w-2", false);
    assert_eq!(
        lab.agents
            .finish(off, metalguard_api::protocol::Outcome::Succeeded),
        200
    );
    let fence = |lab: &KubeLab| {
        lab.admin()
            .get(&format!("{MG}/fencerequests/{name}"))
            .unwrap()
    };
    lab.wait("the request Succeeded", Duration::from_secs(30), |lab| {
        fence(lab)["status"]["phase"] == "Succeeded"
    });
    let remediation = lab.host("w-2")["status"]["remediation"].clone();
    assert_eq!(remediation["phase"], "NeedsPerson", "{remediation}");
    let message = remediation["message"].as_str().unwrap();
    assert!(
        message.contains("powered off on request") && message.contains("is left off"),
        "{message}"
    );
    assert!(
        lab.taints("w-2")
            .iter()
            .any(|t| t == "node.kubernetes.io/out-of-service")
    );
    let status = fence(&lab)["status"].clone();
    let timeline: Vec<&str> = status["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["remediationPhase"].as_str().unwrap_or(""))
        .collect();
    for phase in ["PoweringOff", "VerifiedOff", "NeedsPerson"] {
        assert!(timeline.contains(&phase), "{phase}: {timeline:?}");
    }
    assert!(!timeline.contains(&"PoweringOn"), "{timeline:?}");

    // Rounds go by: the host is never powered on, no new remediation starts.
    std::thread::sleep(Duration::from_secs(5));
    let offered: Vec<String> = lab.agents.offered().keys().cloned().collect();
    assert_eq!(offered, [off], "{offered:?}");
    assert_eq!(
        lab.host("w-2")["status"]["remediation"]["id"],
        "remediation/w-2/1"
    );
    assert_eq!(fence(&lab)["status"]["phase"], "Succeeded");
    let out = cli(&admin, &["status"]);
    assert!(
        text(&out).contains("remediation/w-2/1 target w-2 phase needs-a-person"),
        "{out:?}"
    );
    lab.assert_nothing_forbidden();
}

/// `host`'s agent posts `hold` until the controller answers something but 429/503.
fn post_hold(lab: &KubeLab, host: &str, hold: &metalguard_api::snapshot::Hold) -> (u16, String) {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (code, body) = lab.agents.post_hold(host, hold);
        if !matches!(code, 0 | 429 | 503) || std::time::Instant::now() > deadline {
            return (code, body);
        }
        std::thread::sleep(Duration::from_millis(300));
    }
}

/// `status.holds` entry `id` of GuardedHost `host`.
fn hold_entry(lab: &KubeLab, host: &str, id: &str) -> Option<Value> {
    lab.host(host)["status"]["holds"]
        .as_array()?
        .iter()
        .find(|h| h["id"] == id)
        .cloned()
}

#[test]
fn a_break_glass_hold_is_recorded_on_the_host_honoured_and_released_by_a_person() {
    use metalguard_api::duration::Timestamp;
    use metalguard_api::snapshot::Hold;

    let mut lab = KubeLab::start(&LabOptions::default());
    let admin = lab.cluster.admin_kubeconfig().to_owned();
    lab.start_controller("controller-0");
    lab.wait_leading("w-1", Duration::from_secs(60));
    let since = u64::try_from(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis(),
    )
    .unwrap();
    let hold = |id: String, target: &str, by: &str| Hold {
        id,
        target: target.to_owned(),
        since: Timestamp(since),
        by: by.to_owned(),
        reason: "smoke from the PSU".to_owned(),
        action: "off".to_owned(),
    };

    // Posted by the agent of the host the break-glass fence ran on: recorded in the held
    // host's status, once.
    let posted = hold(format!("w-1/{since}"), "w-2", "alice on w-1");
    let (code, body) = post_hold(&lab, "w-1", &posted);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"first\":true"), "{body}");
    let entry = hold_entry(&lab, "w-2", &posted.id).expect("the hold is in w-2's status");
    assert_eq!(entry["reportedBy"], "w-1", "{entry}");
    assert_eq!(entry["by"], "alice on w-1", "{entry}");
    assert_eq!(entry["action"], "off", "{entry}");
    assert!(entry.get("released").is_none(), "{entry}");
    let (code, body) = post_hold(&lab, "w-1", &posted);
    assert_eq!(code, 200, "{body}");
    assert!(body.contains("\"first\":false"), "{body}");
    // A hold only carried by an agent's reports is recorded too.
    let reported = hold(format!("w-3/{}", since + 1), "w-1", "bob on w-3");
    lab.agents.carry_holds("w-3", vec![reported.clone()]);
    lab.wait(
        "w-3's reported hold in w-1's status",
        Duration::from_secs(20),
        |lab| hold_entry(lab, "w-1", &reported.id).is_some_and(|h| h["reportedBy"] == "w-3"),
    );

    // Honoured: w-2 goes down (NotReady, its agent silent) and is left alone.
    lab.agents.set_live("w-2", false);
    lab.kubelets["w-2"].set_ready(false).unwrap();
    std::thread::sleep(Duration::from_secs(6));
    let offered: Vec<String> = lab.agents.offered().keys().cloned().collect();
    assert!(
        offered.iter().all(|id| !id.contains("/w-2/")),
        "the held host was acted on: {offered:?}"
    );
    let out = cli(&admin, &["status"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    let shown = text(&out);
    assert!(
        shown.contains("w-2: HELD") && shown.contains(&posted.id),
        "{shown}"
    );

    // A person releases it: named in the spec, recorded in status, and w-2 is remediated
    // like any other host.
    let out = cli(&admin, &["release", "w-2", "--reason", "PSU replaced"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    assert!(
        text(&out).contains(&format!("released hold {}", posted.id)),
        "{out:?}"
    );
    let request = lab.host("w-2")["spec"]["holdRelease"].clone();
    assert_eq!(request["holds"], json!([posted.id]), "{request}");
    assert_eq!(request["reason"], "PSU replaced", "{request}");
    let by = request["requestedBy"].as_str().unwrap().to_owned();
    assert!(by.ends_with(" (cli)"), "{by}");
    lab.wait(
        "the release in w-2's status",
        Duration::from_secs(20),
        |lab| {
            hold_entry(lab, "w-2", &posted.id).is_some_and(|h| h["released"]["by"] == by.as_str())
        },
    );
    let off = lab
        .agents
        .wait_offered("remediation/w-2/1/power-off", Duration::from_secs(30));
    assert_ne!(off.agent, "w-2");
    // A released id is never taken again; nothing is left to release.
    let (code, body) = post_hold(&lab, "w-1", &posted);
    assert_eq!(code, 409, "{body}");
    let out = cli(&admin, &["release", "w-2", "--reason", "again"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("w-2 has no hold"),
        "{out:?}"
    );

    // The agent that still carries a released hold is told to delete it.
    let out = cli(&admin, &["release", "w-1", "--reason", "false alarm"]);
    assert_eq!(out.status.code(), Some(0), "{out:?}");
    lab.wait(
        "w-3 told that its hold was released",
        Duration::from_secs(20),
        |lab| lab.agents.released_holds("w-3") == [reported.id.clone()],
    );
    lab.assert_nothing_forbidden();
}
