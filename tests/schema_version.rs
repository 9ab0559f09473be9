//! The relay against a schema of another version: one missing migrations this version needs
//! (an older release's, never migrated since) is refused at start, naming both versions; one
//! with migrations newer than this version knows (a rolling deploy where the newer release
//! migrated first) is run on, the outbox's migrations being additive.

mod support;

use outbox_runtime::testing::{drain, DrainError};
use outbox_runtime::{Error, EventContext, Relay};
use sqlx::PgPool;
use support::*;

/// The migration before `sql_producers`, and the one this version needs at least.
const EXPIRED_LEASES: i64 = 20261201000001;
const SQL_PRODUCERS: i64 = 20261202000002;

async fn on_placed(_: EventContext<()>, _: OrderPlaced) -> Result<(), HandlerError> {
    Ok(())
}

fn relay(pool: &PgPool) -> Relay {
    Relay::builder(pool.clone()).handler(on_placed).build().unwrap()
}

/// The newest migration this version embeds.
fn newest_known() -> i64 {
    std::fs::read_dir(concat!(env!("CARGO_MANIFEST_DIR"), "/../outbox-runtime/migrations"))
        .unwrap()
        .filter_map(|entry| entry.unwrap().file_name().to_str()?.split('_').next()?.parse().ok())
        .max()
        .unwrap()
}

#[sqlx::test(migrations = false)]
async fn an_outdated_schema_stops_the_relay_at_once_naming_both_versions(pool: PgPool) {
    migrated_up_to(&pool, EXPIRED_LEASES).await;

    // Without the check the lease would fail on a missing column, and be retried forever.
    let err = relay(&pool).run_until(std::future::pending()).await.unwrap_err();
    let Error::SchemaOutdated { applied, needed } = &err else {
        panic!("expected SchemaOutdated, got {err:?}");
    };
    assert_eq!((applied.version, applied.description), (EXPIRED_LEASES, "expired leases"));
    assert_eq!(needed.version, newest_known());
    assert!(needed.version >= SQL_PRODUCERS, "{needed}");
    let message = err.to_string();
    assert!(
        message.starts_with("the outbox schema is at 20261201000001 (expired leases)"),
        "{message}"
    );
    assert!(message.contains(&format!("needs {needed}")), "{message}");
    assert!(
        message.contains("outbox_runtime::migrate") && message.contains("outbox migrate"),
        "{message}"
    );
    assert_eq!(count_rows(&pool).await, 0, "nothing was touched");

    // Migrated, the same relay starts and delivers.
    outbox_runtime::migrate(&pool).await.unwrap();
    outbox_runtime::check_schema(&pool).await.unwrap();
    emit_committed(&pool, &[placed(1)]).await;
    let report = drain(Relay::builder(pool.clone()).handler(on_placed)).await.unwrap();
    assert_eq!(report.counts().delivered, 1);
}

#[sqlx::test(migrations = false)]
async fn a_history_that_lost_a_migration_is_outdated_too(pool: PgPool) {
    migrated(&pool).await;
    sqlx::query("DELETE FROM outbox._sqlx_migrations WHERE version = $1")
        .bind(SQL_PRODUCERS)
        .execute(&pool)
        .await
        .unwrap();
    let err = outbox_runtime::check_schema(&pool).await.unwrap_err();
    let Error::SchemaOutdated { needed, .. } = &err else {
        panic!("expected SchemaOutdated, got {err:?}");
    };
    assert_eq!((needed.version, needed.description), (SQL_PRODUCERS, "sql producers"));
}

#[sqlx::test(migrations = false)]
async fn a_schema_newer_than_this_version_is_run_on(pool: PgPool) {
    migrated(&pool).await;
    // What a newer release's `migrate` leaves: a migration this version does not know.
    sqlx::query(
        "INSERT INTO outbox._sqlx_migrations (version, description, success, checksum, \
                                              execution_time) \
         VALUES ($1, 'from a newer release', true, '\\x00', 0)",
    )
    .bind(newest_known() + 1)
    .execute(&pool)
    .await
    .unwrap();

    outbox_runtime::check_schema(&pool).await.expect("a newer schema is accepted");
    emit_committed(&pool, &[placed(1)]).await;
    let report = drain(Relay::builder(pool.clone()).handler(on_placed)).await.unwrap();
    assert_eq!(report.counts().delivered, 1);
}

#[sqlx::test(migrations = false)]
async fn a_missing_schema_is_still_schema_missing(pool: PgPool) {
    let err = outbox_runtime::check_schema(&pool).await.unwrap_err();
    assert!(matches!(err, Error::SchemaMissing), "{err:?}");
    let err = drain(Relay::builder(pool.clone()).handler(on_placed)).await.unwrap_err();
    assert!(matches!(err, DrainError::Relay(Error::SchemaMissing)), "{err:?}");
}

#[sqlx::test(migrations = false)]
async fn the_applications_history_is_checked_when_it_holds_the_outbox_migrations(pool: PgPool) {
    let app = sqlx::migrate!("fixtures/app_migrations");
    let combined = outbox_runtime::with_outbox_migrations(&app).await.unwrap();
    combined.run(&pool).await.unwrap();
    outbox_runtime::check_schema(&pool).await.expect("the combined history is complete");

    sqlx::query("DELETE FROM public._sqlx_migrations WHERE version = $1")
        .bind(SQL_PRODUCERS)
        .execute(&pool)
        .await
        .unwrap();
    let err = outbox_runtime::check_schema(&pool).await.unwrap_err();
    assert!(
        matches!(&err, Error::SchemaOutdated { needed, .. } if needed.version == SQL_PRODUCERS),
        "{err:?}"
    );
}
