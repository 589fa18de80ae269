//! Faults the soak's nemesis injects into a running lab, each with its undo: an etcd-only
//! hang, an agent killed and started again, a BMC that does not answer, a BMC that lies about
//! power (the host ignores what it records). Host hangs ([`Lab::freeze`]), partitions
//! ([`Lab::partition`]) and controller faults (`controllers.rs`) live with the rest of the lab.

use super::Lab;
use crate::Result;

impl Lab {
    /// Freezes only host `i`'s etcd member (SIGSTOP); its agent keeps running and reports it.
    pub fn hang_etcd(&mut self, i: usize) -> Result<()> {
        self.hang_member(i)?;
        let name = self.hosts[i].name.clone();
        self.timeline
            .add("lab", format!("{name}'s etcd hangs (SIGSTOP)"), "");
        Ok(())
    }

    /// Resumes host `i`'s etcd member, unless the host was powered off meanwhile.
    pub fn resume_etcd(&mut self, i: usize) -> Result<()> {
        if self.hosts[i].powered() {
            self.resume_member(i)?;
            let name = self.hosts[i].name.clone();
            self.timeline
                .add("lab", format!("{name}'s etcd resumes (SIGCONT)"), "");
        }
        Ok(())
    }

    /// Kills host `i`'s agent (SIGKILL) and leaves it down until [`Lab::restart_agent`].
    pub fn kill_agent(&mut self, i: usize) {
        self.hosts[i].kill_agent();
        let name = self.hosts[i].name.clone();
        self.timeline
            .add("lab", format!("{name}'s agent is killed (SIGKILL)"), "");
    }

    /// Starts host `i`'s agent again if it is down and the host is powered (a power-on
    /// starts it anyway).
    pub fn restart_agent(&mut self, i: usize) -> Result<()> {
        if self.hosts[i].powered() && !self.hosts[i].agent_running() {
            self.hosts[i].start_agent(&self.options.bin_dir)?;
            let name = self.hosts[i].name.clone();
            self.timeline
                .add("lab", format!("{name}'s agent starts again"), "");
        }
        Ok(())
    }

    /// Upgrades (or downgrades) host `i`'s agent as its package would: the running agent is
    /// stopped (SIGTERM, as systemd's restart does) and the one in `bin_dir` (`None`: the
    /// lab's own) started with the same configuration and state. The host's etcd member
    /// keeps running.
    pub fn upgrade_agent(&mut self, i: usize, bin_dir: Option<&std::path::Path>) -> Result<()> {
        let name = self.hosts[i].name.clone();
        self.hosts[i].stop_agent();
        self.hosts[i].agent_bin_dir = bin_dir.map(std::path::Path::to_path_buf);
        self.hosts[i].start_agent(&self.options.bin_dir)?;
        let from = self.hosts[i]
            .agent_bin_dir
            .as_deref()
            .unwrap_or(&self.options.bin_dir)
            .display()
            .to_string();
        self.timeline.add(
            "lab",
            format!("{name}'s agent restarts on another release"),
            &from,
        );
        Ok(())
    }

    /// Freezes (`true`) or thaws host `i`'s BMC emulator: a BMC that does not answer.
    pub fn freeze_bmc(&mut self, i: usize, frozen: bool) -> Result<()> {
        self.hosts[i].freeze_bmc(frozen)?;
        let name = self.hosts[i].name.clone();
        self.timeline.add(
            &format!("bmc {name}"),
            if frozen {
                "stops answering (SIGSTOP)"
            } else {
                "answers again"
            },
            "",
        );
        Ok(())
    }

    /// Makes host `i`'s BMC lie (`true`): it records power changes and reports them, and the
    /// host keeps running. Back to the truth (`false`), the host follows the BMC's state at
    /// the next tick.
    pub fn set_bmc_lying(&mut self, i: usize, lying: bool) {
        self.hosts[i].bmc_lying = lying;
        let name = self.hosts[i].name.clone();
        self.timeline.add(
            &format!("bmc {name}"),
            if lying {
                "lies: says yes to power changes and does nothing"
            } else {
                "tells the truth again"
            },
            "",
        );
    }

    /// The metrics (and `/health`) address of every voter started with the lab, by host index.
    pub fn member_health_addrs(&self) -> Vec<std::net::SocketAddr> {
        (0..self.etcd.len())
            .map(|i| self.etcd.member(i).metrics_addr())
            .collect()
    }
}
