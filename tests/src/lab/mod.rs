//! The local lab: simulated control-plane hosts on loopback, each a real etcd member, a real
//! `metalguard-agent` and a BMC emulator (Redfish for even hosts, IPMI for odd ones) whose
//! power state is coupled to the host: power off kills the host's processes, power on starts
//! them again. Plus the standalone `metalguard-controller` with generated mTLS certificates.
//!
//! etcd runs as kubeadm runs it unless [`LabOptions::etcd_security`] says otherwise: TLS on
//! client and peer URLs with client certificates required, each host's certificates in its own
//! `pki/<host>/etcd/` (kubeadm's `/etc/kubernetes/pki/etcd/`). Each agent presents its host's
//! `healthcheck-client` certificate; the controller a dedicated client certificate (CN
//! [`CONTROLLER_ETCD_CN`]).
//!
//! In Kubernetes mode ([`LabBackend::Kubernetes`], [`kube`]) the etcd members are also a real
//! kube-apiserver's store, each host has a Node whose fake kubelet follows its power, and the
//! controller runs with `--backend=kubernetes` on `GuardedHost`s instead of the inventory file.
//!
//! The lab is single-threaded: every wait goes through [`Lab::tick`], which applies power
//! changes to the hosts and narrates what the controller, the agents and the BMCs did.
//! Used by the `metalguard-lab` binary (`demo`, `up`) and by the end-to-end tests.

mod controllers;
mod faults;
mod host;
pub mod kube;
pub mod lag;
pub mod scenarios;
mod spare;
pub mod timeline;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

pub use controllers::ControllerExit;
use controllers::LabController;
use host::HostPlacement;
pub use host::{BmcKind, LabHost, Standing};
pub use kube::KubeSide;
pub use spare::{SpareEtcd, Supervised};
use timeline::Timeline;

use crate::etcd::{EtcdCluster, EtcdOptions, EtcdSecurity, Placement};
use crate::netns::LabNetwork;
use crate::process::run_capture;
use crate::{HarnessError, Result, tools};

/// How often the lab reads the controller's status for narration.
const STATUS_PERIOD: Duration = Duration::from_millis(400);
/// Pause between two ticks of a wait.
const TICK: Duration = Duration::from_millis(50);
/// Common name of the controller's etcd client certificate (its etcd user once etcd's
/// authentication is enabled).
pub const CONTROLLER_ETCD_CN: &str = "metalguard";

/// Timings of the lab's agents and controller (small, so scenarios take seconds).
#[derive(Debug, Clone)]
pub struct Timings {
    /// Agent report interval.
    pub report_interval: Duration,
    /// A host whose agent is silent this long is unhealthy.
    pub heartbeat_timeout: Duration,
    /// How long `Ready=False` must hold before a host is unhealthy.
    pub unhealthy_timeout: Duration,
    /// Controller re-plan period.
    pub plan_interval: Duration,
    /// Leader lease.
    pub lease_ttl: Duration,
    /// Retries of a failed remediation before a person is asked.
    pub max_retry: u32,
    /// Wait between a failed attempt and the next.
    pub retry_period: Duration,
    /// The agents' `[controller] request_timeout` (`None`: the agent's default).
    pub agent_request_timeout: Option<Duration>,
    /// Kubernetes mode: how long `Ready=Unknown` must hold before a host is unhealthy
    /// (`None`: [`Timings::unhealthy_timeout`]).
    pub ready_unknown_timeout: Option<Duration>,
    /// The agents' `[bmc_reachability] period`: how often they probe (and, with
    /// credentials, check) the BMCs. A wrong password shows within this and the
    /// controller's re-read of the credentials (10 s). The agent's default (30 s) by default:
    /// checks every 5 s loaded the 2-core lab enough to fail a timing-bound Kubernetes test.
    pub bmc_check_period: Duration,
}

impl Default for Timings {
    fn default() -> Self {
        Self {
            report_interval: Duration::from_secs(1),
            heartbeat_timeout: Duration::from_secs(5),
            unhealthy_timeout: Duration::from_secs(5),
            plan_interval: Duration::from_millis(250),
            lease_ttl: Duration::from_secs(3),
            max_retry: 1,
            retry_period: Duration::from_secs(2),
            agent_request_timeout: None,
            ready_unknown_timeout: None,
            bmc_check_period: Duration::from_secs(30),
        }
    }
}

/// For the lab's end-to-end tests: the directory holding the workspace binaries, next to the
/// running test binary (`target/<profile>/deps/TEST` → `target/<profile>`).
///
/// # Panics
/// When the agent or the controller is not built there, with the command that builds them.
pub fn test_bin_dir() -> PathBuf {
    let dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().and_then(Path::parent).map(Path::to_path_buf))
        .unwrap_or_default();
    for name in ["metalguard-agent", "metalguard-controller"] {
        assert!(
            dir.join(name).exists(),
            "{name} not built in {}: run `cargo build --workspace --bins` first",
            dir.display()
        );
    }
    dir
}

/// What to build.
#[derive(Debug, Clone)]
#[allow(clippy::struct_excessive_bools)] // independent switches of one run
pub struct LabOptions {
    /// Control-plane hosts (odd: 3 or 5).
    pub hosts: usize,
    /// Where `metalguard-agent` and `metalguard-controller` are.
    pub bin_dir: PathBuf,
    /// Print the timeline as it grows.
    pub live: bool,
    /// Timings.
    pub timings: Timings,
    /// Spare control-plane hosts (`cp-<hosts+1>`, ...): a BMC, a certificate and an agent
    /// with `[etcd.join]` (env-file launcher, the lab as the supervisor), but no etcd member
    /// and not in the inventory until the replace scenario adds one.
    pub spares: usize,
    /// Redfish BMCs apply power changes after sushy-tools' stock delay (seeded: the first is
    /// 2 s, later ones 1–11 s) instead of at once, as real BMCs take seconds. Scenarios that
    /// must act while a fence is in flight need it.
    pub redfish_power_delay: bool,
    /// Runs every host in its own network namespace (needs root; see [`crate::netns`]): its
    /// etcd member and agent listen on the host's own address, the controller and the BMC
    /// emulators on the lab bridge's, so [`Lab::partition`] can cut one host off.
    pub netns: bool,
    /// etcd's `--quota-backend-bytes` on every member (small, for NOSPACE scenarios).
    pub quota_backend_bytes: Option<u64>,
    /// How etcd's clients and peers talk (default: TLS with client certificates, as kubeadm).
    pub etcd_security: EtcdSecurity,
    /// How a spare host runs its etcd once its agent joins it.
    pub etcd_layout: EtcdLayout,
    /// Which backend the controller runs with.
    pub backend: LabBackend,
    /// Controller replicas (1 or 2): each its own process, port and identity, competing for
    /// leadership (the etcd election, or the Lease in Kubernetes mode); every agent knows
    /// every controller's URL.
    pub controllers: usize,
    /// Agents reach each controller through a relay that can hold bytes
    /// ([`Lab::set_controller_lag`]; the soak's `leader-lag` fault).
    pub lag_relays: bool,
    /// A controller replica that exits on its own is started again as its supervisor would
    /// ([`Lab::take_controller_exits`] lists the exits); without it an exit fails the next
    /// tick, as a test wants.
    pub supervise_controllers: bool,
    /// Where every agent's binary comes from at the start, when not `bin_dir`: another
    /// release's (`scripts/previous-release.sh`), for the mixed-version tests.
    pub agent_bin_dir: Option<PathBuf>,
    /// Where the controller replicas' binary comes from, when not `bin_dir` (the lab's own
    /// certificate and status commands keep `bin_dir`'s).
    pub controller_bin_dir: Option<PathBuf>,
    /// Kubernetes mode: the controller runs as the shipped Deployment's two Pods on two real
    /// nodes ([`kube::pods`]), from this image archive (`packaging/build-image.sh`), instead
    /// of as processes; agents reach the leader through the NodePort Service.
    pub controller_image: Option<PathBuf>,
}

/// The controller's backend in the lab.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum LabBackend {
    /// `run --inventory`: state and leader lease in the guarded etcd.
    #[default]
    Standalone,
    /// Kubernetes mode ([`kube`]): the lab's etcd is also a real kube-apiserver's store,
    /// each host has a Node (a fake kubelet coupled to its power), and the controller runs
    /// with `--backend=kubernetes` on `GuardedHost`s instead of the inventory file.
    Kubernetes,
}

/// How a spare host runs etcd (the agent's `[etcd.join] launcher`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum EtcdLayout {
    /// An environment file the lab, as the host's supervisor, runs etcd from (`env-file`).
    #[default]
    EnvFile,
    /// kubeadm's static Pod manifest, run by the lab as the host's kubelet (`static-pod`);
    /// needs the TLS etcd.
    StaticPod,
}

impl EtcdLayout {
    /// Parses `env-file` or `static-pod`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "env-file" => Some(Self::EnvFile),
            "static-pod" => Some(Self::StaticPod),
            _ => None,
        }
    }
}

impl LabOptions {
    /// `hosts` hosts with binaries from `bin_dir`.
    pub fn new(hosts: usize, bin_dir: PathBuf) -> Self {
        Self {
            hosts,
            bin_dir,
            live: false,
            timings: Timings::default(),
            spares: 0,
            redfish_power_delay: false,
            netns: false,
            quota_backend_bytes: None,
            etcd_security: EtcdSecurity::default(),
            etcd_layout: EtcdLayout::default(),
            backend: LabBackend::default(),
            controllers: 1,
            lag_relays: false,
            supervise_controllers: false,
            agent_bin_dir: None,
            controller_bin_dir: None,
            controller_image: None,
        }
    }
}

/// Narration state: what the lab has already told about the controller's store.
#[derive(Debug, Default)]
struct Seen {
    phases: BTreeMap<String, String>,
    operations: BTreeSet<String>,
    results: BTreeSet<String>,
    decisions: BTreeSet<String>,
    unhealthy: BTreeSet<String>,
    retirements: BTreeMap<String, String>,
    status_error: Option<String>,
    /// Kubernetes mode: the lab's last read of the API server failed (told once).
    api_unanswered: bool,
    /// How far each controller log was read.
    controller_log_offsets: BTreeMap<PathBuf, u64>,
    last_status: Option<Instant>,
}

/// A running lab. Dropping it stops every process it started.
#[derive(Debug)]
pub struct Lab {
    /// The narration of the current scenario.
    pub timeline: Timeline,
    options: LabOptions,
    // Field order matters: processes drop before the directories they use.
    controllers: Vec<LabController>,
    kube: Option<KubeSide>,
    hosts: Vec<LabHost>,
    etcd: EtcdCluster,
    network: Option<LabNetwork>,
    inventory: PathBuf,
    seen: Seen,
    last_status: Option<Value>,
    dir: tempfile::TempDir,
}

impl Lab {
    /// Starts etcd, the BMCs, certificates, the agents and the controller, and waits until
    /// every agent reports to the leader.
    pub fn start(options: LabOptions) -> Result<Self> {
        if options.hosts < 1 || options.hosts.is_multiple_of(2) {
            return Err(HarnessError::Other(format!(
                "the lab needs an odd number of hosts, not {}",
                options.hosts
            )));
        }
        let mut timeline = Timeline::new(options.live);
        let dir = tools::temp_dir("lab")?;
        let names: Vec<String> = (1..=options.hosts).map(|i| format!("cp-{i}")).collect();
        let spare_names: Vec<String> = (options.hosts + 1..=options.hosts + options.spares)
            .map(|i| format!("cp-{i}"))
            .collect();
        if options.netns && options.spares > 0 {
            return Err(HarnessError::Other(
                "spare hosts run on 127.0.0.1 and cannot join a lab in netns mode".into(),
            ));
        }
        // Created before any process and dropped after all of them, also on an early error.
        let network = if options.netns {
            let network = LabNetwork::create(options.hosts)?;
            timeline.add(
                "lab",
                format!(
                    "created one network namespace per host on bridge {}br",
                    network.tag()
                ),
                format!(
                    "hosts {}.., controller and BMCs on {}",
                    network.host_address(0),
                    network.gateway()
                ),
            );
            Some(network)
        } else {
            None
        };
        let service_address = network
            .as_ref()
            .map_or(Ipv4Addr::LOCALHOST, LabNetwork::gateway);
        let placements: Vec<Placement> = (0..options.hosts)
            .map(|i| {
                network
                    .as_ref()
                    .map_or_else(Placement::default, |n| Placement {
                        address: n.host_address(i),
                        netns: Some(n.namespace(i).to_owned()),
                    })
            })
            .collect();
        timeline.add(
            "lab",
            format!("starting {} etcd members", options.hosts),
            names.join(", "),
        );
        let etcd = EtcdCluster::start_with(EtcdOptions {
            members: options.hosts,
            names: names.clone(),
            placements: placements.clone(),
            quota_backend_bytes: options.quota_backend_bytes,
            security: options.etcd_security,
            ..EtcdOptions::default()
        })?;
        if let Some(pki) = etcd.pki() {
            pki.issue_client(CONTROLLER_ETCD_CN)?;
            timeline.add(
                "lab",
                "etcd serves clients and peers over TLS and requires client certificates",
                "kubeadm's layout: pki/<host>/etcd/{ca,server,peer,healthcheck-client}; the controller has its own client certificate",
            );
        }
        let tls = dir.path().join("tls");
        let controller_bin = options.bin_dir.join("metalguard-controller");
        let tls_s = tls.display().to_string();
        let certs = |args: &[&str]| -> Result<()> {
            let mut command = Command::new(&controller_bin);
            command.args(args);
            run_capture(
                command,
                None,
                &format!("metalguard-controller {}", args.join(" ")),
            )
            .map(drop)
        };
        certs(&["certs", "init", &tls_s])?;
        let san = service_address.to_string();
        certs(&[
            "certs",
            "issue",
            "controller",
            &tls_s,
            "--server",
            "--san",
            &san,
        ])?;
        for name in names.iter().chain(&spare_names) {
            certs(&["certs", "issue", name, &tls_s])?;
        }
        timeline.add(
            "lab",
            "issued a CA, the controller's server certificate and one client certificate per host",
            "mutual TLS between agents and controller",
        );
        controllers::check_count(&options)?;
        let replicas = if options.controller_image.is_some() {
            usize::from(kube::pods::REPLICAS)
        } else {
            options.controllers
        };
        let controllers = (0..replicas)
            .map(|slot| LabController::new(slot, dir.path()))
            .collect::<Result<Vec<_>>>()?;
        let mut hosts = Vec::new();
        for (index, name) in names.iter().enumerate() {
            let kind = if index % 2 == 0 {
                BmcKind::Redfish
            } else {
                BmcKind::Ipmi
            };
            hosts.push(LabHost::new(
                name,
                index,
                kind,
                dir.path(),
                options.redfish_power_delay,
                HostPlacement {
                    bmc_bind: service_address,
                    netns: placements[index].netns.clone(),
                },
            )?);
        }
        for name in &spare_names {
            let index = hosts.len();
            let kind = if index % 2 == 0 {
                BmcKind::Redfish
            } else {
                BmcKind::Ipmi
            };
            let mut host = LabHost::new(
                name,
                index,
                kind,
                dir.path(),
                options.redfish_power_delay,
                HostPlacement {
                    bmc_bind: service_address,
                    netns: None,
                },
            )?;
            let pki = match etcd.pki() {
                Some(pki) => Some(pki.issue_member(name, Ipv4Addr::LOCALHOST)?),
                None => None,
            };
            host.make_spare(pki, options.etcd_layout)?;
            if let Some(template) = host.spare_etcd().and_then(spare::SpareEtcd::template_path) {
                spare::write_template(template, etcd.member(0))?;
            }
            hosts.push(host);
        }
        timeline.add(
            "lab",
            "started one BMC emulator per host",
            hosts
                .iter()
                .map(|h| format!("{} {}", h.name, h.bmc_kind().label()))
                .collect::<Vec<_>>()
                .join(", "),
        );
        let kube = if options.backend == LabBackend::Kubernetes {
            if options.netns {
                return Err(HarnessError::Other(
                    "the Kubernetes lab runs on 127.0.0.1 and has no netns mode".into(),
                ));
            }
            kube::require_kube_backend(&controller_bin)?;
            Some(KubeSide::start(
                &etcd,
                &hosts,
                &options.timings,
                &mut timeline,
                options.controller_image.as_deref(),
            )?)
        } else {
            None
        };
        let inventory = dir.path().join("inventory.toml");
        let mut lab = Self {
            timeline,
            options,
            controllers,
            kube,
            hosts,
            etcd,
            network,
            inventory,
            seen: Seen::default(),
            last_status: None,
            dir,
        };
        // Kubernetes mode has no inventory file: the resources are the inventory.
        if lab.kube.is_none() {
            lab.write_inventory()?;
        }
        if lab.options.lag_relays {
            let address = lab.service_address();
            for c in &mut lab.controllers {
                let to = std::net::SocketAddr::from((address, c.port.port()));
                c.relay = Some(lag::LagRelay::start(address, to)?);
            }
        }
        let endpoints = lab.etcd.endpoints();
        for i in 0..lab.hosts.len() {
            let config = lab.agent_config(i, &endpoints);
            lab.hosts[i].write_agent_config(&config)?;
            lab.hosts[i]
                .agent_bin_dir
                .clone_from(&lab.options.agent_bin_dir);
            lab.hosts[i].start_agent(&lab.options.bin_dir)?;
        }
        lab.timeline
            .add("lab", "started one metalguard-agent per host", "");
        if lab.pods_run_controllers() {
            let tls = lab.dir.path().join("tls");
            if let Some(kube) = lab.kube.as_mut() {
                kube.deploy_controller(&tls, &mut lab.timeline)?;
            }
        } else {
            for slot in 0..lab.controllers.len() {
                lab.start_controller_in(slot)?;
            }
        }
        lab.wait_all_healthy(Duration::from_secs(60))?;
        Ok(lab)
    }

    /// The lab's directory (certificates, inventory, host directories and logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Keeps the lab's directory after the lab stops (for `up`, and when a scenario failed).
    pub fn keep_dir(&mut self) {
        self.dir.disable_cleanup(true);
    }

    /// The inventory file.
    pub fn inventory(&self) -> &Path {
        &self.inventory
    }

    /// The hosts.
    pub fn hosts(&self) -> &[LabHost] {
        &self.hosts
    }

    /// The etcd cluster.
    pub fn etcd(&self) -> &EtcdCluster {
        &self.etcd
    }

    /// The options the lab was started with.
    pub fn options(&self) -> &LabOptions {
        &self.options
    }

    /// The lab's network namespaces, in netns mode.
    pub fn network(&self) -> Option<&LabNetwork> {
        self.network.as_ref()
    }

    /// Where the controller and the BMC emulators listen: the lab bridge's address in netns
    /// mode, else 127.0.0.1.
    pub fn service_address(&self) -> Ipv4Addr {
        self.network
            .as_ref()
            .map_or(Ipv4Addr::LOCALHOST, LabNetwork::gateway)
    }

    /// The controller's log file.
    pub fn controller_log(&self) -> PathBuf {
        self.controllers[0].log.clone()
    }

    fn write_inventory(&self) -> Result<()> {
        for c in &self.controllers {
            self.write_inventory_for(c)?;
        }
        Ok(())
    }

    fn write_inventory_for(&self, controller: &LabController) -> Result<()> {
        let t = &self.options.timings;
        let endpoints: Vec<String> = self
            .etcd
            .endpoints()
            .iter()
            .map(|e| format!("{e:?}"))
            .collect();
        let mut text = format!(
            "# The local lab's inventory (written by metalguard-lab).\n\
             [controller]\nlisten = \"{address}:{port}\"\ntls_dir = \"{tls}\"\nplan_interval = \"{plan}\"\n\n\
             [etcd]\nendpoints = [{endpoints}]\nlease_ttl = \"{lease}\"\ntimeout = \"1s\"\n{etcd_tls}\n\
             [control_plane]\ndesired_replicas = {replicas}\n\n",
            address = self.service_address(),
            port = controller.port.port(),
            tls = self.dir.path().join("tls").display(),
            plan = ms(t.plan_interval),
            endpoints = endpoints.join(", "),
            lease = ms(t.lease_ttl),
            etcd_tls = self.controller_etcd_tls(),
            replicas = self.options.hosts,
        );
        for h in self.hosts.iter().filter(|h| h.in_inventory()) {
            text.push_str(&h.inventory_entry());
        }
        let _ = write!(
            text,
            "\n[[policy.health_checks]]\nname = \"control-plane\"\n\
             selector = {{ role = \"control-plane\" }}\n\
             unhealthy_conditions = [{{ type = \"Ready\", status = \"False\", timeout = \"{unhealthy}\" }}]\n\
             agent_heartbeat_timeout = \"{heartbeat}\"\n\n\
             [policy.remediation]\nmax_retry = {retry}\nretry_period = \"{retry_period}\"\n\
             min_healthy_period = \"20s\"\nexecutor_heartbeat_timeout = \"{heartbeat}\"\n",
            unhealthy = ms(t.unhealthy_timeout),
            heartbeat = ms(t.heartbeat_timeout),
            retry = t.max_retry,
            retry_period = ms(t.retry_period),
        );
        // Through a rename, as editors do: a running controller never reads half a file.
        let path = self.inventory_of(controller);
        let tmp = path.with_extension("toml.tmp");
        crate::tls::write_file(&tmp, text.as_bytes(), 0o644)?;
        std::fs::rename(&tmp, &path)
            .map_err(HarnessError::io("moving the new inventory into place"))
    }

    /// The inventory's etcd TLS keys: the cluster's CA and the controller's own client
    /// certificate (empty without TLS).
    fn controller_etcd_tls(&self) -> String {
        let Some(tls) = self.etcd.client_tls() else {
            return String::new();
        };
        let clients = tls
            .client
            .cert
            .parent()
            .map(Path::to_path_buf)
            .unwrap_or_default();
        format!(
            "ca_file = \"{ca}\"\ncert_file = \"{cert}\"\nkey_file = \"{key}\"\n",
            ca = tls.ca.display(),
            cert = clients.join(format!("{CONTROLLER_ETCD_CN}.crt")).display(),
            key = clients.join(format!("{CONTROLLER_ETCD_CN}.key")).display(),
        )
    }

    /// The agent's etcd TLS keys: its host's CA and `healthcheck-client` certificate in
    /// kubeadm's layout (empty without TLS).
    fn agent_etcd_tls(&self, i: usize) -> String {
        let pki = match self.hosts[i].spare_etcd() {
            Some(spare) => spare.pki(),
            None => self.etcd.member(i).pki(),
        };
        pki.map_or_else(String::new, |pki| {
            format!(
                "ca = \"{}\"\ncert = \"{}\"\nkey = \"{}\"\n",
                pki.ca.display(),
                pki.healthcheck_client.cert.display(),
                pki.healthcheck_client.key.display()
            )
        })
    }

    fn agent_config(&self, i: usize, endpoints: &[String]) -> String {
        let h = &self.hosts[i];
        let tls = self.dir.path().join("tls");
        let list: Vec<String> = self
            .agent_endpoints(i, endpoints)
            .iter()
            .map(|e| format!("{e:?}"))
            .collect();
        let mut config = format!(
            "host = \"{name}\"\n\
             [controller]\nurl = \"{url}\"\nurls = [{more}]\n\
             ca = \"{tls}/ca.pem\"\ncert = \"{tls}/{name}.pem\"\nkey = \"{tls}/{name}-key.pem\"\n\
             report_interval = \"{report}\"\ncommand_wait = \"5s\"\n{request_timeout}\
             [state]\ndir = \"{state}\"\nboot_id_file = \"{boot}\"\ndmi_dir = \"{dmi}\"\n\
             [metrics]\nlisten = \"127.0.0.1:{metrics}\"\n\
             [etcd]\nendpoints = [{list}]\n{etcd_tls}\
             [etcd.probe]\nperiod = \"500ms\"\ntimeout = \"400ms\"\nfailure_threshold = 2\n\
             [bmc_reachability]\nperiod = \"{bmc_period}\"\ntimeout = \"3s\"\n",
            name = h.name,
            url = self.agent_controller_url(),
            more = if self.pods_run_controllers() {
                String::new()
            } else {
                self.controllers[1..]
                    .iter()
                    .map(|c| format!("\"https://{}:{}\"", self.service_address(), c.agent_port()))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
            tls = tls.display(),
            report = ms(self.options.timings.report_interval),
            request_timeout = self
                .options
                .timings
                .agent_request_timeout
                .map(|t| format!("request_timeout = \"{}\"\n", ms(t)))
                .unwrap_or_default(),
            state = h.dir().join("agent-state").display(),
            boot = h.boot_id_file().display(),
            dmi = h.dmi_dir().display(),
            metrics = h.metrics_port(),
            list = list.join(", "),
            etcd_tls = self.agent_etcd_tls(i),
            bmc_period = ms(self.options.timings.bmc_check_period),
        );
        if let Some(spare) = h.spare_etcd() {
            config.push_str(&spare.join_config());
        }
        config
    }

    /// Starts (or restarts) the first controller (when Pods run the controller, their
    /// kubelets do).
    pub fn start_controller(&mut self) -> Result<()> {
        self.start_controller_in(0)
    }

    /// Kills the first controller (SIGKILL, as a crash would); when Pods run the controller,
    /// the leading one's container.
    pub fn kill_controller(&mut self) {
        let slot = self.crash_slot();
        self.kill_controller_in(slot);
    }

    /// Runs `metalguard-controller ARGS --inventory <lab inventory>` (in Kubernetes mode
    /// `--kubeconfig <admin kubeconfig>`) and returns its output (stdout, or the error with
    /// stderr).
    pub fn controller_cli(&self, args: &[&str]) -> Result<String> {
        run_capture(
            self.controller_cli_command(args),
            None,
            &format!("metalguard-controller {}", args.join(" ")),
        )
    }

    /// Runs `metalguard-controller fence ARGS` and returns its stdout, where the verdict is:
    /// in Kubernetes mode a refused request exits 1 and is still an answer.
    pub fn fence_cli(&self, args: &[&str]) -> Result<String> {
        self.request_cli("fence", args)
    }

    /// `metalguard-controller drill ARGS` (Kubernetes mode: against the API server), its
    /// stdout and stderr.
    pub fn drill_cli(&self, args: &[&str]) -> Result<String> {
        self.request_cli("drill", args)
    }

    /// `metalguard-controller check-bmc HOST` (Kubernetes mode: against the API server):
    /// whether it exited 0 (the check passed), and its stdout and stderr.
    pub fn check_bmc_cli(&self, host: &str, wait: Duration) -> Result<(bool, String)> {
        let wait = format!("{}ms", wait.as_millis());
        let output = self
            .controller_cli_command(&["check-bmc", host, "--wait", &wait])
            // The verdict only, not the client's connection log.
            .env("RUST_LOG", "warn")
            .output()
            .map_err(HarnessError::io("running metalguard-controller check-bmc"))?;
        Ok((
            output.status.success(),
            format!(
                "{}{}",
                String::from_utf8_lossy(&output.stdout),
                String::from_utf8_lossy(&output.stderr)
            ),
        ))
    }

    fn request_cli(&self, subcommand: &str, args: &[&str]) -> Result<String> {
        let mut all = vec![subcommand];
        all.extend_from_slice(args);
        if self.kube.is_none() {
            return self.controller_cli(&all);
        }
        let output = self
            .controller_cli_command(&all)
            .output()
            .map_err(HarnessError::io("running a metalguard-controller request"))?;
        Ok(format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }

    fn controller_cli_command(&self, args: &[&str]) -> Command {
        let mut command = Command::new(self.options.bin_dir.join("metalguard-controller"));
        command.args(args);
        match &self.kube {
            Some(kube) => command.arg("--kubeconfig").arg(kube.admin_kubeconfig()),
            None => command.arg("--inventory").arg(&self.inventory),
        };
        command
    }

    /// How much longer than in standalone mode a scenario that freezes a host may take to
    /// act: [`kube::APISERVER_ETCD_STALL`] in Kubernetes mode, zero otherwise.
    pub fn frozen_member_stall(&self) -> Duration {
        if self.kube.is_some() {
            kube::APISERVER_ETCD_STALL
        } else {
            Duration::ZERO
        }
    }

    /// How long a crashed controller's leadership lasts: the lab's lease TTL in standalone
    /// mode, the Kubernetes backend's Lease ([`kube::CONTROLLER_LEASE`]) in Kubernetes mode.
    pub fn leader_lease(&self) -> Duration {
        if self.kube.is_some() {
            kube::CONTROLLER_LEASE
        } else {
            self.options.timings.lease_ttl
        }
    }

    /// The Kubernetes side, in Kubernetes mode.
    pub fn kube(&self) -> Option<&KubeSide> {
        self.kube.as_ref()
    }

    /// The controller's status as JSON (`status --json`), or why it could not be read.
    /// Without the per-endpoint probes: each would cost the request timeout while a member
    /// hangs, and the narration, which polls every [`STATUS_PERIOD`], would lag the controller
    /// by seconds (the controller-crash scenario needs to see a power-off while it is in
    /// flight at a BMC that takes 2 s).
    pub fn status(&self) -> Result<Value> {
        let out = if self.kube.is_some() {
            kube::run_within(
                self.controller_cli_command(&["status", "--json"]),
                self.dir.path(),
                kube::STATUS_DEADLINE,
                "metalguard-controller status --json --kubeconfig",
            )?
        } else {
            self.controller_cli(&["status", "--json", "--no-endpoint-probes"])?
        };
        serde_json::from_str(&out)
            .map_err(|e| HarnessError::Other(format!("status --json unparsable ({e}): {out}")))
    }

    /// The last status read by [`Lab::tick`].
    pub fn last_status(&self) -> Option<&Value> {
        self.last_status.as_ref()
    }

    /// Index of the host named `name`.
    pub fn index_of(&self, name: &str) -> Result<usize> {
        self.hosts
            .iter()
            .position(|h| h.name == name)
            .ok_or_else(|| HarnessError::Other(format!("no lab host {name}")))
    }

    /// Freezes a host: SIGSTOP its etcd member and its agent (a kernel hang, as far as the
    /// rest of the cluster can tell).
    pub fn freeze(&mut self, i: usize) -> Result<()> {
        self.hang_member(i)?;
        self.hosts[i].freeze_agent()?;
        let name = self.hosts[i].name.clone();
        if let Some(kube) = self.kube.as_mut() {
            kube.host_stopped(&name);
        }
        self.timeline.add(
            "lab",
            format!("{name} hangs: SIGSTOP its etcd and its agent"),
            "simulated kernel hang",
        );
        Ok(())
    }

    /// Thaws a frozen host (only if it was not powered off meanwhile).
    pub fn thaw(&mut self, i: usize) -> Result<()> {
        if self.hosts[i].powered() && self.hosts[i].agent_frozen() {
            self.resume_member(i)?;
            self.hosts[i].thaw_agent()?;
            let name = self.hosts[i].name.clone();
            if let Some(kube) = self.kube.as_mut() {
                kube.host_started(&name);
            }
            self.timeline
                .add("lab", format!("{name} resumes: SIGCONT"), "");
        }
        Ok(())
    }

    /// Cuts host `i` off the lab network (netns mode): its etcd member and agent keep running
    /// but reach nothing and nobody reaches them, as when a switch port fails.
    pub fn partition(&mut self, i: usize) -> Result<()> {
        self.require_network("partition")?.partition(i)?;
        let name = self.hosts[i].name.clone();
        self.timeline.add(
            "lab",
            format!("{name} is partitioned: its link is down"),
            "simulated switch-port failure; its etcd and agent keep running",
        );
        Ok(())
    }

    /// Reconnects host `i` (netns mode); `why` is told on the timeline.
    pub fn heal(&mut self, i: usize, why: &str) -> Result<()> {
        self.require_network("heal")?.heal(i)?;
        let name = self.hosts[i].name.clone();
        self.timeline
            .add("lab", format!("{name}'s link is up again"), why);
        Ok(())
    }

    fn require_network(&self, what: &str) -> Result<&LabNetwork> {
        self.network.as_ref().ok_or_else(|| {
            HarnessError::Other(format!(
                "{what} needs a lab in netns mode (LabOptions::netns, as root)"
            ))
        })
    }

    /// Client URLs of every etcd member except host `i`'s.
    pub fn endpoints_except(&self, i: usize) -> Vec<String> {
        let mut endpoints = self.etcd.endpoints();
        endpoints.remove(i);
        endpoints
    }

    /// Swaps the BMC entries (address, credentials, trust) of hosts `a` and `b` in the
    /// inventory, as a copy-paste error would (`false`: each its own again). In Kubernetes
    /// mode their `GuardedHost`s' `spec.bmc` are swapped (again: back).
    pub fn swap_bmcs(&mut self, a: usize, b: usize, swapped: bool) -> Result<()> {
        let (na, nb) = (self.hosts[a].name.clone(), self.hosts[b].name.clone());
        if let Some(kube) = &self.kube {
            kube.swap_bmcs(&na, &nb)?;
        } else {
            let (entry_a, entry_b) = (self.hosts[a].bmc_entry(), self.hosts[b].bmc_entry());
            self.hosts[a].set_bmc_entry_override(swapped.then_some(entry_b));
            self.hosts[b].set_bmc_entry_override(swapped.then_some(entry_a));
            self.write_inventory()?;
        }
        self.timeline.add(
            "lab",
            if swapped {
                format!("the inventory swaps the BMC entries of {na} and {nb} (valid credentials, the other server)")
            } else {
                format!("the inventory names {na}'s and {nb}'s own BMCs again")
            },
            "",
        );
        Ok(())
    }

    /// Changes the password of host `i`'s BMC itself (Redfish hosts only); the controller's
    /// credentials are not touched ([`Self::set_known_password`] with `None` writes it).
    pub fn change_bmc_password(&mut self, i: usize, password: &str) -> Result<()> {
        self.hosts[i].change_bmc_password(password)?;
        let name = self.hosts[i].name.clone();
        self.timeline.add(
            "lab",
            format!("the password of {name}'s BMC account changed on the BMC"),
            "the controller's credentials are not updated by this",
        );
        Ok(())
    }

    /// Locks (`true`) or unlocks the account of host `i`'s BMC, on the BMC.
    pub fn lock_bmc_account(&mut self, i: usize, locked: bool) -> Result<()> {
        self.hosts[i].lock_bmc_account(locked)?;
        let name = self.hosts[i].name.clone();
        self.timeline.add(
            "lab",
            format!(
                "the account of {name}'s BMC {} on the BMC",
                if locked { "locked" } else { "unlocked" }
            ),
            "as its administrator or its lockout policy would",
        );
        Ok(())
    }

    /// Replaces the BMC password the controller knows for host `i` (the BMC keeps its own).
    pub fn set_known_password(&mut self, i: usize, password: Option<&str>) -> Result<()> {
        self.hosts[i].set_known_password(password)?;
        let name = self.hosts[i].name.clone();
        if let Some(kube) = &self.kube {
            kube.set_bmc_password(
                &name,
                password.unwrap_or_else(|| self.hosts[i].bmc_password()),
            )?;
        }
        match password {
            Some(_) => self.timeline.add(
                "lab",
                format!(
                    "the credentials of {name}'s BMC now hold a password the BMC does not take"
                ),
                "a credential rotation before the BMC's change, or gone wrong",
            ),
            None => self.timeline.add(
                "lab",
                format!("restored the right password for {name}'s BMC"),
                "",
            ),
        }
        Ok(())
    }

    /// Applies power changes to hosts and narrates; call it in every wait.
    pub fn tick(&mut self) -> Result<()> {
        for i in 0..self.hosts.len() {
            // The log, not the current state: an off followed at once by an on (a power
            // cycle) must still kill the host's processes.
            let events = self.hosts[i].new_power_events()?;
            let on = self.hosts[i].bmc_power_on()?;
            let name = self.hosts[i].name.clone();
            let went_off = events.iter().any(crate::power::PowerEvent::is_off);
            // A lying BMC records what it was asked and the host does not notice.
            if self.hosts[i].bmc_lying {
                self.supervise_spare(i)?;
                continue;
            }
            if self.hosts[i].powered() && (went_off || !on) {
                self.kill_member(i);
                self.hosts[i].power_lost();
                if let Some(kube) = self.kube.as_mut() {
                    kube.host_stopped(&name);
                }
                self.timeline.add(
                    &format!("bmc {name}"),
                    "power is off",
                    "the host's etcd and agent died with it",
                );
            }
            if !self.hosts[i].powered() && on {
                self.restart_member(i)?;
                self.hosts[i].power_restored(&self.options.bin_dir)?;
                if let Some(kube) = self.kube.as_mut() {
                    kube.host_started(&name);
                }
                self.timeline.add(
                    &format!("bmc {name}"),
                    "power is on",
                    "the host boots: etcd restarts from its data dir, the agent starts",
                );
            }
            self.supervise_spare(i)?;
        }
        self.supervise_controllers()?;
        if let Some(kube) = self.kube.as_mut() {
            for name in kube.register_due() {
                self.timeline.add(
                    &format!("kubelet {name}"),
                    "registers its Node again",
                    "the host is up",
                );
            }
        }
        self.narrate_controller_log();
        if self
            .seen
            .last_status
            .is_none_or(|t| t.elapsed() >= STATUS_PERIOD)
        {
            self.seen.last_status = Some(Instant::now());
            self.narrate_status();
        }
        Ok(())
    }

    /// Ticks until `done` holds or `timeout` passes; returns how long it took.
    pub fn wait_for(
        &mut self,
        what: &str,
        timeout: Duration,
        mut done: impl FnMut(&mut Self) -> Result<bool>,
    ) -> Result<Duration> {
        let started = Instant::now();
        loop {
            self.tick()?;
            if done(self)? {
                return Ok(started.elapsed());
            }
            if started.elapsed() >= timeout {
                return Err(HarnessError::Timeout {
                    what: what.to_owned(),
                    after: timeout,
                });
            }
            std::thread::sleep(TICK);
        }
    }

    /// Ticks for `period`.
    pub fn idle(&mut self, period: Duration) -> Result<()> {
        let started = Instant::now();
        while started.elapsed() < period {
            self.tick()?;
            std::thread::sleep(TICK);
        }
        Ok(())
    }

    /// Whether host `i` is up: powered, not frozen, its etcd member healthy, its agent's
    /// last report fresh and every reported condition true (a pressure condition false).
    /// Fresh is what the controller calls it: stored within the heartbeat timeout (an
    /// unchanged report is stored once per quarter of it, so under load a tighter window
    /// flapped for healthy hosts and a long soak never settled).
    pub fn host_healthy(&mut self, i: usize) -> bool {
        if !self.hosts[i].powered() || self.hosts[i].agent_frozen() || !self.member_healthy(i) {
            return false;
        }
        if let Some(kube) = &self.kube {
            return self.last_status.is_some()
                && kube.host_healthy(&self.hosts[i].name, self.options.timings.heartbeat_timeout);
        }
        let Some(status) = self.last_status.as_ref() else {
            return false;
        };
        let name = &self.hosts[i].name;
        let Some(report) = status["agents"].get(name.as_str()) else {
            return false;
        };
        let (Some(received), Some(now)) = (report["received_at"].as_u64(), status["now"].as_u64())
        else {
            return false;
        };
        let fresh = now.saturating_sub(received)
            < u64::try_from(self.options.timings.heartbeat_timeout.as_millis()).unwrap_or(u64::MAX);
        // Pressure conditions (`EtcdNoSpace`) read the other way: `False` is calm.
        let calm = |c: &Value| {
            let pressure = c["type"] == "EtcdNoSpace";
            c["status"] == if pressure { "False" } else { "True" }
        };
        let conditions_true = report["report"]["conditions"]
            .as_array()
            .is_some_and(|cs| !cs.is_empty() && cs.iter().all(calm));
        fresh && conditions_true
    }

    /// Waits until every host in service (in the inventory, not retired) is healthy and no
    /// remediation is active.
    pub fn wait_all_healthy(&mut self, timeout: Duration) -> Result<Duration> {
        self.wait_for(
            "every host healthy, no remediation active",
            timeout,
            |lab| {
                lab.seen.last_status = None;
                lab.tick()?;
                let serving: Vec<usize> = (0..lab.hosts.len())
                    .filter(|&i| lab.hosts[i].in_service())
                    .collect();
                let all = serving.into_iter().all(|i| lab.host_healthy(i));
                Ok(all && lab.active_remediations().is_empty())
            },
        )
    }

    /// Remediations that are not finished, as `(id, target, phase)`.
    pub fn active_remediations(&self) -> Vec<(String, String, String)> {
        self.remediations()
            .into_iter()
            .filter(|(_, _, phase)| {
                !matches!(
                    phase.as_str(),
                    "done" | "needs-person" | "cancelled" | "reprovisioning" | "failed"
                )
            })
            .collect()
    }

    /// Every remediation in the last status, as `(id, target, phase)`.
    pub fn remediations(&self) -> Vec<(String, String, String)> {
        self.last_status
            .as_ref()
            .and_then(|s| s["remediations"].as_array())
            .map(|list| {
                list.iter()
                    .map(|r| {
                        (
                            r["id"].as_str().unwrap_or_default().to_owned(),
                            r["target"].as_str().unwrap_or_default().to_owned(),
                            r["phase"]["phase"].as_str().unwrap_or_default().to_owned(),
                        )
                    })
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Power-offs of host `i`'s BMC since `since_ms` (Unix milliseconds).
    pub fn power_offs_since(&self, i: usize, since_ms: u64) -> Result<usize> {
        Ok(self.hosts[i]
            .power_log()?
            .iter()
            .filter(|e| e.at_ms >= since_ms && e.is_off())
            .count())
    }

    /// Every power event of every host since `since_ms`, as `(host, event)`.
    pub fn power_events_since(&self, since_ms: u64) -> Result<Vec<(String, String)>> {
        let mut all = Vec::new();
        for h in &self.hosts {
            for e in h.power_log()? {
                if e.at_ms >= since_ms {
                    all.push((h.name.clone(), format!("{} {}", e.kind, e.value)));
                }
            }
        }
        Ok(all)
    }

    /// Writes `count` keys under `prefix` through the running members; returns them.
    pub fn write_data(&self, prefix: &str, count: usize) -> Result<Vec<(String, String)>> {
        let mut written = Vec::new();
        for k in 0..count {
            let key = format!("{prefix}/{k:03}");
            let value = format!("value-{k}-{}", tools::random_token(8));
            self.etcd.put(&key, &value)?;
            written.push((key, value));
        }
        Ok(written)
    }

    /// Checks that every key is present with its value; returns the missing or wrong ones.
    pub fn check_data(&self, written: &[(String, String)]) -> Result<Vec<String>> {
        let mut bad = Vec::new();
        for (key, value) in written {
            if self.etcd.get(key)?.as_deref() != Some(value.as_str()) {
                bad.push(key.clone());
            }
        }
        Ok(bad)
    }

    fn narrate_controller_log(&mut self) {
        for path in self.controller_log_files() {
            for line in self.read_new_lines(&path) {
                for (needle, what) in [
                    ("cannot act", "cannot act"),
                    ("leadership lost", "lost leadership"),
                ] {
                    if let Some(at) = line.find(needle) {
                        let detail = strip_ansi(&line[at..]);
                        self.timeline.add("controller", what, detail);
                    }
                }
            }
        }
    }

    /// The whole lines `path` gained since the last call for it.
    fn read_new_lines(&mut self, path: &Path) -> Vec<String> {
        use std::io::{Read, Seek, SeekFrom};
        let Ok(mut file) = std::fs::File::open(path) else {
            return Vec::new();
        };
        let len = file.metadata().map_or(0, |m| m.len());
        let offset = self
            .seen
            .controller_log_offsets
            .entry(path.to_path_buf())
            .or_default();
        if len < *offset {
            *offset = 0;
        }
        if file.seek(SeekFrom::Start(*offset)).is_err() {
            return Vec::new();
        }
        let mut text = String::new();
        if file.read_to_string(&mut text).is_err() {
            return Vec::new();
        }
        // Only whole lines; the rest is read next time.
        let Some(end) = text.rfind('\n') else {
            return Vec::new();
        };
        *offset += (end + 1) as u64;
        text[..end].lines().map(str::to_owned).collect()
    }

    fn narrate_status(&mut self) {
        if let Some(kube) = self.kube.as_mut() {
            match kube.refresh() {
                Ok(()) => {
                    if std::mem::take(&mut self.seen.api_unanswered) {
                        self.timeline
                            .add("status", "the API server answers the lab again", "");
                    }
                    kube.narrate(&mut self.timeline);
                }
                Err(e) => {
                    // Told once: while it stalls, each read fails with another request's
                    // text.
                    if !self.seen.api_unanswered {
                        self.timeline.add(
                            "status",
                            "the API server does not answer the lab",
                            first_line_of_error(&e.to_string()),
                        );
                        self.seen.api_unanswered = true;
                    }
                    self.last_status = None;
                    return;
                }
            }
        }
        let status = match self.status() {
            Ok(s) => s,
            Err(e) => {
                let text = first_line_of_error(&e.to_string());
                // In Kubernetes mode a stalling API server fails it with a different request
                // each time: told once until it is read again.
                let key = if self.kube.is_some() {
                    String::from("unreadable")
                } else {
                    text.clone()
                };
                if self.seen.status_error.as_deref() != Some(key.as_str()) {
                    self.timeline
                        .add("status", "the controller's store cannot be read", text);
                    self.seen.status_error = Some(key);
                }
                return;
            }
        };
        self.seen.status_error = None;
        let mut events: Vec<(String, String, String)> = Vec::new();
        if let Some(checks) = status["plan"]["health"].as_array() {
            for c in checks {
                let unhealthy: BTreeSet<String> = c["unhealthy"]
                    .as_array()
                    .map(|l| {
                        l.iter()
                            .filter_map(|v| v.as_str().map(str::to_owned))
                            .collect()
                    })
                    .unwrap_or_default();
                for host in unhealthy.difference(&self.seen.unhealthy) {
                    events.push((
                        "controller".into(),
                        format!("{host} is unhealthy"),
                        format!("check {}", c["name"].as_str().unwrap_or("?")),
                    ));
                }
                for host in self.seen.unhealthy.difference(&unhealthy) {
                    events.push((
                        "controller".into(),
                        format!("{host} is healthy again"),
                        String::new(),
                    ));
                }
                self.seen.unhealthy = unhealthy;
                if let Some(sc) = c["short_circuit"].as_str() {
                    events.push((
                        "controller".into(),
                        format!(
                            "short-circuit on check {}",
                            c["name"].as_str().unwrap_or("?")
                        ),
                        sc.to_owned(),
                    ));
                }
            }
        }
        if let Some(d) = status["plan"]["degraded"].as_str() {
            events.push((
                "controller".into(),
                "degraded: takes no action".into(),
                d.to_owned(),
            ));
        }
        if let Some(refusals) = status["plan"]["refusals"].as_array() {
            for r in refusals {
                events.push((
                    "controller".into(),
                    format!(
                        "refuses {} {}",
                        r["refused"].as_str().unwrap_or("acting on"),
                        r["subject"].as_str().unwrap_or("?")
                    ),
                    r["reason"].as_str().unwrap_or_default().to_owned(),
                ));
            }
        }
        if let Some(list) = status["remediations"].as_array() {
            for r in list {
                let id = r["id"].as_str().unwrap_or_default().to_owned();
                let phase = r["phase"]["phase"].as_str().unwrap_or_default().to_owned();
                if self.seen.phases.get(&id) == Some(&phase) {
                    continue;
                }
                let why = match phase.as_str() {
                    "gated" => format!(
                        "{}; executor {}{}",
                        r["cause"].as_str().unwrap_or_default(),
                        r["executor"].as_str().unwrap_or_default(),
                        r["forced"]
                            .as_str()
                            .map(|f| format!("; FORCED: {f}"))
                            .unwrap_or_default()
                    ),
                    _ => r["phase"]["reason"].as_str().unwrap_or_default().to_owned(),
                };
                events.push((
                    "controller".into(),
                    format!(
                        "remediation {id} of {}: {phase}",
                        r["target"].as_str().unwrap_or_default()
                    ),
                    why,
                ));
                self.seen.phases.insert(id, phase);
            }
        }
        if let Some(list) = status["operations"].as_array() {
            for op in list {
                let id = op["id"].as_str().unwrap_or_default().to_owned();
                let agent = op["agent"].as_str().unwrap_or_default();
                if self.seen.operations.insert(id.clone()) {
                    events.push((
                        "controller".into(),
                        format!("sends {} to agent {agent}", describe_kind(&op["kind"])),
                        format!("operation {id}, intent persisted first"),
                    ));
                }
                if let Some(result) = op["result"].as_object()
                    && self.seen.results.insert(id.clone())
                {
                    events.push((
                        format!("agent {agent}"),
                        format!(
                            "{}: {}",
                            describe_kind(&op["kind"]),
                            result.get("outcome").and_then(Value::as_str).unwrap_or("?")
                        ),
                        result
                            .get("error")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_owned(),
                    ));
                }
            }
        }
        if let Some(list) = status["retirements"].as_object() {
            for (host, r) in list {
                let progress = r["progress"].as_str().unwrap_or_default().to_owned();
                if self.seen.retirements.get(host) != Some(&progress) {
                    events.push((
                        "controller".into(),
                        format!("retirement of {host}"),
                        progress.clone(),
                    ));
                    self.seen.retirements.insert(host.clone(), progress);
                }
            }
        }
        for (actor, what, why) in events {
            // Decisions repeat every plan round: tell each one once.
            if actor == "controller"
                && (what.starts_with("refuses")
                    || what.starts_with("short-circuit")
                    || what.starts_with("degraded"))
                && !self.seen.decisions.insert(format!("{what}|{why}"))
            {
                continue;
            }
            self.timeline.add(&actor, what, why);
        }
        self.last_status = Some(status);
    }

    /// Forgets which decisions were told (a new scenario tells them again).
    pub fn new_scenario(&mut self) {
        self.timeline.restart();
        self.seen.decisions.clear();
    }

    /// Log tails of the controller and every agent, for failure reports.
    pub fn logs(&self) -> String {
        let mut out = String::new();
        if let Some(kube) = &self.kube {
            out.push_str(&kube.logs());
        }
        let _ = writeln!(
            out,
            "--- controller\n{}",
            crate::process::tail_of(&self.controller_log(), 40)
        );
        for h in &self.hosts {
            let _ = writeln!(
                out,
                "--- agent {}\n{}",
                h.name,
                crate::process::tail_of(&h.agent_log(), 20)
            );
            if let Some(spare) = h.spare_etcd() {
                let _ = writeln!(
                    out,
                    "--- etcd {} (spare)\n{}",
                    h.name,
                    crate::process::tail_of(&spare.log_path(), 10)
                );
            }
        }
        out
    }
}

fn describe_kind(kind: &Value) -> String {
    match kind["type"].as_str() {
        Some("fence") => format!(
            "power {} of {}",
            kind["action"].as_str().unwrap_or("?"),
            kind["target"].as_str().unwrap_or("?")
        ),
        Some(other) => other.replace('-', " "),
        None => "a command".to_owned(),
    }
}

fn ms(d: Duration) -> String {
    format!("{}ms", d.as_millis())
}

fn first_line_of_error(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .rfind(|l| !l.is_empty())
        .unwrap_or(text)
        .chars()
        .take(240)
        .collect()
}

/// `text` without ANSI colour sequences (the processes' logs, read back).
pub fn strip_ansi(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}
