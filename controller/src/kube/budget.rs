//! The time a round may spend on its best-effort writes: observed statuses, Events, silent
//! agents' Node conditions (writes no decision waits on).
//!
//! Found in the scale benchmark (issue 27): at the start every host's status is written once,
//! and one round wrote them one after the other: 39 s at 5,005 hosts, 239 s at 20,005. The
//! loop renews nothing while a round runs, so the leadership lapsed inside that round (agents
//! answered 503, a new term after it, no remediation meanwhile). Now a round starts such
//! writes only until its [`BUDGET`] is spent, [`CONCURRENCY`] at a time; what it did not start
//! is left for the next rounds, the oldest first.

use std::future::Future;
use std::time::Duration;

use futures::StreamExt as _;
use tokio::time::Instant;

/// How long a round keeps starting best-effort writes. Well inside the shortest time a
/// campaign leaves the leadership (the Lease's last renewal 5 s before its end, less the 2 s
/// margin): the rest of a round takes under 1 s at 20,000 hosts.
pub const BUDGET: Duration = Duration::from_secs(1);
/// How many of those writes are in flight at once.
pub const CONCURRENCY: usize = 8;

/// Runs `write` on `items` in order, at most `concurrency` at once, starting none once
/// `deadline` has passed. Returns the results of the ones started (in the order they
/// finished) and the items never started (in their order).
pub async fn within<T, R, F, Fut>(
    items: Vec<T>,
    concurrency: usize,
    deadline: Instant,
    write: F,
) -> (Vec<R>, Vec<T>)
where
    F: FnMut(T) -> Fut,
    Fut: Future<Output = R>,
{
    let mut items = items.into_iter();
    let results = {
        let started = std::iter::from_fn(|| {
            if Instant::now() < deadline {
                items.next()
            } else {
                None
            }
        })
        .map(write);
        futures::stream::iter(started)
            .buffer_unordered(concurrency.max(1))
            .collect::<Vec<R>>()
            .await
    };
    (results, items.collect())
}

/// `items` with those `waited` names first, each part in its order: what a round left
/// over goes before what changed since, so no host waits behind newer changes for ever.
pub fn oldest_first<T>(
    items: Vec<T>,
    waited: &std::collections::BTreeSet<String>,
    name: impl Fn(&T) -> &str,
) -> Vec<T> {
    let (mut first, rest): (Vec<T>, Vec<T>) =
        items.into_iter().partition(|i| waited.contains(name(i)));
    first.extend(rest);
    first
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    use super::*;

    #[tokio::test(start_paused = true)]
    async fn writes_start_only_within_the_budget_a_few_at_a_time_and_the_rest_is_returned() {
        let started = Instant::now();
        let in_flight = Arc::new(AtomicUsize::new(0));
        let most = Arc::new(AtomicUsize::new(0));
        let (done, left) = within(
            (0..100).collect(),
            4,
            started + Duration::from_millis(95),
            |i: u32| {
                let in_flight = in_flight.clone();
                let most = most.clone();
                async move {
                    let now = in_flight.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    in_flight.fetch_sub(1, Ordering::SeqCst);
                    i
                }
            },
        )
        .await;
        // Four start at 0, 10, ..., 90 ms; none at 100 ms.
        assert_eq!(most.load(Ordering::SeqCst), 4);
        let mut done = done;
        done.sort_unstable();
        assert_eq!(done, (0..40).collect::<Vec<_>>());
        assert_eq!(left, (40..100).collect::<Vec<_>>());
        assert_eq!(started.elapsed(), Duration::from_millis(100));
    }

    #[tokio::test(start_paused = true)]
    async fn a_spent_budget_starts_nothing_and_an_open_one_everything() {
        let now = Instant::now();
        let (done, left) = within(vec![1, 2, 3], 2, now, |i| async move { i }).await;
        assert!(done.is_empty());
        assert_eq!(left, vec![1, 2, 3]);
        let (done, left) = within(vec![1, 2, 3], 0, now + BUDGET, |i| async move { i }).await;
        assert_eq!(done.len(), 3);
        assert!(left.is_empty());
    }

    #[test]
    fn what_waited_goes_first_each_part_in_its_order() {
        let waited = ["w-3".to_owned(), "w-1".to_owned()].into();
        let items = vec!["w-0", "w-1", "w-2", "w-3", "w-4"];
        assert_eq!(
            oldest_first(items, &waited, |s| s),
            vec!["w-1", "w-3", "w-0", "w-2", "w-4"]
        );
    }
}
