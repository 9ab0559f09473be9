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

/// Leaves the outbox schema as a release whose newest migration was `version` would have: the
/// files of `outbox-runtime/migrations/` up to it, copied to a directory of this call's own and
/// run by sqlx's migrator into `outbox._sqlx_migrations`, as `migrate` runs them.
pub async fn migrated_up_to(pool: &PgPool, version: i64) {
    let source = concat!(env!("CARGO_MANIFEST_DIR"), "/../outbox-runtime/migrations");
    let dir = std::env::temp_dir().join(format!("outbox-migrations-{}", Uuid::new_v4()));
    std::fs::create_dir(&dir).unwrap();
    let mut copied = 0;
    for entry in std::fs::read_dir(source).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_str().unwrap().to_owned();
        let number: i64 = name.split('_').next().unwrap().parse().unwrap();
        if number <= version {
            std::fs::copy(&path, dir.join(&name)).unwrap();
            copied += 1;
        }
    }
    assert!(copied > 0, "no outbox migration up to {version}");
    sqlx::query("CREATE SCHEMA outbox").execute(pool).await.unwrap();
    let options = (*pool.connect_options()).clone().options([("search_path", "outbox")]);
    let outbox = sqlx::postgres::PgPoolOptions::new()
        .max_connections(1)
        .connect_with(options)
        .await
        .unwrap();
    let migrator = sqlx::migrate::Migrator::new(dir.as_path()).await.unwrap();
    migrator.run(&outbox).await.expect("the older migrations apply");
    outbox.close().await;
    std::fs::remove_dir_all(&dir).unwrap();
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
