//! Idempotent emit against the real PostgreSQL: an idempotency key names one event per aggregate
//! type. A repeated key, in a later transaction, in the same one or racing from another
//! connection, finds the first event (`Emitted::Found` with its id) and writes nothing; a key
//! whose transaction rolls back leaves the racer its own event (`Emitted::Written`).

mod support;

use outbox_runtime::{EmitOptions, Emitted, OutboxEvent};
use sqlx::{PgPool, Postgres, Transaction};
use support::accounts::*;
use support::*;
use tokio::sync::oneshot;
use uuid::Uuid;

async fn emit_keyed<E: OutboxEvent>(
    tx: &mut Transaction<'_, Postgres>,
    event: &E,
    key: &str,
) -> Emitted {
    outbox_runtime::emit_idempotent(tx, event, key, EmitOptions::new()).await.unwrap()
}

/// Emits `event` under `key` in a transaction of its own, committed.
async fn commit_keyed<E: OutboxEvent>(pool: &PgPool, event: &E, key: &str) -> Emitted {
    let mut tx = pool.begin().await.unwrap();
    let emitted = emit_keyed(&mut tx, event, key).await;
    tx.commit().await.unwrap();
    emitted
}

/// `(event_id, n)` of the rows stored under `key` for `aggregate_type`.
async fn keyed_rows(pool: &PgPool, aggregate_type: &str, key: &str) -> Vec<(Uuid, i64)> {
    sqlx::query_as(
        "SELECT event_id, (payload->>'n')::int8 FROM outbox.events \
         WHERE aggregate_type = $1 AND idempotency_key = $2 ORDER BY seq",
    )
    .bind(aggregate_type)
    .bind(key)
    .fetch_all(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn a_repeated_key_finds_the_first_event(pool: PgPool) {
    migrated(&pool).await;
    let Emitted::Written(first) = commit_keyed(&pool, &noted(1, 1), "req-1").await else {
        panic!("the first emit under a key writes its event");
    };
    let again = commit_keyed(&pool, &noted(1, 2), "req-1").await;
    assert_eq!(again, Emitted::Found(first), "the duplicate finds the first event");
    assert_eq!(keyed_rows(&pool, "account", "req-1").await, [(first, 1)], "the first event stands");

    // The scope is the aggregate type: another account, or an ordered type of the same
    // aggregate type, is the same key.
    assert_eq!(commit_keyed(&pool, &noted(2, 3), "req-1").await, Emitted::Found(first));
    assert_eq!(commit_keyed(&pool, &posted(1, 4), "req-1").await, Emitted::Found(first));
    assert_eq!(count_rows(&pool).await, 1);

    // Another key is another event.
    let second = commit_keyed(&pool, &noted(1, 5), "req-2").await;
    assert!(second.is_written() && second.event_id() != first, "{second:?}");
    assert_eq!(keyed_rows(&pool, "account", "req-2").await, [(second.event_id(), 5)]);

    // The same key under another aggregate type is another event.
    let audit = commit_keyed(&pool, &Audited { account: 1, n: 6 }, "req-1").await;
    assert!(audit.is_written(), "{audit:?}");
    assert_eq!(keyed_rows(&pool, "audit", "req-1").await, [(audit.event_id(), 6)]);
    assert_eq!(keyed_rows(&pool, "account", "req-1").await, [(first, 1)]);
    assert_eq!(count_rows(&pool).await, 3);
}

#[sqlx::test(migrations = false)]
async fn a_repeated_key_within_one_transaction_finds_the_first_event(pool: PgPool) {
    migrated(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    let first = emit_keyed(&mut tx, &noted(1, 1), "req").await;
    let again = emit_keyed(&mut tx, &noted(1, 2), "req").await;
    let ordered = emit_keyed(&mut tx, &posted(1, 3), "o").await;
    let ordered_again = emit_keyed(&mut tx, &posted(1, 4), "o").await;
    tx.commit().await.unwrap();
    assert!(first.is_written() && ordered.is_written(), "{first:?} {ordered:?}");
    assert_eq!(again, Emitted::Found(first.event_id()));
    assert_eq!(ordered_again, Emitted::Found(ordered.event_id()));
    assert_eq!(keyed_rows(&pool, "account", "req").await, [(first.event_id(), 1)]);
    assert_eq!(keyed_rows(&pool, "account", "o").await, [(ordered.event_id(), 3)]);
    assert_eq!(count_rows(&pool).await, 2);
}

/// tx1 emits `first` under `key` and stays open; tx2, on another connection, emits `second`
/// under the same key and must wait; then tx1 commits or rolls back.
async fn race<E>(pool: &PgPool, first: E, second: E, key: &'static str, tx1_commits: bool)
where
    E: OutboxEvent + Send + Sync + 'static,
{
    let mut tx1 = pool.begin().await.unwrap();
    let first_id = emit_keyed(&mut tx1, &first, key).await.event_id();

    let (pid_tx, pid_rx) = oneshot::channel();
    let racer = tokio::spawn({
        let pool = pool.clone();
        async move {
            let mut tx2 = pool.begin().await.unwrap();
            pid_tx.send(backend_pid(&mut tx2).await).unwrap();
            let emitted = emit_keyed(&mut tx2, &second, key).await;
            tx2.commit().await.unwrap();
            emitted
        }
    });
    let pid = pid_rx.await.unwrap();
    eventually("the racer waits for tx1", || async { waits_for_lock(pool, pid).await }).await;
    assert!(!racer.is_finished());

    if tx1_commits {
        tx1.commit().await.unwrap();
    } else {
        tx1.rollback().await.unwrap();
    }
    let second = within(racer, "the racer commits").await.unwrap();
    let rows = keyed_rows(pool, E::AGGREGATE_TYPE, key).await;
    assert_eq!(rows.len(), 1, "{key}: one event");
    if tx1_commits {
        assert_eq!(second, Emitted::Found(first_id), "{key}: the racer finds the committed event");
        assert_eq!(rows[0].0, first_id);
    } else {
        assert!(second.is_written(), "{key}: the racer stores its own event: {second:?}");
        assert_ne!(second.event_id(), first_id);
        assert_eq!(rows[0].0, second.event_id());
    }
}

#[sqlx::test(migrations = false)]
async fn racing_duplicate_keys_end_with_one_event(pool: PgPool) {
    migrated(&pool).await;
    race(&pool, noted(1, 1), noted(1, 2), "unordered", true).await;
    race(&pool, posted(1, 1), posted(1, 2), "ordered", true).await;
    assert_eq!(count_rows(&pool).await, 2);
}

#[sqlx::test(migrations = false)]
async fn a_rolled_back_key_leaves_the_racer_its_own_event(pool: PgPool) {
    migrated(&pool).await;
    race(&pool, noted(1, 1), noted(1, 2), "unordered", false).await;
    race(&pool, posted(1, 1), posted(1, 2), "ordered", false).await;
    assert_eq!(count_rows(&pool).await, 2);
}
