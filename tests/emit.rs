//! `emit`, `emit_all` and `migrate` against the real PostgreSQL.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_runtime::{emit, emit_all, emit_with, EmitOptions, Error, InvalidEvent, OutboxEvent};
use serde::{Deserialize, Serialize};
use sqlx::migrate::Migration;
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Row};
use support::*;
use uuid::Uuid;

#[sqlx::test(migrations = false)]
async fn committed_emit_writes_one_row_with_every_column(pool: PgPool) {
    migrated(&pool).await;
    let event = placed(1250);
    let mut tx = pool.begin().await.unwrap();
    let event_id = emit(&mut tx, &event).await.unwrap();
    tx.commit().await.unwrap();

    let rows = sqlx::query(
        "SELECT event_id, aggregate_type, aggregate_id, event_type, payload, headers, created_at, \
                available_at, attempts, last_error, published_at, seq, ordered, idempotency_key, \
                lease_token, dead_at \
         FROM outbox.events",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 1);
    let row = &rows[0];
    assert_eq!(row.get::<Uuid, _>("event_id"), event_id);
    assert_eq!(event_id.get_version_num(), 7, "event ids are time-ordered UUIDv7");
    assert_eq!(row.get::<String, _>("aggregate_type"), "order");
    assert_eq!(row.get::<String, _>("aggregate_id"), event.order_id.to_string());
    assert_eq!(row.get::<String, _>("event_type"), "order.placed");
    assert_eq!(
        row.get::<serde_json::Value, _>("payload"),
        serde_json::json!({ "order_id": event.order_id, "total_cents": 1250 })
    );
    assert_eq!(row.get::<serde_json::Value, _>("headers"), serde_json::json!({}));
    let created_at: DateTime<Utc> = row.get("created_at");
    assert_eq!(row.get::<DateTime<Utc>, _>("available_at"), created_at);
    assert!((Utc::now() - created_at).num_seconds().abs() < 60, "created_at is the emit time");
    assert_eq!(row.get::<i32, _>("attempts"), 0);
    assert_eq!(row.get::<Option<String>, _>("last_error"), None);
    assert_eq!(row.get::<Option<DateTime<Utc>>, _>("published_at"), None);
    assert!(!row.get::<bool, _>("ordered"), "OrderPlaced is not an ordered event type");
    assert_eq!(row.get::<Option<String>, _>("idempotency_key"), None);
    assert_eq!(row.get::<Option<Uuid>, _>("lease_token"), None);
    assert_eq!(row.get::<Option<DateTime<Utc>>, _>("dead_at"), None);

    let decoded: OrderPlaced = serde_json::from_value(row.get("payload")).unwrap();
    assert_eq!(decoded, event);
}

#[sqlx::test(migrations = false)]
async fn rolled_back_emit_leaves_no_row(pool: PgPool) {
    migrated(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    emit(&mut tx, &placed(1)).await.unwrap();
    tx.rollback().await.unwrap();

    // Dropping an uncommitted transaction rolls back too, and the connection goes back to the
    // pool clean. Another connection never sees an uncommitted row, rolled back or not; the
    // emitting connection does while its transaction is open. So: a pool of one connection,
    // whose next query runs on that very connection.
    let one = PgPoolOptions::new()
        .max_connections(1)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let emitted_on = {
        let mut tx = one.begin().await.unwrap();
        emit(&mut tx, &placed(2)).await.unwrap();
        assert_eq!(count_rows(&mut *tx).await, 1, "the transaction sees its own row");
        backend_pid(&mut tx).await
    };
    let mut conn = one.acquire().await.unwrap();
    let pid: i32 =
        sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut *conn).await.unwrap();
    assert_eq!(pid, emitted_on, "the pool handed back the connection that emitted");
    assert_eq!(count_rows(&mut *conn).await, 0, "its transaction was rolled back, not left open");
    drop(conn);
    one.close().await;

    let count: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox.events").fetch_one(&pool).await.unwrap();
    assert_eq!(count, 0);
}

#[sqlx::test(migrations = false)]
async fn emit_all_writes_a_thousand_events_in_order(pool: PgPool) {
    migrated(&pool).await;
    let events: Vec<OrderPlaced> = (0..1000).map(placed).collect();
    let ids = emit_committed(&pool, &events).await;
    assert_eq!(ids.len(), 1000);

    let rows: Vec<(Uuid, String, i64)> = sqlx::query_as(
        "SELECT event_id, aggregate_id, (payload->>'total_cents')::bigint FROM outbox.events ORDER BY seq",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), 1000);
    for (i, (row, event)) in rows.iter().zip(&events).enumerate() {
        assert_eq!(row.0, ids[i], "ids come back in emit order");
        assert_eq!(row.1, event.order_id.to_string());
        assert_eq!(row.2, event.total_cents, "rows are numbered in emit order");
    }
}

#[sqlx::test(migrations = false)]
async fn emit_all_of_nothing_writes_nothing(pool: PgPool) {
    migrated(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    let ids = emit_all::<OrderPlaced>(&mut tx, []).await.unwrap();
    tx.commit().await.unwrap();
    assert!(ids.is_empty());
}

#[sqlx::test(migrations = false)]
async fn headers_and_delay_are_stored(pool: PgPool) {
    migrated(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    let delayed = emit_with(
        &mut tx,
        &placed(1),
        EmitOptions::new()
            .header("request_id", "req-42")
            .header("tenant", "acme")
            .header("retry_budget", 3)
            .delay(Duration::from_secs(90)),
    )
    .await
    .unwrap();
    let at: DateTime<Utc> = "2031-01-02T03:04:05.678901Z".parse().unwrap();
    let scheduled =
        emit_with(&mut tx, &placed(2), EmitOptions::new().available_at(at)).await.unwrap();
    tx.commit().await.unwrap();

    let (headers, wait): (serde_json::Value, f64) = sqlx::query_as(
        "SELECT headers, extract(epoch FROM available_at - created_at)::float8 \
         FROM outbox.events WHERE event_id = $1",
    )
    .bind(delayed)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(
        headers,
        serde_json::json!({ "request_id": "req-42", "tenant": "acme", "retry_budget": 3 })
    );
    assert_eq!(wait, 90.0);

    assert_eq!(available_at(&pool, scheduled).await, at);
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "grid", event_type = "grid.updated")]
struct GridUpdated {
    #[outbox(id)]
    grid: u32,
    cells: BTreeMap<(u8, u8), u32>,
}

#[sqlx::test(migrations = false)]
async fn unstorable_payloads_are_typed_errors_and_write_nothing(pool: PgPool) {
    migrated(&pool).await;
    let mut tx = pool.begin().await.unwrap();

    let nan = SensorRead { sensor: "s1".into(), value: f64::NAN, by_pair: BTreeMap::new() };
    let err = emit(&mut tx, &nan).await.unwrap_err();
    assert!(
        matches!(err, Error::InvalidEvent { event_type: "sensor.read", reason: InvalidEvent::NonFiniteFloat(x) } if x.is_nan()),
        "{err:?}"
    );
    let nested_inf = SensorRead {
        sensor: "s1".into(),
        value: 1.0,
        by_pair: BTreeMap::from([("a".into(), f64::INFINITY)]),
    };
    let err = emit(&mut tx, &nested_inf).await.unwrap_err();
    assert!(matches!(err, Error::InvalidEvent { reason: InvalidEvent::NonFiniteFloat(_), .. }));

    let tuple_keys = GridUpdated { grid: 1, cells: BTreeMap::from([((0, 0), 5)]) };
    let err = emit(&mut tx, &tuple_keys).await.unwrap_err();
    assert!(
        matches!(err, Error::InvalidEvent { reason: InvalidEvent::Serialize(_), .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("grid.updated"), "{err}");

    let nul_id = SensorRead { sensor: "s\0".into(), value: 1.0, by_pair: BTreeMap::new() };
    let err = emit(&mut tx, &nul_id).await.unwrap_err();
    assert!(matches!(err, Error::InvalidEvent { reason: InvalidEvent::NulCharacter(_), .. }));

    let nul_payload = OrderCancelled { order_id: Uuid::now_v7(), reason: "a\0b".into() };
    let err = emit(&mut tx, &nul_payload).await.unwrap_err();
    assert!(matches!(err, Error::InvalidEvent { reason: InvalidEvent::NulCharacter(_), .. }));

    let nul_header = EmitOptions::new().header("note", "x\0y");
    let err = emit_with(&mut tx, &placed(1), nul_header).await.unwrap_err();
    assert!(matches!(err, Error::InvalidEvent { reason: InvalidEvent::NulCharacter(_), .. }));

    // A batch with one bad event writes none of them.
    let batch = [
        SensorRead { sensor: "ok".into(), value: 1.0, by_pair: BTreeMap::new() },
        SensorRead { sensor: "bad".into(), value: f64::NEG_INFINITY, by_pair: BTreeMap::new() },
    ];
    assert!(emit_all(&mut tx, &batch).await.is_err());

    // Nothing reached the database, so the caller's transaction is still usable.
    let good = emit(&mut tx, &placed(7)).await.unwrap();
    tx.commit().await.unwrap();
    let ids: Vec<Uuid> =
        sqlx::query_scalar("SELECT event_id FROM outbox.events").fetch_all(&pool).await.unwrap();
    assert_eq!(ids, [good]);
}

#[sqlx::test(migrations = false)]
async fn migrate_is_idempotent_and_concurrent_safe(pool: PgPool) {
    let runs = (0..4).map(|_| {
        let pool = pool.clone();
        tokio::spawn(async move { outbox_runtime::migrate(&pool).await })
    });
    for run in runs {
        run.await.unwrap().expect("concurrent migrate succeeds");
    }
    outbox_runtime::migrate(&pool).await.expect("a second migrate is a no-op");
    let applied: Vec<(i64, bool, Vec<u8>)> = sqlx::query_as(
        "SELECT version, success, checksum FROM outbox._sqlx_migrations ORDER BY version",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let expected: Vec<(i64, bool, Vec<u8>)> =
        outbox_migrations().await.iter().map(|m| (m.version, true, m.checksum.to_vec())).collect();
    assert_eq!(applied, expected, "every outbox migration applied, once, as embedded");
}

/// The outbox's migrations as the runtime embeds them: `with_outbox_migrations` appends them to
/// an application's (here the fixture's), which are taken off again. Checked against the files
/// in `outbox-runtime/migrations/`, so that an empty list cannot pass for "all of them".
async fn outbox_migrations() -> Vec<Migration> {
    let app = sqlx::migrate!("fixtures/app_migrations");
    let combined = outbox_runtime::with_outbox_migrations(&app).await.unwrap();
    let mut outbox: Vec<Migration> =
        combined.iter().filter(|m| app.iter().all(|a| a.version != m.version)).cloned().collect();
    outbox.sort_by_key(|m| m.version);
    let files =
        std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../outbox-runtime/migrations"))
            .unwrap()
            .filter(|entry| entry.as_ref().unwrap().path().extension() == Some("sql".as_ref()))
            .count();
    assert_eq!(
        outbox.len(),
        files,
        "one embedded migration per file in outbox-runtime/migrations/"
    );
    outbox
}

#[sqlx::test(migrations = false)]
async fn outbox_migrations_coexist_with_the_applications_own(pool: PgPool) {
    let app = sqlx::migrate!("fixtures/app_migrations");
    app.run(&pool).await.unwrap();
    outbox_runtime::migrate(&pool).await.unwrap();
    // The application's migrator still finds exactly its own history, in either order.
    app.run(&pool).await.expect("the app's migrator is not confused by the outbox's");
    outbox_runtime::migrate(&pool).await.unwrap();

    let app_versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM public._sqlx_migrations ORDER BY version")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(app_versions, [1]);
    let search_path: String =
        sqlx::query_scalar("SHOW search_path").fetch_one(&pool).await.unwrap();
    assert!(!search_path.starts_with("outbox"), "migrate leaves pooled sessions alone");
}

#[sqlx::test(migrations = false)]
async fn outbox_migrations_can_join_the_applications_own_history(pool: PgPool) {
    let app = sqlx::migrate!("fixtures/app_migrations");
    let combined = outbox_runtime::with_outbox_migrations(&app).await.unwrap();
    combined.run(&pool).await.unwrap();
    combined.run(&pool).await.expect("running again is a no-op");

    let versions: Vec<i64> =
        sqlx::query_scalar("SELECT version FROM public._sqlx_migrations ORDER BY version")
            .fetch_all(&pool)
            .await
            .unwrap();
    let mut expected: Vec<i64> = combined.iter().map(|m| m.version).collect();
    expected.sort();
    assert_eq!(versions, expected, "one history holds the app's and the outbox's");
    assert!(versions.contains(&1) && versions.len() > 1, "{versions:?}");
    let outbox_history: Option<String> =
        sqlx::query_scalar("SELECT to_regclass('outbox._sqlx_migrations')::text")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(outbox_history, None, "no second history");

    // The schema is complete: events can be emitted.
    let mut tx = pool.begin().await.unwrap();
    emit(&mut tx, &placed(1)).await.unwrap();
    sqlx::query("INSERT INTO orders (id, state) VALUES ($1, 'placed')")
        .bind(Uuid::now_v7())
        .execute(&mut *tx)
        .await
        .unwrap();
    tx.commit().await.unwrap();
}

#[sqlx::test(migrations = false)]
async fn emit_without_the_schema_says_to_migrate(pool: PgPool) {
    let mut tx = pool.begin().await.unwrap();
    let err = emit(&mut tx, &placed(1)).await.unwrap_err();
    assert!(matches!(err, Error::SchemaMissing), "{err:?}");
    assert!(err.to_string().contains("outbox_runtime::migrate"), "{err}");
}
