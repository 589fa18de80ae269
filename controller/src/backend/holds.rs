//! Bounds on the break-glass holds the store keeps, the same for both backends: at most
//! [`MAX_HOLDS_PER_TARGET`] holds in force per held host (Kubernetes' `status.holds` schema
//! bound) and [`MAX_HOLDS_PER_AGENT`] per agent that brought them, and a released hold is
//! forgotten [`HOLD_RETENTION`] after its release. One agent's certificate could otherwise
//! grow the store without bound: every hold a new key, kept after its release (84 a minute
//! within the API's rate limit, about 170,000 a day; issue 28).
//!
//! A hold made before the retention period is never recorded anew: its id could be one that
//! was released and forgotten. Pure: the caller passes `now`.

use std::collections::BTreeMap;
use std::time::Duration;

use metalguard_api::duration::Timestamp;

use super::StoredHold;

/// Holds in force per held host.
pub const MAX_HOLDS_PER_TARGET: usize = 64;
/// Holds in force that one agent brought (posted or reported).
pub const MAX_HOLDS_PER_AGENT: usize = 64;
/// How long a released hold is kept (so an agent still reporting it is told it is released)
/// before it is deleted.
pub const HOLD_RETENTION: Duration = Duration::from_secs(7 * 24 * 3600);

fn retention_start(now: Timestamp) -> Timestamp {
    let retention = u64::try_from(HOLD_RETENTION.as_millis()).unwrap_or(u64::MAX);
    Timestamp(now.as_millis().saturating_sub(retention))
}

/// Why `record` may not be recorded next to `records` at `now`, if it may not.
pub fn refuse_hold(
    records: &BTreeMap<String, StoredHold>,
    record: &StoredHold,
    now: Timestamp,
) -> Option<String> {
    let hold = &record.hold;
    if hold.since < retention_start(now) {
        return Some(format!(
            "hold {} was made more than {} ago: released holds are forgotten after that, so it is not recorded anew",
            hold.id,
            humantime::format_duration(HOLD_RETENTION)
        ));
    }
    let active = || records.values().filter(|r| r.is_active());
    let of_target = active().filter(|r| r.hold.target == hold.target).count();
    if of_target >= MAX_HOLDS_PER_TARGET {
        return Some(format!(
            "host {} has {MAX_HOLDS_PER_TARGET} holds in force already",
            hold.target
        ));
    }
    let of_agent = active()
        .filter(|r| r.reported_by == record.reported_by)
        .count();
    if of_agent >= MAX_HOLDS_PER_AGENT {
        return Some(format!(
            "agent {} brought {MAX_HOLDS_PER_AGENT} holds in force already",
            record.reported_by
        ));
    }
    None
}

/// The released holds whose retention is over at `now`, to delete.
pub fn expired_holds(records: &BTreeMap<String, StoredHold>, now: Timestamp) -> Vec<String> {
    let start = retention_start(now);
    records
        .values()
        .filter(|r| {
            r.released
                .as_ref()
                .is_some_and(|release| release.at < start)
        })
        .map(|r| r.hold.id.clone())
        .collect()
}

#[cfg(test)]
mod tests {
    use metalguard_api::snapshot::Hold;

    use super::super::HoldRelease;
    use super::*;

    const MINUTE_MS: u64 = 60_000;
    /// Posts one certificate gets through the API's rate limit in a minute (issue 28).
    const POSTS_PER_MINUTE: u64 = 84;

    fn record(agent: &str, target: &str, at: u64) -> StoredHold {
        StoredHold {
            hold: Hold {
                id: format!("{agent}/{at}"),
                target: target.into(),
                since: Timestamp(at),
                by: "mallory on w-1".into(),
                reason: "flood".into(),
                action: "off".into(),
            },
            reported_by: agent.into(),
            recorded_at: Timestamp(at),
            released: None,
        }
    }

    #[test]
    fn one_certificate_cannot_grow_the_store_past_a_bound_in_an_hour() {
        // An hour of posts at the rate limit, spread over every target, with a person
        // releasing everything every ten minutes; the leader forgets expired releases each
        // round. The clock is simulated: an hour takes no time.
        let start = 1_800_000_000_000u64;
        let targets = ["cp-1", "cp-2", "cp-3"];
        let mut store: BTreeMap<String, StoredHold> = BTreeMap::new();
        let mut largest = 0;
        for minute in 0..60 {
            for i in 0..POSTS_PER_MINUTE {
                let at = start + minute * MINUTE_MS + i * (MINUTE_MS / POSTS_PER_MINUTE);
                let now = Timestamp(at);
                let candidate = record("w-1", targets[(i % 3) as usize], at);
                if refuse_hold(&store, &candidate, now).is_none() {
                    store.insert(candidate.hold.id.clone(), candidate);
                }
                for id in expired_holds(&store, now) {
                    store.remove(&id);
                }
                largest = largest.max(store.len());
            }
            if minute % 10 == 9 {
                let at = Timestamp(start + (minute + 1) * MINUTE_MS);
                for r in store.values_mut().filter(|r| r.is_active()) {
                    r.released = Some(HoldRelease {
                        at,
                        by: "alice".into(),
                        reason: "flood".into(),
                    });
                }
            }
        }
        // In force: at most the agent's cap; released: at most what people released.
        let active = store.values().filter(|r| r.is_active()).count();
        assert!(active <= MAX_HOLDS_PER_AGENT, "{active}");
        assert!(largest <= MAX_HOLDS_PER_AGENT * 6, "{largest}");
        // Without the caps the hour would have stored every post.
        assert!(largest < (60 * POSTS_PER_MINUTE) as usize / 10, "{largest}");
        // A week after the last release every released hold is gone.
        let retention = u64::try_from(HOLD_RETENTION.as_millis()).unwrap();
        let later = Timestamp(start + 3_600_000 + retention + MINUTE_MS);
        for id in expired_holds(&store, later) {
            store.remove(&id);
        }
        assert_eq!(store.len(), active, "only holds in force remain");
    }

    #[test]
    fn the_caps_name_the_host_or_the_agent_and_an_old_hold_is_not_recorded_anew() {
        let now = Timestamp(1_800_000_000_000);
        let mut store = BTreeMap::new();
        for i in 0..MAX_HOLDS_PER_TARGET as u64 {
            let r = record(&format!("w-{}", i % 8), "cp-1", now.as_millis() - i);
            store.insert(r.hold.id.clone(), r);
        }
        let why = refuse_hold(&store, &record("w-9", "cp-1", now.as_millis()), now).unwrap();
        assert!(why.contains("host cp-1 has 64 holds in force"), "{why}");
        assert!(refuse_hold(&store, &record("w-9", "cp-2", now.as_millis()), now).is_none());
        let old = record("w-9", "cp-2", 1_000);
        let why = refuse_hold(&store, &old, now).unwrap();
        assert!(why.contains("more than 7days ago"), "{why}");
    }
}
