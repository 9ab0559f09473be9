//! How many rows a relay leases at once: no more than it can start before their leases need
//! renewing, so rows wait in its queue for a fraction of a lease, not for many.

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

#[cfg(test)]
mod tests {
    use super::*;

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
