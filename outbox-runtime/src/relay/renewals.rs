//! Lease renewals: every held lease, in one statement, every third of the lease timeout.
//!
//! On their own task, so that an acknowledgement retrying or slow for a while never holds them
//! back. A renewal and an acknowledgement can meet on a row: both are fenced and skip a row the
//! other has locked, so neither waits, and the acknowledgement that skipped is tried again.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::error::ErrorChain;
use crate::relay::held::Held;
use crate::store::Db;

/// Renews leases of `lease_timeout` until cancelled.
pub(crate) async fn renew_periodically(held: Held, pool: Db, lease_timeout: Duration) {
    let mut renewals = tokio::time::interval(lease_timeout / 3);
    renewals.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    renewals.tick().await;
    loop {
        renewals.tick().await;
        renew(&held, &pool, lease_timeout).await;
    }
}

/// Renews every held lease, and moves the deadlines of those renewed. A lease the statement did
/// not renew (taken over, or locked by someone else right now) keeps its deadline: its delivery
/// is cancelled when that passes, and not before, since until then no other relay can have it.
async fn renew(held: &Held, pool: &Db, lease_timeout: Duration) {
    let (ids, tokens) = held.tokens();
    if ids.is_empty() {
        return;
    }
    let sent_at = Instant::now();
    match pool.renew(&ids, &tokens, lease_timeout).await {
        Ok(renewed) => {
            tracing::debug!(
                held = ids.len(),
                renewed = renewed.len(),
                took = ?sent_at.elapsed(),
                "outbox leases renewed"
            );
            let tokens: HashMap<_, _> = ids.into_iter().zip(tokens).collect();
            held.renewed(&renewed, &tokens, sent_at + lease_timeout);
        }
        Err(error) => tracing::warn!(error = %ErrorChain(&error), "cannot renew outbox leases"),
    }
}
