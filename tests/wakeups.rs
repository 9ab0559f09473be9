//! How an idle relay waits for events while producer transactions stay open: what it costs the
//! database, and that wake-ups stay immediate.
//!
//! Producers run the wake-up trigger's function only while a relay may be asleep (a flag that
//! registrations keep). A relay that registers while producers are inserting must look again
//! once each of them has ended, since they may have read the flag before it went up; it must not
//! spin on the database meanwhile (business transactions stay open for seconds, and every relay
//! of a service waits at once).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::{emit, EventContext, Relay};
use sqlx::postgres::PgListener;
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

async fn ignore_renamed(_: EventContext, _: CustomerRenamed) -> Result<(), HandlerError> {
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
/// transaction or not. About 2 without one; spinning until producers ended ran 100 to 200.
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
    // registering while the open transaction is still writing events.
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

/// The wake-up flag producers read: whether a relay may be asleep.
async fn flag(pool: &PgPool) -> Option<i64> {
    sqlx::query_scalar("SELECT pg_sequence_last_value('outbox.relays_asleep')")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Registers a sleeper directly, as a relay does, for `event_types` (`None`: all).
async fn register(pool: &PgPool, event_types: Option<&[&str]>) -> Uuid {
    let relay_id = Uuid::new_v4();
    sqlx::query(
        "INSERT INTO outbox.sleeping_relays (relay_id, event_types, until) \
         VALUES ($1, $2, now() + interval '1 hour')",
    )
    .bind(relay_id)
    .bind(event_types)
    .execute(pool)
    .await
    .unwrap();
    relay_id
}

async fn unregister(pool: &PgPool, relay_id: Uuid) {
    sqlx::query("DELETE FROM outbox.sleeping_relays WHERE relay_id = $1")
        .bind(relay_id)
        .execute(pool)
        .await
        .unwrap();
}

/// Emits three events in one committed transaction and returns how often it ran the wake-up
/// trigger's function, counted by PostgreSQL's function statistics. A backend keeps its counts
/// until it reports them, which it does only between transactions: within one, the difference
/// is exact.
async fn wake_up_calls_emitting_three(pool: &PgPool) -> i64 {
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("SET LOCAL track_functions = 'pl'").execute(&mut *tx).await.unwrap();
    let calls =
        "SELECT coalesce(pg_stat_get_xact_function_calls('outbox.notify_relays'::regproc), 0)";
    let before: i64 = sqlx::query_scalar(calls).fetch_one(&mut *tx).await.unwrap();
    for n in 0..3 {
        emit(&mut tx, &placed(n)).await.unwrap();
    }
    let after: i64 = sqlx::query_scalar(calls).fetch_one(&mut *tx).await.unwrap();
    tx.commit().await.unwrap();
    after - before
}

/// The next notification on the relays' channel.
async fn next_notification(listener: &mut PgListener) -> String {
    within(listener.recv(), "a notification on outbox_events").await.unwrap().payload().to_owned()
}

#[sqlx::test(migrations = false)]
async fn producers_run_the_wake_up_function_only_while_a_relay_sleeps(pool: PgPool) {
    migrated(&pool).await;
    let mut listener = PgListener::connect_with(&pool).await.unwrap();
    listener.listen("outbox_events").await.unwrap();

    // No relay asleep: the trigger's WHEN stops every row.
    assert_eq!(wake_up_calls_emitting_three(&pool).await, 0, "no sleeper");

    // A relay asleep for another type: every row looks, none notifies.
    let other = register(&pool, Some(&["customer.renamed"])).await;
    assert_eq!(flag(&pool).await, Some(1));
    assert_eq!(wake_up_calls_emitting_three(&pool).await, 3, "a sleeper of another type");
    sqlx::query("SELECT pg_notify('outbox_events', 'marker')").execute(&pool).await.unwrap();
    assert_eq!(next_notification(&mut listener).await, "marker", "nothing notified before");

    // A relay asleep for this type: the first row notifies, and the rest run nothing.
    register(&pool, Some(&["order.placed"])).await;
    assert_eq!(wake_up_calls_emitting_three(&pool).await, 1, "a sleeper of the type");
    assert_eq!(next_notification(&mut listener).await, "", "the producer's notification");

    // Both gone: the flag is down, and producers run nothing again.
    unregister(&pool, other).await;
    assert_eq!(flag(&pool).await, Some(1), "one sleeper left");
    sqlx::query("DELETE FROM outbox.sleeping_relays").execute(&pool).await.unwrap();
    assert_eq!(flag(&pool).await, Some(0));
    assert_eq!(wake_up_calls_emitting_three(&pool).await, 0, "no sleeper any more");
}

#[sqlx::test(migrations = false)]
async fn the_wake_up_flag_counts_registrations_changed_concurrently(pool: PgPool) {
    migrated(&pool).await;
    // Sixteen sleepers register and withdraw at once, many times; half end registered.
    let churn = (0..16).map(|sleeper| {
        let pool = pool.clone();
        tokio::spawn(async move {
            for round in 0..20 {
                let relay_id = register(&pool, None).await;
                if round == 19 && sleeper % 2 == 0 {
                    return Some(relay_id);
                }
                unregister(&pool, relay_id).await;
            }
            None
        })
    });
    let left: Vec<Uuid> = futures_util::future::join_all(churn)
        .await
        .into_iter()
        .filter_map(Result::unwrap)
        .collect();
    assert_eq!(left.len(), 8);
    assert_eq!(flag(&pool).await, Some(1), "eight sleepers registered");

    // The last ones withdraw concurrently: the flag goes down with the last.
    let withdraw = left.into_iter().map(|relay_id| {
        let pool = pool.clone();
        tokio::spawn(async move { unregister(&pool, relay_id).await })
    });
    for done in futures_util::future::join_all(withdraw).await {
        done.unwrap();
    }
    assert_eq!(flag(&pool).await, Some(0), "no sleeper left");
}

#[sqlx::test(migrations = false)]
async fn the_wake_up_flag_follows_relays_falling_asleep_and_stopping(pool: PgPool) {
    migrated(&pool).await;
    let delivered = Delivered::default();
    let placed_relay = Running::start(
        Relay::builder(pool.clone()).state(delivered.clone()).handler(record_placed),
    );
    let renamed_relay = Running::start(Relay::builder(pool.clone()).handler(ignore_renamed));
    eventually("both relays sleep", || async {
        let asleep: i64 =
            sqlx::query_scalar("SELECT count(*) FROM outbox.sleeping_relays WHERE until > now()")
                .fetch_one(&pool)
                .await
                .unwrap();
        asleep == 2
    })
    .await;
    assert_eq!(flag(&pool).await, Some(1));

    // One wakes, delivers and sleeps again; the other slept throughout: the flag stays up.
    let id = emit_committed(&pool, &[placed(1)]).await[0];
    eventually("the event is delivered", || async { delivered.contains(id) }).await;
    assert_eq!(flag(&pool).await, Some(1));

    placed_relay.stop().await;
    assert_eq!(flag(&pool).await, Some(1), "one relay still asleep");
    renamed_relay.stop().await;
    assert_eq!(flag(&pool).await, Some(0), "both relays stopped");
}
