//! Subscribers: an event of a type with subscribers goes to each one the relay runs, at once;
//! its acknowledgement (`store::fan_out`) publishes it and writes a copy for each subscriber that
//! still needs it, which relays then lease, retry and kill as any other row.
//!
//! So an event every subscriber takes the first time costs a lease and an acknowledgement, as
//! with one handler; a copy (an insert, then its own lease and acknowledgement) is written only
//! for a subscriber that failed or snoozed, one behind on the event's aggregate, one that writes
//! in its acknowledgement's transaction, and one run by other relays.

use std::sync::Arc;
use std::time::Duration;

use futures_util::future::join_all;

use crate::decode::JsonUpcasters;
use crate::error::ErrorChain;
use crate::relay::acker::{Failed, Outcome};
use crate::relay::config::{DeadOrderedEvents, RelayConfig};
use crate::relay::context::RowMeta;
use crate::relay::deliver::{call, clean_error, log_failure, Failure};
use crate::relay::handler::{DeliveryLease, Payload, Settled};
use crate::relay::held::HeldLease;
use crate::relay::outcome::Verdict;
use crate::relay::{Subscribed, Subscribers};
use crate::store::{self, Db};

/// How an event ended for one subscriber delivered with it.
#[derive(Debug)]
pub(crate) enum Took {
    /// Delivered: no copy.
    Delivered,
    /// Its handler failed: a copy with the failure, retried after its backoff (or dead).
    Failed(Failed),
    /// Its handler snoozed: a copy due after the delay.
    Snoozed(Duration),
    /// Not called: a copy due now (behind an earlier event of the aggregate, transactional, or
    /// not delivered for a cause that is not the event's).
    Copied,
}

/// An event being delivered to subscribers.
pub(super) struct FanOut<'a> {
    pub(super) row: &'a store::LeasedEvent,
    pub(super) upcasters: &'a JsonUpcasters,
    pub(super) pool: &'a Db,
    pub(super) lease: &'a HeldLease,
}

impl FanOut<'_> {
    /// Delivers the event to each of `subscribers` at once: its outcome for the acknowledger.
    pub(super) async fn deliver<S: Clone + Send + Sync + 'static>(
        &self,
        subscribers: &[Subscribed<S>],
        state: &S,
        config: &RelayConfig,
    ) -> Outcome {
        let row = self.row;
        // An ordered event waits, per subscriber, for the subscriber's copies of earlier events
        // of its aggregate: those subscribers get a copy, which waits behind theirs.
        let behind = if row.ordered {
            let skip_dead = config.dead_ordered_events == DeadOrderedEvents::SkipPast;
            // `build` refuses subscribers on the other databases.
            let Some(pool) = self.pool.postgres() else {
                return Outcome::HandedBack;
            };
            match store::behind(pool, &row.aggregate_type, &row.aggregate_id, skip_dead).await {
                Ok(behind) => behind,
                Err(error) => {
                    tracing::warn!(
                        error = %ErrorChain(&error),
                        "cannot read which subscribers an ordered outbox event waits for; \
                         handed back, no attempt counted"
                    );
                    return Outcome::HandedBack;
                }
            }
        } else {
            Vec::new()
        };
        let deliveries = subscribers.iter().map(|subscriber| async {
            let waits = behind.iter().any(|name| **name == *subscriber.name);
            let took = if waits || subscriber.routed.route.is_transactional() {
                Took::Copied
            } else {
                self.deliver_to(subscriber, state.clone(), config).await
            };
            (subscriber.name.clone(), took)
        });
        let took: Vec<(Arc<str>, Took)> = join_all(deliveries).await;
        Outcome::FannedOut(took)
    }

    async fn deliver_to<S>(
        &self,
        subscriber: &Subscribed<S>,
        state: S,
        config: &RelayConfig,
    ) -> Took {
        let row = self.row;
        let meta = RowMeta {
            event_id: row.delivered_event_id(),
            aggregate_type: row.aggregate_type.clone(),
            aggregate_id: row.aggregate_id.clone(),
            event_type: row.event_type.clone(),
            version: u32::try_from(row.event_version).unwrap_or(1),
            headers: row.headers.clone(),
            attempts: 0,
            expired_leases: u32::try_from(row.expired_leases).unwrap_or(0),
            created_at: row.created_at,
        };
        let payload = Payload { json: &row.payload, upcasters: self.upcasters };
        let lease = DeliveryLease {
            pool: self.pool.clone(),
            lease: self.lease.clone(),
            on_publish: config.on_publish,
        };
        let policy = subscriber.routed.policy;
        match call(&*subscriber.routed.route, policy, state, meta, payload, lease).await {
            Ok(Settled::Handled | Settled::Published) => Took::Delivered,
            Ok(Settled::LeaseLost | Settled::Unavailable(_)) => Took::Copied,
            Err(Failure { verdict: Verdict::Snooze(delay), .. }) => Took::Snoozed(delay),
            Err(Failure { error, logged, verdict }) => {
                let rejected = verdict == Verdict::Reject;
                let event_id = row.delivered_event_id();
                log_failure(event_id, &row.event_type, Some(&subscriber.name), &logged, rejected);
                Took::Failed(Failed {
                    error: clean_error(error),
                    retry_in: policy.backoff.delay(1),
                    max_attempts: policy.max_attempts,
                    rejected,
                })
            }
        }
    }
}

/// Registers the relay's subscribers, retrying while the database cannot be reached: an event's
/// acknowledgement writes copies for the registered subscribers only, so a subscriber is
/// registered before its relay leases anything.
pub(super) async fn register<S>(db: &Db, subscribers: &Subscribers<S>) {
    let mut keys = (Vec::new(), Vec::new(), Vec::new());
    for (aggregate_type, event_type, subscriber) in subscribers.iter() {
        keys.0.push(aggregate_type);
        keys.1.push(event_type);
        keys.2.push(&*subscriber.name);
    }
    // `build` refuses subscribers on the other databases.
    let (false, Some(pool)) = (keys.0.is_empty(), db.postgres()) else { return };
    let mut retry = Duration::from_millis(100);
    while let Err(error) = store::register_subscribers(pool, &keys.0, &keys.1, &keys.2).await {
        tracing::warn!(
            error = %ErrorChain(&error),
            retry_in = ?retry,
            "cannot register the relay's outbox subscribers; it leases nothing until it can"
        );
        tokio::time::sleep(retry).await;
        retry = (retry * 2).min(Duration::from_secs(10));
    }
}
