//! How many rows a relay leases at once: as many as the backlog offers (one statement costs
//! about the same for 100 rows as for 1,000, so a large backlog drains fastest in large leases),
//! but no more than it can start before their leases need renewing, so rows wait in its queue for
//! a fraction of a lease, not for many.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

/// A moving average of how long handlers take; cheap to clone and share with deliveries.
#[derive(Debug, Clone, Default)]
pub(crate) struct Pace(Arc<AtomicU64>);

/// The weight of the newest duration in the average, as a power of two (1/8).
const SHIFT: u32 = 3;

impl Pace {
    /// Adds a handler's duration to the average.
    pub(crate) fn record(&self, took: Duration) {
        let micros = u64::try_from(took.as_micros()).unwrap_or(u64::MAX).max(1);
        // Lost updates between racing deliveries only drop a sample.
        let average = self.0.load(Relaxed);
        let next =
            if average == 0 { micros } else { average - (average >> SHIFT) + (micros >> SHIFT) };
        self.0.store(next.max(1), Relaxed);
    }

    /// The most rows to lease now: what `concurrency` handlers of the average duration get
    /// through in `horizon`, at least one and at most `batch_size`.
    pub(crate) fn lease_limit(
        &self,
        concurrency: usize,
        horizon: Duration,
        batch_size: u32,
    ) -> u32 {
        let average = self.0.load(Relaxed);
        if average == 0 {
            return batch_size; // nothing measured yet
        }
        let rows = horizon.as_micros() * concurrency as u128 / u128::from(average);
        u32::try_from(rows).unwrap_or(u32::MAX).clamp(1, batch_size)
    }
}

/// The smallest lease an adaptive relay asks for: what it leases while it keeps up, so a few new
/// events cost one small statement.
const MIN_ADAPTIVE: u32 = 100;

/// The lease size of a relay whose handlers all take ordered events, unless the application set
/// one (see `RelayBuilder::build`).
pub(crate) const ORDERED_BATCH_SIZE: u32 = MIN_ADAPTIVE;

/// The largest: beyond it a lease's fixed cost no longer shows (see BENCHMARKS.md), while the rows
/// one relay holds (and hands to another after a crash) keep growing.
const MAX_ADAPTIVE: u32 = 1_000;

/// The size of the next lease: fixed by the application, or adapted to the backlog. A lease that
/// came back full says there is more waiting, so the next asks for twice as many; one that came
/// back short says the relay has caught up, so the next asks for about what it found.
#[derive(Debug, Clone, Copy)]
pub(crate) struct BatchSize {
    fixed: bool,
    next: u32,
}

impl BatchSize {
    /// `fixed`: the application's `batch_size`, if it set one.
    pub(crate) fn new(fixed: Option<u32>) -> Self {
        BatchSize { fixed: fixed.is_some(), next: fixed.unwrap_or(MIN_ADAPTIVE) }
    }

    pub(crate) fn next(&self) -> u32 {
        self.next
    }

    /// Learns from a lease that asked for `asked` rows and got `found`.
    pub(crate) fn found(&mut self, asked: u32, found: usize) {
        if self.fixed {
            return;
        }
        let found = u32::try_from(found).unwrap_or(u32::MAX);
        let next =
            if found >= asked { self.next.saturating_mul(2) } else { found.saturating_mul(2) };
        self.next = next.clamp(MIN_ADAPTIVE, MAX_ADAPTIVE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adaptive_leases_grow_with_the_backlog_and_shrink_when_caught_up() {
        let mut size = BatchSize::new(None);
        assert_eq!(size.next(), MIN_ADAPTIVE);
        let mut sizes = Vec::new();
        for _ in 0..6 {
            let asked = size.next();
            size.found(asked, asked as usize); // a backlog: every lease comes back full
            sizes.push(size.next());
        }
        assert_eq!(sizes, [200, 400, 800, 1_000, 1_000, 1_000]);
        size.found(1_000, 300);
        assert_eq!(size.next(), 600, "about what the last lease found");
        size.found(600, 3);
        assert_eq!(size.next(), MIN_ADAPTIVE, "caught up");
        // A lease the pace capped below the size, and full, still says there is more.
        size.found(40, 40);
        assert_eq!(size.next(), 200);
    }

    #[test]
    fn a_fixed_batch_size_stays_fixed() {
        let mut size = BatchSize::new(Some(300));
        size.found(300, 300);
        assert_eq!(size.next(), 300);
        size.found(300, 0);
        assert_eq!(size.next(), 300);
    }

    #[test]
    fn slow_handlers_lease_what_they_can_start_before_a_renewal() {
        let pace = Pace::default();
        assert_eq!(pace.lease_limit(1, Duration::from_millis(333), 40), 40, "unmeasured");
        for _ in 0..50 {
            pace.record(Duration::from_millis(100));
        }
        assert_eq!(pace.lease_limit(1, Duration::from_millis(333), 40), 3);
        assert_eq!(pace.lease_limit(16, Duration::from_millis(333), 40), 40);
        for _ in 0..50 {
            pace.record(Duration::from_secs(5));
        }
        assert_eq!(pace.lease_limit(1, Duration::from_millis(333), 40), 1, "at least one");
    }
}
