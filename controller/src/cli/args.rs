//! The command line's definition (clap derive): the subcommands and their arguments, with the
//! `env` fallbacks; `cli_definition_is_consistent` checks it.

use std::path::PathBuf;

use anyhow::Context as _;
use clap::{Parser, Subcommand};

use crate::pki::certs;

/// metalguard controller.
#[derive(Debug, Parser)]
#[command(name = "metalguard-controller", version, about)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub(super) command: Command,
}

#[derive(Debug, Subcommand)]
pub(super) enum Command {
    /// Run the controller: agent API, leader election, planner, executor.
    Run {
        /// Where inputs, state and leadership live: `standalone` (an inventory file and the
        /// guarded etcd) or `kubernetes` (the cluster's resources and a Lease).
        #[arg(long, value_enum, default_value_t = BackendKind::Standalone)]
        backend: BackendKind,
        /// The inventory file (standalone backend).
        #[arg(
            long,
            env = "METALGUARD_INVENTORY",
            required_if_eq("backend", "standalone")
        )]
        inventory: Option<PathBuf>,
        /// This controller's identity in leader election (default: random).
        #[arg(long, env = "METALGUARD_CONTROLLER_ID")]
        id: Option<String>,
        /// Kubernetes backend settings.
        #[command(flatten)]
        kube: KubeArgs,
    },
    /// Dry run: print the plan for a snapshot with its reasons (text or JSON); exit 2 when
    /// an input cannot be read, 3 when the snapshot is inconsistent.
    Plan(crate::cli::plan::PlanArgs),
    /// Print the leader, agents' last reports, remediations and operations from the store,
    /// and what the planner would decide now, with its reasons.
    Status {
        /// The inventory file.
        #[arg(
            long,
            env = "METALGUARD_INVENTORY",
            required_unless_present = "kubeconfig"
        )]
        inventory: Option<PathBuf>,
        /// Kubernetes mode: read the cluster's metalguard resources instead.
        #[command(flatten)]
        cluster: ClusterArgs,
        /// One JSON document instead of text.
        #[arg(long)]
        json: bool,
        /// Leave out the line per etcd endpoint (each endpoint is asked on its own, so a hung
        /// one costs one request timeout): for scripts that poll often, as the lab does.
        #[arg(long)]
        no_endpoint_probes: bool,
    },
    /// Ask the leader to fence a host.
    Fence {
        /// The host.
        host: String,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
        /// Skip policy gates (never the safety rules).
        #[arg(long)]
        force: bool,
        /// Power off and leave off: the Node is handled as in a remediation, then the host
        /// stays off and its remediation needs a person (`action: PowerOff`).
        #[arg(long)]
        power_off: bool,
        /// The inventory file.
        #[arg(
            long,
            env = "METALGUARD_INVENTORY",
            required_unless_present = "kubeconfig"
        )]
        inventory: Option<PathBuf>,
        /// Kubernetes mode: create a `FenceRequest` and wait for the leader's verdict.
        #[command(flatten)]
        cluster: ClusterArgs,
        /// How long to wait for the verdict (Kubernetes mode); without one the command
        /// fails and the request stays, to be answered when a controller leads.
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        wait: std::time::Duration,
    },
    /// A fence drill: a real power cycle of one healthy host through the path a fence takes
    /// (executor, BMC, verification, Node handling, power on), to prove it works before it
    /// is needed. Skips no gate: only while no host is unhealthy or being remediated, and only
    /// when the quorum guard allows a fence of it. Recorded as a drill.
    Drill {
        /// The host.
        host: String,
        /// Why (recorded).
        #[arg(long)]
        reason: String,
        /// The inventory file.
        #[arg(
            long,
            env = "METALGUARD_INVENTORY",
            required_unless_present = "kubeconfig"
        )]
        inventory: Option<PathBuf>,
        /// Kubernetes mode: create a `FenceRequest` with `action: Drill` and wait for the
        /// leader's verdict.
        #[command(flatten)]
        cluster: ClusterArgs,
        /// How long to wait for the verdict (Kubernetes mode).
        #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
        wait: std::time::Duration,
    },
    /// Check a host's BMC now: the agent that would execute its fence logs in with the
    /// credentials a fence would use, reads the power state and the system's identity (never
    /// changing power) and the verdict is printed. Exit status 1 when the check failed or no
    /// answer came within `--wait`.
    CheckBmc {
        /// The host whose BMC is checked.
        host: String,
        /// The inventory file.
        #[arg(
            long,
            env = "METALGUARD_INVENTORY",
            required_unless_present = "kubeconfig"
        )]
        inventory: Option<PathBuf>,
        /// Kubernetes mode: write `spec.bmcCheckRequest` on the host's `GuardedHost` and wait
        /// for `status.bmcCheckAnswered`.
        #[command(flatten)]
        cluster: ClusterArgs,
        /// How long to wait for the answer.
        #[arg(long, default_value = "60s", value_parser = humantime::parse_duration)]
        wait: std::time::Duration,
    },
    /// Retire a control-plane host: its etcd member is replaced (add its replacement to the
    /// inventory), removed, its hooks released, and then it is powered off.
    Retire {
        /// The host.
        host: String,
        /// Why (recorded, shown by `status`).
        #[arg(long, required_unless_present = "cancel")]
        reason: Option<String>,
        /// Who asks, when not the person running the command (recorded next to that
        /// person's own identity, `$SUDO_USER`/`$USER` and this host's name).
        #[arg(long)]
        requested_by: Option<String>,
        /// Withdraw the retirement (refused once its power-off was issued, a replacement
        /// votes, or the member is gone or being removed).
        #[arg(long)]
        cancel: bool,
        /// The inventory file.
        #[arg(
            long,
            env = "METALGUARD_INVENTORY",
            required_unless_present = "kubeconfig"
        )]
        inventory: Option<PathBuf>,
        /// Kubernetes mode: declare it in the `GuardedHost`'s `spec.retirement`.
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Hand a host held after a break-glass fence (`metalguard-agent fence --direct`) back to
    /// metalguard: its holds are marked released (and never honoured again); a silent host is
    /// then remediated like any other (powered on).
    Release {
        /// The held host.
        host: String,
        /// Why (recorded with the release).
        #[arg(long)]
        reason: String,
        /// The inventory file.
        #[arg(
            long,
            env = "METALGUARD_INVENTORY",
            required_unless_present = "kubeconfig"
        )]
        inventory: Option<PathBuf>,
        /// Kubernetes mode: name the holds in the `GuardedHost`'s `spec.holdRelease`.
        #[command(flatten)]
        cluster: ClusterArgs,
    },
    /// Check the inventory, the files it names (BMC credentials, the etcd CA, client
    /// certificate, key and password) and the TLS files; print every problem.
    CheckConfig {
        /// The inventory file.
        #[arg(long, env = "METALGUARD_INVENTORY")]
        inventory: PathBuf,
    },
    /// Print the OpenAPI document of the agent API.
    Openapi,
    /// Print the CustomResourceDefinitions of the Kubernetes backend as YAML
    /// (`packaging/kubernetes/crds.yaml`).
    #[cfg(feature = "kubernetes")]
    Crd,
    /// Create the cluster CA and certificates.
    #[command(subcommand)]
    Certs(CertsCommand),
}

/// The default leader election Lease (`run --lease-name`).
#[cfg(feature = "kubernetes")]
pub(super) const LEASE_NAME: &str = "metalguard-controller";

/// The backends of `run`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(super) enum BackendKind {
    /// An inventory file; state and leadership in the guarded etcd.
    Standalone,
    /// The cluster's metalguard resources; state in their status, leadership in a Lease.
    Kubernetes,
}

/// Where `status`, `fence`, `retire` and `release` reach the cluster in Kubernetes mode.
#[derive(Debug, clap::Args)]
pub(super) struct ClusterArgs {
    /// A kubeconfig (its current context): reach the state through the cluster's metalguard
    /// resources, as that user (the API server's RBAC decides what it may do).
    #[arg(long, conflicts_with = "inventory")]
    pub(super) kubeconfig: Option<PathBuf>,
    /// The namespace of the metalguard resources (with `--kubeconfig`).
    #[arg(
        long,
        env = "METALGUARD_NAMESPACE",
        default_value = "metalguard-system"
    )]
    pub(super) namespace: String,
}

impl ClusterArgs {
    /// The cluster to reach, when `--kubeconfig` was given.
    #[cfg(feature = "kubernetes")]
    pub(super) fn target(&self) -> Option<crate::cli::kube::Target> {
        self.kubeconfig
            .clone()
            .map(|kubeconfig| crate::cli::kube::Target {
                kubeconfig,
                namespace: self.namespace.clone(),
            })
    }

    /// Without the Kubernetes backend, `--kubeconfig` is an error.
    #[cfg(not(feature = "kubernetes"))]
    pub(super) fn refuse_kubeconfig(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.kubeconfig.is_none(),
            "--kubeconfig: this metalguard-controller was built without the Kubernetes backend"
        );
        Ok(())
    }
}

/// The standalone inventory, required when no cluster is named.
pub(super) fn inventory_path(inventory: Option<PathBuf>) -> anyhow::Result<PathBuf> {
    inventory.context("--inventory (or --kubeconfig) is required")
}

/// Settings of the Kubernetes backend (ignored by the standalone one, whose inventory file has them).
#[derive(Debug, clap::Args)]
pub(super) struct KubeArgs {
    /// The namespace of the metalguard resources, Lease and Events.
    #[arg(
        long,
        env = "METALGUARD_NAMESPACE",
        default_value = "metalguard-system"
    )]
    pub(super) namespace: String,
    /// The namespace of the BMC credentials Secrets that `GuardedHost`s name (the only
    /// Secrets the controller may read; keep nothing else there).
    #[arg(
        long,
        env = "METALGUARD_CREDENTIALS_NAMESPACE",
        default_value = "metalguard-bmc"
    )]
    pub(super) credentials_namespace: String,
    /// The leader election Lease.
    #[arg(long, default_value = "metalguard-controller")]
    pub(super) lease_name: String,
    /// Take each host's node lease (`coordination.k8s.io/v1` Lease `medik8s-leases/node-NAME`,
    /// holder `metalguard`, as Node Health Check and Node Maintenance do) before disrupting
    /// it, and start nothing while another actor holds it.
    #[arg(
        long,
        env = "METALGUARD_NODE_LEASES",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub(super) node_leases: bool,
    /// This controller's pod (the Deployment sets it from the downward API): labelled
    /// `metalguard.io/leader=true` while it leads, so the Service reaches only the leader.
    #[arg(long, env = "METALGUARD_POD_NAME")]
    pub(super) pod_name: Option<String>,
    /// The pod's namespace; it must be `--namespace` (RBAC lets the controller patch pods
    /// there only).
    #[arg(long, env = "METALGUARD_POD_NAMESPACE")]
    pub(super) pod_namespace: Option<String>,
    /// The agent API address (mTLS).
    #[arg(long, env = "METALGUARD_LISTEN", default_value = "0.0.0.0:8443")]
    pub(super) listen: std::net::SocketAddr,
    /// The Prometheus endpoint address.
    #[arg(long, env = "METALGUARD_METRICS_LISTEN")]
    pub(super) metrics_listen: Option<std::net::SocketAddr>,
    /// The directory with `controller.pem`, `controller-key.pem` and `ca.pem` (a mounted Secret).
    #[arg(
        long,
        env = "METALGUARD_TLS_DIR",
        default_value = "/etc/metalguard/tls"
    )]
    pub(super) tls_dir: PathBuf,
    /// A deny list of agent certificates (`serial HEX` / `sha256 HEX` per line), re-read
    /// when it changes (a mounted ConfigMap).
    #[arg(long, env = "METALGUARD_REVOKED_CERTIFICATES")]
    pub(super) revoked_certificates: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub(super) enum CertsCommand {
    /// Create a CA in DIR, and the controllers' hmac key (`hmac.key`) unless DIR has one.
    /// Run it on an offline machine: the CA key never goes to the controller hosts.
    Init {
        /// Directory.
        dir: PathBuf,
        /// How long the CA is valid, in days.
        #[arg(long, default_value_t = certs::DEFAULT_CA_DAYS)]
        days: u32,
    },
    /// Issue a certificate for NAME signed by the CA in DIR (valid one year by default);
    /// prints its serial and fingerprint, which a deny list names to revoke it.
    Issue {
        /// Host name (agent) or controller name (`--server`).
        name: String,
        /// Directory holding the CA.
        dir: PathBuf,
        /// A server certificate for the controller (adds localhost and 127.0.0.1).
        #[arg(long)]
        server: bool,
        /// Extra subject alternative names (names or IP addresses).
        #[arg(long = "san")]
        sans: Vec<String>,
        /// How long the certificate is valid, in days (never past the CA's end).
        #[arg(long, default_value_t = certs::DEFAULT_DAYS)]
        days: u32,
        /// Replace NAME's existing certificate and key (a renewal; a running agent picks the
        /// new pair up by itself). Prints the old serial, to revoke once renewed everywhere.
        #[arg(long)]
        renew: bool,
    },
    /// Print a certificate's host, serial, SHA-256 fingerprint and end of validity.
    Show {
        /// The certificate (PEM).
        cert: PathBuf,
    },
    /// Create or rotate the controllers' hmac key file: with no option, create FILE with one
    /// key; `--add` appends a key that verifies but does not sign yet; `--promote ID` makes
    /// it the signing key; `--remove ID` drops a key (docs/threat-model.md, rotation).
    HmacKey {
        /// The key file (mode 0600).
        file: PathBuf,
        /// Append a new key.
        #[arg(long, conflicts_with_all = ["promote", "remove"])]
        add: bool,
        /// Make the key with this id the signing key.
        #[arg(long, conflicts_with = "remove")]
        promote: Option<String>,
        /// Drop the key with this id.
        #[arg(long)]
        remove: Option<String>,
    },
}
