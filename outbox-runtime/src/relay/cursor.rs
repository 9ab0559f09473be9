//! Where each lease starts reading: past the rows the relay leased last while it drains a
//! backlog, from the head of the pending rows otherwise (see `store::LEASE_HANDLED` for why).

use std::time::Duration;

use tokio::time::Instant;

use crate::store::{LeasePlan, LeasedEvent, Positions, Scan};

/// How often a lease reads from the head even while the relay drains a backlog: the longest a
/// row that landed behind the relay's positions (a transaction that committed late, an event
/// scheduled in the past) waits for it.
const FROM_HEAD_EVERY: Duration = Duration::from_secs(1);

#[derive(Debug, Default)]
pub(crate) struct Cursor {
    /// Per type, the last row leased since the last lease from the head.
    positions: Positions,
    /// The last lease came back full: more rows wait past the positions.
    draining: bool,
    from_head_at: Option<Instant>,
}

impl Cursor {
    /// Where the next lease starts.
    pub(crate) fn scan(&self) -> Scan<'_> {
        let head_due = self.from_head_at.is_none_or(|at| at.elapsed() >= FROM_HEAD_EVERY);
        if self.draining && !head_due && !self.positions.is_empty() {
            Scan::From(&self.positions)
        } else {
            Scan::Full
        }
    }

    /// Learns from a lease (`from_head`: whether it was a [`Scan::Full`]) that asked for `asked`
    /// rows and got `rows`.
    pub(crate) fn leased<'a>(
        &mut self,
        plan: &LeasePlan,
        from_head: bool,
        asked: u32,
        rows: impl ExactSizeIterator<Item = &'a LeasedEvent>,
    ) {
        if from_head {
            self.from_head_at = Some(Instant::now());
            self.positions = Positions::default();
        }
        self.draining = rows.len() >= asked as usize;
        self.positions.advance(plan, rows);
    }
}
