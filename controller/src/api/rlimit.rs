//! The open-file limit: every agent connection is a descriptor, and the usual soft limit of
//! 1024 was exhausted by 1,100 idle connections (reports then timed out while the accept loop
//! failed with EMFILE). At start the soft limit is raised to the hard limit, and the agent API
//! serves at most what the result leaves after a reserve for everything else.

use nix::sys::resource::{Resource, getrlimit, setrlimit};

/// Descriptors kept for everything but agent connections: etcd clients, the metrics endpoint
/// (at most `control::metrics::METRICS_MAX_CONNECTIONS` connections), the inventory and
/// credential files, logs.
pub const RESERVED_FILES: u64 = 128;

/// The soft limit before and after raising it to the hard limit.
pub fn raise_open_files() -> Result<(u64, u64), nix::Error> {
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE)?;
    if soft < hard {
        setrlimit(Resource::RLIMIT_NOFILE, hard, hard)?;
    }
    let (now, _) = getrlimit(Resource::RLIMIT_NOFILE)?;
    Ok((soft, now))
}

/// How many connections the agent API may serve with `soft` descriptors: the configured
/// number, or fewer when the limit leaves fewer after [`RESERVED_FILES`].
pub fn connection_budget(configured: usize, soft: u64) -> usize {
    let available = usize::try_from(soft.saturating_sub(RESERVED_FILES)).unwrap_or(usize::MAX);
    configured.min(available).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_is_raised_to_the_hard_one() {
        let (_, now) = raise_open_files().unwrap();
        let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
        assert_eq!((now, soft), (hard, hard));
    }

    #[test]
    fn the_metrics_endpoint_fits_in_the_reserve_with_room_to_spare() {
        let metrics = crate::control::metrics::METRICS_MAX_CONNECTIONS as u64;
        assert!(
            metrics * 2 <= RESERVED_FILES,
            "{metrics} of {RESERVED_FILES}"
        );
    }

    #[test]
    fn the_budget_leaves_the_reserve() {
        assert_eq!(connection_budget(4096, 1024), 896);
        assert_eq!(connection_budget(4096, 1 << 20), 4096);
        assert_eq!(connection_budget(4096, 10), 1);
    }
}
