//! One simulated host of the lab: its BMC emulator, its agent process and its directory.
//! A voter's etcd member lives in the lab's [`crate::etcd::EtcdCluster`] at the same index; a
//! spare's etcd (the spares come after the voters in the lab's host list) is its own
//! [`SpareEtcd`], started from the environment file its agent writes when it joins.

use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};

use crate::ipmi::{IpmiOptions, IpmiSim, Privilege};
use crate::netns;
use crate::ports::{PortLease, reserve_port};
use crate::power::{self, PowerEvent};
use crate::process::Proc;
use crate::redfish::{RedfishBmc, RedfishOptions, Tls, write_credentials};
use crate::{HarnessError, Result};

use super::spare::SpareEtcd;

/// Which protocol a host's BMC speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BmcKind {
    /// sushy-tools over HTTPS with a CA-signed certificate.
    Redfish,
    /// OpenIPMI's `ipmi_sim`, RMCP+.
    Ipmi,
}

impl BmcKind {
    /// A short label.
    pub fn label(self) -> &'static str {
        match self {
            BmcKind::Redfish => "redfish",
            BmcKind::Ipmi => "ipmi",
        }
    }
}

#[derive(Debug)]
enum Bmc {
    // Boxed: the emulator's handle is several times the size of the IPMI one.
    Redfish(Box<RedfishBmc>),
    Ipmi(IpmiSim),
}

/// Where a host stands: in the inventory or not, expected healthy or going away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Standing {
    /// A spare the inventory does not list yet.
    Standby,
    /// Listed in the inventory and expected healthy.
    InService,
    /// Retired: listed until it is powered off, never expected healthy again.
    Retired,
    /// No longer listed in the inventory.
    Removed,
}

impl Standing {
    /// Whether the inventory lists the host.
    pub fn listed(self) -> bool {
        matches!(self, Self::InService | Self::Retired)
    }
}

/// A lab host.
#[derive(Debug)]
pub struct LabHost {
    /// Host name (also its etcd member name and certificate name).
    pub name: String,
    /// Index in the lab.
    pub index: usize,
    agent: Option<Proc>,
    agent_frozen: bool,
    /// Where this host's `metalguard-agent` comes from when not the lab's own `bin_dir`: an
    /// older release ([`super::LabOptions::agent_bin_dir`], [`super::Lab::upgrade_agent`]).
    pub(super) agent_bin_dir: Option<PathBuf>,
    powered: bool,
    power_events_seen: usize,
    /// The BMC lies (a nemesis fault): it records power changes and the host ignores them.
    pub(super) bmc_lying: bool,
    /// A spare's etcd, supervised by the lab (`None` for a host started as a voter).
    spare: Option<SpareEtcd>,
    standing: Standing,
    metrics: PortLease,
    bmc: Bmc,
    username: String,
    password: String,
    placement: HostPlacement,
    dir: PathBuf,
    /// The inventory's `bmc = {…}` for this host when it is not its own (a copied line).
    bmc_entry_override: Option<String>,
}

/// Where a lab host's parts live: the address its BMC listens on (a management network) and
/// the network namespace its agent runs in (`None`: the lab's own).
#[derive(Debug, Clone)]
pub(super) struct HostPlacement {
    pub bmc_bind: Ipv4Addr,
    pub netns: Option<String>,
}

impl LabHost {
    pub(super) fn new(
        name: &str,
        index: usize,
        kind: BmcKind,
        lab_dir: &Path,
        power_delay: bool,
        placement: HostPlacement,
    ) -> Result<Self> {
        let dir = lab_dir.join("hosts").join(name);
        std::fs::create_dir_all(&dir).map_err(HarnessError::io("creating a host directory"))?;
        let (bmc, username, password) = match kind {
            BmcKind::Redfish => {
                let bmc = RedfishBmc::start(RedfishOptions {
                    tls: Tls::CaSigned,
                    instant_power: !power_delay,
                    random_seed: power_delay.then_some(crate::redfish::SEED_FIRST_DELAY_1_TO_2_S),
                    bind: placement.bmc_bind,
                    ..RedfishOptions::default()
                })?;
                let (u, p) = (bmc.username().to_owned(), bmc.password().to_owned());
                (Bmc::Redfish(Box::new(bmc)), u, p)
            }
            BmcKind::Ipmi => {
                let sim = IpmiSim::start(IpmiOptions {
                    bind: placement.bmc_bind,
                    ..IpmiOptions::default()
                })?;
                let (u, p) = (
                    sim.username(Privilege::Admin).to_owned(),
                    sim.password().to_owned(),
                );
                (Bmc::Ipmi(sim), u, p)
            }
        };
        let host = Self {
            name: name.to_owned(),
            index,
            agent: None,
            agent_frozen: false,
            agent_bin_dir: None,
            powered: true,
            power_events_seen: 0,
            bmc_lying: false,
            spare: None,
            standing: Standing::InService,
            metrics: reserve_port()?,
            bmc,
            username,
            password,
            placement,
            dir,
            bmc_entry_override: None,
        };
        host.set_known_password(None)?;
        host.write_dmi()?;
        host.boot()?;
        Ok(host)
    }

    /// Where the host's agent reads its firmware identity (`[state] dmi_dir`): every simulated
    /// host shares the machine's `/sys/class/dmi/id`, so each gets files that say what its own
    /// BMC emulator says (`product_uuid`; `product_serial` where the emulator has one).
    pub fn dmi_dir(&self) -> PathBuf {
        self.dir.join("dmi")
    }

    /// The identity the host's BMC emulator reports: its system UUID and serial number.
    pub fn bmc_identity(&self) -> (Option<String>, Option<String>) {
        match &self.bmc {
            Bmc::Redfish(b) => (
                b.system_ids().first().cloned(),
                b.serial_number(0).map(str::to_owned),
            ),
            Bmc::Ipmi(s) => (s.system_uuid().map(str::to_owned), None),
        }
    }

    fn write_dmi(&self) -> Result<()> {
        let dir = self.dmi_dir();
        std::fs::create_dir_all(&dir)
            .map_err(HarnessError::io("creating a host's dmi directory"))?;
        let (uuid, serial) = self.bmc_identity();
        for (file, value) in [("product_uuid", uuid), ("product_serial", serial)] {
            if let Some(value) = value {
                std::fs::write(dir.join(file), format!("{value}\n"))
                    .map_err(HarnessError::io("writing a host's dmi file"))?;
            }
        }
        Ok(())
    }

    /// The file the host's agent reads its boot ID from (`[state] boot_id_file`): every
    /// simulated host shares the machine's kernel, so each gets its own.
    pub fn boot_id_file(&self) -> PathBuf {
        self.dir.join("boot_id")
    }

    /// The host boots: a new boot ID, as a real host gets one from its kernel.
    fn boot(&self) -> Result<()> {
        crate::tls::write_file(
            &self.boot_id_file(),
            crate::tools::random_uuid().as_bytes(),
            0o644,
        )
    }

    /// The boot ID of the host's current boot.
    pub fn boot_id(&self) -> Result<String> {
        std::fs::read_to_string(self.boot_id_file())
            .map(|s| s.trim().to_owned())
            .map_err(HarnessError::io("reading a host's boot id"))
    }

    /// Makes this host a spare: no etcd member, not in the inventory, its etcd run from the
    /// environment file its agent writes.
    /// With `pki` (its certificates in kubeadm's layout) its etcd uses TLS.
    pub(super) fn make_spare(
        &mut self,
        pki: Option<crate::etcd_pki::MemberPki>,
        layout: super::EtcdLayout,
    ) -> Result<()> {
        self.spare = Some(SpareEtcd::reserve(&self.name, &self.dir, pki, layout)?);
        self.standing = Standing::Standby;
        Ok(())
    }

    /// A spare's etcd (`None` for a host started as a voter).
    pub fn spare_etcd(&self) -> Option<&SpareEtcd> {
        self.spare.as_ref()
    }

    pub(super) fn spare_etcd_mut(&mut self) -> Option<&mut SpareEtcd> {
        self.spare.as_mut()
    }

    /// Where the host stands.
    pub fn standing(&self) -> Standing {
        self.standing
    }

    pub(super) fn set_standing(&mut self, standing: Standing) {
        self.standing = standing;
    }

    /// Whether the lab's inventory lists the host.
    pub fn in_inventory(&self) -> bool {
        self.standing.listed()
    }

    /// Whether the host is expected to be healthy: listed in the inventory and not retired.
    pub fn in_service(&self) -> bool {
        self.standing == Standing::InService
    }

    /// The host's directory (agent config, state, logs, BMC credentials).
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The BMC's protocol.
    pub fn bmc_kind(&self) -> BmcKind {
        match self.bmc {
            Bmc::Redfish(_) => BmcKind::Redfish,
            Bmc::Ipmi(_) => BmcKind::Ipmi,
        }
    }

    /// The BMC's address as the inventory names it.
    pub fn bmc_address(&self) -> String {
        match &self.bmc {
            Bmc::Redfish(b) => {
                format!(
                    "redfish+https://{}:{}{}",
                    self.placement.bmc_bind,
                    b.port(),
                    b.system_path(0)
                )
            }
            Bmc::Ipmi(s) => s.url(),
        }
    }

    /// How a BMC client trusts this BMC, as `metalguard-agent bmc`/`fence` arguments (the same
    /// CA the inventory names; none for IPMI).
    pub fn bmc_trust_args(&self) -> Vec<String> {
        match &self.bmc {
            Bmc::Redfish(b) => b
                .ca_pem_path()
                .map(|ca| vec!["--ca".to_owned(), ca.display().to_string()])
                .unwrap_or_default(),
            Bmc::Ipmi(_) => Vec::new(),
        }
    }

    /// The real BMC password (tests check it never leaks).
    pub fn bmc_password(&self) -> &str {
        &self.password
    }

    /// The BMC user the controller logs in as.
    pub fn bmc_username(&self) -> &str {
        &self.username
    }

    /// The CA of a Redfish BMC's HTTPS certificate (`None` for IPMI).
    pub fn bmc_ca_file(&self) -> Option<PathBuf> {
        match &self.bmc {
            Bmc::Redfish(b) => b.ca_pem_path().map(Path::to_path_buf),
            Bmc::Ipmi(_) => None,
        }
    }

    /// The credentials directory the inventory names (the lab's copy, so a scenario can
    /// make it wrong).
    pub fn credentials_dir(&self) -> PathBuf {
        self.dir.join("bmc-credentials")
    }

    /// Changes the password of the BMC itself (Redfish only: `ipmi_sim` keeps its users in
    /// its configuration). The credentials the controller is given do not follow: that is
    /// [`Self::set_known_password`], `None` then writes the new password.
    pub fn change_bmc_password(&mut self, password: &str) -> Result<()> {
        match &mut self.bmc {
            Bmc::Redfish(b) => b.change_password(password)?,
            Bmc::Ipmi(_) => {
                return Err(HarnessError::Other(format!(
                    "{}'s BMC is an ipmi_sim: its password cannot change while it runs",
                    self.name
                )));
            }
        }
        password.clone_into(&mut self.password);
        Ok(())
    }

    /// Locks (`true`) or unlocks this host's BMC account on the BMC (a Redfish emulator:
    /// `ipmi_sim` has no lock that says so).
    pub fn lock_bmc_account(&self, locked: bool) -> Result<()> {
        match &self.bmc {
            Bmc::Redfish(b) if locked => b.lock_account(),
            Bmc::Redfish(b) => b.unlock_account(),
            Bmc::Ipmi(_) => Err(HarnessError::Other(format!(
                "{}'s BMC is an ipmi_sim: its account has no lock that a login would name",
                self.name
            ))),
        }
    }

    /// Writes the credentials the controller will use: the right ones (`None`) or a wrong
    /// password.
    pub fn set_known_password(&self, wrong: Option<&str>) -> Result<()> {
        write_credentials(
            &self.credentials_dir(),
            &self.username,
            wrong.unwrap_or(&self.password),
        )
    }

    /// The inventory's `bmc = {…}` value for this host's own BMC.
    pub(super) fn bmc_entry(&self) -> String {
        let tls = match &self.bmc {
            Bmc::Redfish(b) => b
                .ca_pem_path()
                .map(|ca| format!(", tls = {{ ca-file = \"{}\" }}", ca.display()))
                .unwrap_or_default(),
            Bmc::Ipmi(_) => String::new(),
        };
        format!(
            "{{ address = \"{}\", credentials_dir = \"{}\"{tls} }}",
            self.bmc_address(),
            self.credentials_dir().display(),
        )
    }

    /// Makes the inventory name `entry` as this host's BMC (`None`: its own again).
    pub(super) fn set_bmc_entry_override(&mut self, entry: Option<String>) {
        self.bmc_entry_override = entry;
    }

    pub(super) fn inventory_entry(&self) -> String {
        format!(
            "[[hosts]]\nname = \"{}\"\nrole = \"control-plane\"\nbmc = {}\n\n",
            self.name,
            self.bmc_entry_override
                .clone()
                .unwrap_or_else(|| self.bmc_entry()),
        )
    }

    /// The agent's metrics port.
    pub fn metrics_port(&self) -> u16 {
        self.metrics.port()
    }

    /// The agent's configuration file.
    pub fn agent_config_path(&self) -> PathBuf {
        self.dir.join("agent.toml")
    }

    /// The agent's log file.
    pub fn agent_log(&self) -> PathBuf {
        self.dir.join("agent.log")
    }

    pub(super) fn write_agent_config(&self, text: &str) -> Result<()> {
        crate::tls::write_file(&self.agent_config_path(), text.as_bytes(), 0o644)
    }

    pub(super) fn start_agent(&mut self, bin_dir: &Path) -> Result<()> {
        let agent = self
            .agent_bin_dir
            .as_deref()
            .unwrap_or(bin_dir)
            .join("metalguard-agent");
        let mut command = netns::command_in(self.placement.netns.as_deref(), &agent)?;
        command
            .args(["run", "--log-stderr", "--config"])
            .arg(self.agent_config_path())
            .env("RUST_LOG", "info");
        self.agent = Some(Proc::spawn(
            format!("metalguard-agent {}", self.name),
            command,
            &self.agent_log(),
        )?);
        self.agent_frozen = false;
        Ok(())
    }

    /// Whether the lab considers the host powered (it follows the BMC on every tick).
    pub fn powered(&self) -> bool {
        self.powered
    }

    /// Whether the agent is frozen (SIGSTOP).
    pub fn agent_frozen(&self) -> bool {
        self.agent_frozen
    }

    /// The agent's process id.
    pub fn agent_pid(&self) -> Option<u32> {
        self.agent.as_ref().and_then(Proc::pid)
    }

    /// Kills the agent (SIGKILL) without touching the host's power; the lab starts it again
    /// with [`LabHost::start_agent`].
    pub(super) fn kill_agent(&mut self) {
        if let Some(mut a) = self.agent.take() {
            a.kill();
        }
        self.agent_frozen = false;
    }

    /// Stops the agent as systemd would (SIGTERM, then SIGKILL after 5 s).
    pub(super) fn stop_agent(&mut self) {
        if let Some(mut a) = self.agent.take() {
            a.terminate(std::time::Duration::from_secs(5));
        }
        self.agent_frozen = false;
    }

    /// Whether the agent process runs (it may be frozen).
    pub fn agent_running(&self) -> bool {
        self.agent.is_some()
    }

    /// Freezes (`true`) or thaws the BMC emulator: a BMC that does not answer.
    pub(super) fn freeze_bmc(&self, frozen: bool) -> Result<()> {
        match (&self.bmc, frozen) {
            (Bmc::Redfish(b), true) => b.freeze(),
            (Bmc::Redfish(b), false) => b.thaw(),
            (Bmc::Ipmi(b), true) => b.freeze(),
            (Bmc::Ipmi(b), false) => b.thaw(),
        }
    }

    pub(super) fn freeze_agent(&mut self) -> Result<()> {
        if let Some(a) = &self.agent {
            a.freeze()?;
            self.agent_frozen = true;
        }
        Ok(())
    }

    pub(super) fn thaw_agent(&mut self) -> Result<()> {
        if let Some(a) = &self.agent {
            a.thaw()?;
        }
        self.agent_frozen = false;
        Ok(())
    }

    pub(super) fn power_lost(&mut self) {
        if let Some(mut a) = self.agent.take() {
            a.kill();
        }
        self.agent_frozen = false;
        self.powered = false;
    }

    pub(super) fn power_restored(&mut self, bin_dir: &Path) -> Result<()> {
        self.powered = true;
        self.boot()?;
        self.start_agent(bin_dir)
    }

    /// Whether the BMC says the host is on (its power record).
    pub fn bmc_power_on(&self) -> Result<bool> {
        power::is_on(self.bmc_dir())
    }

    /// Every power transition of the BMC.
    pub fn power_log(&self) -> Result<Vec<PowerEvent>> {
        power::log(self.bmc_dir())
    }

    /// Power transitions recorded since the last call.
    pub(super) fn new_power_events(&mut self) -> Result<Vec<PowerEvent>> {
        let log = self.power_log()?;
        let new = log
            .get(self.power_events_seen..)
            .unwrap_or_default()
            .to_vec();
        self.power_events_seen = log.len();
        Ok(new)
    }

    fn bmc_dir(&self) -> &Path {
        match &self.bmc {
            Bmc::Redfish(b) => b.dir(),
            Bmc::Ipmi(s) => s.dir(),
        }
    }
}
