//! Builders the unit tests share: stored agent reports and etcd member views with every field
//! a test does not care about filled in one way.

use metalguard_api::duration::Timestamp;
use metalguard_api::protocol::{AgentReport, EtcdMemberView, EtcdView};

use crate::backend::StoredReport;

/// A report of `host`, received (and sent) at `at` ms, with `etcd` as its etcd view.
pub fn stored_report(host: &str, at: u64, etcd: Option<EtcdView>) -> StoredReport {
    StoredReport {
        report: AgentReport {
            host: host.into(),
            agent_version: "t".into(),
            sequence: 1,
            boot_id: String::new(),
            sent_at: Timestamp(at),
            conditions: vec![],
            etcd,
            bmc_reachability: vec![],
            unacknowledged_results: vec![],
            holds: vec![],
            seen_term: 0,
            host_identity: None,
        },
        received_at: Timestamp(at),
    }
}

/// An etcd member as an agent sees it, applied index 10.
pub fn member(id: u64, name: &str, learner: bool, healthy: bool) -> EtcdMemberView {
    EtcdMemberView {
        id,
        name: name.into(),
        peer_urls: vec![],
        client_urls: vec![],
        learner,
        healthy,
        alarms: vec![],
        raft_applied_index: Some(10),
        error: None,
    }
}

/// The decommission power-off of `target` (retired at `retired_at`), written at `created_at`
/// for `agent`, not carried out yet.
pub fn decommission_op(
    target: &str,
    agent: &str,
    retired_at: Timestamp,
    created_at: Timestamp,
) -> crate::backend::StoredOperation {
    crate::backend::StoredOperation {
        id: metalguard_core::retire::decommission_id(target, retired_at),
        agent: agent.into(),
        kind: crate::backend::OperationKind::Fence {
            target: target.into(),
            action: metalguard_api::protocol::PowerAction::Off,
        },
        remediation_id: None,
        step: Some("decommission".into()),
        created_at,
        requested_by: None,
        executed_by: None,
        result: None,
        term: 0,
    }
}

/// An inventory of `hosts` (name, role as in the inventory file, whether it has a BMC),
/// etcd at a placeholder endpoint, then `extra` TOML (a policy, say).
pub fn inventory(hosts: &[(&str, &str, bool)], extra: &str) -> crate::inventory::Inventory {
    use std::fmt::Write as _;
    let mut text = format!(
        "[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n\n[control_plane]\ndesired_replicas = {}\n",
        hosts
            .iter()
            .filter(|h| h.1 == "control-plane")
            .count()
            .max(1)
    );
    for (i, (name, role, bmc)) in hosts.iter().enumerate() {
        let _ = write!(text, "\n[[hosts]]\nname = \"{name}\"\nrole = \"{role}\"\n");
        if *bmc {
            let _ = writeln!(
                text,
                "bmc = {{ address = \"ipmi://10.0.0.{}\", credentials_dir = \"/nonexistent\" }}",
                i + 1
            );
        }
    }
    text.push_str(extra);
    crate::inventory::Inventory::parse(std::path::Path::new("i.toml"), &text)
        .unwrap_or_else(|e| panic!("{}\n{text}", crate::error::chain(&e)))
}

/// Remediation 1 of `target`, executed by `executor`'s agent, in `phase`, started at 1 ms.
pub fn remediation(
    target: &str,
    executor: &str,
    phase: metalguard_api::remediation::RemediationPhase,
) -> metalguard_api::remediation::Remediation {
    metalguard_api::remediation::Remediation {
        id: format!("remediation/{target}/1"),
        target: target.into(),
        seq: 1,
        attempt: 1,
        executor: executor.into(),
        strategy: metalguard_api::policy::Strategy::default(),
        node_handling: metalguard_api::policy::NodeHandling::default(),
        phase,
        started_at: Timestamp(1),
        phase_since: Timestamp(1),
        control_plane: false,
        cause: "test".into(),
        forced: None,
        cancel_requested: None,
        backup: None,
        powered_on_at: None,
        stay_off: false,
        boot_before: None,
    }
}
