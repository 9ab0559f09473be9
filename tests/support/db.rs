//! Database helpers shared by the workspace's tests (through `support`) and by `outbox-cli`'s
//! tests, which include this file with `#[path]`: so it uses only the crates both have as
//! dev-dependencies (outbox-runtime, sqlx, serde_json, uuid).
#![allow(dead_code)] // each including crate uses its own part

use outbox_runtime::OutboxEvent;
use sqlx::PgPool;
use uuid::Uuid;

/// Applies the outbox schema to a test database.
pub async fn migrated(pool: &PgPool) {
    outbox_runtime::migrate(pool).await.expect("outbox migrations apply");
}

/// Emits `events` in one committed transaction; returns their ids.
pub async fn emit_committed<E: OutboxEvent>(pool: &PgPool, events: &[E]) -> Vec<Uuid> {
    let mut tx = pool.begin().await.unwrap();
    let ids = outbox_runtime::emit_all(&mut tx, events).await.unwrap();
    tx.commit().await.unwrap();
    ids
}

/// Inserts a dead event as a relay leaves one: 10 attempts, `error` as its last error, aggregate
/// id `agg-1`, payload `{"total_cents": 4200, "lines": [1, 2]}`, headers
/// `{"request_id": "req-7"}`. Ids are UUIDv7, so insertion order is list order.
pub async fn dead_row(pool: &PgPool, aggregate_type: &str, event_type: &str, error: &str) -> Uuid {
    let event_id = Uuid::now_v7();
    sqlx::query(
        "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, payload, \
                                    headers, attempts, last_error, dead_at) \
         VALUES ($1, $2, 'agg-1', $3, $4, $5, 10, $6, now())",
    )
    .bind(event_id)
    .bind(aggregate_type)
    .bind(event_type)
    .bind(serde_json::json!({ "total_cents": 4200, "lines": [1, 2] }))
    .bind(serde_json::json!({ "request_id": "req-7" }))
    .bind(error)
    .execute(pool)
    .await
    .unwrap();
    event_id
}

/// Moves the event's `created_at` back by `age` (a PostgreSQL interval, e.g. `30 days`).
pub async fn backdate(pool: &PgPool, event_id: Uuid, age: &str) {
    sqlx::query("UPDATE outbox.events SET created_at = now() - $2::interval WHERE event_id = $1")
        .bind(event_id)
        .bind(age)
        .execute(pool)
        .await
        .unwrap();
}

/// The URL of the database behind a `#[sqlx::test]` pool, for a child process (trust
/// authentication: no password).
pub fn database_url(pool: &PgPool) -> String {
    let options = pool.connect_options();
    format!(
        "postgres://{}@{}:{}/{}",
        options.get_username(),
        options.get_host(),
        options.get_port(),
        options.get_database().expect("sqlx::test names the database")
    )
}
