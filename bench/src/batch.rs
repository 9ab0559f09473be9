//! The lease size (issue #16): is the relay's default sizing as good as the best fixed
//! `batch_size`? One relay (concurrency 16) drains the same backlog, each time in a database of
//! its own, with the default sizing and with each fixed size.

use crate::db::{self, Database};
use crate::events::credited;
use crate::relay::{self, Setup};

/// The fixed sizes tried.
pub const SIZES: [u32; 6] = [50, 100, 200, 300, 500, 1000];

/// What the sweep measured, in events/s.
pub struct Sweep {
    /// The default sizing: the mean of a drain before the fixed sizes and one after, so drift
    /// over the sweep falls on it as on them.
    pub default: f64,
    /// Each of [`SIZES`], in order.
    pub fixed: Vec<f64>,
    /// Handler calls beyond one per event, every drain together.
    pub duplicates: u64,
}

impl Sweep {
    /// The best fixed size and its rate.
    pub fn best(&self) -> (u32, f64) {
        SIZES
            .iter()
            .zip(&self.fixed)
            .map(|(&size, &rate)| (size, rate))
            .max_by(|a, b| a.1.total_cmp(&b.1))
            .unwrap()
    }
}

/// Drains `events` with the default sizing, with each of [`SIZES`], then with the default again.
pub async fn sweep(url: &str, events: usize) -> Sweep {
    let mut duplicates = 0;
    let mut drain = async |batch_size| {
        let db = Database::fresh(url, "batch").await;
        db::backlog(&db.pool, events, credited).await;
        let drained =
            relay::drain(&db.pool, events, Setup { batch_size, ..Setup::new(1, 16) }).await;
        db.drop().await;
        duplicates += drained.duplicates;
        drained.events_per_second
    };
    let first = drain(None).await;
    let mut fixed = Vec::new();
    for size in SIZES {
        fixed.push(drain(Some(size)).await);
    }
    let last = drain(None).await;
    Sweep { default: (first + last) / 2.0, fixed, duplicates }
}
