//! Producers and relays behind PgBouncer (Debian's 1.18), each test with a PgBouncer of its own
//! (`support::pgbouncer`).
//!
//! What transaction pooling does to sqlx 0.8, as these tests show:
//! - sqlx sends the startup parameter `extra_float_digits`, which PgBouncer refuses: connect
//!   with `PgConnectOptions::extra_float_digits(None)` (or set PgBouncer's
//!   `ignore_startup_parameters = extra_float_digits`).
//! - sqlx names the statements it prepares (`sqlx_s_1`, ...) per client connection, and a
//!   server connection keeps the names other clients prepared on it. With the statement cache,
//!   a name cached on one server connection is missing or another statement on the next;
//!   `statement_cache_capacity(0)` does not turn naming off, it prepares under a new name each
//!   time and never closes it. Both fail with "prepared statement ... already exists" or
//!   "... does not exist" (and can bind another client's statement of the same name). A
//!   transaction that starts with `DEALLOCATE ALL` clears its server connection's names
//!   first, so with a cache of 0 every name it prepares is its own: emits through transaction
//!   pooling commit, every row right.
//! - A relay through transaction pooling refuses to start, with `Error::TransactionPooling`,
//!   before it leases anything; through session pooling it delivers, woken by NOTIFY.
//! - A relay whose LISTEN connection hears nothing (here: it alone goes through transaction
//!   pooling) warns once and delivers by polling.

mod support;

use std::collections::HashMap;
use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::{Error, EventContext, Relay};
use sqlx::postgres::PgPoolOptions;
use sqlx::{Executor, PgPool};
use support::pgbouncer::{PgBouncer, PoolMode, Router};
use support::*;
use tracing_subscriber::filter::LevelFilter;
use tracing_subscriber::util::SubscriberInitExt;
use uuid::Uuid;

/// Deliveries per event id.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<HashMap<Uuid, usize>>>);

impl Seen {
    fn per_event(&self) -> HashMap<Uuid, usize> {
        self.0.lock().unwrap().clone()
    }
}

async fn record(ctx: EventContext<Seen>, _: OrderPlaced) -> Result<(), HandlerError> {
    *ctx.state().0.lock().unwrap().entry(ctx.event_id()).or_default() += 1;
    Ok(())
}

/// Warnings and errors logged while it lives, on this thread: `#[sqlx::test]` runs each test,
/// the relay's tasks included, on a single-threaded runtime of its own.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Logs {
    fn capture() -> (Logs, impl Drop) {
        let logs = Logs::default();
        let writer = logs.clone();
        let guard = tracing_subscriber::fmt()
            .with_writer(move || writer.clone())
            .with_ansi(false)
            .with_max_level(LevelFilter::WARN)
            .finish()
            .set_default();
        (logs, guard)
    }

    fn count(&self, needle: &str) -> usize {
        String::from_utf8_lossy(&self.0.lock().unwrap()).matches(needle).count()
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.0.lock().unwrap()).into_owned()
    }
}

impl Write for Logs {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(bytes);
        Ok(bytes.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

const WAKE_UPS_UNAVAILABLE: &str = "outbox wake-ups are unavailable";

/// Waits for a relay's `run_until` that is expected to return by itself.
async fn refused(relay: Relay<Seen>) -> Result<outbox_runtime::RelayCounts, Error> {
    within(relay.run_until(std::future::pending()), "the relay returns").await
}

#[sqlx::test(migrations = false)]
async fn concurrent_emits_through_transaction_pooling_commit_every_row_right(pool: PgPool) {
    migrated(&pool).await;
    pool.execute("CREATE TABLE orders (order_id uuid PRIMARY KEY, total_cents bigint NOT NULL)")
        .await
        .unwrap();
    let bouncer = PgBouncer::start(&pool, PoolMode::Transaction).await;
    // 32 clients on 4 server connections.
    let through = PgPoolOptions::new()
        .max_connections(32)
        .connect_with(bouncer.options(&pool).statement_cache_capacity(0))
        .await
        .unwrap();

    // Each producer writes its order and its events in one transaction: one event, or a batch
    // of three; every fifth transaction rolls back.
    let producers = (0..32_i64).map(|producer| {
        let through = through.clone();
        tokio::spawn(async move {
            let mut committed = Vec::new();
            for n in 0..25_i64 {
                let total = producer * 1_000 + n;
                let mut tx = through.begin().await.unwrap();
                tx.execute("DEALLOCATE ALL").await.unwrap();
                let events: Vec<OrderPlaced> = (0..if n % 2 == 0 { 1 } else { 3 })
                    .map(|i| OrderPlaced { order_id: Uuid::now_v7(), total_cents: total * 10 + i })
                    .collect();
                sqlx::query("INSERT INTO orders (order_id, total_cents) VALUES ($1, $2)")
                    .bind(events[0].order_id)
                    .bind(total)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                let ids = if let [event] = events.as_slice() {
                    vec![outbox_runtime::emit(&mut tx, event).await.unwrap()]
                } else {
                    outbox_runtime::emit_all(&mut tx, &events).await.unwrap()
                };
                if n % 5 == 4 {
                    tx.rollback().await.unwrap();
                } else {
                    tx.commit().await.unwrap();
                    committed.extend(ids.into_iter().zip(events));
                }
            }
            committed
        })
    });
    let mut expected = HashMap::new();
    for producer in producers {
        for (id, event) in producer.await.unwrap() {
            assert!(expected.insert(id, event).is_none(), "emit returned an id twice");
        }
    }
    assert_eq!(expected.len(), 32 * (10 * 3 + 10), "20 committed transactions per producer");

    let rows: Vec<(Uuid, String, String, i32, serde_json::Value)> = sqlx::query_as(
        "SELECT event_id, aggregate_type, event_type, event_version, payload FROM outbox.events",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), expected.len(), "every committed event stored, no rolled-back one");
    for (id, aggregate_type, event_type, version, payload) in rows {
        let event = &expected[&id];
        assert_eq!(
            (aggregate_type.as_str(), event_type.as_str(), version),
            ("order", "order.placed", 1)
        );
        assert_eq!(serde_json::from_value::<OrderPlaced>(payload).unwrap(), *event);
    }
    // The application's writes committed with their events, and only with them.
    let orders: (i64, i64) = sqlx::query_as(
        "SELECT count(*), count(*) FILTER (WHERE EXISTS ( \
             SELECT 1 FROM outbox.events e WHERE e.aggregate_id = o.order_id::text \
               AND (e.payload->>'total_cents')::bigint / 10 = o.total_cents)) \
         FROM orders o",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(orders, (32 * 20, 32 * 20));
    assert_eq!(count_rows(&pool).await, 32 * 40);
}

#[sqlx::test(migrations = false)]
async fn sqlx_defaults_break_on_transaction_pooling(pool: PgPool) {
    migrated(&pool).await;
    let bouncer = PgBouncer::start(&pool, PoolMode::Transaction).await;

    // sqlx's default startup parameters.
    let defaults = (*pool.connect_options()).clone().port(bouncer.port);
    let refused = PgPoolOptions::new().max_connections(1).connect_with(defaults).await;
    let refused = refused.map(|_| ()).unwrap_err().to_string();
    assert!(refused.contains("unsupported startup parameter: extra_float_digits"), "{refused}");

    // Named statements, cached (sqlx's default) or not: two clients in turn on the one server
    // connection of a fresh PgBouncer, each preparing its first statement as `sqlx_s_1`.
    for capacity in [100, 0] {
        let bouncer = PgBouncer::start_with(&pool, PoolMode::Transaction, 1).await;
        let client = || {
            let options = bouncer.options(&pool).statement_cache_capacity(capacity);
            PgPoolOptions::new().max_connections(1).connect_lazy_with(options)
        };
        let emit = |through: PgPool| async move {
            let mut tx = through.begin().await?;
            outbox_runtime::emit(&mut tx, &placed(1)).await?;
            tx.commit().await?;
            Ok::<_, Error>(())
        };
        emit(client()).await.unwrap();
        let error = emit(client()).await.unwrap_err();
        let Error::Database(sqlx::Error::Database(error)) = &error else { panic!("{error:?}") };
        // duplicate_prepared_statement
        assert_eq!(error.code().as_deref(), Some("42P05"), "capacity {capacity}: {error}");
        assert!(error.message().contains("\"sqlx_s_1\" already exists"), "{error}");
    }
    assert_eq!(count_rows(&pool).await, 2, "only the first client's events");
}

#[sqlx::test(migrations = false)]
async fn a_relay_through_transaction_pooling_refuses_to_start_and_leases_nothing(pool: PgPool) {
    migrated(&pool).await;
    let ids = emit_committed(&pool, &(0..20).map(placed).collect::<Vec<_>>()).await;
    let bouncer = PgBouncer::start(&pool, PoolMode::Transaction).await;
    let seen = Seen::default();
    let relay = fast(Relay::builder(bouncer.pool(&pool, 10)))
        .state(seen.clone())
        .handler(record)
        .build()
        .unwrap();

    let error = refused(relay).await.unwrap_err();
    assert!(matches!(error, Error::TransactionPooling), "{error:?}");
    let message = error.to_string();
    assert!(
        message
            .contains("connect the relay directly to PostgreSQL, or through a session-mode pool"),
        "{message}"
    );
    assert!(seen.per_event().is_empty());
    for id in ids {
        let row = row_state(&pool, id).await;
        assert!(!row.leased && !row.published && row.attempts == 0, "{id}: {row:?}");
    }
    // Only the check's connections reached the database: none that sets the relay's session
    // settings, which would have stayed on a server connection PgBouncer lends to others.
    let relay_sessions: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() \
         AND application_name IN ('outbox-relay', 'outbox-relay-lease', 'outbox-relay-listen')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(relay_sessions, 0);
}

#[sqlx::test(migrations = false)]
async fn a_relay_through_session_pooling_delivers_and_is_woken_by_notify(pool: PgPool) {
    migrated(&pool).await;
    let (logs, _capturing) = Logs::capture();
    let ids = emit_committed(&pool, &(0..200).map(placed).collect::<Vec<_>>()).await;
    let bouncer = PgBouncer::start(&pool, PoolMode::Session).await;
    let seen = Seen::default();
    // An hour between polls: after the backlog, only a NOTIFY can wake it.
    let relay = Running::start(
        Relay::builder(bouncer.pool(&pool, 10))
            .state(seen.clone())
            .handler(record)
            .poll_interval(Duration::from_secs(3600)),
    );
    eventually("the backlog is published", || async { count_published(&pool).await == 200 }).await;
    // Let it go to sleep, registered for wake-ups.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let late = emit_committed(&pool, &[placed(200)]).await[0];
    eventually("a NOTIFY wakes it", || async { seen.per_event().contains_key(&late) }).await;
    let counts = relay.stop().await;

    let per_event = seen.per_event();
    assert_eq!(per_event.len(), 201);
    assert!(ids.iter().chain([&late]).all(|id| per_event[id] == 1), "each delivered once");
    assert_eq!(counts.delivered, 201);
    assert_eq!(logs.count(WAKE_UPS_UNAVAILABLE), 0, "{}", logs.text());
}

#[sqlx::test(migrations = false)]
async fn a_relay_whose_listen_connection_hears_nothing_warns_once_and_polls(pool: PgPool) {
    migrated(&pool).await;
    let (logs, _capturing) = Logs::capture();
    let bouncer = PgBouncer::start(&pool, PoolMode::Transaction).await;
    let options = pool.connect_options();
    let database = format!("{}:{}", options.get_host(), options.get_port());
    // The LISTEN connection alone through transaction pooling; the statements straight through.
    let router = Router::start("outbox-relay-listen", bouncer.addr(), database.clone()).await;
    let through = PgPoolOptions::new().connect_lazy_with(router.options(&pool));
    let seen = Seen::default();
    let relay = Running::start(
        Relay::builder(through)
            .state(seen.clone())
            .handler(record)
            .poll_interval(Duration::from_millis(200)),
    );

    let mut ids = Vec::new();
    for round in 0..3_i64 {
        ids.extend(
            emit_committed(&pool, &(0..50).map(|n| placed(round * 50 + n)).collect::<Vec<_>>())
                .await,
        );
        let emitted = ids.len();
        eventually("the round's events are delivered", || async {
            seen.per_event().len() == emitted
        })
        .await;
    }
    eventually("the relay warns", || async { logs.count(WAKE_UPS_UNAVAILABLE) > 0 }).await;
    // Still delivering, by polling, and not warning again.
    ids.extend(emit_committed(&pool, &(150..200).map(placed).collect::<Vec<_>>()).await);
    eventually("the last events are delivered", || async { seen.per_event().len() == 200 }).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let counts = relay.stop().await;

    let per_event = seen.per_event();
    assert!(ids.iter().all(|id| per_event.get(id) == Some(&1)), "each delivered once");
    assert_eq!(counts.delivered, 200);
    assert_eq!(logs.count(WAKE_UPS_UNAVAILABLE), 1, "{}", logs.text());
    assert!(router.routed_to(&bouncer.addr()) >= 1, "the LISTEN connection went through PgBouncer");
    assert!(router.routed_to(&database) >= 3, "the statements went straight to PostgreSQL");
}
