//! How an idle relay waits for events while producer transactions stay open: what it costs the
//! database, and that wake-ups stay immediate.
//!
//! A producer's insert trigger holds the wake-up lock (shared) until its transaction ends. A
//! relay that registers as asleep while producers hold it must look again once each of them has
//! ended, since they may have checked the registrations before it registered; it must not spin
//! on the database meanwhile (business transactions stay open for seconds, and every relay of a
//! service waits at once).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::{emit, EventContext, Relay};
use sqlx::PgPool;
use support::*;
use tokio::time::Instant;
use uuid::Uuid;

/// The events the handler saw, in delivery order.
#[derive(Clone, Default)]
struct Delivered(Arc<Mutex<Vec<Uuid>>>);

impl Delivered {
    fn contains(&self, id: Uuid) -> bool {
        self.0.lock().unwrap().contains(&id)
    }
}

async fn record_placed(ctx: EventContext<Delivered>, _: OrderPlaced) -> Result<(), HandlerError> {
    ctx.state().0.lock().unwrap().push(ctx.event_id());
    Ok(())
}

/// Whether a relay is registered as asleep, for producers to wake.
async fn asleep(pool: &PgPool) -> bool {
    sqlx::query_scalar("SELECT EXISTS (SELECT 1 FROM outbox.sleeping_relays WHERE until > now())")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// The transactions the test database has counted so far, committed or rolled back: every
/// statement a relay sends outside a transaction is one. Backends report them when they go idle,
/// at most about once a second (an idle backend's last ones up to 10 s later), so only a count
/// over several seconds means anything. Each call is a transaction of its own, which reads
/// fresh statistics (no `pg_stat_clear_snapshot()` needed).
async fn transactions(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT xact_commit + xact_rollback FROM pg_stat_database \
         WHERE datname = current_database()",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

/// How many transactions per second the database counted while the test slept for `window`.
async fn transactions_per_second(pool: &PgPool, window: Duration) -> f64 {
    let (before, started) = (transactions(pool).await, Instant::now());
    tokio::time::sleep(window).await;
    let counted = transactions(pool).await - before;
    counted as f64 / started.elapsed().as_secs_f64()
}

/// The measuring window: long enough that the statistics' reporting delays (a second, or up to
/// 10 s for a backend gone idle) move the rate by a few transactions per second at most.
const WINDOW: Duration = Duration::from_secs(6);

/// Most transactions per second an idle relay (polling every second) may run, an open producer
/// transaction or not. About 2 without one; spinning on the wake-up lock ran 100 to 200.
const IDLE_MOST_PER_SECOND: f64 = 25.0;

#[sqlx::test(migrations = false)]
async fn an_open_producer_transaction_costs_an_idle_relay_a_few_statements(pool: PgPool) {
    migrated(&pool).await;
    let delivered = Delivered::default();
    // The default poll interval (1 s), as in production.
    let relay = Running::start(
        Relay::builder(pool.clone()).state(delivered.clone()).handler(record_placed),
    );
    eventually("the idle relay registers", || asleep(&pool)).await;
    tokio::time::sleep(Duration::from_secs(1)).await; // the setup's statistics reported
    let idle = transactions_per_second(&pool, WINDOW).await;

    // A business transaction emits an event no relay here takes, and stays open.
    let mut open = pool.begin().await.unwrap();
    emit(&mut open, &CustomerRenamed { customer_id: 1, name: "n".into() }).await.unwrap();
    // Another producer's event wakes the relay; after delivering it the relay sleeps again,
    // registering while the open transaction holds the wake-up lock.
    let woke = emit_committed(&pool, &[placed(1)]).await[0];
    eventually("the event is delivered", || async { delivered.contains(woke) }).await;
    tokio::time::sleep(Duration::from_secs(1)).await; // past the lingering after the delivery
    let while_open = transactions_per_second(&pool, WINDOW).await;
    open.commit().await.unwrap();
    relay.stop().await;

    eprintln!(
        "idle relay: {idle:.1} transactions/s; with a producer transaction open: {while_open:.1}/s"
    );
    assert!(idle <= IDLE_MOST_PER_SECOND, "idle relay: {idle:.1} transactions/s");
    assert!(
        while_open <= IDLE_MOST_PER_SECOND,
        "idle relay with a producer transaction open: {while_open:.1} transactions/s \
         (without: {idle:.1}/s)"
    );
}

#[sqlx::test(migrations = false)]
async fn wake_ups_stay_immediate_while_a_producer_transaction_is_open(pool: PgPool) {
    migrated(&pool).await;
    // Open before any relay sleeps: its insert finds no registration, so its commit notifies
    // nobody. The relay must notice by itself that this transaction ended.
    let mut long = pool.begin().await.unwrap();
    let late = emit(&mut long, &placed(1)).await.unwrap();

    let delivered = Delivered::default();
    // Polling hourly: only a wake-up can deliver in time.
    let relay = Running::start(
        Relay::builder(pool.clone())
            .state(delivered.clone())
            .handler(record_placed)
            .poll_interval(Duration::from_secs(3600)),
    );
    eventually("the relay sleeps, the long transaction still open", || asleep(&pool)).await;

    // (a) Another producer's event wakes it at once, the long transaction still open.
    let prompt = emit_committed(&pool, &[placed(2)]).await[0];
    eventually("the other producer's event is delivered", || async { delivered.contains(prompt) })
        .await;
    eventually("the relay sleeps again", || asleep(&pool)).await;
    assert!(!delivered.contains(late), "the long transaction's event is not committed yet");

    // (b) Its own event arrives once it commits: the relay saw it end.
    long.commit().await.unwrap();
    eventually("the long transaction's event is delivered", || async { delivered.contains(late) })
        .await;
    relay.stop().await;
    assert_eq!(*delivered.0.lock().unwrap(), [prompt, late]);
}
