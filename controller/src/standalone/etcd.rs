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
//! `fence-requests/HOST`, `consumed-fence-requests/NONCE` ([`replay`]), `retirements/HOST`,
//! `holds/ID` (ID = `<agent host>/<ms>`, so the key has two segments), `hooks/HOST`, `notes`,
//! all JSON. Every value
//! but the leader key's is sealed ([`crate::pki::seal`]): written with an HMAC made with the
//! controllers' key and this writer's fencing token, and read only if the seal holds. A value
//! that does not open (written by hand, altered, sealed with an unknown key) is left out of
//! the [`State`] and listed in [`State::rejected`] instead, so nothing acts on it.

use std::time::Duration;

use etcd_client::{
    Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse, WatchOptions,
};
use serde::Serialize;

use super::access::EtcdAccess;
use super::failover::{Endpoints, timed_out};
use crate::backend::state::{RejectedRecord, StaleSeal};
use crate::backend::{Backend, BackendError, Leadership, State, StoredHold, StoredReport, Write};
use crate::pki::seal::KeyFile;

/// Sub-keys under the prefix.
mod replay;
mod requests;

pub use replay::new_nonce;

const LEADER: &str = "leader";
const REPORTS: &str = "reports/";
const OPERATIONS: &str = "operations/";
const REMEDIATIONS: &str = "remediations/";
const FENCE_REQUESTS: &str = "fence-requests/";
const HOOKS: &str = "hooks/";
const RETIREMENTS: &str = "retirements/";
const HOLDS: &str = "holds/";
const BMC_CHECK_REQUESTS: &str = "bmc-check-requests/";
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
    /// The controllers' record keys; without them nothing is written and nothing is believed.
    keys: Option<KeyFile>,
}

fn encode<T: Serialize>(value: &T) -> Result<String, BackendError> {
    serde_json::to_string(value).map_err(|source| BackendError::Decode {
        key: "(new record)".to_owned(),
        source,
    })
}

/// What kind of record a key under the prefix holds (for messages and metrics).
pub fn kind_of(sub: &str) -> &'static str {
    [
        (REPORTS, "report"),
        (OPERATIONS, "operation"),
        (REMEDIATIONS, "remediation"),
        (FENCE_REQUESTS, "fence-request"),
        (RETIREMENTS, "retirement"),
        (HOOKS, "hooks"),
        (HOLDS, "hold"),
        (BMC_CHECK_REQUESTS, "bmc-check-request"),
        (replay::CONSUMED, "consumed-fence-request"),
        (NOTES, "notes"),
    ]
    .into_iter()
    .find(|(prefix, _)| sub.starts_with(prefix))
    .map_or("other", |(_, kind)| kind)
}

/// Puts one opened record into `state` by its key; false for a key nothing reads.
fn place(
    state: &mut State,
    sub: &str,
    value: serde_json::Value,
) -> Result<bool, serde_json::Error> {
    if let Some(host) = sub.strip_prefix(REPORTS) {
        state
            .reports
            .insert(host.to_owned(), serde_json::from_value(value)?);
    } else if sub.starts_with(OPERATIONS) {
        let op: crate::backend::StoredOperation = serde_json::from_value(value)?;
        state.operations.insert(op.id.clone(), op);
    } else if sub.starts_with(REMEDIATIONS) {
        let r: metalguard_api::remediation::Remediation = serde_json::from_value(value)?;
        state.remediations.insert(r.id.clone(), r);
    } else if let Some(host) = sub.strip_prefix(FENCE_REQUESTS) {
        state
            .fence_requests
            .insert(host.to_owned(), serde_json::from_value(value)?);
    } else if let Some(host) = sub.strip_prefix(RETIREMENTS) {
        state
            .retirements
            .insert(host.to_owned(), serde_json::from_value(value)?);
    } else if let Some(host) = sub.strip_prefix(BMC_CHECK_REQUESTS) {
        state
            .bmc_check_requests
            .insert(host.to_owned(), serde_json::from_value(value)?);
    } else if sub == NOTES {
        state.notes = Some(serde_json::from_value(value)?);
    } else if let Some(host) = sub.strip_prefix(HOOKS) {
        state
            .hooks
            .insert(host.to_owned(), serde_json::from_value(value)?);
    } else if sub.starts_with(replay::CONSUMED) {
        let consumed: crate::backend::ConsumedFenceRequest = serde_json::from_value(value)?;
        state
            .consumed_fence_requests
            .insert(consumed.nonce.clone(), consumed);
    } else if sub.starts_with(HOLDS) {
        let record: StoredHold = serde_json::from_value(value)?;
        state.hold_records.insert(record.hold.id.clone(), record);
    } else {
        return Ok(false);
    }
    Ok(true)
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
            keys: None,
        }
    }

    /// Seals every record this backend writes, and believes only records whose seal holds,
    /// with the keys of `keys`.
    #[must_use]
    pub fn sealing(mut self, keys: KeyFile) -> Self {
        self.keys = Some(keys);
        self
    }

    fn key(&self, sub: &str) -> String {
        format!("{}/{sub}", self.prefix)
    }

    /// This writer's fencing token: the leader key's create revision while it leads, else 0.
    fn token(&self) -> i64 {
        self.lease.as_ref().map_or(0, |l| l.token)
    }

    /// The stored value of `record` under `sub`, sealed with `token`.
    fn seal<T: Serialize>(
        &mut self,
        sub: &str,
        token: i64,
        record: &T,
    ) -> Result<String, BackendError> {
        let value = serde_json::to_value(record).map_err(|source| BackendError::Decode {
            key: sub.to_owned(),
            source,
        })?;
        let keys = self.keys.as_mut().ok_or(BackendError::NoKey)?.current();
        encode(&keys.seal(sub, token, value))
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
            Err(error) if crate::error::chain(&error).contains("lease not found") => None,
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
                return Ok(Some(Leadership::Leader {
                    term: u64::try_from(token).unwrap_or(0),
                }));
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
            return Ok(Leadership::Leader {
                term: u64::try_from(token).unwrap_or(0),
            });
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
        let leader_key = self.key(LEADER);
        let leading = response
            .kvs()
            .iter()
            .find(|kv| kv.key() == leader_key.as_bytes())
            .map(etcd_client::KeyValue::create_revision);
        for kv in response.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            let sub = key.strip_prefix(&root).unwrap_or(&key);
            if sub == LEADER {
                state.leader = Some(String::from_utf8_lossy(kv.value()).into_owned());
                continue;
            }
            if kind_of(sub) == "other" {
                continue;
            }
            let Some(keys) = self.keys.as_mut().map(KeyFile::current) else {
                return Err(BackendError::NoKey);
            };
            let signing = keys.signing_id().to_owned();
            match keys.open(sub, kv.value(), kv.mod_revision(), leading) {
                Ok((value, by)) => {
                    if by != signing {
                        state.stale_seals.push(StaleSeal {
                            key: sub.to_owned(),
                            record: value.clone(),
                            revision: kv.mod_revision(),
                        });
                    }
                    place(&mut state, sub, value).map_err(|source| BackendError::Decode {
                        key: key.clone(),
                        source,
                    })?;
                }
                Err(rejection) => state.rejected.push(RejectedRecord {
                    key: sub.to_owned(),
                    kind: kind_of(sub).to_owned(),
                    reason: rejection.to_string(),
                }),
            }
        }
        replay::refuse_replays(&mut state, crate::clock::now());
        state.refresh_holds();
        Ok(state)
    }

    fn watch_inputs(
        &self,
        wake: tokio::sync::mpsc::Sender<()>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        let fences = watch_prefix(self.etcd.share(), self.key(FENCE_REQUESTS), wake.clone());
        let retirements = watch_prefix(self.etcd.share(), self.key(RETIREMENTS), wake.clone());
        // A release (written by the CLI) hands the host back at once.
        let holds = watch_prefix(self.etcd.share(), self.key(HOLDS), wake.clone());
        // A person waits for the answer to an on-demand check.
        let checks = watch_prefix(self.etcd.share(), self.key(BMC_CHECK_REQUESTS), wake);
        async move {
            tokio::join!(fences, retirements, holds, checks);
        }
    }

    async fn record_report(&mut self, report: &StoredReport) -> Result<(), BackendError> {
        let sub = format!("{REPORTS}{}", report.report.host);
        let key = self.key(&sub);
        let value = self.seal(&sub, self.token(), report)?;
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
                    let sub = format!("{OPERATIONS}{}", op.id);
                    let key = self.key(&sub);
                    compares.push(Compare::version(key.clone(), CompareOp::Equal, 0));
                    first_created.get_or_insert_with(|| op.id.to_string());
                    ops.push(TxnOp::put(key, self.seal(&sub, token, &op)?, None));
                }
                Write::PutOperation(op) => {
                    let sub = format!("{OPERATIONS}{}", op.id);
                    ops.push(TxnOp::put(
                        self.key(&sub),
                        self.seal(&sub, token, &op)?,
                        None,
                    ));
                }
                Write::PutRemediation(r) => {
                    let sub = format!("{REMEDIATIONS}{}", r.id);
                    ops.push(TxnOp::put(
                        self.key(&sub),
                        self.seal(&sub, token, &r)?,
                        None,
                    ));
                }
                Write::DeleteFenceRequest(host) => {
                    ops.push(TxnOp::delete(
                        self.key(&format!("{FENCE_REQUESTS}{host}")),
                        None,
                    ));
                }
                Write::PutHooks(host, hooks) => {
                    let sub = format!("{HOOKS}{host}");
                    ops.push(TxnOp::put(
                        self.key(&sub),
                        self.seal(&sub, token, &hooks)?,
                        None,
                    ));
                }
                Write::PutNotes(notes) => {
                    ops.push(TxnOp::put(
                        self.key(NOTES),
                        self.seal(NOTES, token, &notes)?,
                        None,
                    ));
                }
                Write::Reseal(stale) => {
                    // Only over the very version that was read: a record changed meanwhile
                    // is left to the writer that changed it.
                    let key = self.key(&stale.key);
                    compares.push(Compare::mod_revision(
                        key.clone(),
                        CompareOp::Equal,
                        stale.revision,
                    ));
                    ops.push(TxnOp::put(
                        key,
                        self.seal(&stale.key, token, &stale.record)?,
                        None,
                    ));
                }
                Write::CreateHold(record) => {
                    let sub = format!("{HOLDS}{}", record.hold.id);
                    let key = self.key(&sub);
                    compares.push(Compare::version(key.clone(), CompareOp::Equal, 0));
                    first_created.get_or_insert_with(|| format!("hold {}", record.hold.id));
                    ops.push(TxnOp::put(key, self.seal(&sub, token, &record)?, None));
                }
                Write::ConsumeFenceRequest(consumed) => {
                    let sub = format!("{}{}", replay::CONSUMED, consumed.nonce);
                    let key = self.key(&sub);
                    compares.push(Compare::version(key.clone(), CompareOp::Equal, 0));
                    ops.push(TxnOp::put(key, self.seal(&sub, token, &consumed)?, None));
                }
                Write::DeleteHold(id) => {
                    ops.push(TxnOp::delete(self.key(&format!("{HOLDS}{id}")), None));
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
