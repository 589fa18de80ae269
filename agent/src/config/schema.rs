//! The typed schema of `agent.toml`. Every table denies unknown keys; every default is a named
//! constant.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

/// Default interval between two reports to the controller (reports also go out on change).
pub const DEFAULT_REPORT_INTERVAL: Duration = Duration::from_secs(10);
/// Default timeout of one request to the controller.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Default long-poll wait for commands.
pub const DEFAULT_COMMAND_WAIT: Duration = Duration::from_secs(30);
/// Default state directory (operation journal, pending results, join state).
pub const DEFAULT_STATE_DIR: &str = "/var/lib/metalguard";
/// Default metrics address: loopback only.
pub const DEFAULT_METRICS_LISTEN: &str = "127.0.0.1:9641";
/// Default probe period.
pub const DEFAULT_PROBE_PERIOD: Duration = Duration::from_secs(5);
/// Default probe timeout.
pub const DEFAULT_PROBE_TIMEOUT: Duration = Duration::from_secs(2);
/// Default consecutive failures before a probe turns unhealthy.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 3;
/// Default consecutive successes before a probe turns healthy again.
pub const DEFAULT_SUCCESS_THRESHOLD: u32 = 1;
/// Default minimum free space on the etcd data directory's filesystem.
pub const DEFAULT_MIN_FREE_BYTES: u64 = 2 * 1024 * 1024 * 1024;
/// Default largest tolerated clock offset reported by the kernel.
pub const DEFAULT_MAX_CLOCK_OFFSET: Duration = Duration::from_millis(500);
/// Default etcd binary of the exec launcher (Debian's etcd-server).
pub const DEFAULT_ETCD_BINARY: &str = "/usr/bin/etcd";
/// Default unit of the systemd launcher.
pub const DEFAULT_ETCD_UNIT: &str = "etcd.service";
/// Default EnvironmentFile of the systemd launcher: in the agent's state directory, the one
/// place the packaged (unprivileged, `ProtectSystem=strict`) agent may write; systemd reads it
/// as root when it starts the unit.
pub const DEFAULT_SYSTEMD_ENV_FILE: &str = "/var/lib/metalguard/etcd.env";
/// Default static Pod manifest of the static-pod launcher (kubeadm's).
pub const DEFAULT_STATIC_POD_MANIFEST: &str =
    metalguard_etcd::join::launcher::static_pod::DEFAULT_MANIFEST;
/// Default etcd certificate directory of the static-pod launcher (kubeadm's).
pub const DEFAULT_STATIC_POD_PKI_DIR: &str =
    metalguard_etcd::join::launcher::static_pod::DEFAULT_PKI_DIR;
/// Default time without catch-up progress after which a joining learner is stalled.
pub const DEFAULT_JOIN_STALL_AFTER: Duration = Duration::from_secs(10);
/// Default interval between observations while a join waits.
pub const DEFAULT_JOIN_POLL_INTERVAL: Duration = metalguard_etcd::join::DEFAULT_POLL_INTERVAL;
/// Default longest time one join go-ahead may take before it fails.
pub const DEFAULT_JOIN_TIMEOUT: Duration = Duration::from_secs(30 * 60);
/// Default deadline of the env-file launcher's start command and of the member answering.
pub const DEFAULT_JOIN_START_TIMEOUT: Duration =
    metalguard_etcd::join::launcher::DEFAULT_START_TIMEOUT;

/// Default interval between two reachability checks of the BMCs the controller lists.
pub const DEFAULT_BMC_REACHABILITY_PERIOD: Duration = Duration::from_secs(30);
/// Default timeout of one BMC reachability check.
pub const DEFAULT_BMC_REACHABILITY_TIMEOUT: Duration = Duration::from_secs(3);

/// The whole agent configuration.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AgentConfig {
    /// This host's name, as the inventory and the client certificate name it.
    pub host: Option<String>,
    /// How to reach the controller.
    #[serde(default)]
    pub controller: Option<ControllerConfig>,
    /// Local state.
    #[serde(default)]
    pub state: StateConfig,
    /// The Prometheus endpoint.
    #[serde(default)]
    pub metrics: MetricsConfig,
    /// The local etcd member.
    #[serde(default)]
    pub etcd: Option<EtcdConfig>,
    /// Local health probes.
    #[serde(default)]
    pub probes: ProbesConfig,
    /// Credential-free checks of the BMCs this agent may be asked to fence.
    #[serde(default)]
    pub bmc_reachability: BmcReachabilityConfig,
}

/// `[bmc_reachability]`: how often the agent checks, without credentials, that it reaches
/// the BMCs the controller lists in its answers to reports (results go into the reports).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BmcReachabilityConfig {
    /// Interval between two checks of every listed BMC.
    #[serde(default = "bmc_reachability_period", with = "humantime_serde")]
    pub period: Duration,
    /// Timeout of one check (connect, TLS and the answer; IPMI: every retransmission).
    #[serde(default = "bmc_reachability_timeout", with = "humantime_serde")]
    pub timeout: Duration,
}

impl Default for BmcReachabilityConfig {
    fn default() -> Self {
        Self {
            period: DEFAULT_BMC_REACHABILITY_PERIOD,
            timeout: DEFAULT_BMC_REACHABILITY_TIMEOUT,
        }
    }
}

fn bmc_reachability_period() -> Duration {
    DEFAULT_BMC_REACHABILITY_PERIOD
}
fn bmc_reachability_timeout() -> Duration {
    DEFAULT_BMC_REACHABILITY_TIMEOUT
}

impl AgentConfig {
    /// The host name (empty before validation has checked it is set).
    pub fn host_name(&self) -> &str {
        self.host.as_deref().unwrap_or("")
    }
}

/// The controller connection (mutual TLS).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ControllerConfig {
    /// Base URL, `https://…`.
    pub url: String,
    /// Further controllers (standalone with several controllers, no VIP): tried in order
    /// when the current one is unreachable or answers 503 (not the leader).
    #[serde(default)]
    pub urls: Vec<String>,
    /// CA bundle that signed the controller's certificate.
    pub ca: PathBuf,
    /// This agent's client certificate (names the host).
    pub cert: PathBuf,
    /// Its private key (must not be group- or world-readable).
    pub key: PathBuf,
    /// Interval between reports.
    #[serde(default = "report_interval", with = "humantime_serde")]
    pub report_interval: Duration,
    /// Timeout of one request.
    #[serde(default = "request_timeout", with = "humantime_serde")]
    pub request_timeout: Duration,
    /// Long-poll wait for commands.
    #[serde(default = "command_wait", with = "humantime_serde")]
    pub command_wait: Duration,
}

impl ControllerConfig {
    /// `url`, then every one of `urls` not equal to it.
    pub fn all_urls(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.url.as_str()).chain(
            self.urls
                .iter()
                .map(String::as_str)
                .filter(|u| *u != self.url),
        )
    }
}

fn report_interval() -> Duration {
    DEFAULT_REPORT_INTERVAL
}
fn request_timeout() -> Duration {
    DEFAULT_REQUEST_TIMEOUT
}
fn command_wait() -> Duration {
    DEFAULT_COMMAND_WAIT
}

/// Local state.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StateConfig {
    /// Directory for the operation journal and pending results.
    #[serde(default = "state_dir")]
    pub dir: PathBuf,
    /// Where this host's boot ID is read: the kernel's, which changes only when the host
    /// boots. Reported with every report, it is the controller's evidence that a power cycle
    /// really booted the host. Set only to simulate hosts (the lab gives each its own file).
    #[serde(default = "boot_id_file")]
    pub boot_id_file: PathBuf,
    /// Where this host's firmware identity is read: `product_uuid` and `product_serial` in
    /// this directory (the kernel's DMI attributes, root-only on most kernels). Reported to a
    /// controller that takes it, to be compared with what the host's BMC says. Set to simulate
    /// hosts, or to a directory the unit fills with copies readable by the agent's user.
    #[serde(default = "dmi_dir")]
    pub dmi_dir: PathBuf,
}

impl Default for StateConfig {
    fn default() -> Self {
        Self {
            dir: state_dir(),
            boot_id_file: boot_id_file(),
            dmi_dir: dmi_dir(),
        }
    }
}

/// The kernel's boot ID.
pub const DEFAULT_BOOT_ID_FILE: &str = "/proc/sys/kernel/random/boot_id";

/// The kernel's DMI identification attributes.
pub const DEFAULT_DMI_DIR: &str = "/sys/class/dmi/id";

fn boot_id_file() -> PathBuf {
    PathBuf::from(DEFAULT_BOOT_ID_FILE)
}

fn dmi_dir() -> PathBuf {
    PathBuf::from(DEFAULT_DMI_DIR)
}

fn state_dir() -> PathBuf {
    PathBuf::from(DEFAULT_STATE_DIR)
}

/// The Prometheus endpoint.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MetricsConfig {
    /// Address to serve `/metrics` on; `off` is spelled by leaving the table out is not
    /// possible, so an explicit `enabled = false` turns it off.
    #[serde(default = "metrics_listen")]
    pub listen: SocketAddr,
    /// Whether to serve metrics at all.
    #[serde(default = "yes")]
    pub enabled: bool,
}

impl Default for MetricsConfig {
    fn default() -> Self {
        Self {
            listen: metrics_listen(),
            enabled: true,
        }
    }
}

#[allow(clippy::expect_used)] // a constant that a unit test parses
fn metrics_listen() -> SocketAddr {
    DEFAULT_METRICS_LISTEN
        .parse()
        .expect("DEFAULT_METRICS_LISTEN is a socket address")
}
fn yes() -> bool {
    true
}

/// The local etcd member.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdConfig {
    /// Client endpoints; the first is the local member.
    pub endpoints: Vec<String>,
    /// The local member's plain-HTTP metrics URL (etcd's `--listen-metrics-urls`; kubeadm:
    /// `http://127.0.0.1:2381`). When set, the `EtcdMemberHealthy` probe reads `/health` there;
    /// otherwise on the first endpoint, presenting `cert`/`key` to an etcd that requires client
    /// certificates.
    #[serde(default)]
    pub metrics_url: Option<String>,
    /// Data directory of the local member (for the disk probe and the join flow).
    pub data_dir: Option<PathBuf>,
    /// CA bundle that signed etcd's server certificates (kubeadm:
    /// `/etc/kubernetes/pki/etcd/ca.crt`); required with `https://` endpoints.
    pub ca: Option<PathBuf>,
    /// Client certificate (kubeadm: `/etc/kubernetes/pki/etcd/healthcheck-client.crt`).
    pub cert: Option<PathBuf>,
    /// Client key (must not be group- or world-readable).
    pub key: Option<PathBuf>,
    /// Probe timing of the member probe.
    #[serde(default)]
    pub probe: ProbeTiming,
    /// How this host joins the cluster as a learner when the controller gives the go-ahead.
    #[serde(default)]
    pub join: Option<EtcdJoinConfig>,
}

/// `[etcd.join]`: this host's learner join, run by the daemon on the controller's go-ahead.
/// Launcher-specific keys are optional here and checked against `launcher` by validation, so
/// that a key of another launcher is an error rather than silently ignored.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EtcdJoinConfig {
    /// Member name.
    pub name: String,
    /// Advertised peer URL (this host's identity in the member list).
    pub peer_url: String,
    /// Advertised client URL.
    pub client_url: String,
    /// Peer listen URL, when it differs from the peer URL.
    #[serde(default)]
    pub listen_peer_url: Option<String>,
    /// Client listen URL, when it differs from the client URL.
    #[serde(default)]
    pub listen_client_url: Option<String>,
    /// etcd's data directory (default: `[etcd].data_dir`).
    #[serde(default)]
    pub data_dir: Option<PathBuf>,
    /// Where the join keeps its state (default: `<data dir>.metalguard-join.json`); the
    /// packaged agent, which may write only its state directory, needs it there.
    #[serde(default)]
    pub state_file: Option<PathBuf>,
    /// How etcd is run: `exec`, `systemd`, `env-file` or `static-pod`.
    pub launcher: crate::etcd_join::LauncherKind,
    /// exec: the etcd binary (default [`DEFAULT_ETCD_BINARY`]).
    #[serde(default)]
    pub etcd_binary: Option<PathBuf>,
    /// systemd: the unit (default [`DEFAULT_ETCD_UNIT`]).
    #[serde(default)]
    pub unit: Option<String>,
    /// systemd: the EnvironmentFile the unit reads (default [`DEFAULT_SYSTEMD_ENV_FILE`]);
    /// env-file: the file the host's supervisor starts etcd from (required).
    #[serde(default)]
    pub env_file: Option<PathBuf>,
    /// env-file: run after the file is written (program and arguments, no shell).
    #[serde(default)]
    pub start_command: Option<Vec<String>>,
    /// env-file: deadline of the start command and of the member answering; static-pod:
    /// deadline of the member answering after the manifest is in place (default
    /// [`DEFAULT_JOIN_START_TIMEOUT`]).
    #[serde(default, with = "humantime_serde::option")]
    pub start_timeout: Option<Duration>,
    /// static-pod: the manifest the kubelet runs (default [`DEFAULT_STATIC_POD_MANIFEST`]).
    #[serde(default)]
    pub manifest: Option<PathBuf>,
    /// static-pod: an existing member's manifest (copied from another control-plane host)
    /// to take the image and further flags from.
    #[serde(default)]
    pub template: Option<PathBuf>,
    /// static-pod: the etcd image (default: the template's).
    #[serde(default)]
    pub image: Option<String>,
    /// static-pod: kubeadm's etcd certificate directory (default
    /// [`DEFAULT_STATIC_POD_PKI_DIR`]): `ca.crt`, `server.*`, `peer.*`.
    #[serde(default)]
    pub pki_dir: Option<PathBuf>,
    /// static-pod: replace a manifest the agent did not write (it is moved aside first);
    /// default false.
    #[serde(default)]
    pub overwrite_foreign_manifest: Option<bool>,
    /// Further `ETCD_*` variables for the local etcd (its own TLS files, tuning).
    #[serde(default)]
    pub env: std::collections::BTreeMap<String, String>,
    /// A go-ahead fails when the learner made no catch-up progress for this long.
    #[serde(default = "join_stall_after", with = "humantime_serde")]
    pub stall_after: Duration,
    /// Interval between observations while waiting.
    #[serde(default = "join_poll_interval", with = "humantime_serde")]
    pub poll_interval: Duration,
    /// The longest one go-ahead may take before it fails.
    #[serde(default = "join_timeout", with = "humantime_serde")]
    pub timeout: Duration,
}

fn join_stall_after() -> Duration {
    DEFAULT_JOIN_STALL_AFTER
}
fn join_poll_interval() -> Duration {
    DEFAULT_JOIN_POLL_INTERVAL
}
fn join_timeout() -> Duration {
    DEFAULT_JOIN_TIMEOUT
}

/// Timing and hysteresis shared by every probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbeTiming {
    /// Interval between two runs.
    #[serde(default = "probe_period", with = "humantime_serde")]
    pub period: Duration,
    /// Timeout of one run.
    #[serde(default = "probe_timeout", with = "humantime_serde")]
    pub timeout: Duration,
    /// Consecutive failures before the probe reports unhealthy.
    #[serde(default = "failure_threshold")]
    pub failure_threshold: u32,
    /// Consecutive successes before it reports healthy again.
    #[serde(default = "success_threshold")]
    pub success_threshold: u32,
}

impl Default for ProbeTiming {
    fn default() -> Self {
        Self {
            period: DEFAULT_PROBE_PERIOD,
            timeout: DEFAULT_PROBE_TIMEOUT,
            failure_threshold: DEFAULT_FAILURE_THRESHOLD,
            success_threshold: DEFAULT_SUCCESS_THRESHOLD,
        }
    }
}

fn probe_period() -> Duration {
    DEFAULT_PROBE_PERIOD
}
fn probe_timeout() -> Duration {
    DEFAULT_PROBE_TIMEOUT
}
fn failure_threshold() -> u32 {
    DEFAULT_FAILURE_THRESHOLD
}
fn success_threshold() -> u32 {
    DEFAULT_SUCCESS_THRESHOLD
}

/// Local health probes. Each is off unless configured.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProbesConfig {
    /// The API server's `/readyz`.
    pub apiserver: Option<HttpProbeConfig>,
    /// The kubelet's `/healthz`.
    pub kubelet: Option<HttpProbeConfig>,
    /// Free space on the etcd data directory's filesystem.
    pub disk: Option<DiskProbeConfig>,
    /// Kernel clock synchronisation (adjtimex).
    pub clock: Option<ClockProbeConfig>,
    /// Custom commands: exit 0 means healthy.
    #[serde(default)]
    pub exec: Vec<ExecProbeConfig>,
}

/// Declares a probe table: its own fields plus the four timing fields every probe shares
/// (spelled inline, `period = "5s"` next to `url`), all under `deny_unknown_fields`.
/// (`#[serde(flatten)]` would silently accept unknown keys, so it is not used.)
macro_rules! probe_table {
    ($(#[$meta:meta])* $name:ident { $($(#[$fmeta:meta])* $field:ident : $ty:ty,)* }) => {
        $(#[$meta])*
        #[derive(Debug, Clone, Deserialize)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($(#[$fmeta])* pub $field: $ty,)*
            /// Interval between two runs.
            #[serde(default = "probe_period", with = "humantime_serde")]
            pub period: Duration,
            /// Timeout of one run.
            #[serde(default = "probe_timeout", with = "humantime_serde")]
            pub timeout: Duration,
            /// Consecutive failures before the probe reports unhealthy.
            #[serde(default = "failure_threshold")]
            pub failure_threshold: u32,
            /// Consecutive successes before it reports healthy again.
            #[serde(default = "success_threshold")]
            pub success_threshold: u32,
        }

        impl $name {
            /// The probe's timing and hysteresis.
            pub fn timing(&self) -> ProbeTiming {
                ProbeTiming {
                    period: self.period,
                    timeout: self.timeout,
                    failure_threshold: self.failure_threshold,
                    success_threshold: self.success_threshold,
                }
            }
        }
    };
}

probe_table! {
    /// An HTTP(S) health endpoint probe: healthy on a 2xx answer.
    HttpProbeConfig {
        /// URL, e.g. `https://127.0.0.1:6443/readyz`.
        url: String,
        /// CA bundle for HTTPS (system roots otherwise).
        #[serde(default)]
        ca: Option<PathBuf>,
    }
}

probe_table! {
    /// Free space probe.
    DiskProbeConfig {
        /// Path on the filesystem to check (default: the etcd data directory).
        #[serde(default)]
        path: Option<PathBuf>,
        /// Minimum free bytes.
        #[serde(default = "min_free_bytes")]
        min_free_bytes: u64,
    }
}

fn min_free_bytes() -> u64 {
    DEFAULT_MIN_FREE_BYTES
}

probe_table! {
    /// Clock probe: the kernel's synchronisation status and estimated error (adjtimex).
    ClockProbeConfig {
        /// Largest tolerated offset.
        #[serde(default = "max_clock_offset", with = "humantime_serde")]
        max_offset: Duration,
    }
}

fn max_clock_offset() -> Duration {
    DEFAULT_MAX_CLOCK_OFFSET
}

probe_table! {
    /// A custom command probe: exit status 0 within the timeout means healthy.
    ExecProbeConfig {
        /// Condition name reported for it.
        name: String,
        /// Program and arguments (no shell).
        command: Vec<String>,
    }
}
