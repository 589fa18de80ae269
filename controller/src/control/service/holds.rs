//! Break-glass holds reaching the controller loop: posted by the agent CLI (`Inbound::Hold`)
//! or carried in reports. Both are stored as [`StoredHold`] records (leader-guarded, created
//! once per id); a released id is never taken again while its record is kept. Within the
//! bounds of `backend::holds`: holds in force per host and per agent, released records
//! forgotten after their retention.

use metalguard_api::text::escaped;

use super::Controller;
use crate::api::hub::HoldError;
use crate::backend::holds::{HOLD_RETENTION, expired_holds, refuse_hold};
use crate::backend::{Backend, StoredHold, Write};
use crate::clock::now;

/// Hold ids remembered for logging once.
const MAX_WARNED_HOLDS: usize = 4096;

impl<B: Backend> Controller<B> {
    /// Logs, once per id, a reported hold whose id says another host made it (it is ignored).
    pub(super) fn note_foreign_holds(&mut self, report: &metalguard_api::protocol::AgentReport) {
        for hold in &report.holds {
            if !crate::backend::state::hold_made_by(hold, &report.host)
                && self.holds_warned.insert(hold.id.clone())
            {
                tracing::warn!(host = %report.host, hold = %hold.id, target = %hold.target, "reported hold ignored: its id is not <reporting host>/<milliseconds>");
            }
        }
    }

    /// Records a hold posted by `host`'s agent: 422 for a target outside the inventory, 409
    /// for a released id; a repeat answers `first: false`.
    pub(super) async fn persist_posted_hold(
        &mut self,
        host: &str,
        hold: metalguard_api::snapshot::Hold,
    ) -> Result<metalguard_api::protocol::HoldAck, HoldError> {
        if self.inventory.host(&hold.target).is_none() {
            return Err(HoldError::Invalid(format!(
                "hold target {} is not an inventory host",
                hold.target
            )));
        }
        let state = self
            .backend
            .load()
            .await
            .map_err(|e| HoldError::Unavailable(crate::error::chain(&e)))?;
        let id = hold.id.clone();
        if let Some(record) = state.hold_records.get(&id) {
            return match &record.released {
                Some(release) => Err(HoldError::Released(format!(
                    "hold {id} was released by {} at {}; it is not honoured again",
                    release.by, release.at
                ))),
                None => Ok(metalguard_api::protocol::HoldAck { id, first: false }),
            };
        }
        let record = StoredHold {
            hold,
            reported_by: host.to_owned(),
            recorded_at: now(),
            released: None,
        };
        if let Some(why) = refuse_hold(&state.hold_records, &record, record.recorded_at) {
            tracing::warn!(hold = %record.hold.id, target = %record.hold.target, agent = %host, reason = %why, "posted hold not recorded");
            return Err(HoldError::Invalid(why));
        }
        self.backend
            .apply(vec![Write::CreateHold(record.clone())])
            .await
            .map_err(|e| HoldError::Unavailable(crate::error::chain(&e)))?;
        log_recorded(&record, "posted");
        Ok(metalguard_api::protocol::HoldAck { id, first: true })
    }

    /// Records the holds that stored reports carry and the store has no record of; true when
    /// it wrote one (the next round plans with it; it is honoured meanwhile anyway).
    pub(super) async fn record_reported_holds(&mut self, state: &crate::backend::State) -> bool {
        let mut wrote = false;
        // Ids warned about are remembered to log each once; a flood of new ids must not grow
        // the memory without bound either (then some are logged again).
        if self.holds_warned.len() > MAX_WARNED_HOLDS {
            self.holds_warned.clear();
        }
        let mut records = state.hold_records.clone();
        for record in state.unrecorded_holds() {
            if self.inventory.host(&record.hold.target).is_none() {
                if self.holds_warned.insert(record.hold.id.clone()) {
                    tracing::warn!(hold = %record.hold.id, target = %record.hold.target, agent = %record.reported_by, "reported hold not recorded: its target is not an inventory host");
                }
                continue;
            }
            if let Some(why) = refuse_hold(&records, &record, now()) {
                if self.holds_warned.insert(record.hold.id.clone()) {
                    tracing::warn!(hold = %record.hold.id, target = %record.hold.target, agent = %record.reported_by, reason = %why, "reported hold not recorded");
                }
                continue;
            }
            match self
                .backend
                .apply(vec![Write::CreateHold(record.clone())])
                .await
            {
                Ok(()) => {
                    log_recorded(&record, "reported");
                    records.insert(record.hold.id.clone(), record);
                    wrote = true;
                }
                Err(error) => {
                    tracing::warn!(hold = %record.hold.id, error = %crate::error::chain(&error), "reported hold not recorded yet");
                }
            }
        }
        wrote | self.forget_expired_holds(state).await
    }

    /// Deletes the records of holds released longer than [`HOLD_RETENTION`] ago; true when it
    /// deleted one.
    async fn forget_expired_holds(&mut self, state: &crate::backend::State) -> bool {
        let expired = expired_holds(&state.hold_records, now());
        if expired.is_empty() {
            return false;
        }
        let writes = expired.iter().cloned().map(Write::DeleteHold).collect();
        match self.backend.apply(writes).await {
            Ok(()) => {
                tracing::info!(holds = ?expired, retention = %humantime::format_duration(HOLD_RETENTION), "released holds forgotten after their retention");
                true
            }
            Err(error) => {
                tracing::warn!(error = %crate::error::chain(&error), "released holds not forgotten yet");
                false
            }
        }
    }
}

/// Logs a hold the store took: a person took `target` over.
fn log_recorded(record: &StoredHold, via: &str) {
    let hold = &record.hold;
    tracing::warn!(
        hold = %escaped(&hold.id),
        target = %hold.target,
        by = %escaped(&hold.by),
        reason = %escaped(&hold.reason),
        action = %escaped(&hold.action),
        agent = %record.reported_by,
        via,
        "break-glass hold recorded: the host is left alone until `metalguard-controller release` hands it back"
    );
}
