//! Subscribers (issue #24): what several subscribers of one event type cost, against one handler.
//!
//! - Draining: one backlog delivered to three subscribers, by one relay that runs all three (each
//!   event leased once, delivered to the three at once) or by three relays of one subscriber
//!   each (the leasing relay copies each event for the other two), against the same backlog
//!   drained by one relay with one handler: three relays of one would take three such drains.
//! - Emitting: the emit workload with three subscribers registered for the emitted type, against
//!   none (emit writes nothing per subscriber).
//!
//! Every relay runs with the defaults (concurrency 16, leases sized by the relay), each drain in a
//! database of its own.

use std::sync::atomic::Ordering;
use std::time::Duration;

use outbox_runtime::{EventContext, OutboxEvent, Relay};
use sqlx::PgPool;

use crate::db::{self, Database, Stats};
use crate::emit;
use crate::events::{credited, Credited};
use crate::relay::{until_delivered, Calls};

/// Counts its calls.
async fn noop(ctx: EventContext<Calls>, _: Credited) -> Result<(), std::convert::Infallible> {
    ctx.state().fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Who delivers to the subscribers.
#[derive(Clone, Copy)]
pub enum Relays {
    /// One relay runs every subscriber.
    One,
    /// A relay per subscriber.
    Each,
}

/// Events/s: `events` delivered to each of `subscribers` subscribers, calls beyond one per
/// event and subscriber included in the check.
pub async fn drain(url: &str, events: usize, subscribers: usize, relays: Relays) -> f64 {
    let db = Database::fresh(url, "subscribers").await;
    let names: Vec<String> = (0..subscribers).map(|n| format!("s{n}")).collect();
    // Registered before the backlog is drained, as by relays that ran before.
    register(&db.pool, &names).await;
    db::backlog_with(&db.pool, events, credited, Stats::Vacuumed).await;
    let calls = Calls::default();
    let builder = || Relay::builder(db.pool.clone()).state(calls.clone());
    let built = match relays {
        Relays::One => {
            let relay = names.iter().fold(builder(), |b, name| b.subscriber(name, noop));
            vec![relay.build().unwrap()]
        }
        Relays::Each => {
            names.iter().map(|name| builder().subscriber(name, noop).build().unwrap()).collect()
        }
    };
    let rate = until_delivered(built, events * subscribers).await;
    assert_eq!(calls.load(Ordering::Relaxed), (events * subscribers) as u64, "no repeats");
    db.drop().await;
    rate.events_per_second / subscribers as f64
}

/// Registers `names` for `Credited`, as their relays do when they start.
async fn register(pool: &PgPool, names: &[String]) {
    sqlx::query(
        "INSERT INTO outbox.subscribers (aggregate_type, event_type, subscriber) \
         SELECT $1, $2, unnest($3::text[])",
    )
    .bind(Credited::AGGREGATE_TYPE)
    .bind(Credited::EVENT_TYPE)
    .bind(names)
    .execute(pool)
    .await
    .unwrap();
}

/// Transactions/s of the emit workload (8 producers, one emit each), with `subscribers`
/// subscribers registered for the emitted type.
pub async fn emit(url: &str, subscribers: usize, duration: Duration) -> f64 {
    let db = Database::fresh(url, "subscribers_emit").await;
    emit::accounts(&db.pool).await;
    let names: Vec<String> = (0..subscribers).map(|n| format!("s{n}")).collect();
    register(&db.pool, &names).await;
    let rate = emit::business(&db.pool, 8, duration, emit::Extra::Emit).await;
    db.drop().await;
    rate
}
