//! `retire`: an administrator's request to replace a control-plane host and power it off.
//!
//! The request is persisted in the store (like a fence request) and read by the leader's
//! snapshot, where it marks the host as retiring. Checks here are the CLI's: which hosts may be
//! retired, and when a retirement may still be withdrawn (only while the host's member is in
//! the cluster and no replacement votes yet; the store re-checks, in the cancelling
//! transaction, that the member's removal has not been persisted meanwhile).

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::OperationId;
use metalguard_api::snapshot::Role;

use crate::backend::State;
use crate::inventory::Inventory;

/// Why a host cannot be retired or un-retired.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RetireError {
    /// The host is not in the inventory.
    #[error("host {0} is not in the inventory")]
    UnknownHost(String),
    /// Only control-plane hosts are retired (their etcd member must be replaced first).
    #[error(
        "host {0} is a worker: only control-plane hosts are retired (fence a worker or remove it from the inventory)"
    )]
    Worker(String),
    /// Nothing to withdraw.
    #[error("host {0} is not retired")]
    NotRetired(String),
    /// The retirement went too far to be withdrawn.
    #[error("the retirement of {host} cannot be withdrawn: {why}")]
    TooLate {
        /// The host.
        host: String,
        /// Why.
        why: String,
    },
}

/// Checks that `host` may be retired.
pub fn check_retirable(inventory: &Inventory, host: &str) -> Result<(), RetireError> {
    match inventory.host(host) {
        None => Err(RetireError::UnknownHost(host.to_owned())),
        Some(h) if h.role == Role::Worker => Err(RetireError::Worker(host.to_owned())),
        Some(_) => Ok(()),
    }
}

/// Checks that the retirement of `host` may be withdrawn now; returns the operations whose
/// existence must still be ruled out in the withdrawing transaction (the removal of its
/// member).
pub fn check_cancellable(
    inventory: &Inventory,
    state: &State,
    host: &str,
    now: Timestamp,
) -> Result<Vec<OperationId>, RetireError> {
    let too_late = |why: String| RetireError::TooLate {
        host: host.to_owned(),
        why,
    };
    let Some(retirement) = state.retirements.get(host) else {
        return Err(RetireError::NotRetired(host.to_owned()));
    };
    let power_off = metalguard_core::retire::decommission_id(host, retirement.requested_at);
    if state.operations.contains_key(&power_off) {
        return Err(too_late(format!(
            "its power-off ({power_off}) was already issued"
        )));
    }
    let snapshot = crate::control::snapshot::build(inventory, state, now, now);
    let member = snapshot
        .hosts
        .iter()
        .find(|h| h.name == host)
        .and_then(|h| h.etcd.as_ref());
    let Some(member) = member else {
        return Err(too_late(
            "its etcd member was already removed (wipe its etcd data and add it back as a new host)"
                .to_owned(),
        ));
    };
    let voters = snapshot
        .hosts
        .iter()
        .filter_map(|h| h.etcd.as_ref())
        .filter(|m| m.is_voter())
        .count();
    let desired = snapshot.control_plane.desired_replicas as usize;
    if member.is_voter() && voters > desired {
        return Err(too_late(format!(
            "its replacement already votes ({voters} voters, desired {desired}); let the replacement finish"
        )));
    }
    Ok(vec![OperationId(format!(
        "quorum/remove-member/{:x}",
        member.id
    ))])
}

#[cfg(test)]
mod tests {
    use metalguard_api::protocol::{EtcdMemberView, EtcdView};
    use metalguard_api::snapshot::Retirement;

    use super::*;

    const INVENTORY: &str = r#"
[etcd]
endpoints = ["http://127.0.0.1:2379"]

[control_plane]
desired_replicas = 1

[[hosts]]
name = "cp-1"
role = "control-plane"

[[hosts]]
name = "cp-2"
role = "control-plane"

[[hosts]]
name = "w-1"
role = "worker"
"#;

    fn inventory() -> Inventory {
        Inventory::parse(std::path::Path::new("i.toml"), INVENTORY).unwrap()
    }

    fn member(id: u64, name: &str, learner: bool) -> EtcdMemberView {
        crate::testkit::member(id, name, learner, true)
    }

    fn with_members(members: Vec<EtcdMemberView>) -> State {
        let mut state = State::default();
        state.retirements.insert(
            "cp-1".into(),
            Retirement {
                requested_at: Timestamp(5),
                requested_by: None,
                reason: "disk".into(),
            },
        );
        let etcd = EtcdView {
            local_member_id: Some(1),
            leader_id: Some(1),
            members,
        };
        state.reports.insert(
            "cp-1".into(),
            crate::testkit::stored_report("cp-1", 9, Some(etcd)),
        );
        state
    }

    #[test]
    fn only_known_control_plane_hosts_are_retired() {
        let inv = inventory();
        assert_eq!(check_retirable(&inv, "cp-1"), Ok(()));
        let err = check_retirable(&inv, "w-1").unwrap_err().to_string();
        assert!(err.contains("w-1 is a worker"), "{err}");
        let err = check_retirable(&inv, "cp-9").unwrap_err().to_string();
        assert_eq!(err, "host cp-9 is not in the inventory");
    }

    #[test]
    fn a_retirement_is_withdrawn_only_before_its_replacement_votes_and_its_member_goes() {
        let inv = inventory();
        let now = Timestamp(10);
        // Member present, a learner joining: withdrawable, guarded by the removal's id.
        let state = with_members(vec![member(1, "cp-1", false), member(2, "cp-2", true)]);
        assert_eq!(
            check_cancellable(&inv, &state, "cp-1", now),
            Ok(vec![OperationId("quorum/remove-member/1".into())])
        );
        // The replacement votes: too late.
        let state = with_members(vec![member(1, "cp-1", false), member(2, "cp-2", false)]);
        let err = check_cancellable(&inv, &state, "cp-1", now).unwrap_err();
        assert!(err.to_string().contains("already votes"), "{err}");
        // The member is gone: too late, with the reason.
        let state = with_members(vec![member(2, "cp-2", false)]);
        let err = check_cancellable(&inv, &state, "cp-1", now)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cannot be withdrawn: its etcd member was already removed"),
            "{err}"
        );
        assert_eq!(
            check_cancellable(&inv, &State::default(), "cp-1", now),
            Err(RetireError::NotRetired("cp-1".into()))
        );
    }
}
