//! Operations against the real PostgreSQL: dead letters, retention, per-type stats.

mod support;

use std::time::Duration;

use outbox_runtime::dead_letters::{self, DeadFilter};
use outbox_runtime::{EventContext, Relay};
use sqlx::PgPool;
use support::accounts::Posted;
use support::*;
use uuid::Uuid;

#[sqlx::test(migrations = false)]
async fn dead_letters_are_listed_filtered_and_paged(pool: PgPool) {
    migrated(&pool).await;
    let a = dead_row(&pool, "order", "order.placed", "timeout").await;
    let b = dead_row(&pool, "order", "order.cancelled", "bad gateway").await;
    let c = dead_row(&pool, "customer", "customer.renamed", "no such customer").await;
    emit_committed(&pool, &[placed(1)]).await; // pending: never listed

    let ids = |events: Vec<dead_letters::DeadEvent>| -> Vec<Uuid> {
        events.into_iter().map(|e| e.event_id).collect()
    };
    let all = dead_letters::list(&pool, &DeadFilter::all(), None, 10).await.unwrap();
    assert_eq!(ids(all), [a, b, c], "oldest first");
    let orders = DeadFilter::all().aggregate_type("order");
    assert_eq!(ids(dead_letters::list(&pool, &orders, None, 10).await.unwrap()), [a, b]);
    let cancelled = DeadFilter::all().event_type("order.cancelled");
    assert_eq!(ids(dead_letters::list(&pool, &cancelled, None, 10).await.unwrap()), [b]);

    let page1 = ids(dead_letters::list(&pool, &DeadFilter::all(), None, 2).await.unwrap());
    let page2 =
        ids(dead_letters::list(&pool, &DeadFilter::all(), Some(page1[1]), 2).await.unwrap());
    assert_eq!((page1, page2), (vec![a, b], vec![c]));

    let shown = dead_letters::get(&pool, b).await.unwrap().unwrap();
    assert_eq!(shown.event_type, "order.cancelled");
    assert_eq!(shown.payload, serde_json::json!({ "total_cents": 4200, "lines": [1, 2] }));
    assert_eq!((shown.attempts, shown.last_error.as_deref()), (10, Some("bad gateway")));
    assert_eq!(dead_letters::get(&pool, Uuid::now_v7()).await.unwrap(), None);
}

#[sqlx::test(migrations = false)]
async fn dead_letters_are_found_by_error_text_and_time_and_counted_before_acting(pool: PgPool) {
    migrated(&pool).await;
    let timeout = dead_row(&pool, "order", "order.placed", "Gateway Timeout (504)").await;
    let refused = dead_row(&pool, "order", "order.placed", "refused: 100% sure").await;
    let old = dead_row(&pool, "order", "order.placed", "timeout").await;
    sqlx::query("UPDATE outbox.events SET dead_at = now() - interval '2 days' WHERE event_id = $1")
        .bind(old)
        .execute(&pool)
        .await
        .unwrap();
    let ids = |events: Vec<dead_letters::DeadEvent>| -> Vec<Uuid> {
        events.into_iter().map(|e| e.event_id).collect()
    };
    let day_ago = chrono::Utc::now() - chrono::Duration::days(1);

    let timeouts = DeadFilter::all().error_contains("TIMEOUT");
    assert_eq!(ids(dead_letters::list(&pool, &timeouts, None, 10).await.unwrap()), [timeout, old]);
    // Matched as text, not as a LIKE pattern.
    let percent = DeadFilter::all().error_contains("100%");
    assert_eq!(ids(dead_letters::list(&pool, &percent, None, 10).await.unwrap()), [refused]);
    assert_eq!(
        dead_letters::count(&pool, &DeadFilter::all().error_contains("%")).await.unwrap(),
        1
    );
    let recent = DeadFilter::all().dead_after(day_ago);
    assert_eq!(
        ids(dead_letters::list(&pool, &recent, None, 10).await.unwrap()),
        [timeout, refused]
    );
    let older = DeadFilter::all().dead_before(day_ago);
    assert_eq!(ids(dead_letters::list(&pool, &older, None, 10).await.unwrap()), [old]);

    // The count is what the action then touches.
    let recent_timeouts = timeouts.dead_after(day_ago);
    assert_eq!(dead_letters::count(&pool, &recent_timeouts).await.unwrap(), 1);
    assert_eq!(dead_letters::discard(&pool, &recent_timeouts).await.unwrap(), 1);
    assert_eq!(dead_letters::count(&pool, &DeadFilter::all()).await.unwrap(), 2);
    assert_eq!(dead_letters::requeue(&pool, &older).await.unwrap(), 1);
    assert!(!row_state(&pool, old).await.dead);
    assert!(row_state(&pool, refused).await.dead, "outside the filter");
}

#[sqlx::test(migrations = false)]
async fn requeued_dead_letters_are_delivered_and_keep_their_last_error(pool: PgPool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];
    sqlx::query(
        "UPDATE outbox.events SET attempts = 3, last_error = 'was broken', dead_at = now() \
         WHERE event_id = $1",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap();
    let other = dead_row(&pool, "customer", "customer.renamed", "x").await;

    let requeued =
        dead_letters::requeue(&pool, &DeadFilter::all().event_type("order.placed")).await.unwrap();
    assert_eq!(requeued, 1);
    let row = row_state(&pool, id).await;
    assert_eq!((row.dead, row.attempts, row.available_now), (false, 0, true));
    assert_eq!(row.last_error.as_deref(), Some("was broken"), "history kept");
    assert!(row_state(&pool, other).await.dead, "the filter left the other alone");

    async fn ok(_: EventContext, _: OrderPlaced) -> Result<(), std::io::Error> {
        Ok(())
    }
    let relay = Relay::builder(pool.clone()).handler(ok).build().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run_until(async {
        let _ = stopped.await;
    }));
    eventually("the requeued event is published", || async {
        row_state(&pool, id).await.published
    })
    .await;
    let _ = stop.send(());
    running.await.unwrap().unwrap();

    assert_eq!(dead_letters::discard(&pool, &DeadFilter::event(other)).await.unwrap(), 1);
    let left: i64 = sqlx::query_scalar("SELECT count(*) FROM outbox.events WHERE event_id = $1")
        .bind(other)
        .fetch_one(&pool)
        .await
        .unwrap();
    assert_eq!(left, 0);
    assert_eq!(dead_letters::discard(&pool, &DeadFilter::all()).await.unwrap(), 0);
}

#[sqlx::test(migrations = false)]
async fn requeuing_a_dead_ordered_event_keeps_its_aggregates_order(pool: PgPool) {
    migrated(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    let events: Vec<Posted> = (1..=3).map(|n| Posted { account: 1, n }).collect();
    outbox_runtime::emit_all(&mut tx, &events).await.unwrap();
    tx.commit().await.unwrap();

    // n = 1 fails while `broken` is set and dies at once; 2 and 3 wait behind it.
    #[derive(Clone)]
    struct Ledger {
        broken: std::sync::Arc<std::sync::atomic::AtomicBool>,
        seen: std::sync::Arc<std::sync::Mutex<Vec<u32>>>,
    }
    async fn post(ctx: EventContext<Ledger>, event: Posted) -> Result<(), std::io::Error> {
        if ctx.state().broken.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(std::io::Error::other("ledger offline"));
        }
        ctx.state().seen.lock().unwrap().push(event.n);
        Ok(())
    }
    let ledger = Ledger { broken: Default::default(), seen: Default::default() };
    ledger.broken.store(true, std::sync::atomic::Ordering::SeqCst);
    let relay = Relay::builder(pool.clone())
        .state(ledger.clone())
        .handler(post)
        .max_attempts(1)
        .poll_interval(Duration::from_millis(50))
        .build()
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run_until(async {
        let _ = stopped.await;
    }));
    eventually("the first event is dead", || async {
        outbox_runtime::stats(&pool).await.unwrap().dead == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        ledger.seen.lock().unwrap().is_empty(),
        "the aggregate is blocked behind its dead event"
    );

    ledger.broken.store(false, std::sync::atomic::Ordering::SeqCst);
    assert_eq!(dead_letters::requeue(&pool, &DeadFilter::all()).await.unwrap(), 1);
    eventually("all three are delivered", || async { ledger.seen.lock().unwrap().len() == 3 })
        .await;
    let _ = stop.send(());
    running.await.unwrap().unwrap();
    assert_eq!(*ledger.seen.lock().unwrap(), [1, 2, 3]);
}

#[sqlx::test(migrations = false)]
async fn retention_deletes_only_old_published_events(pool: PgPool) {
    migrated(&pool).await;
    // 2,500 old published rows (several purge batches), 10 recent ones, and old pending and
    // dead rows, which retention must never touch.
    sqlx::query(
        "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, payload, \
                                    published_at) \
         SELECT gen_random_uuid(), 'order', i::text, 'order.placed', '{}', \
                CASE WHEN i <= 2500 THEN now() - interval '8 days' ELSE now() - interval '1 hour' END \
         FROM generate_series(1, 2510) AS i",
    )
    .execute(&pool)
    .await
    .unwrap();
    let pending = emit_committed(&pool, &[placed(1)]).await[0];
    backdate(&pool, pending, "30 days").await;
    let dead = dead_row(&pool, "order", "order.placed", "x").await;

    let week = Duration::from_secs(7 * 24 * 3600);
    assert_eq!(outbox_runtime::purge_published(&pool, week).await.unwrap(), 2500);
    assert_eq!(outbox_runtime::purge_published(&pool, week).await.unwrap(), 0);
    assert_eq!(count_published(&pool).await, 10);
    assert!(!row_state(&pool, pending).await.published);
    assert!(row_state(&pool, dead).await.dead);
}

#[sqlx::test(migrations = false)]
async fn stats_by_type_split_pending_and_dead(pool: PgPool) {
    migrated(&pool).await;
    emit_committed(&pool, &[placed(1), placed(2)]).await;
    dead_row(&pool, "order", "order.placed", "x").await;
    dead_row(&pool, "customer", "customer.renamed", "x").await;

    let by_type = outbox_runtime::stats_by_type(&pool).await.unwrap();
    let rows: Vec<(&str, &str, i64, i64, bool)> = by_type
        .iter()
        .map(|t| {
            let has_lag = t.oldest_pending_age.is_some();
            (t.aggregate_type.as_str(), t.event_type.as_str(), t.pending, t.dead, has_lag)
        })
        .collect();
    assert_eq!(
        rows,
        [("customer", "customer.renamed", 0, 1, false), ("order", "order.placed", 2, 1, true)]
    );
}

/// The relays' gauges share one reading: the first relay to find it stale counts and stores
/// it, and every relay reads that reading until it is `max_age` old, so the pending rows are
/// counted once per interval however many relays run. The reading is exactly
/// [`outbox_runtime::stats_by_type`]'s, ages included.
#[sqlx::test(migrations = false)]
async fn relays_share_one_reading_of_the_gauges(pool: PgPool) {
    use outbox_runtime::__private::test_hooks::shared_stats_by_type;

    migrated(&pool).await;
    emit_committed(&pool, &[placed(1), placed(2)]).await;
    dead_row(&pool, "customer", "customer.renamed", "x").await;
    let hour = Duration::from_secs(3600);
    let pending = |by_type: &[outbox_runtime::TypeStats]| -> Vec<(String, i64, i64)> {
        by_type.iter().map(|t| (t.event_type.clone(), t.pending, t.dead)).collect()
    };

    let first = shared_stats_by_type(&pool, hour).await.unwrap().expect("nobody else counts");
    let exact = outbox_runtime::stats_by_type(&pool).await.unwrap();
    assert_eq!(pending(&first), pending(&exact));
    assert_eq!(pending(&first), [("customer.renamed".into(), 0, 1), ("order.placed".into(), 2, 0)]);
    let age = first[1].oldest_pending_age.expect("order.placed has a pending event");
    assert!(age <= exact[1].oldest_pending_age.unwrap(), "{age:?} is the age at the reading");

    // Three more relays within the hour: the stored reading, not a new count.
    emit_committed(&pool, &[placed(3)]).await;
    for _ in 0..3 {
        let shared = shared_stats_by_type(&pool, hour).await.unwrap().unwrap();
        assert_eq!(pending(&shared), pending(&first), "the reading is shared, not retaken");
        assert!(shared[1].oldest_pending_age.unwrap() >= age, "ages count to each reading");
    }

    // While one relay counts (it holds the lock), another keeps its last values.
    let mut counting = pool.begin().await.unwrap();
    let locked: bool = sqlx::query_scalar(
        "SELECT pg_try_advisory_xact_lock(hashtextextended('outbox.stats_reading', 0))",
    )
    .fetch_one(&mut *counting)
    .await
    .unwrap();
    assert!(locked);
    assert!(shared_stats_by_type(&pool, Duration::ZERO).await.unwrap().is_none());
    counting.rollback().await.unwrap();

    // Stale: the next relay counts again.
    let recounted = shared_stats_by_type(&pool, Duration::ZERO).await.unwrap().unwrap();
    assert_eq!(
        pending(&recounted),
        [("customer.renamed".into(), 0, 1), ("order.placed".into(), 3, 0)]
    );
}

/// Many relays finding no reading at once: one counts, the others read its reading or keep
/// their values, none fails, and the pending rows are counted once.
#[sqlx::test(migrations = false)]
async fn relays_finding_no_reading_at_once_count_once(pool: PgPool) {
    use outbox_runtime::__private::test_hooks::shared_stats_by_type;

    migrated(&pool).await;
    // Each reading stored is one count: the test counts the writes.
    sqlx::raw_sql(
        "CREATE TABLE readings_taken (n int NOT NULL); INSERT INTO readings_taken VALUES (0); \
         CREATE FUNCTION count_reading() RETURNS trigger LANGUAGE plpgsql AS \
           $$ BEGIN UPDATE readings_taken SET n = n + 1; RETURN NEW; END $$; \
         CREATE TRIGGER count_reading AFTER INSERT OR UPDATE ON outbox.stats_reading \
           FOR EACH ROW EXECUTE FUNCTION count_reading();",
    )
    .execute(&pool)
    .await
    .unwrap();
    emit_committed(&pool, &[placed(1)]).await;
    let readings = futures_util::future::join_all((0..8).map(|_| {
        let pool = pool.clone();
        async move { shared_stats_by_type(&pool, Duration::from_secs(3600)).await.unwrap() }
    }))
    .await;
    assert!(readings.iter().flatten().count() >= 1, "someone counted: {readings:?}");
    for reading in readings.iter().flatten() {
        assert_eq!(reading.iter().map(|t| t.pending).sum::<i64>(), 1);
    }
    let (taken,): (i32,) =
        sqlx::query_as("SELECT n FROM readings_taken").fetch_one(&pool).await.unwrap();
    assert_eq!(taken, 1, "eight relays, one count");
}

#[sqlx::test(migrations = false)]
async fn an_event_is_found_by_id_in_every_state(pool: PgPool) {
    use outbox_runtime::events::{self, EventState};
    use outbox_runtime::EmitOptions;
    use std::sync::Arc;
    use tokio::sync::Semaphore;

    migrated(&pool).await;
    let state = |id| {
        let pool = pool.clone();
        async move { events::get(&pool, id).await.unwrap().expect("found").state }
    };
    let options = EmitOptions::new().header("request_id", "req-9");
    let now = commit_with(&pool, &placed(7), options).await;
    let later =
        commit_with(&pool, &placed(8), EmitOptions::new().delay(Duration::from_secs(600))).await;
    let dead = dead_row(&pool, "order", "order.placed", "boom").await;
    assert_eq!(state(now).await, EventState::Pending);
    assert_eq!(state(later).await, EventState::Waiting);
    assert_eq!(state(dead).await, EventState::Dead);
    assert_eq!(events::get(&pool, Uuid::now_v7()).await.unwrap(), None);

    let found = events::get(&pool, now).await.unwrap().unwrap();
    assert_eq!(
        (found.aggregate_type.as_str(), found.event_type.as_str()),
        ("order", "order.placed")
    );
    assert_eq!(found.payload["total_cents"], 7);
    assert_eq!(found.headers["request_id"], "req-9");
    assert_eq!((found.version, found.ordered, found.attempts), (1, false, 0));
    assert_eq!((found.published_at, found.dead_at), (None, None));

    // Leased while its handler runs, then published.
    async fn gated(ctx: EventContext<Arc<Semaphore>>, _: OrderPlaced) -> Result<(), HandlerError> {
        ctx.state().acquire().await.unwrap().forget();
        Ok(())
    }
    let gate = Arc::new(Semaphore::new(0));
    let relay =
        Running::start(fast(Relay::builder(pool.clone())).state(gate.clone()).handler(gated));
    eventually("the event is leased", || async { state(now).await == EventState::Leased }).await;
    gate.add_permits(1);
    eventually("then published", || async { state(now).await == EventState::Published }).await;
    relay.stop().await;
    assert!(events::get(&pool, now).await.unwrap().unwrap().published_at.is_some());
}
