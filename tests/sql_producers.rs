//! Producers outside Rust, against the real PostgreSQL. The reference design's INSERT, which
//! names no `event_id`, gets a version 7 UUID from the database, in time order. `outbox.emit`
//! writes an event by the Rust emit's rules (names, headers, versions, idempotency keys) inside
//! the caller's transaction, so a trigger on a business table emits atomically with the change,
//! and a Rust relay delivers it to a typed handler. Ordered events from SQL take the Rust emit's
//! lock, so SQL and Rust events of one aggregate are delivered in commit order. That the
//! application role of `docs/least-privilege.sql` can do all of it, and the relay role none of
//! it, is proved in `privileges.rs`.

mod support;

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_runtime::{emit_idempotent, EmitOptions, EventContext, OutboxEvent, Relay};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use support::accounts::*;
use support::*;
use tokio::sync::oneshot;
use uuid::{Uuid, Variant};

/// SQLSTATE `invalid_parameter_value`: every argument `outbox.emit` refuses.
const INVALID: &str = "22023";

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// `outbox.emit` of an ordered `account.posted`, the event the Rust `Posted` writes.
async fn sql_posted(conn: &mut PgConnection, account: u32, n: u32) -> Uuid {
    sqlx::query_scalar(
        "SELECT outbox.emit(aggregate_type => 'account', aggregate_id => $1, \
                            event_type => 'account.posted', payload => $2, ordered => true)",
    )
    .bind(account.to_string())
    .bind(json!({ "account": account, "n": n }))
    .fetch_one(conn)
    .await
    .unwrap()
}

/// `outbox.emit` of an unordered `account.noted` of account 1 under an idempotency key.
async fn sql_keyed(conn: &mut PgConnection, key: &str, n: u32) -> Uuid {
    sqlx::query_scalar(
        "SELECT outbox.emit('account', '1', 'account.noted', $1, idempotency_key => $2)",
    )
    .bind(json!({ "account": 1, "n": n }))
    .bind(key)
    .fetch_one(conn)
    .await
    .unwrap()
}

/// The SQLSTATE and message `sql` fails with.
async fn refusal(pool: &PgPool, sql: &'static str) -> (String, String) {
    match sqlx::query(sql).execute(pool).await {
        Err(sqlx::Error::Database(error)) => {
            (error.code().unwrap_or_default().into_owned(), error.message().to_owned())
        }
        other => panic!("{sql}: expected a database error, got {other:?}"),
    }
}

async fn execute(pool: &PgPool, sql: &'static str) {
    sqlx::query(sql).execute(pool).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
}

/// The instant a version 7 id encodes, in microseconds since the Unix epoch: 48 bits of
/// milliseconds, then `outbox.uuid_v7()`'s 12 bits of sub-millisecond fraction (rounded down,
/// so at most a microsecond early).
fn v7_micros(id: Uuid) -> i64 {
    let bytes = id.as_bytes();
    let millis = bytes[..6].iter().fold(0_i64, |acc, &byte| acc << 8 | i64::from(byte));
    let fraction = i64::from(u16::from_be_bytes([bytes[6], bytes[7]]) & 0x0fff);
    millis * 1000 + fraction * 1000 / 4096
}

// ---------------------------------------------------------------------------------------------
// Ids made by the database
// ---------------------------------------------------------------------------------------------

#[sqlx::test(migrations = false)]
async fn the_reference_insert_gets_time_ordered_v7_ids(pool: PgPool) {
    migrated(&pool).await;
    let mut ids = Vec::new();
    for n in 0..20 {
        // Each insert is a transaction of its own: its `created_at` (the transaction's start)
        // is before the id was made, and a clock read after it is after.
        let (id, created_at): (Uuid, DateTime<Utc>) = sqlx::query_as(
            "INSERT INTO outbox.events (aggregate_type, aggregate_id, event_type, payload, \
                                        headers) \
             VALUES ('order', $1, 'order.placed', $2, '{}') RETURNING event_id, created_at",
        )
        .bind(n.to_string())
        .bind(json!({ "n": n }))
        .fetch_one(&pool)
        .await
        .unwrap();
        let after: DateTime<Utc> =
            sqlx::query_scalar("SELECT clock_timestamp()").fetch_one(&pool).await.unwrap();
        assert_eq!((id.get_version_num(), id.get_variant()), (7, Variant::RFC4122), "{id}");
        let made = v7_micros(id);
        assert!(
            created_at.timestamp_micros() - 1 <= made && made <= after.timestamp_micros(),
            "{id} encodes {made} µs, but was made between {created_at} and {after}"
        );
        ids.push(id);
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids increase with time: {ids:#?}");
    assert_eq!(count_rows(&pool).await, 20);

    // They sort by time with the Rust side's ids, a millisecond apart or more (the database is
    // on this host: one clock).
    let sql_id = || async {
        sqlx::query_scalar::<_, Uuid>("SELECT outbox.uuid_v7()").fetch_one(&pool).await.unwrap()
    };
    let before = sql_id().await;
    tokio::time::sleep(Duration::from_millis(2)).await;
    let rust = Uuid::now_v7();
    tokio::time::sleep(Duration::from_millis(2)).await;
    let after = sql_id().await;
    assert!(before < rust && rust < after, "{before} < {rust} < {after}");

    // Many in one statement: all distinct, all version 7 of the RFC's variant.
    let many: Vec<Uuid> =
        sqlx::query_scalar("SELECT outbox.uuid_v7() FROM generate_series(1, 20000)")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert!(many
        .iter()
        .all(|id| id.get_version_num() == 7 && id.get_variant() == Variant::RFC4122));
    assert_eq!(many.iter().collect::<HashSet<_>>().len(), 20_000);
}

// ---------------------------------------------------------------------------------------------
// A trigger on a business table
// ---------------------------------------------------------------------------------------------

/// The event the `orders` table's trigger writes, read by a Rust handler.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.status_changed", ordered)]
struct OrderStatusChanged {
    #[outbox(id)]
    order_id: i64,
    status: String,
    total_cents: i64,
}

/// A business table whose inserts and status changes emit `OrderStatusChanged` from SQL.
const ORDERS: &str = "
CREATE TABLE orders (id bigint PRIMARY KEY, status text NOT NULL, total_cents bigint NOT NULL);
CREATE FUNCTION orders_outbox() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    PERFORM outbox.emit(
        aggregate_type => 'order', aggregate_id => NEW.id::text,
        event_type => 'order.status_changed',
        payload => jsonb_build_object('order_id', NEW.id, 'status', NEW.status,
                                      'total_cents', NEW.total_cents),
        headers => jsonb_build_object('table', TG_TABLE_NAME),
        ordered => true);
    RETURN NULL;
END
$$;
CREATE TRIGGER orders_outbox AFTER INSERT OR UPDATE OF status ON orders
    FOR EACH ROW EXECUTE FUNCTION orders_outbox();
";

/// What the handler received: the event and its `table` header.
type Received = Arc<Mutex<Vec<(OrderStatusChanged, Option<String>)>>>;

async fn on_status(
    ctx: EventContext<Received>,
    event: OrderStatusChanged,
) -> Result<(), HandlerError> {
    let table = ctx.header("table").map(str::to_owned);
    ctx.state().lock().unwrap().push((event, table));
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn a_trigger_emits_with_its_transaction_and_a_relay_delivers_it(pool: PgPool) {
    migrated(&pool).await;
    sqlx::raw_sql(ORDERS).execute(&pool).await.unwrap();
    let received = Received::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone())).state(received.clone()).handler(on_status),
    );

    execute(&pool, "INSERT INTO orders VALUES (1, 'placed', 4200)").await;
    execute(&pool, "UPDATE orders SET status = 'paid' WHERE id = 1").await;
    // A business transaction that rolls back emits nothing, though its triggers ran in it.
    let mut tx = pool.begin().await.unwrap();
    sqlx::query("INSERT INTO orders VALUES (2, 'placed', 100)").execute(&mut *tx).await.unwrap();
    sqlx::query("UPDATE orders SET status = 'cancelled' WHERE id = 1")
        .execute(&mut *tx)
        .await
        .unwrap();
    assert_eq!(count_rows(&mut *tx).await, 4, "the trigger wrote inside the transaction");
    tx.rollback().await.unwrap();
    // The trigger is on `status`: another change emits nothing.
    execute(&pool, "UPDATE orders SET total_cents = 4300 WHERE id = 1").await;
    execute(&pool, "UPDATE orders SET status = 'shipped' WHERE id = 1").await;

    eventually("three events are delivered", || async { received.lock().unwrap().len() == 3 })
        .await;
    tokio::time::sleep(Duration::from_millis(300)).await; // time for a wrong fourth to show
    let counts = relay.stop().await;
    let changed = |status: &str, total_cents| {
        let event = OrderStatusChanged { order_id: 1, status: status.into(), total_cents };
        (event, Some("orders".to_owned()))
    };
    assert_eq!(
        *received.lock().unwrap(),
        [changed("placed", 4200), changed("paid", 4200), changed("shipped", 4300)],
        "the committed changes, in commit order, with the trigger's header"
    );
    assert_eq!((counts.delivered, counts.failed), (3, 0));
    assert_eq!(count_rows(&pool).await, 3, "nothing of the rolled-back transaction");
}

// ---------------------------------------------------------------------------------------------
// Ordering across SQL and Rust producers
// ---------------------------------------------------------------------------------------------

/// How one emit of the mixed tests writes its event.
#[derive(Debug, Clone, Copy)]
enum Via {
    Sql,
    Rust,
}

async fn emit_via(tx: &mut Transaction<'_, Postgres>, via: Via, account: u32, n: u32) {
    match via {
        Via::Sql => {
            sql_posted(tx, account, n).await;
        }
        Via::Rust => {
            outbox_runtime::emit(tx, &posted(account, n)).await.unwrap();
        }
    }
}

#[sqlx::test(migrations = false)]
async fn sql_and_rust_ordered_emits_queue_on_one_lock(pool: PgPool) {
    migrated(&pool).await;
    let log = Log::default();
    let relay =
        Running::start(fast(Relay::builder(pool.clone())).state(log.clone()).handler(log_posted));

    // One way holds account 1 in an open transaction; the other way, on another connection,
    // must wait for it: Rust holds and SQL waits, then SQL holds and Rust waits.
    for (n, holds, waits) in [(1, Via::Rust, Via::Sql), (3, Via::Sql, Via::Rust)] {
        let mut holder = pool.begin().await.unwrap();
        emit_via(&mut holder, holds, 1, n).await;
        let (pid_tx, pid_rx) = oneshot::channel();
        let waiter = tokio::spawn({
            let pool = pool.clone();
            async move {
                let mut tx = pool.begin().await.unwrap();
                pid_tx.send(backend_pid(&mut tx).await).unwrap();
                emit_via(&mut tx, waits, 1, n + 1).await;
                tx.commit().await.unwrap();
            }
        });
        let pid = pid_rx.await.unwrap();
        eventually("the second emit waits for the first's transaction", || {
            waits_for_lock(&pool, pid)
        })
        .await;
        // Another account's events go through meanwhile.
        let other = emit_committed(&pool, &[posted(2, n)]).await[0];
        until_published(&pool, other).await;
        assert!(!waiter.is_finished(), "{waits:?} still waits for {holds:?}");
        holder.commit().await.unwrap();
        within(waiter, "the second emit commits").await.unwrap();
    }
    // A rolled-back SQL emit leaves no event, and no gap that holds the next one back.
    let mut tx = pool.begin().await.unwrap();
    emit_via(&mut tx, Via::Sql, 1, 99).await;
    tx.rollback().await.unwrap();
    let mut tx = pool.begin().await.unwrap();
    emit_via(&mut tx, Via::Sql, 1, 5).await;
    tx.commit().await.unwrap();

    eventually("account 1's five events are delivered", || async { log.of(1).len() == 5 }).await;
    relay.stop().await;
    let delivered: Vec<u32> = log.of(1).into_iter().map(|(n, _)| n).collect();
    assert_eq!(delivered, [1, 2, 3, 4, 5], "commit order, across SQL and Rust");
    assert_eq!(count_rows(&pool).await, 7);
}

const MIXED_ACCOUNTS: u32 = 3;
const MIXED_EMITTERS: u64 = 4;
const MIXED_TRANSACTIONS: usize = 15;

/// What the mixed emitters did: the emit order per account, and the rolled-back `n`s.
#[derive(Clone, Default)]
struct Emitted {
    order: Arc<Mutex<BTreeMap<u32, Vec<u32>>>>,
    rolled_back: Arc<Mutex<Vec<u32>>>,
}

/// Transactions of one account each, emitting through SQL, Rust or both; about one in six
/// rolls back.
async fn mixed_emitter(pool: PgPool, emitted: Emitted, next: Arc<AtomicU32>, seed: u64) {
    const WAYS: [&[Via]; 4] =
        [&[Via::Sql], &[Via::Rust], &[Via::Sql, Via::Rust], &[Via::Rust, Via::Sql]];
    let mut rng = fastrand::Rng::with_seed(seed);
    for _ in 0..MIXED_TRANSACTIONS {
        let account = rng.u32(1..=MIXED_ACCOUNTS);
        let mut tx = pool.begin().await.unwrap();
        let mut ns = Vec::new();
        for &via in WAYS[rng.usize(..WAYS.len())] {
            let n = next.fetch_add(1, SeqCst);
            emit_via(&mut tx, via, account, n).await;
            ns.push(n);
        }
        if rng.usize(..6) == 0 {
            tx.rollback().await.unwrap();
            emitted.rolled_back.lock().unwrap().extend(ns);
        } else {
            // Recorded while this transaction holds the account's lock: no other transaction
            // can emit for the account before this one commits, so this is commit order.
            emitted.order.lock().unwrap().entry(account).or_default().extend(ns);
            tx.commit().await.unwrap();
        }
        tokio::task::yield_now().await;
    }
}

#[sqlx::test(migrations = false)]
async fn concurrent_sql_and_rust_producers_are_delivered_in_commit_order(pool: PgPool) {
    migrated(&pool).await;
    let log = Log::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone())).state(log.clone()).handler(log_posted).concurrency(8),
    );
    // The emitters get a pool of their own: the test pool holds only a few connections.
    let emitters = PgPoolOptions::new()
        .max_connections(MIXED_EMITTERS as u32)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let (emitted, next) = (Emitted::default(), Arc::new(AtomicU32::new(1)));
    let tasks: Vec<_> = (0..MIXED_EMITTERS)
        .map(|seed| {
            tokio::spawn(mixed_emitter(emitters.clone(), emitted.clone(), next.clone(), seed))
        })
        .collect();
    for task in tasks {
        within(task, "an emitter finishes").await.unwrap();
    }
    emitters.close().await;

    let order = emitted.order.lock().unwrap().clone();
    let total: usize = order.values().map(Vec::len).sum();
    eventually("every committed event is delivered", || async { log.len() == total }).await;
    tokio::time::sleep(Duration::from_millis(300)).await; // time for a wrong extra to show
    relay.stop().await;

    assert_eq!(order.len(), MIXED_ACCOUNTS as usize);
    for (account, emitted_order) in &order {
        let delivered: Vec<u32> = log.of(*account).into_iter().map(|(n, _)| n).collect();
        assert_eq!(&delivered, emitted_order, "account {account} in commit order, once each");
    }
    assert_eq!(log.len(), total);
    let rolled_back = emitted.rolled_back.lock().unwrap().clone();
    assert!(!rolled_back.is_empty(), "the plan rolls some transactions back");
    assert!(log.all().iter().all(|seen| !rolled_back.contains(&seen.n)));
    assert_eq!(count_rows(&pool).await, total as i64);
}

// ---------------------------------------------------------------------------------------------
// The rules
// ---------------------------------------------------------------------------------------------

#[sqlx::test(migrations = false)]
async fn emit_refuses_what_the_rust_emit_refuses(pool: PgPool) {
    migrated(&pool).await;
    let grammar = r#"use lowercase letters, digits, "_", "." and "-", starting with a letter"#;
    let too_long = format!("'{}', '1', 'order.placed', '{{}}'", "a".repeat(129));
    let cases = [
        (
            "'Order', '1', 'order.placed', '{}'",
            format!("invalid aggregate_type 'Order': {grammar}"),
        ),
        (
            "'1order', '1', 'order.placed', '{}'",
            format!("invalid aggregate_type '1order': {grammar}"),
        ),
        ("'', '1', 'order.placed', '{}'", format!("invalid aggregate_type '': {grammar}")),
        (
            "'order', '1', 'order placed', '{}'",
            format!("invalid event_type 'order placed': {grammar}"),
        ),
        (
            "'order', '1', 'ordér.placed', '{}'",
            format!("invalid event_type 'ordér.placed': {grammar}"),
        ),
        (
            "'order', '1', 'order/placed', '{}'",
            format!("invalid event_type 'order/placed': {grammar}"),
        ),
        ("'order', '1', NULL, '{}'", format!("invalid event_type NULL: {grammar}")),
        (too_long.as_str(), "aggregate_type is 129 characters long, the maximum is 128".to_owned()),
        ("'order', NULL, 'order.placed', '{}'", "aggregate_id cannot be NULL".to_owned()),
        ("'order', '1', 'order.placed', NULL", "payload cannot be NULL".to_owned()),
        (
            "'order', '1', 'order.placed', '{}', headers => '[]'",
            "headers must be a JSON object, not a JSON array".to_owned(),
        ),
        (
            "'order', '1', 'order.placed', '{}', headers => '\"request-7\"'",
            "headers must be a JSON object, not a JSON string".to_owned(),
        ),
        (
            "'order', '1', 'order.placed', '{}', headers => 'null'",
            "headers must be a JSON object, not a JSON null".to_owned(),
        ),
        (
            "'order', '1', 'order.placed', '{}', headers => NULL",
            "headers must be a JSON object, not NULL".to_owned(),
        ),
        (
            "'order', '1', 'order.placed', '{}', event_version => 0",
            "event_version must be at least 1, not 0".to_owned(),
        ),
        (
            "'order', '1', 'order.placed', '{}', event_version => -3",
            "event_version must be at least 1, not -3".to_owned(),
        ),
        (
            "'order', '1', 'order.placed', '{}', event_version => NULL",
            "event_version must be at least 1, not NULL".to_owned(),
        ),
        (
            "'order', '1', 'order.placed', '{}', ordered => NULL",
            "ordered cannot be NULL".to_owned(),
        ),
        (
            "'order', '1', 'order.placed', '{}', available_at => NULL",
            "available_at cannot be NULL".to_owned(),
        ),
    ];
    for (args, message) in cases {
        let sql = sqlx::static_sql(format!("SELECT outbox.emit({args})"));
        let expected = (INVALID.to_owned(), format!("outbox.emit: {message}"));
        assert_eq!(refusal(&pool, sql).await, expected, "{sql}");
    }
    assert_eq!(count_rows(&pool).await, 0, "a refused emit writes nothing");

    // The edges of the grammar pass, with every optional argument given by name.
    let longest = "a".repeat(128);
    let id: Uuid = sqlx::query_scalar(
        "SELECT outbox.emit($1, '', 'a-b.c_9', '{\"x\": 1}', \
                            headers => '{\"request_id\": \"r-1\"}', ordered => true, \
                            event_version => 7, available_at => now() + interval '1 hour')",
    )
    .bind(&longest)
    .fetch_one(&pool)
    .await
    .unwrap();
    let row: (String, String, String, serde_json::Value, serde_json::Value, bool, i32, bool) =
        sqlx::query_as(
            "SELECT aggregate_type, aggregate_id, event_type, payload, headers, ordered, \
                    event_version, available_at > now() + interval '59 minutes' \
             FROM outbox.events WHERE event_id = $1",
        )
        .bind(id)
        .fetch_one(&pool)
        .await
        .unwrap();
    let headers = json!({ "request_id": "r-1" });
    let expected =
        (longest, String::new(), "a-b.c_9".into(), json!({ "x": 1 }), headers, true, 7, true);
    assert_eq!(row, expected);
}

#[sqlx::test(migrations = false)]
async fn a_repeated_idempotency_key_returns_the_first_event(pool: PgPool) {
    migrated(&pool).await;
    let keyed_rows = |key: &'static str| {
        let pool = pool.clone();
        async move {
            sqlx::query_as::<_, (Uuid, i64)>(
                "SELECT event_id, (payload->>'n')::int8 FROM outbox.events \
                 WHERE idempotency_key = $1 ORDER BY seq",
            )
            .bind(key)
            .fetch_all(&pool)
            .await
            .unwrap()
        }
    };
    let mut conn = pool.acquire().await.unwrap();
    let first = sql_keyed(&mut conn, "cmd-1", 1).await;
    assert_eq!(sql_keyed(&mut conn, "cmd-1", 2).await, first, "a later transaction");
    assert_eq!(keyed_rows("cmd-1").await, [(first, 1)], "the first event stands");

    // In one transaction, and ordered.
    let mut tx = pool.begin().await.unwrap();
    let a = sql_keyed(&mut tx, "cmd-2", 3).await;
    assert_eq!(sql_keyed(&mut tx, "cmd-2", 4).await, a, "the same transaction");
    let ordered = "SELECT outbox.emit('account', '1', 'account.posted', $1, ordered => true, \
                                     idempotency_key => 'cmd-3')";
    let o1: Uuid =
        sqlx::query_scalar(ordered).bind(json!({"n": 5})).fetch_one(&mut *tx).await.unwrap();
    let o2: Uuid =
        sqlx::query_scalar(ordered).bind(json!({"n": 6})).fetch_one(&mut *tx).await.unwrap();
    assert_eq!(o2, o1, "an ordered event");
    tx.commit().await.unwrap();

    // SQL and Rust share the keys.
    let commit_keyed = |event: Noted, key: &'static str| {
        let pool = pool.clone();
        async move {
            let mut tx = pool.begin().await.unwrap();
            let emitted = emit_idempotent(&mut tx, &event, key, EmitOptions::new()).await.unwrap();
            tx.commit().await.unwrap();
            emitted
        }
    };
    let rust_after_sql = commit_keyed(noted(1, 7), "cmd-1").await;
    assert_eq!(rust_after_sql, outbox_runtime::Emitted::Found(first), "Rust after SQL");
    let by_rust = commit_keyed(noted(1, 8), "cmd-4").await;
    assert!(by_rust.is_written(), "{by_rust:?}");
    assert_eq!(sql_keyed(&mut conn, "cmd-4", 9).await, by_rust.event_id(), "SQL after Rust");
    drop(conn);

    // Racing: the second waits for the first's transaction and gets its event if it commits,
    // its own if it rolls back.
    for (key, first_commits) in [("race-1", true), ("race-2", false)] {
        let mut tx1 = pool.begin().await.unwrap();
        let first = sql_keyed(&mut tx1, key, 10).await;
        let (pid_tx, pid_rx) = oneshot::channel();
        let racer = tokio::spawn({
            let pool = pool.clone();
            async move {
                let mut tx2 = pool.begin().await.unwrap();
                pid_tx.send(backend_pid(&mut tx2).await).unwrap();
                let id = sql_keyed(&mut tx2, key, 11).await;
                tx2.commit().await.unwrap();
                id
            }
        });
        let pid = pid_rx.await.unwrap();
        eventually("the racer waits for tx1", || waits_for_lock(&pool, pid)).await;
        if first_commits {
            tx1.commit().await.unwrap();
            assert_eq!(within(racer, "the racer commits").await.unwrap(), first);
            assert_eq!(keyed_rows(key).await, [(first, 10)]);
        } else {
            tx1.rollback().await.unwrap();
            let own = within(racer, "the racer commits").await.unwrap();
            assert_ne!(own, first);
            assert_eq!(keyed_rows(key).await, [(own, 11)]);
        }
    }
    assert_eq!(count_rows(&pool).await, 6, "one event per key");
}

// ---------------------------------------------------------------------------------------------
// Versions
// ---------------------------------------------------------------------------------------------

/// Version 1 of a booking: the weight in kilograms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "shipment", event_type = "shipment.booked")]
struct ShipmentBookedV1 {
    #[outbox(id)]
    shipment_id: i64,
    kilograms: i64,
}

/// Version 2: the weight in grams.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "shipment", event_type = "shipment.booked", version = 2, upcast_from = ShipmentBookedV1)]
struct ShipmentBooked {
    #[outbox(id)]
    shipment_id: i64,
    grams: i64,
}

impl From<ShipmentBookedV1> for ShipmentBooked {
    fn from(v1: ShipmentBookedV1) -> Self {
        ShipmentBooked { shipment_id: v1.shipment_id, grams: v1.kilograms * 1000 }
    }
}

/// The stored version and the event as the handler read it.
type Versions = Arc<Mutex<Vec<(u32, ShipmentBooked)>>>;

async fn on_booked(ctx: EventContext<Versions>, event: ShipmentBooked) -> Result<(), HandlerError> {
    ctx.state().lock().unwrap().push((ctx.version(), event));
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn a_handler_sees_the_version_emitted_from_sql(pool: PgPool) {
    migrated(&pool).await;
    // Without `event_version`: the default, 1.
    let v1: Uuid = sqlx::query_scalar(
        "SELECT outbox.emit('shipment', '1', 'shipment.booked', \
                            '{\"shipment_id\": 1, \"kilograms\": 3}')",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let v2: Uuid = sqlx::query_scalar(
        "SELECT outbox.emit('shipment', '2', 'shipment.booked', \
                            '{\"shipment_id\": 2, \"grams\": 500}', event_version => 2)",
    )
    .fetch_one(&pool)
    .await
    .unwrap();

    let seen = Versions::default();
    let relay =
        Running::start(fast(Relay::builder(pool.clone())).state(seen.clone()).handler(on_booked));
    until_published(&pool, v1).await;
    until_published(&pool, v2).await;
    relay.stop().await;
    let mut seen = seen.lock().unwrap().clone();
    seen.sort_by_key(|(version, _)| *version);
    assert_eq!(
        seen,
        [
            (1, ShipmentBooked { shipment_id: 1, grams: 3000 }),
            (2, ShipmentBooked { shipment_id: 2, grams: 500 }),
        ],
        "each row read as the version it was emitted at, then upcast"
    );
}
