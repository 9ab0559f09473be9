//! Counters of what a relay did, readable while it runs.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// A live view of a relay's counters; get it with [`Relay::metrics`](crate::Relay::metrics)
/// before running the relay.
#[derive(Debug, Clone, Default)]
pub struct RelayMetrics(Arc<Counters>);

#[derive(Debug, Default)]
struct Counters {
    delivered: AtomicU64,
    failed: AtomicU64,
    dead: AtomicU64,
    released: AtomicU64,
    lost_leases: AtomicU64,
}

/// What a relay has done since it was built.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RelayCounts {
    /// Events handled successfully and marked published.
    pub delivered: u64,
    /// Failed deliveries recorded (handler error, panic, timeout, undecodable payload, unknown
    /// event type); the dead ones included.
    pub failed: u64,
    /// Rows this relay found had exhausted their attempts and marked dead.
    pub dead: u64,
    /// Leased rows handed back unstarted or cancelled (at shutdown).
    pub released: u64,
    /// Acknowledgements refused because the lease had expired and another relay took the row.
    pub lost_leases: u64,
}

impl RelayMetrics {
    /// The counts so far.
    pub fn counts(&self) -> RelayCounts {
        let c = &self.0;
        RelayCounts {
            delivered: c.delivered.load(Relaxed),
            failed: c.failed.load(Relaxed),
            dead: c.dead.load(Relaxed),
            released: c.released.load(Relaxed),
            lost_leases: c.lost_leases.load(Relaxed),
        }
    }

    pub(crate) fn add_delivered(&self, n: usize) {
        self.0.delivered.fetch_add(n as u64, Relaxed);
    }
    pub(crate) fn add_failed(&self, n: usize) {
        self.0.failed.fetch_add(n as u64, Relaxed);
    }
    pub(crate) fn add_dead(&self, n: usize) {
        self.0.dead.fetch_add(n as u64, Relaxed);
    }
    pub(crate) fn add_released(&self, n: usize) {
        self.0.released.fetch_add(n as u64, Relaxed);
    }
    pub(crate) fn add_lost_leases(&self, n: usize) {
        self.0.lost_leases.fetch_add(n as u64, Relaxed);
    }
}
