//! What people ask of the standalone store outside the loop: `fence` and `retire` requests,
//! cancelled retirements, released holds (each a guarded, sealed record the leader reads), and
//! etcd's alarms for `status`.

use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse};
use metalguard_api::plan::OperationId;
use metalguard_api::snapshot::{FenceRequest, Retirement};

use super::{
    BMC_CHECK_REQUESTS, EtcdAlarm, EtcdBackend, FENCE_REQUESTS, HOLDS, OPERATIONS, RETIREMENTS,
};
use crate::backend::{Backend, BackendError, BmcCheckRequest, HoldRelease, StoredHold};

impl EtcdBackend {
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
        self.put_request("fence request", &format!("{FENCE_REQUESTS}{host}"), request)
            .await
    }

    /// Puts a person's request under `sub`, sealed by no leadership (token 0).
    async fn put_request<T: serde::Serialize>(
        &mut self,
        what: &'static str,
        sub: &str,
        request: &T,
    ) -> Result<(), BackendError> {
        let key = self.key(sub);
        let value = self.seal(sub, 0, request)?;
        self.etcd
            .call(what, |mut c| {
                let (key, value) = (key.clone(), value.clone());
                async move { c.put(key, value, None).await }
            })
            .await?;
        Ok(())
    }

    /// Records a person's on-demand check of `host`'s BMC (replacing an earlier one): the
    /// leader hands its id to the agent that would execute the host's fence.
    pub async fn request_bmc_check(
        &mut self,
        host: &str,
        request: &BmcCheckRequest,
    ) -> Result<(), BackendError> {
        let sub = format!("{BMC_CHECK_REQUESTS}{host}");
        self.put_request("bmc check request", &sub, request).await
    }

    /// Records an administrator's retirement request unless one is already recorded for
    /// `host`; returns the request in force (the earlier one when there was one: its time
    /// identifies the retirement's power-off).
    pub async fn request_retirement(
        &mut self,
        host: &str,
        request: &Retirement,
    ) -> Result<Retirement, BackendError> {
        let sub = format!("{RETIREMENTS}{host}");
        let key = self.key(&sub);
        let value = self.seal(&sub, 0, request)?;
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
            TxnOpResponse::Get(get) => get
                .kvs()
                .first()
                .map(|kv| (kv.value().to_vec(), kv.mod_revision())),
            _ => None,
        });
        let Some((bytes, written)) = existing else {
            return Err(BackendError::Refused { what: key });
        };
        // The request in force must open like any record: one nobody sealed is not a
        // retirement (the leader ignores it), and it blocks this one until it is deleted.
        let keys = self.keys.as_mut().ok_or(BackendError::NoKey)?.current();
        match keys.open(&sub, &bytes, written, None) {
            Ok((value, _)) => {
                serde_json::from_value(value).map_err(|source| BackendError::Decode { key, source })
            }
            Err(rejection) => Err(BackendError::Refused {
                what: format!(
                    "{key}, whose record is not believed ({rejection}: delete it after finding out who wrote it)"
                ),
            }),
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

    /// Releases every hold of `target` in force (recorded, or only carried by a stored
    /// report): each record is written with `release`, in one transaction that checks no
    /// record changed since it was read. Returns the holds released (empty: none in force);
    /// an error [`BackendError::Refused`] when a record changed meanwhile (try again).
    pub async fn release_holds(
        &mut self,
        target: &str,
        release: &HoldRelease,
    ) -> Result<Vec<StoredHold>, BackendError> {
        let state = self.load().await?;
        let active = state.active_holds_of(target);
        if active.is_empty() {
            return Ok(active);
        }
        let root = format!("{}/", self.prefix);
        let response = self
            .etcd
            .call("read holds", |mut c| {
                let key = format!("{root}{HOLDS}");
                async move { c.get(key, Some(GetOptions::new().with_prefix())).await }
            })
            .await?;
        let mut compares = Vec::new();
        let mut ops = Vec::new();
        let mut released = Vec::new();
        for mut record in active {
            let key = self.key(&format!("{HOLDS}{}", record.hold.id));
            let revision = response
                .kvs()
                .iter()
                .find(|kv| kv.key() == key.as_bytes())
                .map(etcd_client::KeyValue::mod_revision);
            compares.push(match revision {
                Some(revision) => Compare::mod_revision(key.clone(), CompareOp::Equal, revision),
                None => Compare::version(key.clone(), CompareOp::Equal, 0),
            });
            record.released = Some(release.clone());
            let sub = format!("{HOLDS}{}", record.hold.id);
            ops.push(TxnOp::put(key, self.seal(&sub, 0, &record)?, None));
            released.push(record);
        }
        let txn = Txn::new().when(compares).and_then(ops);
        let response = self
            .etcd
            .call("release holds", |mut c| {
                let txn = txn.clone();
                async move { c.txn(txn).await }
            })
            .await?;
        if response.succeeded() {
            Ok(released)
        } else {
            Err(BackendError::Refused {
                what: format!("a hold of {target} changed meanwhile; the release"),
            })
        }
    }
}
