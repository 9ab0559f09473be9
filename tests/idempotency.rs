//! Idempotent emit against the real PostgreSQL: an idempotency key names one event per aggregate
//! type. A repeated key, in a later transaction, in the same one or racing from another
//! connection, returns the first event's id and writes nothing; a key whose transaction rolls
//! back leaves the racer its own event; a key cannot name a batch.

mod support;

use outbox_runtime::{EmitOptions, Error, InvalidEvent, OutboxEvent};
use sqlx::PgPool;
use support::accounts::*;
use support::*;
use tokio::sync::oneshot;
use uuid::Uuid;

fn keyed(key: &str) -> EmitOptions {
    EmitOptions::new().idempotency_key(key)
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
async fn a_repeated_key_returns_the_first_event(pool: PgPool) {
    migrated(&pool).await;
    let first = commit_with(&pool, &noted(1, 1), keyed("req-1")).await;
    let again = commit_with(&pool, &noted(1, 2), keyed("req-1")).await;
    assert_eq!(again, first, "the duplicate returns the first event's id");
    assert_eq!(keyed_rows(&pool, "account", "req-1").await, [(first, 1)], "the first event stands");

    // The scope is the aggregate type: another account, or an ordered type of the same
    // aggregate type, is the same key.
    assert_eq!(commit_with(&pool, &noted(2, 3), keyed("req-1")).await, first);
    assert_eq!(commit_with(&pool, &posted(1, 4), keyed("req-1")).await, first);
    assert_eq!(count_rows(&pool).await, 1);

    // Another key is another event.
    let second = commit_with(&pool, &noted(1, 5), keyed("req-2")).await;
    assert_ne!(second, first);
    assert_eq!(keyed_rows(&pool, "account", "req-2").await, [(second, 5)]);

    // The same key under another aggregate type is another event.
    let audit = commit_with(&pool, &Audited { account: 1, n: 6 }, keyed("req-1")).await;
    assert_ne!(audit, first);
    assert_eq!(keyed_rows(&pool, "audit", "req-1").await, [(audit, 6)]);
    assert_eq!(keyed_rows(&pool, "account", "req-1").await, [(first, 1)]);
    assert_eq!(count_rows(&pool).await, 3);
}

#[sqlx::test(migrations = false)]
async fn a_repeated_key_within_one_transaction_returns_the_first_event(pool: PgPool) {
    migrated(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    let first = outbox_runtime::emit_with(&mut tx, &noted(1, 1), keyed("req")).await.unwrap();
    let again = outbox_runtime::emit_with(&mut tx, &noted(1, 2), keyed("req")).await.unwrap();
    let ordered = outbox_runtime::emit_with(&mut tx, &posted(1, 3), keyed("o")).await.unwrap();
    let ordered_again =
        outbox_runtime::emit_with(&mut tx, &posted(1, 4), keyed("o")).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(again, first);
    assert_eq!(ordered_again, ordered);
    assert_eq!(keyed_rows(&pool, "account", "req").await, [(first, 1)]);
    assert_eq!(keyed_rows(&pool, "account", "o").await, [(ordered, 3)]);
    assert_eq!(count_rows(&pool).await, 2);
}

#[sqlx::test(migrations = false)]
async fn a_key_names_one_event_not_a_batch(pool: PgPool) {
    migrated(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    let batch = [noted(1, 1), noted(1, 2)];
    let err = outbox_runtime::emit_all_with(&mut tx, &batch, keyed("req")).await.unwrap_err();
    assert!(matches!(err, Error::InvalidEvent { reason: InvalidEvent::KeyedBatch, .. }), "{err:?}");
    // Nothing was written and the transaction is still usable.
    let ids = outbox_runtime::emit_all_with(&mut tx, &batch[..1], keyed("req")).await.unwrap();
    tx.commit().await.unwrap();
    assert_eq!(ids.len(), 1);
    assert_eq!(keyed_rows(&pool, "account", "req").await, [(ids[0], 1)]);
    assert_eq!(count_rows(&pool).await, 1);
}

/// tx1 emits `first` under `key` and stays open; tx2, on another connection, emits `second`
/// under the same key and must wait; then tx1 commits or rolls back.
async fn race<E>(pool: &PgPool, first: E, second: E, key: &'static str, tx1_commits: bool)
where
    E: OutboxEvent + Send + Sync + 'static,
{
    let mut tx1 = pool.begin().await.unwrap();
    let first_id = outbox_runtime::emit_with(&mut tx1, &first, keyed(key)).await.unwrap();

    let (pid_tx, pid_rx) = oneshot::channel();
    let racer = tokio::spawn({
        let pool = pool.clone();
        async move {
            let mut tx2 = pool.begin().await.unwrap();
            pid_tx.send(backend_pid(&mut tx2).await).unwrap();
            let id = outbox_runtime::emit_with(&mut tx2, &second, keyed(key)).await.unwrap();
            tx2.commit().await.unwrap();
            id
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
    let second_id = within(racer, "the racer commits").await.unwrap();
    let rows = keyed_rows(pool, E::AGGREGATE_TYPE, key).await;
    if tx1_commits {
        assert_eq!(second_id, first_id, "{key}: the racer gets the committed event's id");
        assert_eq!(rows.len(), 1, "{key}: one event");
        assert_eq!(rows[0].0, first_id);
    } else {
        assert_ne!(second_id, first_id, "{key}: the racer stores its own event");
        assert_eq!(rows.len(), 1, "{key}: one event");
        assert_eq!(rows[0].0, second_id);
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
