//! The soak's history: one JSON object per line (NDJSON), written by the recorder as things
//! happen and read back by the checker ([`super::check`]). Times are milliseconds since the
//! soak started (`t`). Hosts are named like the lab's (`cp-1` …), controllers `ctl-1`,
//! `ctl-2`.
//!
//! What is recorded, and from where:
//! - faults the nemesis injects and heals (the driver itself);
//! - every power change a BMC recorded (the BMC emulators' power logs, with their own times
//!   mapped onto the soak's clock);
//! - what the agents did: commands executed with their term, commands refused as older than
//!   the term the agent had seen, terms seen (the agents' logs);
//! - what the controllers did: leaderships begun with their term, intents persisted
//!   (the controllers' logs);
//! - etcd's membership and each member's health, sampled by the soak's own observer;
//! - remediation phases (the leader's store, as `status` reads it);
//! - the workload's acknowledged writes, and what of them was read back at the end.

use serde::{Deserialize, Serialize};

/// One line of the history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Entry {
    /// Milliseconds since the soak started.
    pub t: u64,
    /// What happened.
    #[serde(flatten)]
    pub event: Event,
}

/// A fault the nemesis can inject.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// The host's etcd and agent are frozen (SIGSTOP): a hung host.
    HostHang,
    /// Only the host's etcd is frozen.
    EtcdHang,
    /// The host's agent is killed and started again after a while.
    AgentKill,
    /// The host is cut off the lab network (network namespaces; standalone only).
    Partition,
    /// The leading controller is frozen longer than its lease, then resumed.
    ControllerPause,
    /// The leading controller is killed, and started again after a while.
    ControllerKill,
    /// The host's BMC refuses every request (its emulator frozen: no answer).
    BmcFail,
    /// The host's BMC answers slowly (frozen for a few seconds at a time).
    BmcSlow,
    /// The host's BMC says yes to power changes and does nothing (the host keeps running).
    BmcLying,
    /// The Kubernetes API server is frozen (Kubernetes mode).
    ApiserverFreeze,
    /// The network between the agents and the leading controller holds every byte for
    /// seconds, both ways; once the leader persists an intent meanwhile, it crashes (killed)
    /// with its answers still in flight. Agents get its commands after a newer leadership
    /// began, and it planned from reports whose views were old. Opt-in (`--lag`).
    LeaderLag,
}

impl FaultKind {
    /// Every kind, in the order they are documented.
    pub const ALL: [FaultKind; 11] = [
        Self::HostHang,
        Self::EtcdHang,
        Self::AgentKill,
        Self::Partition,
        Self::ControllerPause,
        Self::ControllerKill,
        Self::BmcFail,
        Self::BmcSlow,
        Self::BmcLying,
        Self::ApiserverFreeze,
        Self::LeaderLag,
    ];

    /// The kind's name as the history spells it (`host-hang`).
    pub fn name(self) -> &'static str {
        match self {
            Self::HostHang => "host-hang",
            Self::EtcdHang => "etcd-hang",
            Self::AgentKill => "agent-kill",
            Self::Partition => "partition",
            Self::ControllerPause => "controller-pause",
            Self::ControllerKill => "controller-kill",
            Self::BmcFail => "bmc-fail",
            Self::BmcSlow => "bmc-slow",
            Self::BmcLying => "bmc-lying",
            Self::ApiserverFreeze => "apiserver-freeze",
            Self::LeaderLag => "leader-lag",
        }
    }

    /// Whether this fault makes its host unhealthy, so that fencing it is justified. BMC faults
    /// do not (a host whose BMC misbehaves is healthy); controller and API server faults have
    /// no host.
    pub fn afflicts_host(self) -> bool {
        matches!(
            self,
            Self::HostHang | Self::EtcdHang | Self::AgentKill | Self::Partition
        )
    }

    /// Whether this fault takes the host's etcd member away from quorum while it lasts.
    pub fn takes_member(self) -> bool {
        matches!(self, Self::HostHang | Self::EtcdHang | Self::Partition)
    }
}

/// A power state a BMC recorded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Power {
    /// Off.
    Off,
    /// On.
    On,
}

/// One etcd member in a sample.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberSample {
    /// The member's name (its host).
    pub name: String,
    /// A voter (not a learner).
    pub voter: bool,
    /// Answered the observer's status probe with a leader and no alarm.
    pub healthy: bool,
}

/// What happened.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "kebab-case")]
pub enum Event {
    /// The soak begins: its seed, duration and hosts.
    Start {
        /// The schedule's seed (the same seed replays the same schedule).
        seed: u64,
        /// `standalone` or `kubernetes`.
        backend: String,
        /// The control-plane hosts.
        hosts: Vec<String>,
        /// The controllers.
        controllers: Vec<String>,
        /// How long faults are injected, in seconds.
        duration_s: u64,
    },
    /// The nemesis injected a fault.
    FaultStart {
        /// Its id (unique in the history).
        id: u64,
        /// What it is.
        fault: FaultKind,
        /// Its target: a host (`cp-2`), a controller (`ctl-1`) or `apiserver`.
        target: String,
    },
    /// A fault ended: the nemesis healed it, or the host was power-cycled (which ends a hang).
    FaultEnd {
        /// The fault's id.
        id: u64,
        /// `healed` (the nemesis undid it) or `power-cycled` (the host was powered off).
        how: String,
    },
    /// A BMC recorded a power change of its host.
    Power {
        /// The host.
        host: String,
        /// The new state.
        state: Power,
    },
    /// An agent executed a command (it passed the term check; the outcome follows).
    CommandExecuted {
        /// The executing agent's host.
        agent: String,
        /// The operation id.
        op: String,
        /// The command's kind (`fence`, `etcd-remove`, …).
        command: String,
        /// The term of the leadership that offered it.
        term: u64,
        /// For a fence: the target host.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        target: Option<String>,
        /// For a fence: `off`, `on` or `reboot`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        action: Option<String>,
    },
    /// An agent refused a command of an older term.
    CommandRefused {
        /// The agent's host.
        agent: String,
        /// The operation id.
        op: String,
        /// The command's term.
        term: u64,
        /// The highest term the agent had seen.
        seen: u64,
    },
    /// An agent's own quorum check refused a power cut.
    PowerCutRefused {
        /// The agent's host.
        agent: String,
        /// The host whose power it would have cut.
        target: String,
        /// Why (the counts).
        reason: String,
    },
    /// An agent saw a newer term (in a command or an answer).
    TermSeen {
        /// The agent's host.
        agent: String,
        /// The term.
        term: u64,
    },
    /// A controller began leading in a term.
    Leader {
        /// The controller.
        controller: String,
        /// The term.
        term: u64,
    },
    /// A controller replica exited on its own (not killed by the nemesis) and its supervisor
    /// will start it again (the lab plays systemd's `Restart=on-failure` or the kubelet's
    /// restart back-off).
    ControllerExit {
        /// The replica (`ctl-1`).
        controller: String,
        /// Its exit code, if it exited.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        code: Option<i32>,
        /// The signal that ended it, if one did.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        signal: Option<i32>,
        /// How long until the supervisor starts it again, in milliseconds.
        restart_in_ms: u64,
        /// The last line of its log (the error it gave).
        last_line: String,
    },
    /// A controller persisted an intent.
    Intent {
        /// The controller.
        controller: String,
        /// The operation id.
        op: String,
        /// Why (the plan's reason).
        reason: String,
    },
    /// etcd as the soak's observer saw it.
    EtcdSample {
        /// Every member.
        members: Vec<MemberSample>,
        /// A linearizable read through the cluster succeeded (quorum held).
        quorum: bool,
    },
    /// A remediation entered a phase (from the leader's store).
    Remediation {
        /// The remediation id.
        id: String,
        /// The host.
        target: String,
        /// The phase's name (`powering-off`, `done`, `needs-person`, …).
        phase: String,
    },
    /// Whether a host is healthy as the lab judges it (powered, not frozen, its member
    /// healthy, its agent reporting true conditions); recorded on every change.
    HostHealth {
        /// The host.
        host: String,
        /// Healthy now.
        healthy: bool,
    },
    /// The workload's result: writes acknowledged, and the acknowledged keys a
    /// linearizable read did not find at the end.
    Workload {
        /// Writes acknowledged by etcd.
        acked: u64,
        /// Writes that failed or got no answer (not a violation: etcd may refuse them).
        failed: u64,
        /// Acknowledged keys not found at the end.
        lost: Vec<String>,
    },
    /// The soak ends.
    End,
}

/// Parses a history, one entry per non-empty line; a line that does not parse is an error
/// naming its number.
pub fn parse(text: &str) -> Result<Vec<Entry>, String> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| serde_json::from_str(l).map_err(|e| format!("history line {}: {e}", i + 1)))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_fault_kind_is_listed_once_under_the_name_the_history_spells() {
        let mut names: Vec<&str> = FaultKind::ALL.iter().map(|k| k.name()).collect();
        for kind in FaultKind::ALL {
            assert_eq!(
                serde_json::to_value(kind).unwrap(),
                serde_json::Value::from(kind.name())
            );
        }
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FaultKind::ALL.len());
    }

    #[test]
    fn an_entry_reads_back_as_written_and_a_bad_line_is_named_by_its_number() {
        let entry = Entry {
            t: 1500,
            event: Event::FaultStart {
                id: 3,
                fault: FaultKind::EtcdHang,
                target: "cp-2".into(),
            },
        };
        let line = serde_json::to_string(&entry).unwrap();
        assert_eq!(
            line,
            r#"{"t":1500,"kind":"fault-start","id":3,"fault":"etcd-hang","target":"cp-2"}"#
        );
        assert_eq!(
            parse(&format!("{line}\n\n{line}\n")).unwrap(),
            vec![entry.clone(), entry]
        );
        let err = parse(&format!("{line}\n{{\"t\":1}}\n")).unwrap_err();
        assert!(err.starts_with("history line 2:"), "{err}");
    }
}
