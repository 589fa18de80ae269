//! The lab's controllers: one or two replicas ([`LabOptions::controllers`]), each with its own
//! port, inventory file (standalone: the same inventory but for the listen address), log and
//! identity, competing for leadership. Slot 0's inventory is the lab's (`inventory.toml`,
//! what the CLI reads); slot 1 gets `inventory-2.toml`.
//!
//! Identities are `ctl-<slot+1>-run-<n>`: the slot names the replica in the soak's history,
//! the run tells restarts apart.

use std::os::unix::process::ExitStatusExt as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use super::{KubeSide, Lab, LabOptions};
use crate::Result;
use crate::ports::{PortLease, reserve_port};
use crate::process::Proc;

/// How long systemd waits before starting the standalone controller again
/// (`RestartSec=2s` in `systemd/metalguard-controller.service`).
const SYSTEMD_RESTART_SEC: Duration = Duration::from_secs(2);
/// The kubelet's restart back-off for a container that exited: 10 s, doubled after each
/// exit up to 5 minutes, and back to 10 s once the container ran 10 minutes.
const KUBELET_BACKOFF_START: Duration = Duration::from_secs(10);
const KUBELET_BACKOFF_MAX: Duration = Duration::from_secs(300);
const KUBELET_BACKOFF_RESET: Duration = Duration::from_secs(600);

/// A replica's exit that the lab, as its supervisor, saw ([`LabOptions::supervise_controllers`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ControllerExit {
    /// The replica (`ctl-1`).
    pub controller: String,
    /// Its exit code, if it exited.
    pub code: Option<i32>,
    /// The signal that ended it, if one did.
    pub signal: Option<i32>,
    /// How long until it is started again.
    pub restart_in: Duration,
    /// The last line of its log.
    pub last_line: String,
}

/// One controller replica of the lab.
#[derive(Debug)]
pub(super) struct LabController {
    pub(super) slot: usize,
    pub(super) port: PortLease,
    pub(super) log: PathBuf,
    pub(super) process: Option<Proc>,
    pub(super) starts: usize,
    pub(super) frozen: bool,
    /// The relay the agents reach it through ([`LabOptions::lag_relays`]).
    pub(super) relay: Option<super::lag::LagRelay>,
    /// When the supervisor starts it again after it exited.
    restart_at: Option<Instant>,
    /// When it was last started.
    started_at: Option<Instant>,
    /// Exits in a row for the kubelet's back-off.
    backoff_exits: u32,
    /// Exits not yet taken by [`Lab::take_controller_exits`].
    exits: Vec<ControllerExit>,
}

impl LabController {
    pub(super) fn new(slot: usize, dir: &Path) -> Result<Self> {
        let log = if slot == 0 {
            dir.join("controller.log")
        } else {
            dir.join(format!("controller-{}.log", slot + 1))
        };
        Ok(Self {
            slot,
            port: reserve_port()?,
            log,
            process: None,
            starts: 0,
            frozen: false,
            relay: None,
            restart_at: None,
            started_at: None,
            backoff_exits: 0,
            exits: Vec::new(),
        })
    }

    /// The replica's name in histories and timelines (`ctl-1`, `ctl-2`).
    pub(super) fn name(&self) -> String {
        format!("ctl-{}", self.slot + 1)
    }

    /// The port agents connect to: its relay's, or its own.
    pub(super) fn agent_port(&self) -> u16 {
        self.relay
            .as_ref()
            .map_or_else(|| self.port.port(), |r| r.addr().port())
    }

    fn identity(&self) -> String {
        format!("{}-run-{}", self.name(), self.starts)
    }

    /// How long its supervisor waits before starting it again after an exit (`kube`: the
    /// kubelet, otherwise systemd).
    fn restart_delay(&mut self, kube: bool) -> Duration {
        if !kube {
            return SYSTEMD_RESTART_SEC;
        }
        if self
            .started_at
            .is_some_and(|t| t.elapsed() >= KUBELET_BACKOFF_RESET)
        {
            self.backoff_exits = 0;
        }
        let delay = KUBELET_BACKOFF_START
            .saturating_mul(1 << self.backoff_exits.min(5))
            .min(KUBELET_BACKOFF_MAX);
        self.backoff_exits += 1;
        delay
    }

    /// Notices that the process exited: keeps the exit and schedules the restart.
    fn supervise(&mut self, kube: bool) -> Option<String> {
        let p = self.process.as_mut()?;
        let status = p.exit_status()?;
        let last_line = p.log_tail(1).trim().to_owned();
        self.process = None;
        let restart_in = self.restart_delay(kube);
        self.restart_at = Some(Instant::now() + restart_in);
        let exit = ControllerExit {
            controller: self.name(),
            code: status.code(),
            signal: status.signal(),
            restart_in,
            last_line,
        };
        let told = format!(
            "{} exited ({status}); its supervisor starts it again in {restart_in:?}",
            exit.controller
        );
        self.exits.push(exit);
        Some(told)
    }
}

impl Lab {
    /// Whether the controller runs as Pods on real nodes ([`LabOptions::controller_image`]).
    pub fn pods_run_controllers(&self) -> bool {
        self.kube
            .as_ref()
            .is_some_and(|k| k.controller_pods().is_some())
    }

    /// The controller URL the agents are given first: the NodePort Service when Pods run the
    /// controller, else slot 0's (or its relay's) port.
    pub(super) fn agent_controller_url(&self) -> String {
        if self.pods_run_controllers() {
            return super::kube::pods::ControllerPods::agent_url();
        }
        format!(
            "https://{}:{}",
            self.service_address(),
            self.controllers[0].agent_port()
        )
    }

    /// The controller logs the lab narrates: slot 0's file, or every controller container's
    /// (one file per run) when Pods run the controller.
    pub(super) fn controller_log_files(&self) -> Vec<PathBuf> {
        match self.kube.as_ref().and_then(|k| k.controller_pods()) {
            Some(pods) => pods.log_files(),
            None => vec![self.controllers[0].log.clone()],
        }
    }

    /// The slot of the replica that holds the leadership now, when Pods run the controller
    /// (the Lease's holder is a Pod name).
    fn leader_pod_slot(&self) -> Option<usize> {
        let kube = self.kube.as_ref()?;
        let holder = super::kube::pods::lease_holder(kube.cluster())?;
        super::kube::pods::ControllerPods::slot_of(kube.cluster(), &holder)
    }

    /// The replica to crash in a scenario that crashes "the controller": slot 0, or the
    /// leading Pod's slot when Pods run the controller.
    pub(super) fn crash_slot(&self) -> usize {
        if self.pods_run_controllers() {
            self.leader_pod_slot().unwrap_or(0)
        } else {
            0
        }
    }

    /// The inventory file controller `c` runs from (slot 0: the lab's own).
    pub(super) fn inventory_of(&self, c: &LabController) -> PathBuf {
        if c.slot == 0 {
            self.inventory.clone()
        } else {
            self.dir
                .path()
                .join(format!("inventory-{}.toml", c.slot + 1))
        }
    }

    /// The controller replicas' names (`ctl-1`, `ctl-2`).
    pub fn controller_names(&self) -> Vec<String> {
        self.controllers.iter().map(LabController::name).collect()
    }

    /// The log of controller replica `slot`.
    pub fn controller_log_of(&self, slot: usize) -> PathBuf {
        self.controllers[slot].log.clone()
    }

    /// The replica whose identity `identity` is (`ctl-2-run-3` → 1).
    pub fn controller_slot_of(&self, identity: &str) -> Option<usize> {
        if let Some(kube) = self.kube.as_ref().filter(|k| k.controller_pods().is_some()) {
            return super::kube::pods::ControllerPods::slot_of(kube.cluster(), identity);
        }
        self.controllers
            .iter()
            .position(|c| identity.starts_with(&format!("{}-run-", c.name())))
    }

    /// Whether replica `slot` runs (started, not killed; it may be frozen).
    pub fn controller_running(&self, slot: usize) -> bool {
        if let Some(kube) = &self.kube
            && let Some(pods) = kube.controller_pods()
        {
            return pods.running(kube.cluster(), slot);
        }
        self.controllers[slot].process.is_some()
    }

    /// Starts (or restarts) controller replica `slot`. When Pods run the controller its
    /// kubelet restarts the container on its own: this only says so.
    pub fn start_controller_in(&mut self, slot: usize) -> Result<()> {
        if self.pods_run_controllers() {
            let name = self.controllers[slot].name();
            self.timeline.add(
                "lab",
                format!("{name}'s kubelet starts its container again (restart back-off)"),
                "the lab does not start Pods' containers itself",
            );
            return Ok(());
        }
        if let Some(mut old) = self.controllers[slot].process.take() {
            old.terminate(Duration::from_secs(5));
        }
        self.controllers[slot].starts += 1;
        self.controllers[slot].frozen = false;
        self.controllers[slot].restart_at = None;
        self.controllers[slot].started_at = Some(Instant::now());
        let bin = self
            .options
            .controller_bin_dir
            .as_ref()
            .unwrap_or(&self.options.bin_dir)
            .join("metalguard-controller");
        let c = &self.controllers[slot];
        let id = c.identity();
        let mut command = if let Some(kube) = &self.kube {
            kube.controller_command(
                &bin,
                &format!("{}:{}", self.service_address(), c.port.port()),
                &self.dir.path().join("tls"),
                &id,
            )
        } else {
            let mut command = Command::new(bin);
            command
                .args(["run", "--inventory"])
                .arg(self.inventory_of(c))
                .args(["--id", &id]);
            command
        };
        command.env(
            "RUST_LOG",
            std::env::var("METALGUARD_LAB_CONTROLLER_LOG").unwrap_or_else(|_| "info".into()),
        );
        let process = Proc::spawn(format!("metalguard-controller {id}"), command, &c.log)?;
        let (name, starts) = (c.name(), c.starts);
        self.controllers[slot].process = Some(process);
        self.timeline.add(
            "lab",
            format!("started metalguard-controller {name} (run {starts})"),
            if self.kube.is_some() {
                "kubernetes backend as its ServiceAccount (shipped RBAC): state on the GuardedHosts, leader election by a Lease"
            } else {
                "standalone backend: state and leader election in the guarded etcd"
            },
        );
        Ok(())
    }

    /// One tick's check of the replicas that are not frozen: without
    /// [`LabOptions::supervise_controllers`] an exit is an error; with it the exit is kept
    /// and the replica started again when its supervisor would.
    pub(super) fn supervise_controllers(&mut self) -> Result<()> {
        if self.pods_run_controllers() {
            // The kubelets supervise the containers; the lab checks the nodes still run.
            if let Some(pods) = self.kube.as_mut().and_then(KubeSide::controller_pods_mut) {
                pods.ensure_running()?;
            }
            return Ok(());
        }
        let kube = self.kube.is_some();
        let mut told = Vec::new();
        let mut due = Vec::new();
        for c in self.controllers.iter_mut().filter(|c| !c.frozen) {
            if !self.options.supervise_controllers {
                if let Some(p) = c.process.as_mut() {
                    p.ensure_running()?;
                }
            } else if let Some(line) = c.supervise(kube) {
                told.push(line);
            } else if c.process.is_none() && c.restart_at.is_some_and(|t| Instant::now() >= t) {
                due.push(c.slot);
            }
        }
        for line in told {
            self.timeline.add("supervisor", line, "");
        }
        for slot in due {
            self.start_controller_in(slot)?;
        }
        Ok(())
    }

    /// The exits the supervisor saw since the last call ([`LabOptions::supervise_controllers`]).
    pub fn take_controller_exits(&mut self) -> Vec<ControllerExit> {
        self.controllers
            .iter_mut()
            .flat_map(|c| std::mem::take(&mut c.exits))
            .collect()
    }

    /// Kills controller replica `slot` (SIGKILL, as a crash would).
    pub fn kill_controller_in(&mut self, slot: usize) {
        if let Some(kube) = &self.kube
            && let Some(pods) = kube.controller_pods()
        {
            let name = self.controllers[slot].name();
            let (what, detail) = match pods.kill(kube.cluster(), slot) {
                Ok(pod) => (
                    format!("killed {name}'s container (Pod {pod}, SIGKILL)"),
                    "simulated crash; its kubelet restarts it".to_owned(),
                ),
                Err(e) => (format!("could not kill {name}'s container"), e.to_string()),
            };
            self.timeline.add("lab", what, detail);
            return;
        }
        if let Some(mut c) = self.controllers[slot].process.take() {
            c.kill();
            self.controllers[slot].frozen = false;
            let name = self.controllers[slot].name();
            self.timeline.add(
                "lab",
                format!("killed metalguard-controller {name} (SIGKILL)"),
                "simulated crash",
            );
        }
    }

    /// Holds every byte controller replica `slot` sends its agents for `lag` (zero: none);
    /// an error without relays ([`LabOptions::lag_relays`]).
    pub fn set_controller_lag(&mut self, slot: usize, lag: Duration) -> Result<()> {
        let c = &self.controllers[slot];
        let Some(relay) = &c.relay else {
            return Err(crate::HarnessError::Other(
                "the lab runs without lag relays".into(),
            ));
        };
        relay.set_lag(lag);
        let name = c.name();
        self.timeline.add(
            "lab",
            if lag.is_zero() {
                format!("the network to {name} is quick again")
            } else {
                format!("the network holds {name}'s answers {lag:?}")
            },
            "",
        );
        Ok(())
    }

    /// Freezes controller replica `slot` (SIGSTOP): a process that stops mid-flight and may
    /// resume long after its lease ran out.
    pub fn freeze_controller(&mut self, slot: usize) -> Result<()> {
        if self.pods_run_controllers() {
            return self.pause_pod(slot, true);
        }
        if let Some(p) = &self.controllers[slot].process {
            p.freeze()?;
            self.controllers[slot].frozen = true;
            let name = self.controllers[slot].name();
            self.timeline
                .add("lab", format!("{name} is paused (SIGSTOP)"), "");
        }
        Ok(())
    }

    /// Resumes controller replica `slot` (SIGCONT).
    pub fn thaw_controller(&mut self, slot: usize) -> Result<()> {
        if self.pods_run_controllers() {
            return self.pause_pod(slot, false);
        }
        if let Some(p) = &self.controllers[slot].process {
            p.thaw()?;
            self.controllers[slot].frozen = false;
            let name = self.controllers[slot].name();
            self.timeline
                .add("lab", format!("{name} resumes (SIGCONT)"), "");
        }
        Ok(())
    }
}

impl Lab {
    fn pause_pod(&mut self, slot: usize, paused: bool) -> Result<()> {
        let Some(kube) = &self.kube else {
            return Ok(());
        };
        let Some(pods) = kube.controller_pods() else {
            return Ok(());
        };
        let pod = pods.pause(kube.cluster(), slot, paused)?;
        self.controllers[slot].frozen = paused;
        let name = self.controllers[slot].name();
        self.timeline.add(
            "lab",
            if paused {
                format!("{name}'s container is paused (Pod {pod}, runc's freezer)")
            } else {
                format!("{name}'s container resumes (Pod {pod})")
            },
            "",
        );
        Ok(())
    }
}

/// Checks the number of controllers asked for.
pub(super) fn check_count(options: &LabOptions) -> Result<()> {
    if options.controller_image.is_some() {
        if options.backend != super::LabBackend::Kubernetes || options.lag_relays {
            return Err(crate::HarnessError::Other(
                "the controller runs as Pods only in Kubernetes mode, and without lag relays"
                    .into(),
            ));
        }
        return Ok(());
    }
    if (1..=2).contains(&options.controllers) {
        Ok(())
    } else {
        Err(crate::HarnessError::Other(format!(
            "the lab runs one or two controllers, not {}",
            options.controllers
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemd_waits_2_s_and_the_kubelet_backs_off_from_10_s_doubling_to_5_minutes() {
        let dir = tempfile::tempdir().unwrap();
        let mut c = LabController::new(0, dir.path()).unwrap();
        assert_eq!(c.restart_delay(false), Duration::from_secs(2));
        let delays: Vec<u64> = (0..7).map(|_| c.restart_delay(true).as_secs()).collect();
        assert_eq!(delays, [10, 20, 40, 80, 160, 300, 300]);
        c.started_at = Instant::now().checked_sub(KUBELET_BACKOFF_RESET);
        assert_eq!(c.restart_delay(true), Duration::from_secs(10));
    }
}
