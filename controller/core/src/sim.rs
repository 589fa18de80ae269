//! A small cluster simulator for tests: hidden machine state (power, crashed OS, hung etcd,
//! broken BMC), an executor that applies plan actions to the snapshot the way the real
//! executors would, and the invariants checked after every action.

use std::collections::BTreeSet;

use metalguard_api::duration::Timestamp;
use metalguard_api::plan::{Action, ActionKind, Plan, RemediationStep};
use metalguard_api::policy::Policy;
use metalguard_api::remediation::RemediationPhase;
use metalguard_api::snapshot::{ConditionStatus, Host, NodeCondition, QUORUM_HOOK, Role, Snapshot};

use crate::quorum::{EtcdView, quorum};
use crate::testkit::{cp_host, ready_node};

/// The simulated world.
#[derive(Debug, Clone)]
pub(crate) struct World {
    pub snap: Snapshot,
    pub policy: Policy,
    pub now: Timestamp,
    pub power_off: BTreeSet<String>,
    pub broken: BTreeSet<String>,
    pub hung: BTreeSet<String>,
    pub bmc_broken: BTreeSet<String>,
    /// Hosts whose kubelet is down: Node NotReady while etcd and the agent still run.
    pub kubelet_down: BTreeSet<String>,
    /// Hosts whose BMC says yes to every power change and does nothing.
    pub bmc_lying: BTreeSet<String>,
    /// Boots so far (each power-on that really happens gives its host a new boot ID).
    pub boots: u32,
    pub next_member: u64,
    pub next_host: u32,
    /// Retired hosts powered off by a `DecommissionHost` (each at most once).
    pub decommissioned: BTreeSet<String>,
    /// Actions applied so far (for failure messages).
    pub log: Vec<String>,
}

fn quorum_ok(s: &Snapshot) -> bool {
    EtcdView::from_snapshot(s).quorum_lost().is_none()
}

impl World {
    pub(crate) fn new(snap: Snapshot, policy: Policy, now: Timestamp) -> Self {
        let next_member = snap
            .hosts
            .iter()
            .filter_map(|h| h.etcd.as_ref())
            .map(|m| m.id)
            .max()
            .unwrap_or(0)
            + 1;
        let next_host = snap.hosts.len() as u32;
        let mut w = World {
            snap,
            policy,
            now,
            power_off: BTreeSet::new(),
            broken: BTreeSet::new(),
            hung: BTreeSet::new(),
            bmc_broken: BTreeSet::new(),
            kubelet_down: BTreeSet::new(),
            bmc_lying: BTreeSet::new(),
            boots: 0,
            next_member,
            next_host,
            decommissioned: BTreeSet::new(),
            log: Vec::new(),
        };
        w.refresh();
        w
    }

    pub(crate) fn up(&self, name: &str) -> bool {
        !self.power_off.contains(name) && !self.broken.contains(name)
    }

    pub(crate) fn host_mut(&mut self, name: &str) -> Option<&mut Host> {
        self.snap.hosts.iter_mut().find(|h| h.name == name)
    }

    /// Derives observable state (node, agent, etcd health, leader, Machine API deletion) from
    /// the hidden machine state.
    pub(crate) fn refresh(&mut self) {
        let now = self.now;
        let (up, hung): (Vec<bool>, Vec<bool>) = self
            .snap
            .hosts
            .iter()
            .map(|h| (self.up(&h.name), self.hung.contains(&h.name)))
            .unzip();
        let kubelet: Vec<bool> = self
            .snap
            .hosts
            .iter()
            .map(|h| !self.kubelet_down.contains(&h.name))
            .collect();
        for (((h, up), hung), kubelet) in self.snap.hosts.iter_mut().zip(up).zip(hung).zip(kubelet)
        {
            let want = if up && kubelet {
                ConditionStatus::True
            } else {
                ConditionStatus::False
            };
            match h.node.as_mut() {
                None if up && kubelet => {
                    h.node = Some(ready_node(now));
                    h.node_seen = true;
                }
                None => {}
                Some(n) => {
                    let cur = n
                        .conditions
                        .iter()
                        .find(|c| c.type_ == "Ready")
                        .map(|c| c.status);
                    if cur != Some(want) {
                        n.conditions = vec![NodeCondition {
                            type_: "Ready".into(),
                            status: want,
                            last_transition: now,
                        }];
                    }
                }
            }
            if up && let Some(a) = h.agent.as_mut() {
                a.last_heartbeat = now;
                a.boot_reported_at = a.boot_id.as_ref().map(|_| now);
            }
            if let Some(m) = h.etcd.as_mut() {
                m.healthy = up && !hung;
                if !m.healthy {
                    m.leader = false;
                }
            }
        }
        // Machine API: a deleting host without preDrain hooks is drained and removed; its etcd
        // member (if any) dies with it and becomes an orphan. A retired host has no Machine:
        // it stays until metalguard powers it off (`DecommissionHost`).
        let (gone, kept): (Vec<Host>, Vec<Host>) = std::mem::take(&mut self.snap.hosts)
            .into_iter()
            .partition(|h| h.is_deleting() && !h.is_retiring() && h.pre_drain_hooks.is_empty());
        self.snap.hosts = kept;
        for h in gone {
            if let Some(mut m) = h.etcd {
                m.healthy = false;
                m.leader = false;
                self.snap.orphan_members.push(m);
            }
        }
        // Raft: elect the lowest healthy voter when there is no leader and quorum holds.
        if quorum_ok(&self.snap) {
            let has_leader = self
                .snap
                .hosts
                .iter()
                .filter_map(|h| h.etcd.as_ref())
                .any(|m| m.leader);
            if !has_leader
                && let Some(m) = self
                    .snap
                    .hosts
                    .iter_mut()
                    .filter_map(|h| h.etcd.as_mut())
                    .filter(|m| m.healthy && !m.learner)
                    .min_by_key(|m| m.id)
            {
                m.leader = true;
            }
        }
        self.snap.observed_at = now;
    }

    /// Time passes: learners that are healthy catch up.
    pub(crate) fn advance(&mut self, secs: u64) {
        self.now = self.now.after(std::time::Duration::from_secs(secs));
        for m in self.snap.hosts.iter_mut().filter_map(|h| h.etcd.as_mut()) {
            if m.learner && m.healthy {
                m.progress_permille = 1000;
            }
        }
        self.refresh();
    }

    /// Adds a new control-plane host (the inventory providing one).
    pub(crate) fn add_cp_host(&mut self, domain: Option<&str>) -> String {
        let name = format!("cp-{}", self.next_host);
        self.next_host += 1;
        let mut h = cp_host(&name, domain, self.now.as_millis());
        h.node = Some(ready_node(self.now));
        if let Some(a) = h.agent.as_mut() {
            a.last_heartbeat = self.now;
        }
        self.snap.hosts.push(h);
        name
    }

    /// Plans, checks per-plan invariants (determinism, restart, short-circuit, one membership
    /// change), then applies every action, checking invariants after each.
    pub(crate) fn step(&mut self) -> Result<Plan, String> {
        let plan = crate::plan(&self.snap, &self.policy, self.now);
        let again = crate::plan(&self.snap, &self.policy, self.now);
        if plan != again {
            return Err("re-planning the same snapshot gave a different plan".into());
        }
        let json = serde_json::to_string(&self.snap).map_err(|e| e.to_string())?;
        let restored: Snapshot = serde_json::from_str(&json).map_err(|e| e.to_string())?;
        if crate::plan(&restored, &self.policy, self.now) != plan {
            return Err(
                "a restarted controller planned differently from the persisted snapshot".into(),
            );
        }
        if plan
            .actions
            .iter()
            .filter(|a| a.kind.is_membership_change())
            .count()
            > 1
        {
            return Err(format!("two membership changes in one plan:\n{plan}"));
        }
        for a in &plan.actions {
            if let ActionKind::StartRemediation { remediation: r } = &a.kind
                && r.forced.is_none()
                && plan
                    .health
                    .iter()
                    .any(|c| c.short_circuit.is_some() && c.unhealthy.contains(&r.target))
            {
                return Err(format!(
                    "remediation of {} started despite a short-circuit:\n{plan}",
                    r.target
                ));
            }
        }
        for a in &plan.actions {
            self.apply(a)
                .map_err(|e| format!("{e}\naction {} ({})\nplan:\n{plan}", a.id, a.reason))?;
            self.log.push(a.id.0.clone());
        }
        self.refresh();
        Ok(plan)
    }

    fn member_host(&mut self, id: u64) -> Option<&mut Host> {
        self.snap
            .hosts
            .iter_mut()
            .find(|h| h.etcd.as_ref().is_some_and(|m| m.id == id))
    }

    /// Applies one action like an executor would, then checks the invariants.
    pub(crate) fn apply(&mut self, a: &Action) -> Result<(), String> {
        let quorum_before = quorum_ok(&self.snap);
        let desired = self.snap.control_plane.desired_replicas as usize;
        let now = self.now;
        match &a.kind {
            ActionKind::AddQuorumHook { host } => {
                let h = self.host_mut(host).ok_or("hook for unknown host")?;
                if h.is_deleting() {
                    return Err(format!(
                        "quorum hook re-added to {host}, which is being deleted"
                    ));
                }
                h.pre_drain_hooks.insert(QUORUM_HOOK.into());
            }
            ActionKind::RemoveQuorumHook { host } => {
                let h = self.host_mut(host).ok_or("unhook unknown host")?;
                if h.etcd.is_some() {
                    return Err(format!("hook removed from {host} while its member exists"));
                }
                h.pre_drain_hooks.remove(QUORUM_HOOK);
            }
            ActionKind::AddLearner { host } => {
                let view = EtcdView::from_snapshot(&self.snap);
                if view.learners().next().is_some() {
                    return Err("etcdserver: too many learner members in cluster".into());
                }
                if view.voters().any(|m| !m.member.healthy) {
                    return Err(
                        "etcdserver: unhealthy cluster (learner added with a voter down)".into(),
                    );
                }
                let id = self.next_member;
                self.next_member += 1;
                let healthy = self.up(host) && !self.hung.contains(host);
                let h = self.host_mut(host).ok_or("learner on unknown host")?;
                let mut m = crate::testkit::member(id, true, healthy);
                m.progress_permille = 0;
                h.etcd = Some(m);
            }
            ActionKind::PromoteLearner { member_id, .. } => {
                let voters = EtcdView::from_snapshot(&self.snap).voter_count();
                let h = self
                    .member_host(*member_id)
                    .ok_or("promote unknown member")?;
                let (hooked, deleting) = (h.has_quorum_hook(), h.is_deleting());
                let m = h.etcd.as_mut().ok_or("no member")?;
                if !m.caught_up() {
                    return Err("etcdserver: can only promote a learner member which is in sync with leader".into());
                }
                if !hooked || deleting {
                    return Err("promoted a learner without hook or on a deleting host".into());
                }
                if voters + 1 > desired + 1 {
                    return Err(format!(
                        "promotion makes {} voters > desired {desired} + 1",
                        voters + 1
                    ));
                }
                m.learner = false;
            }
            ActionKind::MoveLeader {
                from_member,
                to_member,
            } => {
                let ok = self
                    .member_host(*to_member)
                    .and_then(|h| h.etcd.as_ref())
                    .is_some_and(|m| m.healthy && !m.learner);
                if !ok {
                    return Err("leadership moved to a member that cannot lead".into());
                }
                for m in self.snap.hosts.iter_mut().filter_map(|h| h.etcd.as_mut()) {
                    if m.id == *from_member && !m.leader {
                        return Err("etcdserver: not leader".into());
                    }
                    m.leader = m.id == *to_member;
                }
            }
            ActionKind::RemoveMember { member_id, .. } => {
                let view = EtcdView::from_snapshot(&self.snap);
                let m = view
                    .members
                    .iter()
                    .find(|m| m.member.id == *member_id)
                    .ok_or("etcdserver: member not found")?;
                if m.member.is_voter() && m.member.healthy {
                    if view.voter_count() <= desired {
                        return Err(format!(
                            "healthy voter {} removed before its replacement was promoted",
                            m.label()
                        ));
                    }
                    if m.member.leader {
                        return Err("leader removed without moving leadership first".into());
                    }
                }
                self.snap.orphan_members.retain(|o| o.id != *member_id);
                if let Some(h) = self.member_host(*member_id) {
                    h.etcd = None;
                }
            }
            ActionKind::RequestHost { failure_domain } => {
                self.add_cp_host(failure_domain.as_deref());
            }
            ActionKind::RequestHostDeletion { host } => {
                self.host_mut(host)
                    .ok_or("delete unknown host")?
                    .deletion_requested_at = Some(now);
            }
            ActionKind::Rebalance { .. } => {}
            ActionKind::DecommissionHost { host, executor } => {
                self.decommission(host, executor)?;
            }
            ActionKind::StartRemediation { remediation: r } => {
                if r.executor == r.target {
                    return Err(format!("{} would be executed by its own target", r.id));
                }
                if self
                    .snap
                    .remediations
                    .iter()
                    .any(|o| o.target == r.target && o.phase.is_active())
                {
                    return Err(format!("two remediations on {}", r.target));
                }
                if self.snap.remediations.iter().any(|o| o.id == r.id) {
                    return Err(format!("remediation id {} reused", r.id));
                }
                self.snap.remediations.push(r.clone());
            }
            ActionKind::Remediate {
                remediation_id,
                target,
                executor,
                step,
            } => {
                if executor == target {
                    return Err(format!("{remediation_id} executed by its own target"));
                }
                self.remediate(remediation_id, target, step)?;
            }
        }
        // The world reacts at once (etcd health follows power, the Machine API removes
        // unhooked deleting hosts) so the invariants see the action's real effect.
        self.refresh();
        self.check_invariants(quorum_before)
    }

    /// Powers a retired host off the way the standalone executor does (a verified fence by
    /// another agent), after checking it is retiring and nothing of etcd is left on it; the
    /// adapter then drops the host from the snapshot.
    fn decommission(&mut self, host: &str, executor: &str) -> Result<(), String> {
        if executor == host {
            return Err(format!("{host} would power itself off"));
        }
        if !self.up(executor) {
            return Err(format!(
                "{host} powered off through {executor}, which is down"
            ));
        }
        if !self.decommissioned.insert(host.to_owned()) {
            return Err(format!("{host} powered off for retirement twice"));
        }
        let h = self.host_mut(host).ok_or("power-off of an unknown host")?;
        if !h.is_retiring() {
            return Err(format!("{host} powered off although it is not retiring"));
        }
        if let Some(m) = &h.etcd {
            return Err(format!(
                "{host} powered off for retirement while it has etcd member {:x}",
                m.id
            ));
        }
        if !h.pre_drain_hooks.is_empty() {
            return Err(format!(
                "{host} powered off for retirement with hooks {:?}",
                h.pre_drain_hooks
            ));
        }
        self.power_off.insert(host.to_owned());
        self.snap.hosts.retain(|h| h.name != host);
        Ok(())
    }

    fn remediate(&mut self, id: &str, target: &str, step: &RemediationStep) -> Result<(), String> {
        let now = self.now;
        let bmc_fails = self.bmc_broken.contains(target);
        let mut next = step.resulting_phase();
        match step {
            RemediationStep::PowerOff | RemediationStep::PowerOn if bmc_fails => {
                next = RemediationPhase::Failed {
                    reason: "bmc refused the power change".into(),
                };
            }
            RemediationStep::PowerOff | RemediationStep::PowerOn
                if self.bmc_lying.contains(target) => {}
            RemediationStep::PowerOff => {
                self.power_off.insert(target.to_owned());
            }
            RemediationStep::PowerOn | RemediationStep::Reprovision => {
                self.power_off.remove(target);
                self.broken.remove(target);
                self.hung.remove(target);
                self.kubelet_down.remove(target);
                self.boots += 1;
                let boot = format!("{target}-boot-{}", self.boots);
                if let Some(a) = self.host_mut(target).and_then(|h| h.agent.as_mut()) {
                    a.boot_id = Some(boot);
                }
            }
            RemediationStep::DeleteNode => {
                if let Some(h) = self.host_mut(target) {
                    h.node = None;
                }
            }
            RemediationStep::TaintOutOfService => {
                if let Some(n) = self.host_mut(target).and_then(|h| h.node.as_mut()) {
                    n.out_of_service = true;
                }
            }
            _ => {}
        }
        let backup = self.host_mut(target).and_then(|h| h.node.clone());
        let r = self
            .snap
            .remediations
            .iter_mut()
            .find(|r| r.id == id)
            .ok_or("unknown remediation")?;
        if *step == RemediationStep::BackupNodeMetadata {
            r.backup = Some(metalguard_api::remediation::NodeBackup {
                labels: backup
                    .as_ref()
                    .map(|n| n.labels.clone())
                    .unwrap_or_default(),
                annotations: backup
                    .as_ref()
                    .map(|n| n.annotations.clone())
                    .unwrap_or_default(),
            });
        }
        let saved = r.backup.clone();
        r.advance(next, now).map_err(|e| e.to_string())?;
        if *step == RemediationStep::RestoreNodeMetadata
            && let (Some(b), Some(n)) = (saved, self.host_mut(target).and_then(|h| h.node.as_mut()))
        {
            for (k, v) in b.labels {
                n.labels.entry(k).or_insert(v);
            }
            for (k, v) in b.annotations {
                n.annotations.entry(k).or_insert(v);
            }
            n.out_of_service = false;
        }
        Ok(())
    }

    fn check_invariants(&self, quorum_before: bool) -> Result<(), String> {
        let view = EtcdView::from_snapshot(&self.snap);
        if quorum_before && view.quorum_lost().is_some() {
            return Err(format!(
                "a planned action left {} of {} voters healthy (quorum {})",
                view.healthy_voter_count(),
                view.voter_count(),
                quorum(view.voter_count())
            ));
        }
        if view.learners().count() > 1 {
            return Err("two learners".into());
        }
        let active: Vec<_> = self
            .snap
            .remediations
            .iter()
            .filter(|r| r.phase.is_active())
            .collect();
        let targets: BTreeSet<&str> = active.iter().map(|r| r.target.as_str()).collect();
        if targets.len() != active.len() {
            return Err("two active remediations on one target".into());
        }
        if active.iter().filter(|r| r.control_plane).count() > 1 {
            return Err("two control-plane remediations at once".into());
        }
        let workers = active
            .iter()
            .filter(|r| !r.control_plane && r.forced.is_none())
            .count();
        if workers > self.policy.remediation.max_concurrent as usize {
            return Err(format!("{workers} worker remediations > maxConcurrent"));
        }
        if active.iter().any(|r| r.executor == r.target) {
            return Err("a remediation is executed by its own target".into());
        }
        Ok(())
    }

    /// Names of hosts with the given role.
    pub(crate) fn names(&self, role: Role) -> Vec<String> {
        self.snap
            .hosts
            .iter()
            .filter(|h| h.role == role)
            .map(|h| h.name.clone())
            .collect()
    }
}
