//! Conditions production has every day, in one process: another transaction holding locks on
//! rows a relay leased, and both cores busy. (Backlogs with stale statistics and relays in
//! separate processes are in `faults_crash.rs`; each statement's plan in `plans.rs`.)

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::{EventContext, Relay};
use sqlx::{Connection, PgPool};
use support::*;
use uuid::Uuid;

/// Handler calls that ran to the end, per event.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<HashMap<Uuid, u32>>>);

#[derive(Debug, thiserror::Error)]
#[error("never")]
struct Never;

/// Takes about 0.1 s, like a call to another service, then records the call.
async fn slow(ctx: EventContext<Calls>, _: OrderPlaced) -> Result<(), Never> {
    tokio::time::sleep(Duration::from_millis(100)).await;
    *ctx.state().0.lock().unwrap().entry(ctx.event_id()).or_default() += 1;
    Ok(())
}

/// A relay with one-second leases, one handler slot and batches of 40; another transaction
/// locks the rows it leased for 1.6 s, so renewals and acknowledgements of those rows cannot
/// take their locks and the leases run out. Once the lock goes, every row is delivered, each
/// once: none is kept leased without being delivered.
async fn rows_locked_by_another_transaction(pool: PgPool, burner: Option<CpuBurner>) {
    migrated(&pool).await;
    let ids = emit_committed(&pool, &(0..40).map(placed).collect::<Vec<_>>()).await;
    let calls = Calls::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(calls.clone())
            .handler(slow)
            .concurrency(1)
            .batch_size(40)
            .lease_timeout(Duration::from_secs(1)),
    );
    let leased = || async {
        let n: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM outbox.events \
             WHERE lease_token IS NOT NULL AND published_at IS NULL",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        n
    };
    eventually("the relay leased rows", || async { leased().await > 1 }).await;

    let mut locker = pool.acquire().await.unwrap();
    let mut tx = locker.begin().await.unwrap();
    let locked: Vec<Uuid> = sqlx::query_scalar(
        "SELECT event_id FROM outbox.events \
         WHERE lease_token IS NOT NULL AND published_at IS NULL FOR UPDATE",
    )
    .fetch_all(&mut *tx)
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    tx.commit().await.unwrap();

    let published = || async { count_published(&pool).await == ids.len() as i64 };
    eventually("every row is delivered after the lock goes", published).await;
    let counts = relay.stop().await;
    drop(burner);

    let calls = calls.0.lock().unwrap().clone();
    let repeated: Vec<_> = calls.iter().filter(|(_, &n)| n > 1).collect();
    println!("{} rows were locked; {counts:?}; repeated calls {repeated:?}", locked.len());
    assert!(!locked.is_empty(), "the lock caught leased rows");
    assert_eq!(calls.len(), ids.len(), "every event was handled");
    assert!(repeated.is_empty(), "one relay handled events twice: {repeated:?}");
    assert_eq!((counts.delivered, counts.lost_leases), (ids.len() as u64, 0));
    let dead: i64 =
        sqlx::query_scalar("SELECT count(*) FROM outbox.events WHERE dead_at IS NOT NULL")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(dead, 0);
}

#[sqlx::test(migrations = false)]
async fn rows_locked_by_another_transaction_are_all_delivered_once_the_lock_goes(pool: PgPool) {
    rows_locked_by_another_transaction(pool, None).await;
}

#[sqlx::test(migrations = false)]
async fn rows_locked_by_another_transaction_are_delivered_with_both_cores_busy(pool: PgPool) {
    let burner = CpuBurner::start(Duration::from_secs(120));
    rows_locked_by_another_transaction(pool, Some(burner)).await;
}

/// Event 1 is handled at once, event 2 takes longer than the lease, which must be renewed.
async fn quick_or_long(ctx: EventContext<Calls>, event: OrderPlaced) -> Result<(), Never> {
    if event.total_cents == 2 {
        tokio::time::sleep(Duration::from_secs(4)).await;
    }
    *ctx.state().0.lock().unwrap().entry(ctx.event_id()).or_default() += 1;
    Ok(())
}

/// An acknowledgement statement that takes long (here an operator's trigger holds the first
/// one that marks an event published for five seconds, longer than a lease): the leases of the
/// other deliveries are renewed all the while, with both cores busy, so a handler that runs
/// longer than its lease finishes once and is acknowledged, and is not cancelled at its first
/// deadline.
#[sqlx::test(migrations = false)]
async fn renewals_go_on_while_an_acknowledgement_takes_long(pool: PgPool) {
    migrated(&pool).await;
    let ids = emit_committed(&pool, &[placed(1), placed(2)]).await;
    let (slowed, long) = (ids[0], ids[1]);
    sqlx::raw_sql(sqlx::static_sql(format!(
        "CREATE SEQUENCE publishes; \
         CREATE FUNCTION slow_publish() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN \
             IF NEW.event_id = '{slowed}' AND nextval('publishes') = 1 THEN \
                 PERFORM pg_sleep(5); \
             END IF; RETURN NEW; END $$; \
         CREATE TRIGGER slow_publish BEFORE UPDATE ON outbox.events FOR EACH ROW \
             WHEN (OLD.published_at IS NULL AND NEW.published_at IS NOT NULL) \
             EXECUTE FUNCTION slow_publish();"
    )))
    .execute(&pool)
    .await
    .unwrap();
    let burner = CpuBurner::start(Duration::from_secs(120));
    let calls = Calls::default();
    // Renewed every second; the long handler takes four.
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(calls.clone())
            .handler(quick_or_long)
            .lease_timeout(Duration::from_secs(3)),
    );
    until_published(&pool, long).await;
    until_published(&pool, slowed).await;
    let counts = relay.stop().await;
    drop(burner);

    let calls = calls.0.lock().unwrap().clone();
    assert_eq!(calls.get(&long), Some(&1), "the long handler ran to the end once: {calls:?}");
    assert_eq!(row_state(&pool, long).await.expired_leases, 0, "its lease never ran out");
    assert_eq!((counts.delivered, counts.lost_leases), (2, 0));
}
