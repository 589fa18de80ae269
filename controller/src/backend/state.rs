//! The persisted records: reports, operations (intent + result), remediations, fence requests,
//! retirement requests, break-glass holds, hooks and the leader's notes for people. Credentials are never part of a record; they are read from the inventory's
//! files when a command is handed to an agent.

use std::collections::{BTreeMap, BTreeSet};

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::OperationId;
use metalguard_api::protocol::{AgentReport, CommandResult, PowerAction};
use metalguard_api::remediation::Remediation;
use metalguard_api::snapshot::{FenceRequest, Hold, Retirement};
use serde::{Deserialize, Serialize};

/// An agent's latest report and when the controller received it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredReport {
    /// The report.
    pub report: AgentReport,
    /// The controller's receive time (heartbeats use this, not the agent's clock).
    pub received_at: Timestamp,
}

/// What an operation does (the command minus credentials).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "type")]
pub enum OperationKind {
    /// Drive `target`'s BMC.
    Fence {
        /// The host fenced.
        target: String,
        /// The power action.
        action: PowerAction,
    },
    /// Promote a learner.
    EtcdPromote {
        /// Member id.
        member_id: u64,
    },
    /// Remove a member.
    EtcdRemove {
        /// Member id.
        member_id: u64,
    },
    /// Join the agent's own host as a learner and wait until it has caught up.
    EtcdJoin {},
    /// Move raft leadership to `to_member`.
    EtcdMoveLeader {
        /// The voter that should lead.
        to_member: u64,
    },
}

/// A destructive operation: written before its command is sent, completed by its result.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredOperation {
    /// The plan's stable operation id.
    pub id: OperationId,
    /// The agent host that executes it.
    pub agent: String,
    /// What it does.
    pub kind: OperationKind,
    /// The remediation it belongs to, if any.
    #[serde(default)]
    pub remediation_id: Option<String>,
    /// The remediation step name (`power-off`, `power-on`), if any.
    #[serde(default)]
    pub step: Option<String>,
    /// When the intent was persisted.
    pub created_at: Timestamp,
    /// Who asked for it: the remediation's cause (an administrator's identity for a fence
    /// request, the failing health check otherwise) or the retirement's requester; `None`
    /// for the controller's own membership steps.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requested_by: Option<String>,
    /// Who posted the result: the host and serial of the executing agent's client
    /// certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub executed_by: Option<String>,
    /// The agent's result, once received.
    #[serde(default)]
    pub result: Option<CommandResult>,
    /// The term of the leadership that persisted this intent (0: before terms).
    #[serde(default, skip_serializing_if = "metalguard_api::protocol::no_term")]
    pub term: u64,
}

impl StoredOperation {
    /// True while the result is outstanding (the command is offered to the agent).
    pub fn in_flight(&self) -> bool {
        self.result.is_none()
    }
}

/// A break-glass hold as the controller keeps it: the hold an agent reported (or posted),
/// which agent that was, and, once a person released it, who did and when. A released record
/// is kept so that the id is never honoured again, however long an agent still reports it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StoredHold {
    /// The hold.
    pub hold: Hold,
    /// The agent host whose report or post brought it (the host the fence ran on).
    pub reported_by: String,
    /// When the controller first received it (its clock).
    pub recorded_at: Timestamp,
    /// The release, once a person gave it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub released: Option<HoldRelease>,
}

impl StoredHold {
    /// True until a person releases it.
    pub fn is_active(&self) -> bool {
        self.released.is_none()
    }
}

/// A fence request the leader turned into a remediation: its nonce, its host, when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsumedFenceRequest {
    /// The request's nonce.
    pub nonce: String,
    /// The host it asked to fence.
    pub host: String,
    /// When the leader consumed it.
    pub at: Timestamp,
}

/// A person's release of a hold (`metalguard-controller release`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HoldRelease {
    /// When.
    pub at: Timestamp,
    /// Who (the invoking user, `SUDO_USER` first).
    pub by: String,
    /// Why.
    pub reason: String,
}

/// A person's on-demand check of a host's BMC (`metalguard-controller check-bmc`): the
/// agent that would execute the host's fence checks it at once and echoes `id`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BmcCheckRequest {
    /// New per request (random).
    pub id: String,
    /// When.
    pub at: Timestamp,
    /// Who.
    pub by: String,
}

/// Everything a backend persists.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct State {
    /// Latest report per host.
    pub reports: BTreeMap<String, StoredReport>,
    /// Every operation, by id.
    pub operations: BTreeMap<OperationId, StoredOperation>,
    /// Remediations by id.
    pub remediations: BTreeMap<String, Remediation>,
    /// Pending administrator fence requests by host.
    pub fence_requests: BTreeMap<String, FenceRequest>,
    /// Fence requests that became remediations, by nonce (standalone: kept apart from the
    /// remediations, so deleting one does not make its request servable again).
    pub consumed_fence_requests: BTreeMap<String, ConsumedFenceRequest>,
    /// Pending administrator retirement requests by host.
    pub retirements: BTreeMap<String, Retirement>,
    /// The latest on-demand BMC check request by host.
    pub bmc_check_requests: BTreeMap<String, BmcCheckRequest>,
    /// preDrain hooks per host.
    pub hooks: BTreeMap<String, BTreeSet<String>>,
    /// Node leases another actor holds, by host: the holder (Kubernetes backend,
    /// `medik8s-leases/node-<name>`; always empty standalone).
    pub node_leases: BTreeMap<String, String>,
    /// Break-glass holds by held host: a person fenced it directly, and metalguard leaves it
    /// alone until a person releases it. Derived from [`State::hold_records`] and the stored
    /// reports by [`State::refresh_holds`] (the newest active hold per host).
    pub holds: BTreeMap<String, Hold>,
    /// Every hold record, active and released, by hold id.
    pub hold_records: BTreeMap<String, StoredHold>,
    /// What the leader last told people (inventory generation, what it needs, what waits).
    pub notes: Option<ControllerNotes>,
    /// The current leader's identity, if any.
    pub leader: Option<String>,
    /// The Kubernetes backend's Node of each host (by host name); `None` for the standalone
    /// backend, which has no Node objects (an agent's report stands in for its Node).
    /// A persistent map: the Kubernetes backend keeps it across rounds, and each round's
    /// copy shares it (issue 27).
    pub nodes: Option<imbl::OrdMap<String, metalguard_api::snapshot::NodeStatus>>,
    /// Which hosts' entries changed, by revision, when the backend keeps its state across
    /// rounds (Kubernetes); `None` when every round reads everything (standalone).
    pub changes: Option<super::revisions::HostRevisions>,
    /// Stored records that were not believed (their seal does not hold): left out of
    /// everything above, so never acted on; shown by `status` and counted in metrics.
    pub rejected: Vec<RejectedRecord>,
    /// Records whose seal holds but was made with a key that no longer signs (a rotation is
    /// under way): the leader seals them again with the signing key.
    pub stale_seals: Vec<StaleSeal>,
}

/// A stored record that is not believed, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct RejectedRecord {
    /// Its key under the prefix, e.g. `operations/remediation/cp-1/1/power-off`.
    pub key: String,
    /// `operation`, `remediation`, `report`, `fence-request`, `retirement`, `hooks`, `notes`.
    pub kind: String,
    /// Why its seal does not hold (never the record or a key).
    pub reason: String,
}

/// A record sealed with a key that verifies but no longer signs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleSeal {
    /// Its key under the prefix.
    pub key: String,
    /// The record as stored.
    pub record: serde_json::Value,
    /// The revision it was read at (it is sealed again only if still unchanged).
    pub revision: i64,
}

/// What the leading controller wants people to know, written when it changes and shown by
/// `status`: things it cannot do itself.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerNotes {
    /// The identity of the controller that wrote these notes.
    pub identity: String,
    /// Increases with every inventory (re)load that was accepted.
    pub inventory_generation: u64,
    /// Why the latest change of the inventory file was not accepted (the previous one is
    /// still in use), if it was not.
    #[serde(default)]
    pub inventory_error: Option<String>,
    /// Work for a person, e.g. `add a control-plane host to the inventory (failure domain a)`.
    #[serde(default)]
    pub needs: Vec<String>,
    /// Planned actions that wait, with the reason (e.g. an agent that has not reported).
    #[serde(default)]
    pub waiting: Vec<String>,
}

impl State {
    /// Recomputes [`State::holds`]: every recorded hold that is not released, and every hold
    /// an agent's stored report carries that has no record yet (a hold is honoured from the
    /// first report that carries it, before the leader has stored it). A released id is never
    /// honoured again. Per host the newest hold stands for all (releasing a host releases
    /// them all).
    pub fn refresh_holds(&mut self) {
        let mut holds: BTreeMap<String, Hold> = BTreeMap::new();
        let mut keep = |hold: &Hold| {
            let newer = holds
                .get(&hold.target)
                .is_none_or(|h| (h.since, &h.id) < (hold.since, &hold.id));
            if newer {
                holds.insert(hold.target.clone(), hold.clone());
            }
        };
        for record in self.hold_records.values().filter(|r| r.is_active()) {
            keep(&record.hold);
        }
        for hold in self.unrecorded_holds().into_iter().map(|r| r.hold) {
            keep(&hold);
        }
        self.holds = holds;
    }

    /// Holds the stored reports carry that have no record (active or released) yet, as
    /// records to create: reported by the reporting host, recorded at the report's receipt.
    /// A hold whose id does not start with `<reporting host>/` is not one this agent made:
    /// it is left out (the controller logs it).
    pub fn unrecorded_holds(&self) -> Vec<StoredHold> {
        let mut found: BTreeMap<&str, StoredHold> = BTreeMap::new();
        for (host, stored) in &self.reports {
            for hold in &stored.report.holds {
                if self.hold_records.contains_key(&hold.id) || !hold_made_by(hold, host) {
                    continue;
                }
                found.entry(&hold.id).or_insert_with(|| StoredHold {
                    hold: hold.clone(),
                    reported_by: host.clone(),
                    recorded_at: stored.received_at,
                    released: None,
                });
            }
        }
        found.into_values().collect()
    }

    /// Every hold of `target` in force: recorded and not released, or only reported so far.
    pub fn active_holds_of(&self, target: &str) -> Vec<StoredHold> {
        let mut active: Vec<StoredHold> = self
            .hold_records
            .values()
            .filter(|r| r.is_active() && r.hold.target == target)
            .cloned()
            .collect();
        active.extend(
            self.unrecorded_holds()
                .into_iter()
                .filter(|r| r.hold.target == target),
        );
        active
    }

    /// Ids of every released hold.
    pub fn released_hold_ids(&self) -> std::collections::BTreeSet<String> {
        self.hold_records
            .values()
            .filter(|r| !r.is_active())
            .map(|r| r.hold.id.clone())
            .collect()
    }

    /// The operation of `remediation_id` for `step`, if one was created.
    pub fn operation_of(&self, remediation_id: &str, step: &str) -> Option<&StoredOperation> {
        self.operations.values().find(|op| {
            op.remediation_id.as_deref() == Some(remediation_id) && op.step.as_deref() == Some(step)
        })
    }
}

/// Whether `hold` was made on `host`: its id is `<host>/<milliseconds>`.
pub fn hold_made_by(hold: &Hold, host: &str) -> bool {
    hold.id
        .strip_prefix(host)
        .and_then(|rest| rest.strip_prefix('/'))
        .is_some_and(|ms| !ms.is_empty() && ms.bytes().all(|b| b.is_ascii_digit()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hold(id: &str, target: &str, since: u64) -> Hold {
        Hold {
            id: id.into(),
            target: target.into(),
            since: Timestamp(since),
            by: "alice on cp-2".into(),
            reason: "r".into(),
            action: "off".into(),
        }
    }

    fn reporting(state: &mut State, host: &str, holds: Vec<Hold>) {
        let mut stored = crate::testkit::stored_report(host, 50, None);
        stored.report.holds = holds;
        state.reports.insert(host.to_owned(), stored);
    }

    #[test]
    fn a_hold_is_honoured_from_its_first_report_and_never_after_its_release() {
        let mut state = State::default();
        reporting(&mut state, "cp-2", vec![hold("cp-2/10", "cp-1", 10)]);
        state.refresh_holds();
        assert_eq!(
            state.holds["cp-1"].id, "cp-2/10",
            "reported, not stored yet"
        );
        let [record] = &state.unrecorded_holds()[..] else {
            panic!("{:?}", state.unrecorded_holds())
        };
        assert_eq!(
            (record.reported_by.as_str(), record.recorded_at),
            ("cp-2", Timestamp(50))
        );
        let mut record = record.clone();
        state
            .hold_records
            .insert(record.hold.id.clone(), record.clone());
        state.refresh_holds();
        assert!(state.unrecorded_holds().is_empty());
        assert!(state.holds.contains_key("cp-1"));
        // Released: the agent still reports it until it hears so; it is not honoured.
        record.released = Some(HoldRelease {
            at: Timestamp(60),
            by: "bob (cli)".into(),
            reason: "fixed".into(),
        });
        state.hold_records.insert(record.hold.id.clone(), record);
        state.refresh_holds();
        assert!(state.holds.is_empty(), "{:?}", state.holds);
        assert!(state.unrecorded_holds().is_empty(), "never recorded again");
        assert_eq!(
            state.released_hold_ids().into_iter().collect::<Vec<_>>(),
            ["cp-2/10"]
        );
        // A new break-glass fence of the same host is a new id: held again.
        reporting(
            &mut state,
            "cp-2",
            vec![hold("cp-2/10", "cp-1", 10), hold("cp-2/70", "cp-1", 70)],
        );
        state.refresh_holds();
        assert_eq!(state.holds["cp-1"].id, "cp-2/70");
    }

    #[test]
    fn a_hold_counts_only_when_the_reporting_host_made_it() {
        let mut state = State::default();
        reporting(&mut state, "cp-3", vec![hold("cp-2/10", "cp-1", 10)]);
        state.refresh_holds();
        assert!(state.holds.is_empty() && state.unrecorded_holds().is_empty());
        assert!(hold_made_by(&hold("cp-2/10", "x", 1), "cp-2"));
        for id in ["cp-2", "cp-2/", "cp-2/x1", "cp-20/1", "cp-2/1/2"] {
            assert!(!hold_made_by(&hold(id, "x", 1), "cp-2"), "{id}");
        }
    }

    #[test]
    fn the_newest_hold_of_a_host_stands_for_it() {
        let mut state = State::default();
        reporting(&mut state, "cp-2", vec![hold("cp-2/30", "cp-1", 30)]);
        reporting(&mut state, "cp-3", vec![hold("cp-3/20", "cp-1", 20)]);
        state.refresh_holds();
        assert_eq!(state.holds["cp-1"].id, "cp-2/30");
        assert_eq!(state.active_holds_of("cp-1").len(), 2);
        assert!(state.active_holds_of("cp-2").is_empty());
    }
}
