//! The backend interface: where the controller's inputs, persisted intent and leadership live.
//!
//! Two implementations: [`crate::standalone::etcd::EtcdBackend`] (standalone: an inventory file plus state and a
//! lease-guarded leader key in the guarded etcd) and `crate::kube::KubeBackend` (state in the
//! custom resources' status, leadership through a `Lease` object). The controller loop only ever: campaigns for leadership, loads the
//! [`State`], records reports, and applies atomic batches of [`Write`]s that succeed only
//! while it still leads — so two controllers never both act.

pub mod holds;
pub mod revisions;
pub mod state;

use std::future::Future;

pub use state::{
    BmcCheckRequest, ConsumedFenceRequest, ControllerNotes, HoldRelease, OperationKind, StaleSeal,
    State, StoredHold, StoredOperation, StoredReport,
};

use metalguard_api::remediation::Remediation;

/// What a backend call could not do.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// The store did not answer or refused us (for etcd: each endpoint tried with how it
    /// failed — TLS, authentication, permission, unreachable, timeout, no quorum). Never act
    /// blind.
    #[error("backend store is unavailable: {what}")]
    Unavailable {
        /// What was attempted.
        what: String,
        /// The cause.
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    /// A leader-guarded write was refused: leadership was lost, or an operation with the
    /// same id already exists.
    #[error("guarded write was refused: leadership lost or {what} already exists")]
    Refused {
        /// The first key whose guard may have failed.
        what: String,
    },
    /// The backend has no key to seal records with (nor to believe any).
    #[error("this controller has no hmac key: it can neither write nor believe records")]
    NoKey,
    /// Stored data did not decode.
    #[error("stored record {key} could not be decoded")]
    Decode {
        /// The key.
        key: String,
        /// The cause.
        #[source]
        source: serde_json::Error,
    },
}

/// This controller's standing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Leadership {
    /// This controller leads and may act, in leadership `term`: a number that only grows from
    /// one leadership to the next (standalone: the leader key's create revision, also the
    /// fencing token of every write; Kubernetes: a counter the leader increments on its
    /// Lease when its leadership begins). Every command carries it; agents refuse older ones.
    Leader {
        /// The leadership's term.
        term: u64,
    },
    /// Another controller leads (its identity, if known).
    Follower {
        /// The current leader's identity.
        holder: Option<String>,
    },
}

/// One change in an atomic, leader-guarded batch.
#[derive(Debug, Clone)]
pub enum Write {
    /// Persist the intent of a new operation; the batch fails if the id exists.
    CreateOperation(StoredOperation),
    /// Replace an operation (to record its result).
    PutOperation(StoredOperation),
    /// Create or replace a remediation record.
    PutRemediation(Remediation),
    /// Remove a host's pending fence request (it became a remediation).
    DeleteFenceRequest(String),
    /// Record a fence request's nonce as consumed (standalone; the batch fails if it was).
    ConsumeFenceRequest(ConsumedFenceRequest),
    /// Replace a host's preDrain hook set.
    PutHooks(String, std::collections::BTreeSet<String>),
    /// Replace the leader's notes for people.
    PutNotes(ControllerNotes),
    /// Record a break-glass hold an agent reported or posted; the batch fails if a record
    /// with its id exists (active or released: a released id is never recorded again).
    CreateHold(StoredHold),
    /// Delete the record of a hold released longer than `holds::HOLD_RETENTION` ago.
    DeleteHold(String),
    /// Act on a host's Node (Kubernetes backend only: planned only when [`State::nodes`] is
    /// set). Written after the intent that justifies it and before the phase that records it.
    Node(NodeWrite),
    /// Seal a record again with the signing key, unchanged, if it is still the version read
    /// (standalone backend only: planned only from [`State::stale_seals`]).
    Reseal(StaleSeal),
}

/// What is done to a host's Node object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeWrite {
    /// Delete the host's Node (its power-off is verified).
    Delete {
        /// The host.
        host: String,
    },
    /// Taint the host's Node `node.kubernetes.io/out-of-service` (its power-off is verified).
    TaintOutOfService {
        /// The host.
        host: String,
    },
    /// Merge the saved labels and annotations into the re-registered Node (keys on the Node
    /// win) and drop metalguard's out-of-service taint.
    Restore {
        /// The host.
        host: String,
        /// What was saved.
        backup: metalguard_api::remediation::NodeBackup,
    },
}

/// One plan round as the planner saw it: the persisted state, the snapshot judged, the plan
/// made from it and the policy it was made under. What a backend publishes comes from here,
/// never from a second read.
#[derive(Debug, Clone, Copy)]
// Only the Kubernetes backend reads it; the standalone backend's `publish` ignores it.
#[cfg_attr(not(feature = "kubernetes"), allow(dead_code))]
pub struct Judged<'a> {
    /// The state the snapshot was built from.
    pub state: &'a State,
    /// The snapshot the planner judged.
    pub snapshot: &'a metalguard_api::snapshot::Snapshot,
    /// The plan made from it.
    pub plan: &'a metalguard_api::plan::Plan,
    /// The policy it was made under.
    pub policy: &'a metalguard_api::policy::Policy,
}

/// What [`Backend::hosts_visited`] counts.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct HostsVisited {
    /// Hosts the last load read again from the backend's sources.
    pub loaded: Option<usize>,
    /// Hosts whose observed status the last publish derived again.
    pub observed: Option<usize>,
}

/// The store and leadership of one controller. `Send` futures so the loop can be spawned.
pub trait Backend: Send {
    /// Acquires or renews leadership. An error means the store is unreachable: the caller
    /// must stop acting at once.
    fn campaign(&mut self) -> impl Future<Output = Result<Leadership, BackendError>> + Send;

    /// Gives up leadership (on clean shutdown), so a successor need not wait for the lease.
    fn resign(&mut self) -> impl Future<Output = ()> + Send;

    /// Reads everything persisted.
    fn load(&mut self) -> impl Future<Output = Result<State, BackendError>> + Send;

    /// Stores an agent's latest report (not guarded: any controller may record one).
    fn record_report(
        &mut self,
        report: &StoredReport,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// Applies `writes` atomically, only if this controller still leads.
    fn apply(
        &mut self,
        writes: Vec<Write>,
    ) -> impl Future<Output = Result<(), BackendError>> + Send;

    /// The inventory when the backend's own sources of it changed (the Kubernetes backend
    /// builds it from its resources); `None` when unchanged or kept in a file.
    fn inventory(&mut self) -> Option<crate::inventory::Inventory> {
        None
    }

    /// How many hosts the last [`Backend::load`] and [`Backend::publish`] read or observed
    /// again (issue 27: a round's work); `None` for what the backend does for every host.
    fn hosts_visited(&self) -> HostsVisited {
        HostsVisited::default()
    }

    /// Tells people about a plan and what it was judged on: the Kubernetes backend writes
    /// Events for decisions and refusals, the health checks' conditions, the hosts' and the
    /// control plane's observed status, and silent agents onto their Nodes. The standalone
    /// backend logs only.
    fn publish(&mut self, judged: Judged<'_>) -> impl Future<Output = ()> + Send {
        let _ = judged;
        std::future::ready(())
    }

    /// A task that sends on `wake` whenever an input other than an agent message changes (an
    /// administrator's fence or retirement request), so the leader re-plans at once instead of on its timer.
    /// It runs until `wake` is closed and survives store outages.
    fn watch_inputs(
        &self,
        wake: tokio::sync::mpsc::Sender<()>,
    ) -> impl Future<Output = ()> + Send + 'static;
}
