//! Powers off retired control-plane hosts once nothing of etcd is left on them.
//!
//! Without a Machine API (the standalone backend) nobody deprovisions a host whose deletion
//! the quorum guard let through, so metalguard does the last step itself: a retiring host
//! whose etcd member is gone and whose preDrain hooks are all released is powered off through
//! another host's agent. The operation id is derived from the host and its retirement request
//! only, so the power-off is created once per request whatever the executor or the plan round.
//!
//! Never planned while the host still has a member (or the etcd view cannot say, because
//! quorum is lost), while any preDrain hook is left, for a host that is not retiring, or by
//! the host's own agent.

use std::collections::BTreeSet;
use std::time::Duration;

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::{Action, ActionKind, OperationId, ReasonKind, Refusal};
use metalguard_api::snapshot::{Host, Snapshot};

use crate::health::CheckVerdict;
use crate::quorum::EtcdView;

/// What is refused, in the plan's refusals.
const REFUSED: &str = "powering off";

/// The stable operation id of the power-off that ends the retirement of `host` requested at
/// `requested_at`.
pub fn decommission_id(host: &str, requested_at: Timestamp) -> OperationId {
    OperationId(format!("retire/{host}/{}/power-off", requested_at.0))
}

/// True for the id of a retirement's power-off ([`decommission_id`]).
pub fn is_decommission(id: &OperationId) -> bool {
    // Four parts: a remediation's step of a host named `retire` has three.
    let parts: Vec<&str> = id.0.split('/').collect();
    matches!(parts.as_slice(), ["retire", host, at, "power-off"]
        if !host.is_empty() && !at.is_empty() && at.bytes().all(|b| b.is_ascii_digit()))
}

/// Power-offs of retired hosts, and why others wait.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetireOutput {
    /// `DecommissionHost` actions.
    pub actions: Vec<Action>,
    /// Why a retiring host is not powered off yet.
    pub refusals: Vec<Refusal>,
}

impl RetireOutput {
    fn refuse(&mut self, host: &str, kind: ReasonKind, reason: String) {
        self.refusals.push(Refusal {
            refused: REFUSED.to_owned(),
            subject: host.to_owned(),
            reason,
            kind,
        });
    }
}

/// The inputs of [`plan_decommissions`].
#[derive(Debug, Clone, Copy)]
pub struct RetireInputs<'a> {
    /// The snapshot.
    pub snapshot: &'a Snapshot,
    /// Its etcd view.
    pub view: &'a EtcdView<'a>,
    /// The health verdicts (an unhealthy host drives no BMC).
    pub verdicts: &'a [CheckVerdict<'a>],
    /// How recent an executor's heartbeat must be.
    pub executor_heartbeat: Duration,
    /// Now.
    pub now: Timestamp,
}

/// Plans the power-off of every retired control-plane host that has nothing of etcd left.
pub fn plan_decommissions(inp: RetireInputs<'_>) -> RetireOutput {
    let mut out = RetireOutput::default();
    for host in inp.view.control_plane.iter().copied() {
        let Some(retirement) = &host.retirement else {
            continue;
        };
        let name = host.name.as_str();
        if let Some(reason) = inp.view.quorum_lost() {
            out.refuse(
                name,
                ReasonKind::Degraded,
                format!("the etcd view cannot be trusted ({reason}) to show its member is gone"),
            );
            continue;
        }
        if let Some(m) = inp.view.member_of(name) {
            let what = if m.member.learner { "learner" } else { "voter" };
            out.refuse(
                name,
                ReasonKind::Waiting,
                format!(
                    "its etcd {what} {:x} is still in the cluster (waiting for its replacement and removal)",
                    m.member.id
                ),
            );
            continue;
        }
        if !host.pre_drain_hooks.is_empty() {
            let hooks: Vec<&str> = host.pre_drain_hooks.iter().map(String::as_str).collect();
            out.refuse(
                name,
                ReasonKind::Waiting,
                format!("preDrain hooks are left: {}", hooks.join(", ")),
            );
            continue;
        }
        if !host.bmc_configured {
            out.refuse(
                name,
                ReasonKind::Policy,
                "it has no BMC: power it off by hand".to_owned(),
            );
            continue;
        }
        if let Some(r) = inp
            .snapshot
            .remediations
            .iter()
            .find(|r| r.target == name && r.phase.is_active())
        {
            out.refuse(
                name,
                ReasonKind::Waiting,
                format!("remediation {} is still active", r.id),
            );
            continue;
        }
        if let Some(hold) = &host.hold {
            out.refuse(
                name,
                ReasonKind::Hold,
                format!(
                    "held since {} by {} after a break-glass fence ({})",
                    hold.since, hold.by, hold.reason
                ),
            );
            continue;
        }
        if let Some(holder) = &host.lease_held_by {
            // Another actor (Node Maintenance, Node Health Check) is disrupting the host: the
            // retirement's power-off waits for its node lease, as a remediation does.
            out.refuse(
                name,
                ReasonKind::Hold,
                format!(
                    "its node lease medik8s-leases/node-{name} is held by {}: another actor is disrupting it; the power-off waits until the lease is free",
                    metalguard_api::text::escaped(holder)
                ),
            );
            continue;
        }
        let executor = match choose_executor(&inp, host) {
            Ok(e) => e,
            Err(why) => {
                out.refuse(name, ReasonKind::Executor, why);
                continue;
            }
        };
        let why = if retirement.reason.is_empty() {
            String::new()
        } else {
            format!(" ({})", retirement.reason)
        };
        out.actions.push(Action {
            id: decommission_id(name, retirement.requested_at),
            kind: ActionKind::DecommissionHost {
                host: name.to_owned(),
                executor: executor.name.clone(),
            },
            reason: format!(
                "{name} is retired{why}, its etcd member is gone and no preDrain hook is left: power it off through {}'s agent",
                executor.name
            ),
        });
    }
    out
}

/// The first host by name whose agent may drive `target`'s BMC: reported within the
/// heartbeat, can fence, Node ready, not deleting, not unhealthy, not under remediation, not
/// `target` itself, not held, and not reporting that it cannot reach the BMC.
fn choose_executor<'a>(inp: &RetireInputs<'a>, target: &Host) -> Result<&'a Host, String> {
    let unhealthy: BTreeSet<&str> = inp
        .verdicts
        .iter()
        .flat_map(|v| v.unhealthy.iter().map(|u| u.host.name.as_str()))
        .collect();
    let busy: BTreeSet<&str> = inp
        .snapshot
        .remediations
        .iter()
        .filter(|r| r.phase.is_active())
        .map(|r| r.target.as_str())
        .collect();
    let mut candidates: Vec<&Host> = inp
        .snapshot
        .hosts
        .iter()
        .filter(|h| {
            h.name != target.name
                && h.agent.as_ref().is_some_and(|a| {
                    a.can_fence && a.last_heartbeat.after(inp.executor_heartbeat) > inp.now
                })
                && h.node_ready()
                && h.hold.is_none()
                && !h.is_deleting()
                && !unhealthy.contains(h.name.as_str())
                && !busy.contains(h.name.as_str())
        })
        .collect();
    candidates.sort_by(|a, b| a.name.cmp(&b.name));
    let count = candidates.len();
    crate::remediation::prefer_bmc_reachers(candidates, &target.name)
        .first()
        .copied()
        .ok_or_else(|| crate::remediation::no_executor_reason(count, &target.name))
}
