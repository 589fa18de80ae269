//! The daemon's executor running the etcd commands against real etcd from the harness: the
//! join go-ahead (at most once per operation id, in the background without duplicates) and
//! leadership moves.
//!
//! Plain HTTP on purpose (`EtcdCluster::start_plain_http`): the subject here is the membership
//! mechanics, not the transport. The same client over TLS with client certificates is tested
//! in `agent/etcd/tests/tls.rs`, and every membership step runs over TLS in the lab's
//! `replace` scenario (`tests/tests/lab_replace.rs`).

use std::path::Path;
use std::time::Duration;

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::OperationId;
use metalguard_api::protocol::{Command, CommandKind, CommandResult, Outcome, PromotedBy};
use metalguard_e2e::etcd::{EtcdCluster, HostSlot};
use metalguard_etcd::ClientSettings;
use metalguard_etcd::join::JoinConfig;
use metalguard_etcd::ops::DEFAULT_PROMOTE_RETRY;

use super::execute::Executor;
use super::join::Joiner;
use super::journal::Journal;
use crate::etcd_join::{JoinSetup, LauncherChoice, sibling};

fn settings(endpoints: Vec<String>) -> ClientSettings {
    let mut s = ClientSettings::new(endpoints);
    s.probe_timeout = Duration::from_secs(1);
    s.change_timeout = Duration::from_secs(15);
    s
}

fn command(op: &str, kind: CommandKind) -> Command {
    Command {
        operation_id: OperationId(op.into()),
        issued_at: Timestamp(0),
        kind,
        term: 0,
    }
}

fn timeline_text(result: &CommandResult) -> String {
    result
        .timeline
        .iter()
        .map(|e| format!("{:>6} ms {:?} {}", e.elapsed_ms, e.direction, e.what))
        .collect::<Vec<_>>()
        .join("\n")
}

fn join_setup(cluster: &EtcdCluster, slot: &HostSlot) -> JoinSetup {
    JoinSetup {
        config: JoinConfig {
            client: settings(cluster.endpoints()),
            name: slot.name.clone(),
            peer_url: slot.peer_url.clone(),
            client_url: slot.client_url.clone(),
            listen_peer_url: None,
            listen_client_url: None,
            data_dir: slot.data_dir.clone(),
            state_file: None,
            extra_env: Vec::new(),
            bootstrap_desired_voters: None,
            poll_interval: Duration::from_millis(100),
            stall_after: Duration::from_secs(30),
            promote_retry: DEFAULT_PROMOTE_RETRY,
        },
        launcher: LauncherChoice::Exec {
            binary: metalguard_e2e::tools::etcd_bin().unwrap(),
        },
    }
}

/// Kills the exec launcher's etcd (its PID file is next to the data dir) if a test fails
/// before stopping it.
struct PidGuard(std::path::PathBuf);

impl Drop for PidGuard {
    fn drop(&mut self) {
        if let Some(pid) = std::fs::read_to_string(&self.0)
            .ok()
            .and_then(|s| s.trim().parse::<i32>().ok())
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

fn executor(state: &Path, cluster: &EtcdCluster, joiner: Option<Joiner>) -> Executor {
    Executor::new(
        Journal::open(state).unwrap(),
        Some(settings(cluster.endpoints())),
        joiner,
        state,
    )
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_go_ahead_ends_with_a_caught_up_learner_and_runs_once_per_operation() {
    let mut cluster = EtcdCluster::start_plain_http(1).unwrap();
    let slot = cluster.reserve_host().unwrap();
    let _guard = PidGuard(sibling(&slot.data_dir, "etcd.pid"));
    let state = tempfile::tempdir().unwrap();
    let joiner = Joiner::new(join_setup(&cluster, &slot), Duration::from_secs(120));
    let executor = executor(state.path(), &cluster, Some(joiner));
    let go = command("join/m1/1", CommandKind::EtcdJoinGoAhead {});

    let first = Box::pin(executor.handle(go.clone())).await.unwrap();
    let text = timeline_text(&first);
    eprintln!("{text}");
    assert_eq!(
        first.outcome,
        Outcome::Succeeded,
        "{:?}\n{text}",
        first.error
    );
    let members = cluster.member_list().unwrap();
    assert_eq!(members.len(), 2, "{members:?}");
    let mine = members
        .iter()
        .find(|m| m.peer_urls.contains(&slot.peer_url))
        .unwrap();
    assert!(mine.is_learner, "the controller promotes, not the agent");
    assert_eq!(mine.name, slot.name, "the learner runs");
    for want in [
        format!("learner {:x} added for peer url {}", mine.id, slot.peer_url),
        "local etcd started (exec launcher)".to_owned(),
        format!("learner {:x} caught up (promotable)", mine.id),
    ] {
        assert!(text.contains(&want), "{want}\n{text}");
    }

    // The same operation id again: the journal's result, nothing executed.
    let again = Box::pin(executor.handle(go)).await.unwrap();
    assert_eq!(again, first);
    assert_eq!(cluster.member_list().unwrap().len(), 2);

    // A new go-ahead in the background: one task per operation id, and the join is already
    // promotable, so it succeeds at once.
    let next = command("join/m1/2", CommandKind::EtcdJoinGoAhead {});
    let task = executor.start_background(next.clone()).unwrap();
    assert!(executor.start_background(next.clone()).is_none());
    assert!(executor.is_running(&next.operation_id));
    let result = task.await.unwrap().unwrap();
    assert!(!executor.is_running(&next.operation_id));
    let text = timeline_text(&result);
    assert_eq!(result.outcome, Outcome::Succeeded, "{text}");
    assert!(
        text.contains(&format!("learner {:x} already caught up", mine.id)),
        "{text}"
    );
    assert_eq!(cluster.member_list().unwrap().len(), 2);

    // The controller's promotion: this command promoted it, and the result says so; a second
    // promotion (or one after kubeadm's own) finds a voter and says it was promoted outside.
    let promote = |op: &str| command(op, CommandKind::EtcdPromote { member_id: mine.id });
    let promoted = Box::pin(executor.handle(promote("promote/m1/1")))
        .await
        .unwrap();
    let text = timeline_text(&promoted);
    assert_eq!(promoted.outcome, Outcome::Succeeded, "{text}");
    assert_eq!(promoted.promoted_by, Some(PromotedBy::Metalguard), "{text}");
    assert!(text.contains("promoted by this command"), "{text}");
    let again = Box::pin(executor.handle(promote("promote/m1/2")))
        .await
        .unwrap();
    let text = timeline_text(&again);
    assert_eq!(again.outcome, Outcome::Succeeded, "{text}");
    assert_eq!(again.promoted_by, Some(PromotedBy::Outside), "{text}");
    assert!(text.contains("promoted outside metalguard"), "{text}");
    let json = serde_json::to_value(&again).unwrap();
    assert_eq!(json["promoted_by"], "outside", "{json}");
    let members = cluster.member_list().unwrap();
    assert!(members.iter().all(|m| !m.is_learner), "{members:?}");
    // Any other command's result carries no promoted_by (and the field is left out).
    let json = serde_json::to_value(&first).unwrap();
    assert!(json.get("promoted_by").is_none(), "{json}");

    executor.joiner().unwrap().stop_etcd().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn join_go_ahead_without_join_configuration_is_rejected() {
    let cluster = EtcdCluster::start_plain_http(1).unwrap();
    let state = tempfile::tempdir().unwrap();
    let executor = executor(state.path(), &cluster, None);
    let result = Box::pin(executor.handle(command("join/x", CommandKind::EtcdJoinGoAhead {})))
        .await
        .unwrap();
    assert_eq!(result.outcome, Outcome::Rejected);
    assert!(
        result.error.as_deref().unwrap().contains("no [etcd.join]"),
        "{result:?}"
    );
}

/// The leader as every member's own status says (etcdctl, not our observation code).
fn leader_by_etcdctl(cluster: &EtcdCluster) -> Option<u64> {
    let out = cluster
        .etcdctl(&["endpoint", "status", "-w", "json"])
        .unwrap();
    let statuses: Vec<serde_json::Value> = serde_json::from_str(&out).unwrap();
    let leaders: Vec<u64> = statuses
        .iter()
        .filter_map(|s| s["Status"]["leader"].as_u64())
        .collect();
    (leaders.len() == cluster.len() && leaders.iter().all(|l| *l == leaders[0])).then(|| leaders[0])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn move_leader_moves_leadership_and_refuses_an_unknown_member() {
    let cluster = EtcdCluster::start_plain_http(3).unwrap();
    let state = tempfile::tempdir().unwrap();
    let executor = executor(state.path(), &cluster, None);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    let leader = loop {
        if let Some(leader) = leader_by_etcdctl(&cluster) {
            break leader;
        }
        assert!(std::time::Instant::now() < deadline, "no agreed leader");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let target = cluster
        .member_list()
        .unwrap()
        .into_iter()
        .map(|m| m.id)
        .find(|id| *id != leader)
        .unwrap();

    let moved = Box::pin(executor.handle(command(
        "move/1",
        CommandKind::EtcdMoveLeader { to_member: target },
    )))
    .await
    .unwrap();
    let text = timeline_text(&moved);
    eprintln!("{text}");
    assert_eq!(
        moved.outcome,
        Outcome::Succeeded,
        "{:?}\n{text}",
        moved.error
    );
    assert!(
        text.contains(&format!(
            "leadership moved from member {leader:x} to member {target:x}"
        )),
        "{text}"
    );
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while leader_by_etcdctl(&cluster) != Some(target) {
        assert!(
            std::time::Instant::now() < deadline,
            "etcdctl never showed {target:x} leading"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Moving to the leader again is done at once.
    let again = Box::pin(executor.handle(command(
        "move/2",
        CommandKind::EtcdMoveLeader { to_member: target },
    )))
    .await
    .unwrap();
    assert_eq!(again.outcome, Outcome::Succeeded, "{again:?}");
    assert!(timeline_text(&again).contains("already leads"), "{again:?}");

    let unknown = Box::pin(executor.handle(command(
        "move/3",
        CommandKind::EtcdMoveLeader {
            to_member: 0xdead_beef,
        },
    )))
    .await
    .unwrap();
    assert_eq!(unknown.outcome, Outcome::Failed);
    let error = unknown.error.unwrap();
    assert!(
        error.starts_with("move etcd leadership to member deadbeef:")
            && error.contains("member deadbeef is not in the cluster"),
        "{error}"
    );
    assert_eq!(leader_by_etcdctl(&cluster), Some(target));
}

/// A fence command for `target`'s BMC (one Redfish system per host in this test).
fn power_off(
    op: &str,
    target: &str,
    bmc: &metalguard_e2e::redfish::RedfishBmc,
    term: u64,
) -> Command {
    use metalguard_api::protocol::{BmcCredentials, BmcTrust, FenceCommand, PowerAction, Secret};
    Command {
        term,
        ..command(
            op,
            CommandKind::Fence(FenceCommand {
                target: target.into(),
                action: PowerAction::Off,
                bmc_address: format!(
                    "redfish+http://127.0.0.1:{}{}",
                    bmc.port(),
                    bmc.system_path(0)
                ),
                tls: BmcTrust::SystemRoots,
                credentials: BmcCredentials {
                    username: bmc.username().into(),
                    password: Secret::new(bmc.password()),
                },
                etcd_member: None,
                forced: None,
                expected_identity: None,
            }),
        )
    }
}

/// The executor checks quorum itself on real etcd, whatever the controller asks: with one of
/// three voters hung, cutting a healthy member's host is refused with the counts and the BMC
/// never touched; the hung member's host may be cut (two healthy voters remain); a person's
/// forced fence is the only override.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_executing_agent_refuses_a_power_off_that_would_leave_fewer_healthy_voters_than_quorum()
{
    use metalguard_e2e::redfish::{RedfishBmc, RedfishOptions};
    let mut cluster = EtcdCluster::start_plain_http(3).unwrap();
    let state = tempfile::tempdir().unwrap();
    let executor = executor(state.path(), &cluster, None);
    let names: Vec<String> = (0..3)
        .map(|i| cluster.member(i).name().to_owned())
        .collect();
    let bmcs: Vec<RedfishBmc> = (0..3)
        .map(|_| RedfishBmc::start(RedfishOptions::default()).unwrap())
        .collect();
    cluster.hang(0).unwrap();

    // The controller (buggy, stale, lied to) asks to cut a healthy voter's host: refused.
    let refused = executor
        .handle(power_off("op-1", &names[1], &bmcs[1], 3))
        .await
        .unwrap();
    let timeline = timeline_text(&refused);
    assert_eq!(refused.outcome, Outcome::Rejected, "{timeline}");
    let error = refused.error.clone().unwrap();
    assert!(
        error.contains(&format!(
            "powering off {} would leave fewer healthy voters than quorum",
            names[1]
        )) && error.contains("1 healthy voters besides the target's member")
            && error.contains("of 3 voters; quorum 2"),
        "{error}"
    );
    assert_eq!(bmcs[1].power_state(0).unwrap(), "On", "the BMC was touched");

    // The hung member's host: two healthy voters remain, so the power goes off.
    let cut = executor
        .handle(power_off("op-2", &names[0], &bmcs[0], 3))
        .await
        .unwrap();
    let timeline = timeline_text(&cut);
    assert_eq!(cut.outcome, Outcome::Succeeded, "{timeline}");
    assert!(
        timeline
            .contains("quorum checked by this agent: 2 healthy voters besides the target's member"),
        "{timeline}"
    );
    assert_eq!(bmcs[0].power_state(0).unwrap(), "Off");

    // A person forced it: the check is skipped, and the result says so.
    let mut forced = power_off("op-3", &names[1], &bmcs[1], 3);
    if let CommandKind::Fence(fence) = &mut forced.kind {
        fence.forced = Some(metalguard_api::protocol::ForcedBy {
            by: "alice".into(),
            reason: "replacing the board".into(),
        });
    }
    let forced = executor.handle(forced).await.unwrap();
    let timeline = timeline_text(&forced);
    assert_eq!(forced.outcome, Outcome::Succeeded, "{timeline}");
    assert!(timeline.contains("quorum check skipped"), "{timeline}");
    cluster.resume(0).unwrap();
}
