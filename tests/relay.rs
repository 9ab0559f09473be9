//! The relay against the real PostgreSQL: delivery, sharing, retries, dead letters, fencing,
//! bad rows, shutdown and wake-ups.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::{Backoff, BuildError, Error, EventContext, Relay, UnknownEvents};
use sqlx::PgPool;
use support::*;
use tokio::sync::Notify;
use uuid::Uuid;

/// Every delivery the handlers saw: `(event id, attempt)`.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<(Uuid, u32)>>>);

impl Log {
    fn record<S>(&self, ctx: &EventContext<S>) {
        self.0.lock().unwrap().push((ctx.event_id(), ctx.delivery()));
    }
    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    fn deliveries_per_event(&self) -> HashMap<Uuid, usize> {
        let mut counts = HashMap::new();
        for (id, _) in self.0.lock().unwrap().iter() {
            *counts.entry(*id).or_default() += 1;
        }
        counts
    }
}

async fn log_placed(ctx: EventContext<Log>, _: OrderPlaced) -> Result<(), HandlerError> {
    ctx.state().record(&ctx);
    Ok(())
}

async fn log_cancelled(ctx: EventContext<Log>, _: OrderCancelled) -> Result<(), HandlerError> {
    ctx.state().record(&ctx);
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn every_event_reaches_its_typed_handler_exactly_once(pool: PgPool) {
    migrated(&pool).await;
    let events: Vec<OrderPlaced> = (0..300).map(placed).collect();
    let mut ids = emit_committed(&pool, &events).await;
    let mut tx = pool.begin().await.unwrap();
    let cancel = OrderCancelled { order_id: events[0].order_id, reason: "r".into() };
    ids.push(outbox_runtime::emit(&mut tx, &cancel).await.unwrap());
    tx.commit().await.unwrap();

    let log = Log::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(log.clone())
            .handler(log_placed)
            .handler(log_cancelled),
    );
    eventually("all 301 events are published", || async { count_published(&pool).await == 301 })
        .await;
    let counts = relay.stop().await;

    let per_event = log.deliveries_per_event();
    assert_eq!(per_event.len(), 301);
    assert!(ids.iter().all(|id| per_event.get(id) == Some(&1)), "each event delivered once");
    assert_eq!(counts.delivered, 301);
    assert_eq!(counts.failed, 0);
    let stats = outbox_runtime::stats(&pool).await.unwrap();
    assert_eq!((stats.pending, stats.dead, stats.oldest_pending_age), (0, 0, None));
}

#[sqlx::test(migrations = false)]
async fn two_relays_share_one_table_without_duplicates(pool: PgPool) {
    migrated(&pool).await;
    let events: Vec<OrderPlaced> = (0..2000).map(placed).collect();
    let ids = emit_committed(&pool, &events).await;

    let log = Log::default();
    let relay = |batch| {
        fast(Relay::builder(pool.clone()))
            .state(log.clone())
            .handler(log_placed)
            .batch_size(batch)
            .concurrency(8)
    };
    let (a, b) = (Running::start(relay(25)), Running::start(relay(40)));
    eventually("all 2000 events are published", || async { count_published(&pool).await == 2000 })
        .await;
    let (a, b) = (a.stop().await, b.stop().await);

    let per_event = log.deliveries_per_event();
    assert_eq!(per_event.len(), 2000, "nothing missing");
    assert!(ids.iter().all(|id| per_event[id] == 1), "no event delivered twice");
    assert_eq!(a.delivered + b.delivered, 2000);
    assert!(a.delivered > 0 && b.delivered > 0, "both relays took work: {a:?} {b:?}");
}

#[sqlx::test(migrations = false)]
async fn failures_back_off_then_succeed(pool: PgPool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];

    async fn flaky(ctx: EventContext<Log>, _: OrderPlaced) -> Result<(), HandlerError> {
        ctx.state().record(&ctx);
        if ctx.delivery() < 3 {
            return Err(HandlerError(format!(
                "downstream unavailable (attempt {})",
                ctx.delivery()
            )));
        }
        Ok(())
    }
    let log = Log::default();
    let counts =
        deliver(&pool, fast(Relay::builder(pool.clone())).state(log.clone()).handler(flaky), id)
            .await;

    assert_eq!(*log.0.lock().unwrap(), [(id, 1), (id, 2), (id, 3)]);
    let row = row_state(&pool, id).await;
    assert_eq!(row.attempts, 2, "attempts count the two failures, not the success");
    assert_eq!(row.last_error.as_deref(), Some("downstream unavailable (attempt 2)"));
    assert_eq!((counts.delivered, counts.failed), (1, 2));
}

#[sqlx::test(migrations = false)]
async fn failed_delivery_is_scheduled_by_backoff(pool: PgPool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];

    async fn failing(_: EventContext, _: OrderPlaced) -> Result<(), HandlerError> {
        Err(HandlerError("no".into()))
    }
    let backoff =
        Backoff { base: Duration::from_secs(40), cap: Duration::from_secs(600), jitter: false };
    let relay = Running::start(
        Relay::builder(pool.clone())
            .handler(failing)
            .backoff(backoff)
            .poll_interval(Duration::from_millis(50)),
    );
    eventually("the failure is recorded", || async { row_state(&pool, id).await.attempts == 1 })
        .await;
    relay.stop().await;

    let retry_in: f64 = sqlx::query_scalar(
        "SELECT extract(epoch FROM available_at - now())::float8 FROM outbox.events WHERE event_id = $1",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    assert!((30.0..=40.0).contains(&retry_in), "first retry base = 40 s away, got {retry_in}");
}

#[sqlx::test(migrations = false)]
async fn exhausted_attempts_make_a_dead_letter(pool: PgPool) {
    migrated(&pool).await;
    let dead = emit_committed(&pool, &[placed(1)]).await[0];

    async fn always_fails(ctx: EventContext<Log>, _: OrderPlaced) -> Result<(), HandlerError> {
        ctx.state().record(&ctx);
        Err(HandlerError("card declined".into()))
    }
    let log = Log::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone())).state(log.clone()).handler(always_fails).max_attempts(3),
    );
    eventually("the event is dead", || async { row_state(&pool, dead).await.dead }).await;
    // Give the relay time to (wrongly) lease it again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let counts = relay.stop().await;

    assert_eq!(log.len(), 3, "a dead event is never delivered again");
    let row = row_state(&pool, dead).await;
    assert_eq!((row.attempts, row.published), (3, false));
    assert_eq!(row.last_error.as_deref(), Some("card declined"), "the last error is kept");
    assert_eq!((counts.failed, counts.dead), (3, 1));
    let stats = outbox_runtime::stats(&pool).await.unwrap();
    assert_eq!((stats.pending, stats.dead), (0, 1));
}

/// A handler that reports it started, then waits to be told how to finish.
#[derive(Clone)]
struct Stall {
    started: Arc<Notify>,
    finish: Arc<Notify>,
    log: Log,
    fail: bool,
}

impl Stall {
    fn new(fail: bool) -> Self {
        Stall { started: Arc::default(), finish: Arc::default(), log: Log::default(), fail }
    }
}

async fn stalls(ctx: EventContext<Stall>, _: OrderPlaced) -> Result<(), HandlerError> {
    let stall = ctx.state();
    stall.log.record(&ctx);
    stall.started.notify_one();
    stall.finish.notified().await;
    if stall.fail {
        return Err(HandlerError("stale failure".into()));
    }
    Ok(())
}

/// Relay A stalls on an event (think: a long GC pause) until its lease runs out and relay B
/// takes the row over; while B's handler still runs, A finishes with `a_fails` and
/// acknowledges under its stale token.
async fn stale_acknowledgement(pool: PgPool, a_fails: bool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];

    // With its one slot busy, A leases nothing more meanwhile.
    let a_stall = Stall::new(a_fails);
    let a = Running::start(
        fast(Relay::builder(pool.clone())).state(a_stall.clone()).handler(stalls).concurrency(1),
    );
    a_stall.started.notified().await;
    let a_token = lease_token(&pool, id).await.unwrap();

    // The lease runs out (A renews only every lease_timeout / 3 = 10 s) and B takes the row.
    expire_lease(&pool, id).await;
    let b_stall = Stall::new(false);
    let b =
        Running::start(fast(Relay::builder(pool.clone())).state(b_stall.clone()).handler(stalls));
    b_stall.started.notified().await;
    let b_token = lease_token(&pool, id).await.unwrap();
    assert_ne!(a_token, b_token, "B leased under a new fencing token");
    assert_eq!(*b_stall.log.0.lock().unwrap(), [(id, 2)], "the second delivery attempt");

    // A's stale outcome is refused: it neither publishes, nor counts an attempt, nor takes
    // B's lease away.
    a_stall.finish.notify_one();
    let a = a.stop().await;
    assert_eq!((a.delivered, a.failed, a.lost_leases), (0, 0, 1));
    let row = row_state(&pool, id).await;
    assert_eq!(
        (row.published, row.attempts, row.expired_leases, row.leased),
        (false, 0, 1, true),
        "the expiry is counted apart from failed deliveries"
    );
    assert_eq!(row.last_error, None, "an expiry is not a failure");
    assert_eq!(lease_token(&pool, id).await, Some(b_token));

    // B's outcome stands.
    b_stall.finish.notify_one();
    eventually("relay B publishes the event", || async { row_state(&pool, id).await.published })
        .await;
    assert_eq!(b.stop().await.delivered, 1);
    let row = row_state(&pool, id).await;
    assert_eq!((row.attempts, row.expired_leases), (0, 1));
}

#[sqlx::test(migrations = false)]
async fn a_stale_failure_cannot_overwrite_the_new_lease(pool: PgPool) {
    stale_acknowledgement(pool, true).await;
}

#[sqlx::test(migrations = false)]
async fn a_stale_success_cannot_publish_under_the_new_lease(pool: PgPool) {
    stale_acknowledgement(pool, false).await;
}

#[sqlx::test(migrations = false)]
async fn a_handler_outliving_the_lease_timeout_keeps_its_row(pool: PgPool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];

    async fn slow(ctx: EventContext<Log>, _: OrderPlaced) -> Result<(), HandlerError> {
        ctx.state().record(&ctx);
        tokio::time::sleep(Duration::from_millis(2_000)).await;
        Ok(())
    }
    // Leases of 300 ms, renewed every 100 ms, while the handler takes 2 s; a second relay
    // polls all along.
    let log = Log::default();
    let relay = || {
        fast(Relay::builder(pool.clone()))
            .state(log.clone())
            .handler(slow)
            .lease_timeout(Duration::from_millis(300))
    };
    let (a, b) = (Running::start(relay()), Running::start(relay()));
    until_published(&pool, id).await;
    let (a, b) = (a.stop().await, b.stop().await);

    assert_eq!(*log.0.lock().unwrap(), [(id, 1)], "delivered once, by one relay");
    assert_eq!(a.delivered + b.delivered, 1);
    assert_eq!(row_state(&pool, id).await.attempts, 0, "the lease never expired");
}

#[sqlx::test(migrations = false)]
async fn a_relay_that_re_leases_its_own_row_does_not_run_it_twice(pool: PgPool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];

    let stall = Stall::new(false);
    let relay = Running::start(
        fast(Relay::builder(pool.clone())).state(stall.clone()).handler(stalls).concurrency(4),
    );
    stall.started.notified().await;
    // The lease runs out before the relay renewed it, and the same relay leases the row again.
    let first = lease_token(&pool, id).await.unwrap();
    expire_lease(&pool, id).await;
    eventually("the relay re-leased its row", || async {
        lease_token(&pool, id).await != Some(first)
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    stall.finish.notify_one();
    until_published(&pool, id).await;
    let counts = relay.stop().await;

    assert_eq!(*stall.log.0.lock().unwrap(), [(id, 1)], "the handler ran once");
    assert_eq!((counts.delivered, counts.lost_leases), (1, 0), "acknowledged under the new lease");
}

#[sqlx::test(migrations = false)]
async fn a_lost_lease_cancels_the_delivery(pool: PgPool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];

    /// Sets its flag when the handler's future is dropped before it finished.
    struct CancelledFlag(Arc<Notify>);
    impl Drop for CancelledFlag {
        fn drop(&mut self) {
            self.0.notify_one();
        }
    }
    async fn hangs(
        ctx: EventContext<(Arc<Notify>, Arc<Notify>)>,
        _: OrderPlaced,
    ) -> Result<(), HandlerError> {
        let _flag = CancelledFlag(ctx.state().1.clone());
        ctx.state().0.notify_one();
        std::future::pending().await
    }
    let (started, cancelled) = (Arc::new(Notify::new()), Arc::new(Notify::new()));
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state((started.clone(), cancelled.clone()))
            .handler(hangs)
            .lease_timeout(Duration::from_millis(600)),
    );
    started.notified().await;
    // Another relay took the row over (as after a pause longer than the lease).
    sqlx::query("UPDATE outbox.events SET lease_token = gen_random_uuid() WHERE event_id = $1")
        .bind(id)
        .execute(&pool)
        .await
        .unwrap();
    tokio::time::timeout(Duration::from_secs(10), cancelled.notified())
        .await
        .expect("the renewer found the lease lost and cancelled the handler");
    let counts = relay.stop().await;
    assert_eq!((counts.delivered, counts.failed), (0, 0));
    assert!(!row_state(&pool, id).await.published);
}

#[sqlx::test(migrations = false)]
async fn a_lease_expiring_for_the_last_time_makes_a_dead_letter(pool: PgPool) {
    migrated(&pool).await;
    // A relay died holding this row after two earlier expiries; the lease has expired.
    let id: Uuid = sqlx::query_scalar(
        "INSERT INTO outbox.events \
             (event_id, aggregate_type, aggregate_id, event_type, payload, expired_leases, \
              lease_token, available_at) \
         VALUES (gen_random_uuid(), 'order', '1', 'order.placed', \
                 jsonb_build_object('order_id', gen_random_uuid(), 'total_cents', 1), 2, \
                 gen_random_uuid(), now() - interval '1 second') \
         RETURNING event_id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();

    let log = Log::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(log.clone())
            .handler(log_placed)
            .max_attempts(1)
            .max_expired_leases(3),
    );
    eventually("the row is dead", || async { row_state(&pool, id).await.dead }).await;
    let counts = relay.stop().await;
    assert_eq!(log.len(), 0, "a row that died on expiry is not delivered");
    assert_eq!(counts.dead, 1);
    let row = row_state(&pool, id).await;
    assert_eq!((row.attempts, row.expired_leases), (0, 3));
    assert_eq!(
        row.last_error.as_deref(),
        Some("its lease expired 3 times before a relay acknowledged it")
    );
}

#[sqlx::test(migrations = false)]
async fn rows_of_a_relay_that_died_come_back_when_the_lease_expires(pool: PgPool) {
    migrated(&pool).await;
    let ids = emit_committed(&pool, &(0..5).map(placed).collect::<Vec<_>>()).await;

    async fn hangs(ctx: EventContext<Arc<Notify>>, _: OrderPlaced) -> Result<(), HandlerError> {
        ctx.state().notify_one();
        std::future::pending().await
    }
    let started = Arc::new(Notify::new());
    let doomed = Relay::builder(pool.clone())
        .state(started.clone())
        .handler(hangs)
        .lease_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let doomed = tokio::spawn(doomed.run_until(std::future::pending()));
    started.notified().await;
    doomed.abort(); // the relay dies mid-batch: no shutdown, no acknowledgements
    let _ = doomed.await;
    assert!(row_state(&pool, ids[0]).await.leased);

    let log = Log::default();
    let heir =
        Running::start(fast(Relay::builder(pool.clone())).state(log.clone()).handler(log_placed));
    eventually("every event is published", || async { count_published(&pool).await == 5 }).await;
    heir.stop().await;
    assert_eq!(log.deliveries_per_event().len(), 5, "nothing lost");
}

#[sqlx::test(migrations = false)]
async fn a_panicking_handler_is_a_failure_and_the_relay_keeps_going(pool: PgPool) {
    migrated(&pool).await;
    let ids = emit_committed(&pool, &[placed(13), placed(1), placed(2)]).await;

    async fn panics_on_13(ctx: EventContext<Log>, event: OrderPlaced) -> Result<(), HandlerError> {
        if event.total_cents == 13 && ctx.delivery() == 1 {
            panic!("unlucky number {}", event.total_cents);
        }
        ctx.state().record(&ctx);
        Ok(())
    }
    let log = Log::default();
    let relay =
        Running::start(fast(Relay::builder(pool.clone())).state(log.clone()).handler(panics_on_13));
    eventually("all events are published", || async { count_published(&pool).await == 3 }).await;
    let counts = relay.stop().await;

    let row = row_state(&pool, ids[0]).await;
    assert_eq!(row.attempts, 1);
    assert_eq!(row.last_error.as_deref(), Some("handler panicked: unlucky number 13"));
    assert_eq!((counts.delivered, counts.failed), (3, 1));
}

#[sqlx::test(migrations = false)]
async fn an_undecodable_payload_is_a_failure_naming_the_type(pool: PgPool) {
    migrated(&pool).await;
    // A row written by an older version of the producer, or by hand.
    let bad: Uuid = sqlx::query_scalar(
        "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, payload) \
         VALUES (gen_random_uuid(), 'order', '1', 'order.placed', '{\"order_id\": \"not-a-uuid\"}') \
         RETURNING event_id",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    let good = emit_committed(&pool, &[placed(1)]).await[0];

    let log = Log::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone())).state(log.clone()).handler(log_placed).max_attempts(2),
    );
    eventually("the bad row is dead", || async { row_state(&pool, bad).await.dead }).await;
    eventually("the good row is published", || async { row_state(&pool, good).await.published })
        .await;
    relay.stop().await;

    let error = row_state(&pool, bad).await.last_error.unwrap();
    assert!(error.contains("payload does not deserialize into `"), "{error}");
    assert!(error.contains("OrderPlaced`"), "{error}");
    assert!(error.contains("invalid"), "the serde error is included: {error}");
    assert_eq!(log.deliveries_per_event().keys().collect::<Vec<_>>(), [&good]);
}

#[sqlx::test(migrations = false)]
async fn unknown_event_types_stay_pending_by_default(pool: PgPool) {
    migrated(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    let renamed = CustomerRenamed { customer_id: 9, name: "Ada".into() };
    let unknown = outbox_runtime::emit(&mut tx, &renamed).await.unwrap();
    tx.commit().await.unwrap();
    let known = emit_committed(&pool, &[placed(1)]).await[0];

    let relay = Running::start(
        fast(Relay::builder(pool.clone())).state(Log::default()).handler(log_placed),
    );
    eventually("the known event is published", || async {
        row_state(&pool, known).await.published
    })
    .await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    relay.stop().await;

    let row = row_state(&pool, unknown).await;
    assert_eq!((row.published, row.leased, row.attempts, row.dead), (false, false, 0, false));
    assert_eq!(outbox_runtime::stats(&pool).await.unwrap().pending, 1, "it shows as pending");
}

#[sqlx::test(migrations = false)]
async fn unknown_event_types_fail_when_asked_to(pool: PgPool) {
    migrated(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    let renamed = CustomerRenamed { customer_id: 9, name: "Ada".into() };
    let unknown = outbox_runtime::emit(&mut tx, &renamed).await.unwrap();
    tx.commit().await.unwrap();
    // Handled events of another type, older and newer: a relay leasing every type still
    // delivers them.
    let mut placed_ids = emit_committed(&pool, &[placed(1)]).await;
    placed_ids.extend(emit_committed(&pool, &[placed(2)]).await);

    let log = Log::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(log.clone())
            .handler(log_placed)
            .unknown_events(UnknownEvents::Fail)
            .max_attempts(1),
    );
    eventually("the unknown event is dead", || async { row_state(&pool, unknown).await.dead })
        .await;
    eventually("the handled events are published", || async {
        row_state(&pool, placed_ids[0]).await.published
            && row_state(&pool, placed_ids[1]).await.published
    })
    .await;
    relay.stop().await;
    let mut delivered: Vec<Uuid> = log.0.lock().unwrap().iter().map(|(id, _)| *id).collect();
    delivered.sort();
    placed_ids.sort();
    assert_eq!(delivered, placed_ids, "each handled event delivered once");
    let error = row_state(&pool, unknown).await.last_error.unwrap();
    assert_eq!(
        error,
        "no handler registered for aggregate `customer`, event type `customer.renamed`"
    );
}

/// A relay whose handler signals `started` and never returns; shutdown cancels it after 200 ms.
fn start_hanging(pool: &PgPool, concurrency: usize, batch_size: u32) -> (Running, Arc<Notify>) {
    async fn hangs(ctx: EventContext<Arc<Notify>>, _: OrderPlaced) -> Result<(), HandlerError> {
        ctx.state().notify_one();
        std::future::pending().await
    }
    let started = Arc::new(Notify::new());
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(started.clone())
            .handler(hangs)
            .concurrency(concurrency)
            .batch_size(batch_size)
            .shutdown_timeout(Duration::from_millis(200)),
    );
    (relay, started)
}

#[sqlx::test(migrations = false)]
async fn shutdown_hands_leased_rows_back(pool: PgPool) {
    migrated(&pool).await;
    let ids = emit_committed(&pool, &(0..5).map(placed).collect::<Vec<_>>()).await;

    let (relay, started) = start_hanging(&pool, 1, 10);
    started.notified().await;
    assert!(row_state(&pool, ids[4]).await.leased, "the whole batch was leased");
    let counts = relay.stop().await;

    assert_eq!(counts.handed_back, 5, "4 never started, 1 cancelled at the shutdown timeout");
    for id in &ids {
        let row = row_state(&pool, *id).await;
        assert!(!row.leased && row.available_now && !row.published, "{id} is free again");
        assert_eq!(row.attempts, 0, "handing back is not a failed attempt");
    }
}

/// While a backlog drains, the next lease runs beside the deliveries instead of after them:
/// with every slot busy the relay still leases the rows it starts next, one lease ahead and no
/// further, and hands all of them back at shutdown.
#[sqlx::test(migrations = false)]
async fn a_draining_relay_leases_one_batch_ahead_and_hands_it_back(pool: PgPool) {
    migrated(&pool).await;
    let ids = emit_committed(&pool, &(0..20).map(placed).collect::<Vec<_>>()).await;
    let leased = || async {
        let ids = &ids;
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM outbox.events WHERE event_id = ANY($1) AND lease_token IS NOT NULL",
        )
        .bind(ids)
        .fetch_one(&pool)
        .await
        .unwrap()
    };

    let (relay, started) = start_hanging(&pool, 2, 4);
    started.notified().await;
    // 4 leased, 2 started, 2 queued: the queue is as short as the slots are many, so the next
    // 4 are leased while both slots stay busy.
    eventually("a second lease while every slot is busy", || async { leased().await == 8 }).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(leased().await, 8, "6 rows queued for 2 busy slots: no third lease");
    let counts = relay.stop().await;

    assert_eq!(counts.handed_back, 8, "6 never started, 2 cancelled at the shutdown timeout");
    for id in &ids {
        let row = row_state(&pool, *id).await;
        assert!(!row.leased && row.available_now && !row.published, "{id} is free again");
        assert_eq!(row.attempts, 0, "handing back is not a failed attempt");
    }
}

#[sqlx::test(migrations = false)]
async fn shutdown_waits_for_running_handlers(pool: PgPool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];

    async fn slow(ctx: EventContext<Arc<Notify>>, _: OrderPlaced) -> Result<(), HandlerError> {
        ctx.state().notify_one();
        tokio::time::sleep(Duration::from_millis(300)).await;
        Ok(())
    }
    let started = Arc::new(Notify::new());
    let relay =
        Running::start(fast(Relay::builder(pool.clone())).state(started.clone()).handler(slow));
    started.notified().await;
    let counts = relay.stop().await;
    assert_eq!(counts.delivered, 1);
    assert!(row_state(&pool, id).await.published);
}

#[sqlx::test(migrations = false)]
async fn notify_wakes_an_idle_relay_before_the_poll_interval(pool: PgPool) {
    migrated(&pool).await;
    let log = Log::default();
    let relay = Running::start(
        Relay::builder(pool.clone())
            .state(log.clone())
            .handler(log_placed)
            .poll_interval(Duration::from_secs(3600)),
    );
    // Let the relay find the table empty and go to sleep on the poll interval.
    tokio::time::sleep(Duration::from_millis(500)).await;

    let id = emit_committed(&pool, &[placed(1)]).await[0];
    eventually("the event is delivered", || async { log.len() == 1 }).await;
    relay.stop().await;
    assert_eq!(log.0.lock().unwrap()[0].0, id);
}

#[sqlx::test(migrations = false)]
async fn wake_ups_survive_a_dropped_listen_connection(pool: PgPool) {
    migrated(&pool).await;
    let log = Log::default();
    let relay = Running::start(
        Relay::builder(pool.clone())
            .state(log.clone())
            .handler(log_placed)
            .poll_interval(Duration::from_secs(3600)),
    );
    let listener = || async {
        sqlx::query_scalar::<_, i32>(
            "SELECT pid FROM pg_stat_activity \
             WHERE datname = current_database() AND query ILIKE 'LISTEN%'",
        )
        .fetch_optional(&pool)
        .await
        .unwrap()
    };
    eventually("the relay LISTENs", || async { listener().await.is_some() }).await;
    let first = listener().await;
    let killed: bool = sqlx::query_scalar("SELECT pg_terminate_backend($1)")
        .bind(first.unwrap())
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(killed);
    eventually("the relay LISTENs again", || async {
        listener().await.is_some_and(|pid| Some(pid) != first)
    })
    .await;
    // Let the wake-up that follows the reconnect pass, so only NOTIFY can find the event.
    tokio::time::sleep(Duration::from_millis(300)).await;

    let id = emit_committed(&pool, &[placed(1)]).await[0];
    eventually("the event is delivered", || async { log.len() == 1 }).await;
    relay.stop().await;
    assert_eq!(log.0.lock().unwrap()[0].0, id);
}

#[sqlx::test(migrations = false)]
async fn headers_and_context_reach_the_handler(pool: PgPool) {
    migrated(&pool).await;
    let event = placed(5);
    let mut tx = pool.begin().await.unwrap();
    let options = outbox_runtime::EmitOptions::new().header("request_id", "req-9");
    let id = outbox_runtime::emit_with(&mut tx, &event, options).await.unwrap();
    tx.commit().await.unwrap();

    type Seen = Arc<Mutex<Option<(Uuid, String, Option<String>, OrderPlaced)>>>;
    let seen: Seen = Arc::default();
    let relay = Running::start(fast(Relay::builder(pool.clone())).state(seen.clone()).handler(
        |ctx: EventContext<Seen>, event: OrderPlaced| async move {
            let header = ctx.header("request_id").map(str::to_owned);
            *ctx.state().lock().unwrap() =
                Some((ctx.event_id(), ctx.aggregate_id().to_owned(), header, event));
            Ok::<_, HandlerError>(())
        },
    ));
    eventually("the closure handler ran", || async { seen.lock().unwrap().is_some() }).await;
    relay.stop().await;
    let (event_id, aggregate_id, header, got) = seen.lock().unwrap().take().unwrap();
    assert_eq!(event_id, id);
    assert_eq!(aggregate_id, event.order_id.to_string());
    assert_eq!(header.as_deref(), Some("req-9"));
    assert_eq!(got, event);
}

#[sqlx::test(migrations = false)]
async fn a_missing_schema_stops_the_relay_with_a_clear_error(pool: PgPool) {
    let relay = Relay::builder(pool).state(Log::default()).handler(log_placed).build().unwrap();
    let err = relay.run_until(std::future::pending()).await.unwrap_err();
    assert!(matches!(err, Error::SchemaMissing), "{err:?}");
}

#[sqlx::test(migrations = false)]
async fn build_refuses_conflicting_or_empty_relays(pool: PgPool) {
    async fn other_placed(_: EventContext, _: OrderPlaced) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn placed_again(_: EventContext, _: OrderPlaced) -> Result<(), HandlerError> {
        Ok(())
    }
    let err =
        Relay::builder(pool.clone()).handler(other_placed).handler(placed_again).build().err();
    assert!(
        matches!(
            err,
            Some(BuildError::DuplicateHandler {
                aggregate_type: "order",
                event_type: "order.placed",
                ..
            })
        ),
        "{err:?}"
    );
    assert_eq!(Relay::builder(pool.clone()).build().err(), Some(BuildError::NoHandlers));
    let err = Relay::builder(pool).handler(other_placed).concurrency(0).build().err();
    assert!(matches!(err, Some(BuildError::InvalidSetting(_))));
}

#[sqlx::test(migrations = false)]
async fn stats_report_pending_dead_and_lag(pool: PgPool) {
    migrated(&pool).await;
    let stats = outbox_runtime::stats(&pool).await.unwrap();
    assert_eq!((stats.pending, stats.dead, stats.oldest_pending_age), (0, 0, None));

    sqlx::query(
        "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, payload, created_at) \
         VALUES (gen_random_uuid(), 'order', '1', 'order.placed', '{}', now() - interval '5 minutes'), \
                (gen_random_uuid(), 'order', '2', 'order.placed', '{}', now() - interval '1 minute')",
    )
    .execute(&pool)
    .await
    .unwrap();
    sqlx::query(
        "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, payload, dead_at, created_at) \
         VALUES (gen_random_uuid(), 'order', '3', 'order.placed', '{}', now(), now() - interval '1 hour')",
    )
    .execute(&pool)
    .await
    .unwrap();
    let stats = outbox_runtime::stats(&pool).await.unwrap();
    assert_eq!((stats.pending, stats.dead), (2, 1));
    let lag = stats.oldest_pending_age.unwrap().as_secs();
    assert!((299..=310).contains(&lag), "the oldest pending event is 5 minutes old: {lag}");
}

#[sqlx::test(migrations = false)]
async fn handlers_registered_before_the_state_keep_working(pool: PgPool) {
    migrated(&pool).await;
    let placed_id = emit_committed(&pool, &[placed(1)]).await[0];
    let mut tx = pool.begin().await.unwrap();
    let cancel = OrderCancelled { order_id: Uuid::now_v7(), reason: "r".into() };
    let cancelled_id = outbox_runtime::emit(&mut tx, &cancel).await.unwrap();
    tx.commit().await.unwrap();

    async fn stateless(ctx: EventContext, _: OrderPlaced) -> Result<(), HandlerError> {
        assert_eq!(ctx.delivery(), 1);
        Ok(())
    }
    let log = Log::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .handler(stateless)
            .state(log.clone())
            .handler(log_cancelled),
    );
    eventually("both events are published", || async { count_published(&pool).await == 2 }).await;
    relay.stop().await;
    assert!(row_state(&pool, placed_id).await.published);
    assert_eq!(log.deliveries_per_event().keys().collect::<Vec<_>>(), [&cancelled_id]);
}

#[sqlx::test(migrations = false)]
async fn only_a_sleeping_relay_asks_producers_for_notify(pool: PgPool) {
    migrated(&pool).await;
    let sleepers = || async {
        sqlx::query_scalar::<_, Vec<String>>(
            "SELECT event_types FROM outbox.sleeping_relays WHERE until > now()",
        )
        .fetch_all(&pool)
        .await
        .unwrap()
    };
    let log = Log::default();
    let relay = Running::start(
        Relay::builder(pool.clone())
            .state(log.clone())
            .handler(log_placed)
            .poll_interval(Duration::from_secs(3600)),
    );
    // Idle: registered, for the one event type it handles.
    eventually("the idle relay registers", || async { !sleepers().await.is_empty() }).await;
    assert_eq!(sleepers().await, [vec!["order.placed".to_owned()]]);

    // Woken by the first event's NOTIFY, it withdraws while it works, then sleeps again.
    emit_committed(&pool, &[placed(1)]).await;
    eventually("the event is delivered", || async { log.len() == 1 }).await;
    eventually("the relay sleeps again", || async { !sleepers().await.is_empty() }).await;
    relay.stop().await;
    assert!(sleepers().await.is_empty(), "a stopped relay withdraws its registration");
}

#[sqlx::test(migrations = false)]
async fn a_hung_handler_fails_at_the_handler_timeout(pool: PgPool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];

    async fn hangs_once(ctx: EventContext<Log>, _: OrderPlaced) -> Result<(), HandlerError> {
        ctx.state().record(&ctx);
        if ctx.delivery() == 1 {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
    let log = Log::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(log.clone())
            .handler(hangs_once)
            .handler_timeout(Some(Duration::from_millis(300))),
    );
    eventually("the retry succeeds", || async { row_state(&pool, id).await.published }).await;
    let counts = relay.stop().await;

    assert_eq!(*log.0.lock().unwrap(), [(id, 1), (id, 2)]);
    let row = row_state(&pool, id).await;
    assert_eq!(row.attempts, 1);
    assert_eq!(row.last_error.as_deref(), Some("handler timed out after 300ms"));
    assert_eq!((counts.failed, counts.delivered), (1, 1));
}

/// Handled unless its total is negative; writes a receipt in the acknowledging transaction.
async fn receipt(
    mut ctx: outbox_runtime::TransactionContext<Log>,
    event: OrderPlaced,
) -> Result<(), HandlerError> {
    ctx.state().record(&*ctx);
    if event.total_cents < 0 {
        return Err(HandlerError(format!("negative total {}", event.total_cents)));
    }
    sqlx::query("INSERT INTO receipts (order_id) VALUES ($1)")
        .bind(event.order_id)
        .execute(&mut **ctx.tx())
        .await
        .map_err(|error| HandlerError(error.to_string()))?;
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn delete_on_publish_removes_delivered_rows_and_keeps_dead_ones(pool: PgPool) {
    migrated(&pool).await;
    sqlx::query("CREATE TABLE receipts (order_id uuid PRIMARY KEY)").execute(&pool).await.unwrap();
    let customers: Vec<CustomerRenamed> = (0..20)
        .map(|n| CustomerRenamed { customer_id: n, name: format!("customer {n}") })
        .collect();
    let renamed = emit_committed(&pool, &customers).await;
    let orders: Vec<OrderPlaced> = (0..20).map(placed).chain([placed(-1)]).collect();
    let placed_ids = emit_committed(&pool, &orders).await;
    let dead = *placed_ids.last().unwrap();

    async fn on_renamed(ctx: EventContext<Log>, _: CustomerRenamed) -> Result<(), HandlerError> {
        ctx.state().record(&ctx);
        Ok(())
    }
    let log = Log::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(log.clone())
            .handler(on_renamed)
            .handler(receipt)
            .max_attempts(2)
            .delete_on_publish(true),
    );
    eventually("the failing event is dead", || async { row_state(&pool, dead).await.dead }).await;
    eventually("every other event is gone", || async { count_rows(&pool).await == 1 }).await;
    relay.stop().await;

    // Plain and transactional acknowledgements both deleted their rows; the dead one stays.
    let left: Vec<Uuid> =
        sqlx::query_scalar("SELECT event_id FROM outbox.events").fetch_all(&pool).await.unwrap();
    assert_eq!(left, [dead]);
    let receipts: i64 =
        sqlx::query_scalar("SELECT count(*) FROM receipts").fetch_one(&pool).await.unwrap();
    assert_eq!(receipts, 20, "each transactional handler's write committed with its deletion");
    let calls = log.deliveries_per_event();
    for id in renamed.iter().chain(&placed_ids[..20]) {
        assert_eq!(calls.get(id), Some(&1), "delivered exactly once");
    }
    assert_eq!(calls.get(&dead), Some(&2), "the failing event was tried max_attempts times");
}
