//! The standalone backend: state and leadership in the guarded etcd under a key prefix.
//!
//! Leadership is a lease-guarded key `PREFIX/leader` created with a transaction
//! (`create_revision == 0`). Its create revision is this controller's fencing token: every
//! write of the controller loop is a transaction that compares the leader key's create
//! revision with the token, so a controller that lost its lease (paused, partitioned) cannot
//! write even if it still believes it leads. A dead leader's key vanishes with its lease,
//! so a successor takes over within the lease time to live.
//!
//! Keys: `leader`, `reports/HOST`, `operations/ID`, `remediations/ID`,
//! `fence-requests/HOST`, `retirements/HOST`, `hooks/HOST`, `notes`, all JSON.

use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use metalguard_api::plan::OperationId;
use metalguard_api::snapshot::{FenceRequest, Retirement};
use serde::Serialize;

use super::access::EtcdAccess;
use super::failover::{Endpoints, timed_out};
use super::{Backend, BackendError, Leadership, State, StoredReport, Write};

/// Sub-keys under the prefix.
const LEADER: &str = "leader";
const REPORTS: &str = "reports/";
const OPERATIONS: &str = "operations/";
const REMEDIATIONS: &str = "remediations/";
const FENCE_REQUESTS: &str = "fence-requests/";
const HOOKS: &str = "hooks/";
const RETIREMENTS: &str = "retirements/";
const NOTES: &str = "notes";
/// Pause before re-establishing a broken watch.
const WATCH_RETRY: Duration = Duration::from_secs(1);

struct Lease {
    id: i64,
    token: i64,
}

/// One active etcd alarm.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct EtcdAlarm {
    /// The member that raised it.
    pub member_id: u64,
    /// That member's name (the host, by convention), empty when the member list lacks it.
    pub member: String,
    /// `NOSPACE` or `CORRUPT`.
    pub alarm: String,
}

/// State and leadership in etcd.
pub struct EtcdBackend {
    etcd: Endpoints,
    prefix: String,
    identity: String,
    lease_ttl: Duration,
    lease: Option<Lease>,
}

fn encode<T: Serialize>(value: &T) -> Result<String, BackendError> {
    serde_json::to_string(value).map_err(|source| BackendError::Decode {
        key: "(new record)".to_owned(),
        source,
    })
}

impl EtcdBackend {
    /// A backend over `endpoints` (one client each, connected on first use) reached with
    /// `access` (TLS files, user, the request timeout), its keys under `access.prefix()`.
    pub fn new(
        endpoints: &[String],
        access: EtcdAccess,
        identity: String,
        lease_ttl: Duration,
    ) -> Self {
        Self {
            prefix: access.prefix().to_owned(),
            etcd: Endpoints::new(endpoints, access),
            identity,
            lease_ttl,
            lease: None,
        }
    }

    fn key(&self, sub: &str) -> String {
        format!("{}/{sub}", self.prefix)
    }

    /// The alarms active in etcd (`etcdctl alarm list`), each with the name of the member that
    /// raised it when the member list names it. Read from etcd itself, not from the stored
    /// reports: while NOSPACE is active etcd refuses every write, this store's included, so
    /// the agents' reports of the alarm cannot be recorded.
    pub async fn alarms(&mut self) -> Result<Vec<EtcdAlarm>, BackendError> {
        let alarms = self
            .etcd
            .call("alarm list", |mut c| async move {
                c.alarm(
                    etcd_client::AlarmAction::Get,
                    etcd_client::AlarmType::None,
                    None,
                )
                .await
            })
            .await?;
        let members = self
            .etcd
            .call("member list", |mut c| async move { c.member_list().await })
            .await?;
        Ok(alarms
            .alarms()
            .iter()
            .map(|a| EtcdAlarm {
                member_id: a.member_id(),
                member: members
                    .members()
                    .iter()
                    .find(|m| m.id() == a.member_id())
                    .map(|m| m.name().to_owned())
                    .unwrap_or_default(),
                alarm: a.alarm().as_str_name().to_owned(),
            })
            .collect())
    }

    /// Records an administrator's fence request (read by the leader's next plan).
    pub async fn request_fence(
        &mut self,
        host: &str,
        request: &FenceRequest,
    ) -> Result<(), BackendError> {
        let key = self.key(&format!("{FENCE_REQUESTS}{host}"));
        let value = encode(request)?;
        self.etcd
            .call("fence request", |mut c| {
                let (key, value) = (key.clone(), value.clone());
                async move { c.put(key, value, None).await }
            })
            .await?;
        Ok(())
    }

    /// Records an administrator's retirement request unless one is already recorded for
    /// `host`; returns the request in force (the earlier one when there was one: its time
    /// identifies the retirement's power-off).
    pub async fn request_retirement(
        &mut self,
        host: &str,
        request: &Retirement,
    ) -> Result<Retirement, BackendError> {
        let key = self.key(&format!("{RETIREMENTS}{host}"));
        let value = encode(request)?;
        let txn = Txn::new()
            .when(vec![Compare::version(key.clone(), CompareOp::Equal, 0)])
            .and_then(vec![TxnOp::put(key.clone(), value, None)])
            .or_else(vec![TxnOp::get(key.clone(), None)]);
        let response = self
            .etcd
            .call("retirement request", |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        if response.succeeded() {
            return Ok(request.clone());
        }
        let existing = response.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(get) => get.kvs().first().map(|kv| kv.value().to_vec()),
            _ => None,
        });
        match existing {
            Some(bytes) => serde_json::from_slice(&bytes)
                .map_err(|source| BackendError::Decode { key, source }),
            None => Err(BackendError::Refused { what: key }),
        }
    }

    /// Withdraws the retirement request of `host`, only while no operation `blocker` exists
    /// (the first attempt of its member's removal): checked in the same transaction, so a
    /// cancel never races a removal the leader has already persisted. False when refused.
    pub async fn cancel_retirement(
        &mut self,
        host: &str,
        blockers: &[OperationId],
    ) -> Result<bool, BackendError> {
        let key = self.key(&format!("{RETIREMENTS}{host}"));
        let compares: Vec<Compare> = blockers
            .iter()
            .map(|id| Compare::version(self.key(&format!("{OPERATIONS}{id}")), CompareOp::Equal, 0))
            .collect();
        let txn = Txn::new()
            .when(compares)
            .and_then(vec![TxnOp::delete(key, None)]);
        let response = self
            .etcd
            .call("retirement cancel", |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        Ok(response.succeeded())
    }

    async fn renew(&mut self) -> Result<Option<Leadership>, BackendError> {
        let timeout = self.etcd.timeout();
        let Some((lease_id, token)) = self.lease.as_ref().map(|l| (l.id, l.token)) else {
            return Ok(None);
        };
        // The keep-alive is a stream, which the client's request timeout does not cover;
        // without quorum it would wait forever, so it gets its own deadline. A fresh stream
        // per round: a stream broken by an outage never blocks renewal after it.
        let answer = self
            .etcd
            .call("lease keep-alive", |mut client| async move {
                let renewal = async {
                    let (mut keeper, mut stream) = client.lease_keep_alive(lease_id).await?;
                    keeper.keep_alive().await?;
                    stream.message().await
                };
                tokio::time::timeout(timeout, renewal)
                    .await
                    .unwrap_or_else(|_| Err(timed_out("lease keep-alive", timeout)))
            })
            .await;
        let answer = match answer {
            // The lease ran out while etcd had no quorum (or we were away): etcd answers
            // "requested lease not found" to every keep-alive from now on. The lease is lost,
            // not the store; campaign again with a new one.
            Err(error) if crate::cli::chain(&error).contains("lease not found") => None,
            other => other?,
        };
        if answer.is_some_and(|a| a.ttl() > 0) {
            let key = self.key(LEADER);
            let current = self
                .etcd
                .call("leader key", |mut c| {
                    let key = key.clone();
                    async move { c.get(key, None).await }
                })
                .await?;
            if current
                .kvs()
                .first()
                .is_some_and(|kv| kv.create_revision() == token)
            {
                return Ok(Some(Leadership::Leader));
            }
        }
        tracing::warn!(identity = %self.identity, "leader lease lost");
        self.lease = None;
        Ok(None)
    }
}

impl Backend for EtcdBackend {
    async fn campaign(&mut self) -> Result<Leadership, BackendError> {
        if let Some(leadership) = self.renew().await? {
            return Ok(leadership);
        }
        let ttl = i64::try_from(self.lease_ttl.as_secs()).unwrap_or(i64::MAX);
        let grant = self
            .etcd
            .call("lease grant", |mut c| async move {
                c.lease_grant(ttl, None).await
            })
            .await?;
        let key = self.key(LEADER);
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                key.clone(),
                CompareOp::Equal,
                0,
            )])
            .and_then(vec![TxnOp::put(
                key.clone(),
                self.identity.clone(),
                Some(PutOptions::new().with_lease(grant.id())),
            )])
            .or_else(vec![TxnOp::get(key, None)]);
        let response = self
            .etcd
            .call("leader election", |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        if response.succeeded() {
            let token = response
                .header()
                .map_or(0, etcd_client::ResponseHeader::revision);
            tracing::info!(identity = %self.identity, token, "became leader");
            self.lease = Some(Lease {
                id: grant.id(),
                token,
            });
            return Ok(Leadership::Leader);
        }
        // Not ours: give the unused lease back at once.
        let id = grant.id();
        let _ = self
            .etcd
            .call(
                "lease revoke",
                |mut c| async move { c.lease_revoke(id).await },
            )
            .await;
        let holder = response.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(get) => get
                .kvs()
                .first()
                .and_then(|kv| kv.value_str().ok().map(str::to_owned)),
            _ => None,
        });
        Ok(Leadership::Follower { holder })
    }

    async fn resign(&mut self) {
        if let Some(lease) = self.lease.take() {
            let id = lease.id;
            let _ = self
                .etcd
                .call(
                    "lease revoke",
                    |mut c| async move { c.lease_revoke(id).await },
                )
                .await;
            tracing::info!(identity = %self.identity, "resigned leadership");
        }
    }

    async fn load(&mut self) -> Result<State, BackendError> {
        let root = format!("{}/", self.prefix);
        let response = self
            .etcd
            .call("load state", |mut c| {
                let root = root.clone();
                async move { c.get(root, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        let mut state = State::default();
        for kv in response.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let sub = key.strip_prefix(&root).unwrap_or(&key);
            let decode = |source| BackendError::Decode {
                key: key.clone(),
                source,
            };
            if sub == LEADER {
                state.leader = Some(String::from_utf8_lossy(kv.value()).into_owned());
            } else if let Some(host) = sub.strip_prefix(REPORTS) {
                let report: StoredReport = serde_json::from_slice(kv.value()).map_err(decode)?;
                state.reports.insert(host.to_owned(), report);
            } else if sub.starts_with(OPERATIONS) {
                let op: super::StoredOperation =
                    serde_json::from_slice(kv.value()).map_err(decode)?;
                state.operations.insert(op.id.clone(), op);
            } else if sub.starts_with(REMEDIATIONS) {
                let r: metalguard_api::remediation::Remediation =
                    serde_json::from_slice(kv.value()).map_err(decode)?;
                state.remediations.insert(r.id.clone(), r);
            } else if let Some(host) = sub.strip_prefix(FENCE_REQUESTS) {
                let request: FenceRequest = serde_json::from_slice(kv.value()).map_err(decode)?;
                state.fence_requests.insert(host.to_owned(), request);
            } else if let Some(host) = sub.strip_prefix(RETIREMENTS) {
                let request: Retirement = serde_json::from_slice(kv.value()).map_err(decode)?;
                state.retirements.insert(host.to_owned(), request);
            } else if sub == NOTES {
                state.notes = Some(serde_json::from_slice(kv.value()).map_err(decode)?);
            } else if let Some(host) = sub.strip_prefix(HOOKS) {
                let hooks = serde_json::from_slice(kv.value()).map_err(decode)?;
                state.hooks.insert(host.to_owned(), hooks);
            }
        }
        Ok(state)
    }

    fn watch_inputs(
        &self,
        wake: tokio::sync::mpsc::Sender<()>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let fences = watch_prefix(self.etcd.share(), self.key(FENCE_REQUESTS), wake.clone());
        let retirements = watch_prefix(self.etcd.share(), self.key(RETIREMENTS), wake);
        async move {
            tokio::join!(fences, retirements);
        }
    }

    async fn record_report(&mut self, report: &StoredReport) -> Result<(), BackendError> {
        let key = self.key(&format!("{REPORTS}{}", report.report.host));
        let value = encode(report)?;
        self.etcd
            .call("record report", |mut c| {
                let (key, value) = (key.clone(), value.clone());
                async move { c.put(key, value, None).await }
            })
            .await?;
        Ok(())
    }

    async fn apply(&mut self, writes: Vec<Write>) -> Result<(), BackendError> {
        if writes.is_empty() {
            return Ok(());
        }
        let Some(token) = self.lease.as_ref().map(|l| l.token) else {
            return Err(BackendError::Refused {
                what: "leadership".to_owned(),
            });
        };
        let mut compares = vec![Compare::create_revision(
            self.key(LEADER),
            CompareOp::Equal,
            token,
        )];
        let mut ops = Vec::new();
        let mut first_created = None;
        for write in writes {
            match write {
                Write::CreateOperation(op) => {
                    let key = self.key(&format!("{OPERATIONS}{}", op.id));
                    compares.push(Compare::version(key.clone(), CompareOp::Equal, 0));
                    first_created.get_or_insert_with(|| op.id.to_string());
                    ops.push(TxnOp::put(key, encode(&op)?, None));
                }
                Write::PutOperation(op) => {
                    let key = self.key(&format!("{OPERATIONS}{}", op.id));
                    ops.push(TxnOp::put(key, encode(&op)?, None));
                }
                Write::PutRemediation(r) => {
                    let key = self.key(&format!("{REMEDIATIONS}{}", r.id));
                    ops.push(TxnOp::put(key, encode(&r)?, None));
                }
                Write::DeleteFenceRequest(host) => {
                    ops.push(TxnOp::delete(
                        self.key(&format!("{FENCE_REQUESTS}{host}")),
                        None,
                    ));
                }
                Write::PutHooks(host, hooks) => {
                    let key = self.key(&format!("{HOOKS}{host}"));
                    ops.push(TxnOp::put(key, encode(&hooks)?, None));
                }
                Write::PutNotes(notes) => {
                    ops.push(TxnOp::put(self.key(NOTES), encode(&notes)?, None));
                }
                // Never planned here: the standalone state has no Nodes (`State::nodes`).
                Write::Node(node) => {
                    tracing::warn!(
                        ?node,
                        "node write ignored: the standalone backend has no Node objects"
                    );
                }
            }
        }
        let txn = Txn::new().when(compares).and_then(ops);
        let response = self
            .etcd
            .call("guarded write", |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        if response.succeeded() {
            Ok(())
        } else {
            Err(BackendError::Refused {
                what: first_created.unwrap_or_else(|| "leadership".to_owned()),
            })
        }
    }
}

/// Sends on `wake` whenever a key under `prefix` changes, until `wake` is closed; survives
/// store outages by re-establishing the watch.
async fn watch_prefix(mut etcd: Endpoints, prefix: String, wake: tokio::sync::mpsc::Sender<()>) {
    loop {
        let timeout = etcd.timeout();
        let started = match etcd.next_client().await {
            Some(mut client) => {
                let watch = client.watch(prefix.clone(), Some(WatchOptions::new().with_prefix()));
                tokio::time::timeout(timeout, watch)
                    .await
                    .unwrap_or_else(|_| Err(timed_out("input watch", timeout)))
            }
            None => Err(timed_out("input watch", WATCH_RETRY)),
        };
        match started {
            Ok(mut stream) => {
                while let Ok(Some(_)) = stream.message().await {
                    if wake.send(()).await.is_err() {
                        return;
                    }
                }
            }
            Err(error) => {
                tracing::debug!(%prefix, %error, "input watch could not start");
            }
        }
        if wake.is_closed() {
            return;
        }
        tokio::time::sleep(WATCH_RETRY).await;
    }
}
