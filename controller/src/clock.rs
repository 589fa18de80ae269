//! The one place the controller reads the wall clock; decisions receive `now` as data.

use std::time::{SystemTime, UNIX_EPOCH};

use metalguard_api::duration::Timestamp;

/// The current time as a [`Timestamp`] (0 if the clock is before 1970).
pub fn now() -> Timestamp {
    let ms = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    Timestamp(ms)
}
