//! `emit` and `migrate` on SQLite and MariaDB (MySQL's statements), against the real databases:
//! what an event's row holds, that it commits and rolls back with the caller's transaction,
//! idempotency keys, delays, bad input, and the migrations. The same suite runs on both (the
//! macro below); what only one backend has follows it.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_runtime::{
    emit, emit_all, emit_idempotent, emit_with, Backoff, EmitOptions, Emitted, Error, EventContext,
    InvalidEvent, OutboxEvent, Relay,
};
use serde::{Deserialize, Serialize};
use sqlx::migrate::MigrateError;
use support::backends::{MySqlDatabase, SqliteFile};
use support::{placed, CustomerRenamed, OrderPlaced, SensorRead};
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "account", event_type = "account.posted", ordered)]
struct Posted {
    #[outbox(id)]
    account: String,
    cents: i64,
}

/// An event's row as the reference design's columns read it back, in `seq` order.
#[derive(Debug, sqlx::FromRow)]
struct Row {
    event_id: Uuid,
    aggregate_type: String,
    aggregate_id: String,
    event_type: String,
    payload: String,
    headers: String,
    created_at: DateTime<Utc>,
    available_at: DateTime<Utc>,
    attempts: i32,
    last_error: Option<String>,
    published_at: Option<DateTime<Utc>>,
    event_version: i32,
}

/// The same statement on both backends: `CAST(... AS CHAR)` is text on each (sqlx 0.8 reads
/// MySQL's JSON and the outbox's `utf8mb4_bin` columns as bytes).
const ROWS: &str = "SELECT event_id, CAST(aggregate_type AS CHAR) AS aggregate_type, \
                           CAST(aggregate_id AS CHAR) AS aggregate_id, \
                           CAST(event_type AS CHAR) AS event_type, \
                           CAST(payload AS CHAR) AS payload, CAST(headers AS CHAR) AS headers, \
                           created_at, available_at, attempts, last_error, published_at, \
                           event_version \
                    FROM outbox_events ORDER BY seq";

fn sensor(name: &str, value: f64) -> SensorRead {
    SensorRead { sensor: name.to_owned(), value, by_pair: BTreeMap::new() }
}

/// `emit_idempotent` of `event` under `key`, on any backend.
async fn keyed<E: OutboxEvent>(
    tx: &mut sqlx::Transaction<'_, impl outbox_runtime::Backend>,
    event: &E,
    key: &str,
) -> Emitted {
    emit_idempotent(tx, event, key, EmitOptions::new()).await.unwrap()
}

fn json(text: &str) -> serde_json::Value {
    serde_json::from_str(text).unwrap()
}

/// The suite, for one backend: `$setup` makes `(guard, pool)` for a fresh database, `$teardown`
/// takes the guard back.
macro_rules! backend_suite {
    ($backend:ident, $setup:expr, $teardown:expr) => {
        mod $backend {
            use super::*;

            #[tokio::test]
            async fn migrate_applies_once_with_concurrent_callers() {
                let (guard, pool) = $setup;
                let migrate = || outbox_runtime::migrate(&pool);
                let (a, b) = tokio::join!(migrate(), migrate());
                a.unwrap();
                b.unwrap();
                outbox_runtime::migrate(&pool).await.unwrap();
                let history: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox_migrations")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                let files = std::fs::read_dir(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/../outbox-runtime/migrations-",
                    stringify!($backend)
                ))
                .unwrap()
                .count();
                assert_eq!(history, files as i64, "one history row per migration file");
                let rows: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox_events")
                    .fetch_one(&pool)
                    .await
                    .unwrap();
                assert_eq!(rows, 0);
                pool.close().await;
                $teardown(guard).await;
            }

            #[tokio::test]
            async fn check_schema_tells_a_database_without_the_outbox_and_an_edited_history() {
                let (guard, pool) = $setup;
                let missing = outbox_runtime::check_schema(&pool).await.unwrap_err();
                assert!(matches!(missing, Error::SchemaMissing), "{missing:?}");
                outbox_runtime::migrate(&pool).await.unwrap();
                outbox_runtime::check_schema(&pool).await.unwrap();

                // A migration edited after it was applied is refused, not applied again.
                sqlx::query("UPDATE outbox_migrations SET checksum = X'00'")
                    .execute(&pool)
                    .await
                    .unwrap();
                let edited = outbox_runtime::migrate(&pool).await.unwrap_err();
                assert!(
                    matches!(edited, Error::Migrate(MigrateError::VersionMismatch(_))),
                    "{edited:?}"
                );
                pool.close().await;
                $teardown(guard).await;
            }

            #[tokio::test]
            async fn an_event_is_written_with_its_transaction_and_the_reference_columns() {
                let (guard, pool) = $setup;
                outbox_runtime::migrate(&pool).await.unwrap();

                let mut tx = pool.begin().await.unwrap();
                emit(&mut tx, &placed(1)).await.unwrap();
                tx.rollback().await.unwrap();
                let rows: Vec<Row> = sqlx::query_as(ROWS).fetch_all(&pool).await.unwrap();
                assert!(rows.is_empty(), "a rolled-back emit leaves nothing: {rows:?}");

                let event = placed(4200);
                let mut tx = pool.begin().await.unwrap();
                let options = EmitOptions::new().header("request_id", "req-7");
                let event_id = emit_with(&mut tx, &event, options).await.unwrap();
                tx.commit().await.unwrap();

                let rows: Vec<Row> = sqlx::query_as(ROWS).fetch_all(&pool).await.unwrap();
                let [row] = &rows[..] else { panic!("one row: {rows:?}") };
                assert_eq!(row.event_id, event_id);
                assert_eq!(row.aggregate_type, "order");
                assert_eq!(row.aggregate_id, event.order_id.to_string());
                assert_eq!(row.event_type, "order.placed");
                assert_eq!(json(&row.payload), serde_json::to_value(&event).unwrap());
                assert_eq!(json(&row.headers), serde_json::json!({ "request_id": "req-7" }));
                assert_eq!(row.available_at, row.created_at, "deliverable at once");
                assert!((Utc::now() - row.created_at).num_seconds().abs() < 60, "{row:?}");
                assert_eq!((row.attempts, &row.last_error, row.published_at), (0, &None, None));
                assert_eq!(row.event_version, 1);
                pool.close().await;
                $teardown(guard).await;
            }

            #[tokio::test]
            async fn emit_all_writes_in_iteration_order() {
                let (guard, pool) = $setup;
                outbox_runtime::migrate(&pool).await.unwrap();
                let events: Vec<OrderPlaced> = (1..=5).map(placed).collect();
                let mut tx = pool.begin().await.unwrap();
                let ids = emit_all(&mut tx, &events).await.unwrap();
                let renamed = CustomerRenamed { customer_id: 7, name: "Ada".into() };
                emit(&mut tx, &renamed).await.unwrap();
                tx.commit().await.unwrap();

                let rows: Vec<Row> = sqlx::query_as(ROWS).fetch_all(&pool).await.unwrap();
                let stored: Vec<Uuid> = rows.iter().take(5).map(|row| row.event_id).collect();
                assert_eq!(stored, ids, "rows in `seq` order are the events in iteration order");
                let total = |row: &Row| json(&row.payload)["total_cents"].as_i64().unwrap();
                let totals: Vec<i64> = rows.iter().take(5).map(total).collect();
                assert_eq!(totals, [1, 2, 3, 4, 5]);
                assert_eq!(rows[5].aggregate_type, "customer");
                pool.close().await;
                $teardown(guard).await;
            }

            #[tokio::test]
            async fn an_idempotency_key_writes_once_per_aggregate_type() {
                let (guard, pool) = $setup;
                outbox_runtime::migrate(&pool).await.unwrap();
                let key = "request-42";

                // Rolled back: the key is free again.
                let mut tx = pool.begin().await.unwrap();
                let first = keyed(&mut tx, &placed(1), key).await;
                assert!(first.is_written());
                tx.rollback().await.unwrap();

                let mut tx = pool.begin().await.unwrap();
                let written = keyed(&mut tx, &placed(1), key).await;
                // Within the same transaction, the key finds the event written earlier in it.
                let again = keyed(&mut tx, &placed(2), key).await;
                tx.commit().await.unwrap();
                let Emitted::Written(event_id) = written else { panic!("{written:?}") };
                assert_eq!(again, Emitted::Found(event_id));

                let mut tx = pool.begin().await.unwrap();
                let retried = keyed(&mut tx, &placed(3), key).await;
                let other_type = CustomerRenamed { customer_id: 1, name: "Ada".into() };
                let other = keyed(&mut tx, &other_type, key).await;
                tx.commit().await.unwrap();
                assert_eq!(retried, Emitted::Found(event_id));
                assert!(other.is_written(), "keys are per aggregate type");

                let rows: Vec<Row> = sqlx::query_as(ROWS).fetch_all(&pool).await.unwrap();
                assert_eq!(rows.len(), 2, "{rows:?}");
                assert_eq!(json(&rows[0].payload)["total_cents"], 1);
                pool.close().await;
                $teardown(guard).await;
            }

            #[tokio::test]
            async fn a_delay_and_an_instant_set_when_an_event_is_deliverable() {
                let (guard, pool) = $setup;
                outbox_runtime::migrate(&pool).await.unwrap();
                let at = Utc::now() + chrono::Duration::days(2);
                let mut tx = pool.begin().await.unwrap();
                emit_with(&mut tx, &placed(1), EmitOptions::new().delay(Duration::from_secs(3600)))
                    .await
                    .unwrap();
                emit_with(&mut tx, &placed(2), EmitOptions::new().available_at(at)).await.unwrap();
                tx.commit().await.unwrap();

                let rows: Vec<Row> = sqlx::query_as(ROWS).fetch_all(&pool).await.unwrap();
                let delayed = rows[0].available_at - rows[0].created_at;
                assert!(
                    (delayed - chrono::Duration::hours(1)).num_milliseconds().abs() < 1000,
                    "an hour after the database's now: {delayed:?}"
                );
                // SQLite keeps milliseconds, MySQL microseconds.
                let off = (rows[1].available_at - at).num_microseconds().unwrap().abs();
                assert!(off < 1000, "{} vs {at}", rows[1].available_at);
                pool.close().await;
                $teardown(guard).await;
            }

            #[tokio::test]
            async fn a_bad_event_writes_nothing_and_the_transaction_goes_on() {
                let (guard, pool) = $setup;
                outbox_runtime::migrate(&pool).await.unwrap();
                let mut tx = pool.begin().await.unwrap();
                let nan = sensor("s1", f64::NAN);
                let err = emit(&mut tx, &nan).await.unwrap_err();
                assert!(
                    matches!(
                        err,
                        Error::InvalidEvent {
                            event_type: "sensor.read",
                            reason: InvalidEvent::NonFiniteFloat(_)
                        }
                    ),
                    "{err:?}"
                );
                let nul = sensor("s\0-1", 1.0);
                let err = emit(&mut tx, &nul).await.unwrap_err();
                assert!(
                    matches!(
                        err,
                        Error::InvalidEvent {
                            reason: InvalidEvent::NulCharacter("the aggregate id"),
                            ..
                        }
                    ),
                    "{err:?}"
                );
                let fine = sensor("s1", 0.1);
                emit(&mut tx, &fine).await.unwrap();
                tx.commit().await.unwrap();
                let rows: Vec<Row> = sqlx::query_as(ROWS).fetch_all(&pool).await.unwrap();
                let [row] = &rows[..] else { panic!("only the good event: {rows:?}") };
                let read: SensorRead = serde_json::from_str(&row.payload).unwrap();
                assert_eq!(read, fine, "floats come back exactly");
                pool.close().await;
                $teardown(guard).await;
            }
        }
    };
}

async fn sqlite() -> (SqliteFile, sqlx::SqlitePool) {
    let file = SqliteFile::new();
    let pool = file.pool().await;
    (file, pool)
}

async fn mysql() -> (MySqlDatabase, sqlx::MySqlPool) {
    let database = MySqlDatabase::create().await;
    let pool = database.pool().await;
    (database, pool)
}

async fn keep(_file: SqliteFile) {}

backend_suite!(sqlite, sqlite().await, keep);
backend_suite!(mysql, mysql().await, MySqlDatabase::drop_it);

/// What only MySQL and MariaDB have: concurrent writers, and column lengths.
mod mysql_only {
    use super::*;

    #[tokio::test]
    async fn the_key_lookup_uses_its_index_whatever_the_statistics() {
        let (database, pool) = mysql().await;
        outbox_runtime::migrate(&pool).await.unwrap();
        // Statistics of an empty outbox, then a backlog the planner has not seen.
        sqlx::query("ANALYZE TABLE outbox_events").execute(&pool).await.unwrap();
        let events: Vec<OrderPlaced> = (0..5_000).map(placed).collect();
        let mut tx = pool.begin().await.unwrap();
        emit_all(&mut tx, &events).await.unwrap();
        // A key that is there: for one that is not, the unique index answers while planning.
        let keyed = emit_idempotent(&mut tx, &placed(1), "k", EmitOptions::new()).await.unwrap();
        assert!(keyed.is_written());
        tx.commit().await.unwrap();
        for analyzed in [false, true] {
            if analyzed {
                sqlx::query("ANALYZE TABLE outbox_events").execute(&pool).await.unwrap();
            }
            let plan = sqlx::query(
                "EXPLAIN SELECT event_id FROM outbox_events \
                 WHERE aggregate_type = 'order' AND idempotency_key = 'k' FOR UPDATE",
            )
            .fetch_one(&pool)
            .await
            .unwrap();
            let key: Option<String> = sqlx::Row::get(&plan, "key");
            assert_eq!(
                key.as_deref(),
                Some("outbox_events_idempotency_key"),
                "analyzed {analyzed}"
            );
        }
        pool.close().await;
        database.drop_it().await;
    }

    #[tokio::test]
    async fn an_id_longer_than_the_schema_holds_is_refused_before_writing() {
        let (database, pool) = mysql().await;
        outbox_runtime::migrate(&pool).await.unwrap();
        let mut tx = pool.begin().await.unwrap();
        let long = SensorRead { sensor: "é".repeat(256), value: 1.0, by_pair: BTreeMap::new() };
        let err = emit(&mut tx, &long).await.unwrap_err();
        assert!(
            matches!(
                err,
                Error::InvalidEvent {
                    reason: InvalidEvent::TooLong {
                        what: "the aggregate id",
                        length: 256,
                        limit: 255
                    },
                    ..
                }
            ),
            "{err:?}"
        );
        let longest = SensorRead { sensor: "é".repeat(255), ..long };
        emit(&mut tx, &longest).await.unwrap();
        let err = emit_idempotent(&mut tx, &placed(1), &"k".repeat(256), EmitOptions::new())
            .await
            .unwrap_err();
        assert!(
            matches!(err, Error::InvalidEvent { reason: InvalidEvent::TooLong { .. }, .. }),
            "{err:?}"
        );
        tx.commit().await.unwrap();
        let ids: Vec<String> =
            sqlx::query_scalar("SELECT CAST(aggregate_id AS CHAR) FROM outbox_events")
                .fetch_all(&pool)
                .await
                .unwrap();
        assert_eq!(ids, ["é".repeat(255)], "stored whole, not truncated");
        pool.close().await;
        database.drop_it().await;
    }

    /// docs/least-privilege-mysql.sql's step `step`, for `database` and accounts named after
    /// `tag`, each statement on its own.
    fn grants(step: &str, database: &str, tag: &str) -> Vec<String> {
        let file = include_str!("../docs/least-privilege-mysql.sql");
        let marker = format!("-- step: {step}\n");
        let text = file.split(&marker).nth(1).expect("the step is in the file");
        let text = text.split("-- step: ").next().unwrap();
        text.replace("outbox_db", database)
            .replace("outbox_owner", &format!("'owner_{tag}'@'127.0.0.1'"))
            .replace("outbox_app", &format!("'app_{tag}'@'127.0.0.1'"))
            .replace("outbox_relay", &format!("'relay_{tag}'@'127.0.0.1'"))
            .split(';')
            .map(str::trim)
            .filter(|statement| !statement.is_empty())
            .map(str::to_owned)
            .collect()
    }

    #[tokio::test]
    async fn the_least_privilege_accounts_migrate_emit_and_relay_and_do_nothing_else() {
        let database = MySqlDatabase::create().await;
        let root = database.pool().await;
        let tag = Uuid::new_v4().simple().to_string()[..12].to_owned();
        let run = |statements: Vec<String>| {
            let root = root.clone();
            async move {
                for statement in statements {
                    let statement = sqlx::static_sql(statement);
                    sqlx::query(statement).execute(&root).await.unwrap();
                }
            }
        };
        run(grants("accounts", &database.name, &tag)).await;
        let account = |name: &str| {
            let server = support::backends::mysql_server();
            let host = server.split('@').nth(1).unwrap().to_owned();
            format!("mysql://{name}_{tag}:change%20me@{host}/{}", database.name)
        };
        let owner = sqlx::MySqlPool::connect(&account("owner")).await.unwrap();
        outbox_runtime::migrate(&owner).await.expect("the owner migrates");
        outbox_runtime::check_schema(&owner).await.unwrap();
        run(grants("tables", &database.name, &tag)).await;

        let app = sqlx::MySqlPool::connect(&account("app")).await.unwrap();
        let mut tx = app.begin().await.unwrap();
        emit(&mut tx, &placed(1)).await.unwrap();
        emit_all(&mut tx, &[placed(2), placed(3)]).await.unwrap();
        let written = keyed(&mut tx, &placed(4), "k").await;
        assert_eq!(keyed(&mut tx, &placed(5), "k").await, Emitted::Found(written.event_id()));
        for cents in [1, 2] {
            emit(&mut tx, &Posted { account: "acct-1".into(), cents }).await.unwrap();
        }
        tx.commit().await.unwrap();

        let payloads = sqlx::query("SELECT payload FROM outbox_events").fetch_all(&app).await;
        let refused = payloads.unwrap_err().to_string();
        assert!(refused.contains("denied"), "the application reads no payload: {refused}");
        let update = sqlx::query("UPDATE outbox_events SET attempts = 1").execute(&app).await;
        assert!(update.unwrap_err().to_string().contains("denied"));
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox_events")
            .fetch_one(&root)
            .await
            .unwrap();
        assert_eq!(count, 6);

        // The relay's account delivers them all: leases, a failure and its retry, deletes.
        let relay = sqlx::MySqlPool::connect(&account("relay")).await.unwrap();
        let delivered = Arc::new(AtomicUsize::new(0));
        let count_placed = {
            let delivered = delivered.clone();
            move |_: EventContext, _: OrderPlaced| {
                delivered.fetch_add(1, Ordering::SeqCst);
                async { Ok::<(), std::io::Error>(()) }
            }
        };
        let fail_once = {
            let delivered = delivered.clone();
            move |ctx: EventContext, _: Posted| {
                let first = ctx.attempts() == 0;
                if !first {
                    delivered.fetch_add(1, Ordering::SeqCst);
                }
                async move {
                    match first {
                        true => Err(std::io::Error::other("first attempt")),
                        false => Ok(()),
                    }
                }
            }
        };
        let backoff = Backoff {
            base: Duration::from_millis(10),
            cap: Duration::from_millis(10),
            jitter: false,
        };
        let relay = Relay::builder(relay)
            .handler(count_placed)
            .handler(fail_once)
            .backoff(backoff)
            .delete_on_publish(true)
            .retention(Duration::from_secs(3_600))
            .build()
            .unwrap();
        let all_delivered = async {
            while delivered.load(Ordering::SeqCst) < 6 {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        };
        let counts = relay
            .run_until(async {
                tokio::time::timeout(Duration::from_secs(30), all_delivered).await.unwrap();
            })
            .await
            .expect("the relay's account runs the relay");
        assert_eq!((counts.delivered, counts.failed), (6, 2));
        let left: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox_events")
            .fetch_one(&root)
            .await
            .unwrap();
        assert_eq!(left, 0, "each delivered row deleted");
        app.close().await;
        owner.close().await;
        for name in ["owner", "app", "relay"] {
            let drop = sqlx::static_sql(format!("DROP USER '{name}_{tag}'@'127.0.0.1'"));
            sqlx::query(drop).execute(&root).await.unwrap();
        }
        root.close().await;
        database.drop_it().await;
    }

    #[tokio::test]
    async fn a_key_raced_by_two_transactions_ends_with_one_event() {
        let (database, pool) = mysql().await;
        outbox_runtime::migrate(&pool).await.unwrap();
        let mut first = pool.begin().await.unwrap();
        let written =
            emit_idempotent(&mut first, &placed(1), "k", EmitOptions::new()).await.unwrap();

        let racer = {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut second = pool.begin().await.unwrap();
                let emitted =
                    emit_idempotent(&mut second, &placed(2), "k", EmitOptions::new()).await;
                second.commit().await.unwrap();
                emitted.unwrap()
            })
        };
        // The second waits on the first's key for as long as the first is open.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!racer.is_finished(), "the second emit waits for the first transaction");
        first.commit().await.unwrap();
        assert_eq!(racer.await.unwrap(), Emitted::Found(written.event_id()));

        // A rolled-back first leaves the key to the second.
        let mut first = pool.begin().await.unwrap();
        let first_try = placed(3);
        let emitted = emit_idempotent(&mut first, &first_try, "k2", EmitOptions::new()).await;
        assert!(emitted.unwrap().is_written());
        let racer = {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut second = pool.begin().await.unwrap();
                let emitted =
                    emit_idempotent(&mut second, &placed(4), "k2", EmitOptions::new()).await;
                second.commit().await.unwrap();
                emitted.unwrap()
            })
        };
        tokio::time::sleep(Duration::from_millis(300)).await;
        first.rollback().await.unwrap();
        assert!(racer.await.unwrap().is_written());
        let count: i64 = sqlx::query_scalar("SELECT COUNT(*) FROM outbox_events")
            .fetch_one(&pool)
            .await
            .unwrap();
        assert_eq!(count, 2);
        pool.close().await;
        database.drop_it().await;
    }

    #[tokio::test]
    async fn ordered_events_of_one_aggregate_are_written_one_transaction_at_a_time() {
        let (database, pool) = mysql().await;
        outbox_runtime::migrate(&pool).await.unwrap();
        let posted = |cents| Posted { account: "acct-1".into(), cents };
        let mut first = pool.begin().await.unwrap();
        emit(&mut first, &posted(1)).await.unwrap();

        let second = {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut second = pool.begin().await.unwrap();
                emit(&mut second, &posted(2)).await.unwrap();
                second.commit().await.unwrap();
            })
        };
        // Another aggregate is not held back.
        let mut other = pool.begin().await.unwrap();
        emit(&mut other, &Posted { account: "acct-2".into(), cents: 9 }).await.unwrap();
        other.commit().await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!second.is_finished(), "the second waits for the first to commit");
        first.commit().await.unwrap();
        second.await.unwrap();

        let cents: Vec<i64> = sqlx::query_scalar(
            "SELECT CAST(JSON_EXTRACT(payload, '$.cents') AS SIGNED) FROM outbox_events \
             WHERE aggregate_id = 'acct-1' ORDER BY seq",
        )
        .fetch_all(&pool)
        .await
        .unwrap();
        assert_eq!(cents, [1, 2], "seq follows the order the transactions committed in");
        pool.close().await;
        database.drop_it().await;
    }
}

/// What only SQLite has: a second process on the same file.
mod sqlite_only {
    use super::*;

    #[tokio::test]
    async fn the_key_lookup_uses_its_index_whatever_the_statistics() {
        let file = SqliteFile::new();
        let pool = file.pool().await;
        outbox_runtime::migrate(&pool).await.unwrap();
        // Statistics of an empty outbox, then a backlog the planner has not seen.
        sqlx::query("ANALYZE").execute(&pool).await.unwrap();
        let events: Vec<OrderPlaced> = (0..5_000).map(placed).collect();
        let mut tx = pool.begin().await.unwrap();
        emit_all(&mut tx, &events).await.unwrap();
        tx.commit().await.unwrap();
        for analyzed in [false, true] {
            if analyzed {
                sqlx::query("ANALYZE").execute(&pool).await.unwrap();
            }
            let plan: Vec<(i64, i64, i64, String)> = sqlx::query_as(
                "EXPLAIN QUERY PLAN SELECT event_id FROM outbox_events \
                 WHERE aggregate_type = ?1 AND idempotency_key = ?2",
            )
            .bind("order")
            .bind("k")
            .fetch_all(&pool)
            .await
            .unwrap();
            let details: Vec<&str> = plan.iter().map(|row| row.3.as_str()).collect();
            assert!(
                details.iter().any(|d| d.contains("USING INDEX outbox_events_idempotency_key")),
                "analyzed {analyzed}: {details:?}"
            );
        }
        pool.close().await;
    }

    #[tokio::test]
    async fn two_pools_on_one_file_take_turns_writing() {
        let file = SqliteFile::new();
        let (a, b) = (file.pool().await, file.pool().await);
        outbox_runtime::migrate(&a).await.unwrap();
        outbox_runtime::migrate(&b).await.unwrap();
        let write = |pool: sqlx::SqlitePool| async move {
            for n in 0..20 {
                let mut tx = pool.begin().await.unwrap();
                emit(&mut tx, &placed(n)).await.unwrap();
                tx.commit().await.unwrap();
            }
        };
        tokio::join!(write(a.clone()), write(b.clone()));
        let count: i64 =
            sqlx::query_scalar("SELECT COUNT(*) FROM outbox_events").fetch_one(&a).await.unwrap();
        assert_eq!(count, 40, "every transaction of both committed, after waiting its turn");
        a.close().await;
        b.close().await;
    }
}
