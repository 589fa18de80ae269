//! A fence request is served once. Deleting a remediation record and putting back the sealed,
//! consumed `fence-requests/<host>` from the store's history (its seal still holds: it is the
//! very record a controller sealed) made the leader start a new forced remediation of a
//! healthy host (issue 28). So every request carries a random nonce inside its seal; when the
//! leader turns it into a remediation it records the nonce under
//! `consumed-fence-requests/<nonce>` in the same transaction (created once, sealed), a key no
//! remediation write touches; and when the state is read, a request whose nonce was consumed,
//! that has no nonce, or that is older than [`MAX_FENCE_REQUEST_AGE`] is left out of the
//! [`State`] and listed in [`State::rejected`] (shown by `status`, counted, logged once), as a
//! record whose seal does not hold is.

use std::time::Duration;

use metalguard_api::duration::Timestamp;

use crate::backend::State;
use crate::backend::state::RejectedRecord;

/// Sub-key prefix of the consumed nonces.
pub const CONSUMED: &str = "consumed-fence-requests/";
/// The oldest request the leader still serves (a request waits for the leader's next round,
/// seconds; one the guard refuses stays pending until it is served or this long).
pub const MAX_FENCE_REQUEST_AGE: Duration = Duration::from_secs(3600);
/// Random bytes of a nonce.
const NONCE_BYTES: usize = 16;

/// A new nonce for a fence request: random, hex.
pub fn new_nonce() -> Result<String, getrandom::Error> {
    use std::fmt::Write as _;
    let mut bytes = [0u8; NONCE_BYTES];
    getrandom::fill(&mut bytes)?;
    let mut text = String::with_capacity(NONCE_BYTES * 2);
    for byte in bytes {
        let _ = write!(text, "{byte:02x}");
    }
    Ok(text)
}

/// Moves every fence request of `state` that must not be served at `now` to
/// [`State::rejected`]: replayed (its nonce consumed), without a nonce, or too old.
pub fn refuse_replays(state: &mut State, now: Timestamp) {
    let max_age = u64::try_from(MAX_FENCE_REQUEST_AGE.as_millis()).unwrap_or(u64::MAX);
    let oldest = Timestamp(now.as_millis().saturating_sub(max_age));
    let mut refused = Vec::new();
    for (host, request) in &state.fence_requests {
        let why = match &request.nonce {
            None => Some(
                "fence request has no nonce: it was not made by this version's `fence`, or was altered"
                    .to_owned(),
            ),
            Some(nonce) => match state.consumed_fence_requests.get(nonce) {
                Some(consumed) => Some(format!(
                    "fence request was served already (nonce {nonce} consumed at {}): a replay",
                    consumed.at
                )),
                None if request.requested_at < oldest => Some(format!(
                    "fence request made at {} is older than {}: make a new one",
                    request.requested_at,
                    humantime::format_duration(MAX_FENCE_REQUEST_AGE)
                )),
                None => None,
            },
        };
        if let Some(reason) = why {
            refused.push((host.clone(), reason));
        }
    }
    for (host, reason) in refused {
        state.fence_requests.remove(&host);
        state.rejected.push(RejectedRecord {
            key: format!("{}{host}", super::FENCE_REQUESTS),
            kind: "fence-request".to_owned(),
            reason,
        });
    }
}

#[cfg(test)]
mod tests {
    use metalguard_api::snapshot::FenceRequest;

    use super::*;
    use crate::backend::ConsumedFenceRequest;

    const NOW: u64 = 1_800_000_000_000;

    fn request(at: u64, nonce: Option<&str>) -> FenceRequest {
        FenceRequest {
            requested_at: Timestamp(at),
            requested_by: Some("alice (cli): test".into()),
            force_reason: Some("test".into()),
            stay_off: false,
            nonce: nonce.map(Into::into),
            drill: false,
        }
    }

    #[test]
    fn a_consumed_an_old_or_a_nonceless_request_is_rejected_and_a_fresh_one_kept() {
        let mut state = State::default();
        state
            .fence_requests
            .insert("cp-1".into(), request(NOW - 1_000, Some("aa")));
        state
            .fence_requests
            .insert("cp-2".into(), request(NOW - 1_000, Some("bb")));
        state
            .fence_requests
            .insert("cp-3".into(), request(NOW - 3_700_000, Some("cc")));
        state
            .fence_requests
            .insert("cp-4".into(), request(NOW - 1_000, None));
        state.consumed_fence_requests.insert(
            "bb".into(),
            ConsumedFenceRequest {
                nonce: "bb".into(),
                host: "cp-2".into(),
                at: Timestamp(NOW - 500),
            },
        );
        refuse_replays(&mut state, Timestamp(NOW));
        assert_eq!(
            state.fence_requests.keys().collect::<Vec<_>>(),
            ["cp-1"],
            "only the fresh, unconsumed request stays"
        );
        let reasons: Vec<(&str, &str)> = state
            .rejected
            .iter()
            .map(|r| (r.key.as_str(), r.reason.as_str()))
            .collect();
        assert!(reasons[0].0 == "fence-requests/cp-2" && reasons[0].1.contains("a replay"));
        assert!(reasons[1].1.contains("older than 1h"), "{reasons:?}");
        assert!(reasons[2].1.contains("has no nonce"), "{reasons:?}");
        assert_eq!(new_nonce().unwrap().len(), 32);
        assert_ne!(new_nonce().unwrap(), new_nonce().unwrap());
    }
}
