//! The held-transaction lease mode (`LeaseMode::HeldTransaction`) against the real PostgreSQL:
//! `build` refuses handlers that write in the acknowledgement's transaction; every outcome
//! (published or deleted, failed, rejected, snoozed) is written in the batch's transaction, and
//! nothing else is ever written to a row; relays of both modes share one outbox without
//! delivering twice or out of order; the row locks are the lease, so other relays skip a row
//! for as long as its delivery runs; a lost connection cancels the batch's deliveries at once
//! and its rows are delivered again; and the server ends the transaction of a relay that stopped
//! answering (SIGSTOP), so another relay delivers its rows; rows another transaction locks are
//! skipped, and delivered once the lock goes; a retry's delay and a snooze count
//! from the outcome, not from the start of the batch's transaction.

mod support;

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_runtime::{
    Backoff, BoxError, BuildError, EventContext, LeaseMode, Reject, Relay, RelayBuilder, Snooze,
    TransactionContext,
};
use sqlx::PgPool;
use support::accounts::{posted, Log, Posted};
use support::relay_process::{JobRun, RelayProcess};
use support::*;
use tokio::sync::{Notify, Semaphore};
use tokio::time::Instant;
use uuid::Uuid;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// The name of a relay's lease connection in `pg_stat_activity`: in the held mode, the
/// connection whose transaction holds the rows.
const LEASE_CONNECTION: &str = "outbox-relay-lease";

/// How long a test may keep the cores busy at most.
const BURN_LIMIT: Duration = Duration::from_secs(300);

/// `fast` settings, in the held-transaction mode.
fn held<S: Clone + Send + Sync + 'static>(builder: RelayBuilder<S>) -> RelayBuilder<S> {
    fast(builder).lease_mode(LeaseMode::HeldTransaction)
}

/// One handler call.
#[derive(Debug, Clone)]
struct Call {
    event_id: Uuid,
    attempts: u32,
    expired_leases: u32,
    at: DateTime<Utc>,
}

/// Every handler call, in the order the handlers were entered.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<Call>>>);

impl Calls {
    /// Records the call; returns how many calls of its event there were, this one included.
    fn record<S>(&self, ctx: &EventContext<S>) -> usize {
        let mut calls = self.0.lock().unwrap();
        calls.push(Call {
            event_id: ctx.event_id(),
            attempts: ctx.attempts(),
            expired_leases: ctx.expired_leases(),
            at: Utc::now(),
        });
        calls.iter().filter(|call| call.event_id == ctx.event_id()).count()
    }

    fn of(&self, id: Uuid) -> Vec<Call> {
        self.0.lock().unwrap().iter().filter(|call| call.event_id == id).cloned().collect()
    }

    fn ids(&self) -> HashSet<Uuid> {
        self.0.lock().unwrap().iter().map(|call| call.event_id).collect()
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

async fn records(ctx: EventContext<Calls>, _: OrderPlaced) -> Result<(), HandlerError> {
    ctx.state().record(&ctx);
    Ok(())
}

/// Of `ids`, the rows some transaction holds locked, which a relay's lease skips: found by
/// trying to lock them all (`SKIP LOCKED`), then rolled back.
async fn locked(pool: &PgPool, ids: &[Uuid]) -> HashSet<Uuid> {
    let mut tx = pool.begin().await.unwrap();
    let existing: Vec<Uuid> =
        sqlx::query_scalar("SELECT event_id FROM outbox.events WHERE event_id = ANY ($1)")
            .bind(ids)
            .fetch_all(&mut *tx)
            .await
            .unwrap();
    let free: HashSet<Uuid> = sqlx::query_scalar(
        "SELECT event_id FROM outbox.events WHERE event_id = ANY ($1) FOR UPDATE SKIP LOCKED",
    )
    .bind(ids)
    .fetch_all(&mut *tx)
    .await
    .unwrap()
    .into_iter()
    .collect();
    tx.rollback().await.unwrap();
    existing.into_iter().filter(|id| !free.contains(id)).collect()
}

/// A row's `(published, dead, attempts, expired leases, has a lease token)`.
async fn outcome(pool: &PgPool, id: Uuid) -> (bool, bool, i32, i32, bool) {
    let row = row_state(pool, id).await;
    (row.published, row.dead, row.attempts, row.expired_leases, row.leased)
}

// ---------------------------------------------------------------------------------------------
// Building
// ---------------------------------------------------------------------------------------------

async fn in_the_acknowledgement(_: TransactionContext, _: OrderPlaced) -> Result<(), HandlerError> {
    Ok(())
}

async fn plain(_: EventContext, _: OrderCancelled) -> Result<(), HandlerError> {
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn build_refuses_a_transactional_handler_in_the_held_mode(pool: PgPool) {
    let builder = |mode| {
        Relay::builder(pool.clone()).handler(plain).handler(in_the_acknowledgement).lease_mode(mode)
    };
    match builder(LeaseMode::HeldTransaction).build().err() {
        Some(BuildError::TransactionalHandler { handler }) => {
            assert!(handler.ends_with("OrderPlaced"), "names the transactional one: {handler}")
        }
        other => panic!("expected TransactionalHandler, got {other:?}"),
    }
    assert_eq!(builder(LeaseMode::Written).build().err(), None, "the written mode takes it");
    let plain_only =
        Relay::builder(pool.clone()).handler(plain).lease_mode(LeaseMode::HeldTransaction);
    assert_eq!(plain_only.build().err(), None, "the held mode takes plain handlers");
}

// ---------------------------------------------------------------------------------------------
// Outcomes
// ---------------------------------------------------------------------------------------------

/// `total_cents` of the events that do not simply succeed.
const FLAKY: i64 = -1;
const REJECTED: i64 = -2;
const SNOOZED: i64 = -3;
const SNOOZE: Duration = Duration::from_millis(300);

/// Succeeds, but for [`FLAKY`] (fails its first two deliveries), [`REJECTED`] (rejects) and
/// [`SNOOZED`] (snoozes its first delivery).
async fn mixed(ctx: EventContext<Calls>, event: OrderPlaced) -> Result<(), BoxError> {
    let calls = ctx.state().record(&ctx);
    match event.total_cents {
        FLAKY if calls <= 2 => Err(HandlerError(format!("flaky failure {calls}")).into()),
        REJECTED => Err(Reject::new(format!("order {} is unknown", event.order_id)).into()),
        SNOOZED if calls == 1 => Err(Snooze::after(SNOOZE).into()),
        _ => Ok(()),
    }
}

#[sqlx::test(migrations = false)]
async fn a_held_relay_writes_every_outcome_and_deletes_what_it_delivered(pool: PgPool) {
    migrated(&pool).await;
    let orders: Vec<OrderPlaced> =
        (1..=30).map(placed).chain([placed(FLAKY), placed(REJECTED), placed(SNOOZED)]).collect();
    let ids = emit_committed(&pool, &orders).await;
    let (plain_ids, [flaky, rejected, snoozed]) = (&ids[..30], [ids[30], ids[31], ids[32]]);

    let calls = Calls::default();
    let relay = Running::start(
        held(Relay::builder(pool.clone()))
            .state(calls.clone())
            .handler(mixed)
            .max_attempts(5)
            .delete_on_publish(true),
    );
    eventually("the rejected event is dead", || async { row_state(&pool, rejected).await.dead })
        .await;
    eventually("every other row is deleted", || async { count_rows(&pool).await == 1 }).await;
    let counts = relay.stop().await;

    let left: Vec<Uuid> =
        sqlx::query_scalar("SELECT event_id FROM outbox.events").fetch_all(&pool).await.unwrap();
    assert_eq!(left, [rejected], "delivered rows are deleted, the dead one is kept");
    let row = row_state(&pool, rejected).await;
    let reason = format!("rejected by its handler: order {} is unknown", orders[31].order_id);
    assert_eq!((row.dead, row.attempts, row.leased), (true, 1, false));
    assert_eq!(row.last_error.as_deref(), Some(reason.as_str()));

    let attempts = |id| calls.of(id).iter().map(|call| call.attempts).collect::<Vec<_>>();
    for &id in plain_ids {
        assert_eq!(attempts(id), [0], "event {id} delivered exactly once");
    }
    assert_eq!(attempts(flaky), [0, 1, 2], "the flaky event: two failures counted, then delivered");
    assert_eq!(attempts(rejected), [0], "a rejected event is not retried");
    // When it comes back is `delays_count_from_the_outcome`'s (the held mode's is a known bug).
    assert_eq!(attempts(snoozed), [0, 0], "the snooze counted no attempt");
    let all = calls.0.lock().unwrap().clone();
    assert!(all.iter().all(|call| call.expired_leases == 0), "no expired lease: {all:?}");

    assert_eq!(
        (counts.delivered, counts.failed, counts.rejected, counts.dead, counts.snoozed),
        (32, 3, 1, 1, 1),
        "{counts:?}"
    );
    assert_eq!((counts.handed_back, counts.lost_leases), (0, 0), "{counts:?}");
}

/// What a row held that a relay could have written to.
#[derive(Debug, Clone, sqlx::FromRow)]
struct Written {
    event_id: Uuid,
    published: bool,
    lease_token: Option<Uuid>,
    available_at: DateTime<Utc>,
    attempts: i32,
    expired_leases: i32,
}

const WRITTEN: &str = "SELECT event_id, published_at IS NOT NULL AS published, lease_token, \
                              available_at, attempts, expired_leases FROM outbox.events";

/// What each handler saw of its own row while delivering it, read on another connection.
#[derive(Clone)]
struct Observer {
    pool: PgPool,
    /// [`WRITTEN`] of one row.
    sql: &'static str,
    seen: Arc<Mutex<HashMap<Uuid, Written>>>,
}

async fn observes(ctx: EventContext<Observer>, _: OrderPlaced) -> Result<(), BoxError> {
    let observer = ctx.state();
    let row = sqlx::query_as(observer.sql).bind(ctx.event_id()).fetch_one(&observer.pool).await?;
    let earlier = observer.seen.lock().unwrap().insert(ctx.event_id(), row);
    assert!(earlier.is_none(), "event {} delivered twice", ctx.event_id());
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn a_held_relay_writes_nothing_to_a_row_but_its_outcome(pool: PgPool) {
    migrated(&pool).await;
    let ids = emit_committed(&pool, &(0..200).map(placed).collect::<Vec<_>>()).await;
    let before: HashMap<Uuid, DateTime<Utc>> =
        sqlx::query_as("SELECT event_id, available_at FROM outbox.events")
            .fetch_all(&pool)
            .await
            .unwrap()
            .into_iter()
            .collect();

    let sql = sqlx::static_sql(format!("{WRITTEN} WHERE event_id = $1"));
    let observer = Observer { pool: pool.clone(), sql, seen: Arc::default() };
    let relay = Running::start(
        held(Relay::builder(pool.clone())).state(observer.clone()).handler(observes).batch_size(50),
    );
    eventually("every event is published", || async { count_published(&pool).await == 200 }).await;
    let counts = relay.stop().await;

    // While it was delivered, its row looked as it did before: no lease written.
    let seen = observer.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), ids.len());
    for row in seen.values() {
        let id = row.event_id;
        assert!(!row.published, "event {id}: published only by the outcome");
        assert_eq!(row.lease_token, None, "event {id}: no lease token while delivered");
        assert_eq!(Some(&row.available_at), before.get(&id), "event {id}: available_at untouched");
    }
    // Afterwards, only the outcome.
    let rows: Vec<Written> = sqlx::query_as(WRITTEN).fetch_all(&pool).await.unwrap();
    assert_eq!(rows.len(), ids.len());
    for row in rows {
        let id = row.event_id;
        assert!(row.published, "event {id} is published");
        assert_eq!((row.lease_token, row.attempts, row.expired_leases), (None, 0, 0), "event {id}");
        assert_eq!(Some(&row.available_at), before.get(&id), "event {id}: available_at untouched");
    }
    assert_eq!((counts.delivered, counts.failed, counts.handed_back), (200, 0, 0), "{counts:?}");
}

/// How long the first delivery of [`slow_then_not_yet`] takes before it fails or snoozes.
const SLOW: Duration = Duration::from_millis(1_500);
/// The retry delay and the snooze after it; shorter than [`SLOW`].
const NOT_YET: Duration = Duration::from_secs(1);

/// When each first delivery of [`slow_then_not_yet`] ended.
#[derive(Clone, Default)]
struct NotYet {
    calls: Calls,
    ended: Arc<Mutex<HashMap<Uuid, DateTime<Utc>>>>,
}

/// Takes [`SLOW`], then fails (`total_cents` 1) or snoozes for [`NOT_YET`] (2); succeeds the
/// second time.
async fn slow_then_not_yet(ctx: EventContext<NotYet>, event: OrderPlaced) -> Result<(), BoxError> {
    let state = ctx.state();
    if state.calls.record(&ctx) > 1 {
        return Ok(());
    }
    tokio::time::sleep(SLOW).await;
    state.ended.lock().unwrap().insert(ctx.event_id(), Utc::now());
    match event.total_cents {
        1 => Err(HandlerError("upstream timed out".into()).into()),
        _ => Err(Snooze::after(NOT_YET).into()),
    }
}

/// A retry's delay and a snooze's count from the failure or the snooze, as the handler sees
/// it: neither event is delivered again sooner after its first delivery ended.
async fn delays_count_from_the_outcome(pool: PgPool, mode: LeaseMode) {
    migrated(&pool).await;
    let ids = emit_committed(&pool, &[placed(1), placed(2)]).await;
    let state = NotYet::default();
    let backoff = Backoff { base: NOT_YET, cap: NOT_YET, jitter: false };
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(state.clone())
            .handler(slow_then_not_yet)
            .backoff(backoff)
            .lease_mode(mode),
    );
    for &id in &ids {
        until_published(&pool, id).await;
    }
    relay.stop().await;

    for (id, what) in ids.into_iter().zip(["retried", "delivered again after its snooze"]) {
        let calls = state.calls.of(id);
        assert_eq!(calls.len(), 2, "event {id}: {calls:?}");
        let ended = state.ended.lock().unwrap()[&id];
        let after = (calls[1].at - ended).to_std().unwrap_or_default();
        assert!(
            after >= NOT_YET - Duration::from_millis(50),
            "{mode:?}: {what} {after:?} after the first delivery ended, not {NOT_YET:?}"
        );
    }
}

/// The written mode, for comparison: the outcome's statement starts the delay.
#[sqlx::test(migrations = false)]
async fn a_written_relay_counts_delays_from_the_outcome(pool: PgPool) {
    delays_count_from_the_outcome(pool, LeaseMode::Written).await;
}

/// The held mode writes its outcomes in the batch's transaction, which began before the
/// handlers ran: the delay still counts from the outcome.
#[sqlx::test(migrations = false)]
async fn a_held_relay_counts_delays_from_the_outcome(pool: PgPool) {
    delays_count_from_the_outcome(pool, LeaseMode::HeldTransaction).await;
}

// ---------------------------------------------------------------------------------------------
// Sharing an outbox
// ---------------------------------------------------------------------------------------------

const ACCOUNTS: u32 = 20;
const PER_ACCOUNT: u32 = 30;
const EMITTERS: u32 = 4;

/// What the ordered handlers saw, in every relay.
#[derive(Clone, Default)]
struct Ordered {
    log: Log,
    in_flight: Arc<Mutex<HashSet<u32>>>,
    /// Deliveries that started while another delivery of the same account was under way.
    overlaps: Arc<Mutex<Vec<Posted>>>,
}

async fn one_at_a_time(ctx: EventContext<Ordered>, event: Posted) -> Result<(), HandlerError> {
    let state = ctx.state();
    if !state.in_flight.lock().unwrap().insert(event.account) {
        state.overlaps.lock().unwrap().push(event.clone());
    }
    state.log.record(&ctx, event.account, event.n);
    // Stay in flight for a moment, so an overlapping delivery would be caught.
    tokio::time::sleep(Duration::from_millis(u64::from(event.n % 3))).await;
    state.in_flight.lock().unwrap().remove(&event.account);
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn relays_of_both_modes_share_an_outbox_in_order_and_exactly_once(pool: PgPool) {
    migrated(&pool).await;
    let ordered = Ordered::default();
    let relay = |mode, batch| {
        Running::start(
            fast(Relay::builder(pool.clone()))
                .state(ordered.clone())
                .handler(one_at_a_time)
                .lease_mode(mode)
                .concurrency(8)
                .batch_size(batch)
                // No relay dies here: no lease may expire, and a delivery after one would
                // show in the log as a second delivery.
                .lease_timeout(Duration::from_secs(10))
                .poll_interval(Duration::from_millis(20)),
        )
    };
    let relays = [
        relay(LeaseMode::HeldTransaction, 5),
        relay(LeaseMode::HeldTransaction, 7),
        relay(LeaseMode::Written, 3),
    ];

    // Each account's events come from one emitter, one transaction each, in `n` order; the
    // emitters run at once, so the accounts' events interleave in `seq`.
    let emitters: Vec<_> = (0..EMITTERS)
        .map(|emitter| {
            let pool = pool.clone();
            tokio::spawn(async move {
                for n in 0..PER_ACCOUNT {
                    for account in (emitter..ACCOUNTS).step_by(EMITTERS as usize) {
                        emit_committed(&pool, &[posted(account, n)]).await;
                    }
                }
            })
        })
        .collect();
    for emitter in emitters {
        emitter.await.unwrap();
    }
    let total = i64::from(ACCOUNTS * PER_ACCOUNT);
    eventually("every event is published", || async { count_published(&pool).await == total })
        .await;
    let mut counts = Vec::new();
    for relay in relays {
        counts.push(relay.stop().await);
    }

    assert_eq!(*ordered.overlaps.lock().unwrap(), [], "two deliveries of one account overlapped");
    let expected: Vec<(u32, u32)> = (0..PER_ACCOUNT).map(|n| (n, 1)).collect();
    for account in 0..ACCOUNTS {
        assert_eq!(
            ordered.log.of(account),
            expected,
            "account {account}: `(n, delivery)` in emit order, each delivered once"
        );
    }
    assert_eq!(ordered.log.len(), total as usize);
    let delivered: Vec<u64> = counts.iter().map(|c| c.delivered).collect();
    println!("delivered per relay (held, held, written): {delivered:?}");
    assert_eq!(counts.iter().map(|c| c.delivered).sum::<u64>(), total as u64);
    assert!(counts.iter().all(|c| c.delivered > 0), "every relay took work: {counts:?}");
    assert!(counts.iter().all(|c| c.failed + c.lost_leases == 0), "{counts:?}");
}

// ---------------------------------------------------------------------------------------------
// The locks are the lease
// ---------------------------------------------------------------------------------------------

/// `total_cents` of the event whose first delivery blocks.
const BLOCKING: i64 = 0;

/// A handler that blocks on the [`BLOCKING`] event until released.
#[derive(Clone, Default)]
struct Gate {
    calls: Calls,
    started: Arc<Notify>,
    release: Arc<Notify>,
}

async fn waits_at_the_gate(ctx: EventContext<Gate>, event: OrderPlaced) -> Result<(), BoxError> {
    let gate = ctx.state();
    gate.calls.record(&ctx);
    if event.total_cents == BLOCKING {
        gate.started.notify_one();
        gate.release.notified().await;
    }
    Ok(())
}

/// Longer than any stall of a loaded test machine, so the held transaction is not ended by the
/// server meanwhile: a relay that stopped answering this long is taken for gone.
const LOCK_LEASE: Duration = Duration::from_secs(4);

#[sqlx::test(migrations = false)]
async fn other_relays_skip_a_row_while_a_held_relay_delivers_it(pool: PgPool) {
    migrated(&pool).await;
    let blocked = emit_committed(&pool, &[placed(BLOCKING)]).await[0];
    let gate = Gate::default();
    // One row per batch: the batch holds the blocked event alone.
    let holder = Running::start(
        held(Relay::builder(pool.clone()))
            .state(gate.clone())
            .handler(waits_at_the_gate)
            .batch_size(1)
            .lease_timeout(LOCK_LEASE),
    );
    signalled(&gate.started, "the held relay delivers the blocked event").await;

    let others = emit_committed(&pool, &(1..=50).map(placed).collect::<Vec<_>>()).await;
    let calls = Calls::default();
    let other = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(calls.clone())
            .handler(records)
            .lease_timeout(LOCK_LEASE),
    );
    // By either relay: the held one goes on with a second batch beside the blocked one.
    eventually("the other events are delivered", || async { count_published(&pool).await == 50 })
        .await;
    // Past the lease timeout: the keep-alive holds the transaction, and its lock, meanwhile.
    tokio::time::sleep(LOCK_LEASE + Duration::from_secs(1)).await;
    assert!(calls.of(blocked).is_empty(), "the other relay delivered the locked row");
    assert_eq!(locked(&pool, &[blocked]).await, HashSet::from([blocked]), "still locked");
    assert_eq!(outcome(&pool, blocked).await, (false, false, 0, 0, false), "and untouched");

    gate.release.notify_one();
    until_published(&pool, blocked).await;
    let held_counts = holder.stop().await;
    let other_counts = other.stop().await;

    assert_eq!(gate.calls.of(blocked).len(), 1, "delivered once, by the relay that held it");
    assert!(calls.of(blocked).is_empty(), "never by the other relay");
    for id in &others {
        let deliveries = calls.of(*id).len() + gate.calls.of(*id).len();
        assert_eq!(deliveries, 1, "event {id}: delivered once");
    }
    assert_eq!(outcome(&pool, blocked).await, (true, false, 0, 0, false));
    assert_eq!(held_counts.delivered + other_counts.delivered, 51);
}

// ---------------------------------------------------------------------------------------------
// A lost connection
// ---------------------------------------------------------------------------------------------

/// Events whose first delivery blocks until cancelled.
const HANGING: usize = 3;

/// Counts the first deliveries started, and those cancelled (their futures dropped).
#[derive(Clone)]
struct Hangs {
    calls: Calls,
    started: Arc<Semaphore>,
    cancelled: Arc<Semaphore>,
}

/// Adds a permit to `cancelled` when the handler's future is dropped mid-delivery.
struct OnCancel(Arc<Semaphore>);

impl Drop for OnCancel {
    fn drop(&mut self) {
        self.0.add_permits(1);
    }
}

async fn hangs_first(ctx: EventContext<Hangs>, _: OrderPlaced) -> Result<(), HandlerError> {
    let hangs = ctx.state();
    if hangs.calls.record(&ctx) == 1 {
        let _cancelled = OnCancel(hangs.cancelled.clone());
        hangs.started.add_permits(1);
        std::future::pending::<()>().await;
    }
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn a_lost_connection_cancels_the_batch_and_its_rows_are_delivered_again(pool: PgPool) {
    let _burner = CpuBurner::start(BURN_LIMIT);
    migrated(&pool).await;
    let ids = emit_committed(&pool, &(0..HANGING as i64).map(placed).collect::<Vec<_>>()).await;
    let hangs = Hangs {
        calls: Calls::default(),
        started: Arc::new(Semaphore::new(0)),
        cancelled: Arc::new(Semaphore::new(0)),
    };
    // A lease far longer than the test: only the keep-alive can notice the loss in time.
    let lease = Duration::from_secs(120);
    let relay = Running::start(
        held(Relay::builder(pool.clone()))
            .state(hangs.clone())
            .handler(hangs_first)
            .lease_timeout(lease),
    );
    within(hangs.started.acquire_many(HANGING as u32), "every delivery of the batch started")
        .await
        .unwrap()
        .forget();
    assert_eq!(locked(&pool, &ids).await.len(), HANGING, "the batch holds every row");

    // Only the connection that holds the locks (its transaction has an id: it locked rows). The
    // other lease connection may be mid-lease: killed too, it could lose a batch it leased the
    // moment the first released the rows, and a third delivery would follow, as it should.
    let terminated: Vec<bool> = sqlx::query_scalar(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity \
         WHERE datname = current_database() AND application_name = $1 \
           AND backend_xid IS NOT NULL",
    )
    .bind(LEASE_CONNECTION)
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(terminated, [true], "the batch's lease connection is terminated");
    let lost_at = Instant::now();

    // The keep-alive runs every second: the deliveries must not wait for the lease to run out.
    let limit = Duration::from_secs(20);
    let cancelled = tokio::time::timeout(limit, hangs.cancelled.acquire_many(HANGING as u32)).await;
    assert!(cancelled.is_ok(), "the deliveries still run {limit:?} after the connection was lost");
    println!("deliveries cancelled {:?} after the connection was lost", lost_at.elapsed());
    for &id in &ids {
        until_published(&pool, id).await;
    }
    let counts = relay.stop().await;

    for &id in &ids {
        let calls = hangs.calls.of(id);
        assert_eq!(calls.len(), 2, "event {id}: cancelled, then delivered again: {calls:?}");
        assert!(
            calls.iter().all(|call| (call.attempts, call.expired_leases) == (0, 0)),
            "event {id}: nothing counted for the lost batch: {calls:?}"
        );
        assert_eq!(outcome(&pool, id).await, (true, false, 0, 0, false), "event {id}");
    }
    assert_eq!((counts.delivered, counts.failed), (HANGING as u64, 0), "{counts:?}");
}

/// Another transaction holds locks on pending rows (an operator's `FOR UPDATE`, a long update):
/// a held relay skips them instead of waiting, delivers the others, and delivers them once the
/// lock goes, each once; with both cores busy.
#[sqlx::test(migrations = false)]
async fn rows_another_transaction_locks_are_delivered_once_the_lock_goes(pool: PgPool) {
    let _burner = CpuBurner::start(BURN_LIMIT);
    migrated(&pool).await;
    let ids = emit_committed(&pool, &(0..40).map(placed).collect::<Vec<_>>()).await;
    let locked_by_other = &ids[..10];
    let mut other = pool.begin().await.unwrap();
    sqlx::query("SELECT 1 FROM outbox.events WHERE event_id = ANY ($1) FOR UPDATE")
        .bind(locked_by_other)
        .execute(&mut *other)
        .await
        .unwrap();

    let calls = Calls::default();
    let relay =
        Running::start(held(Relay::builder(pool.clone())).state(calls.clone()).handler(records));
    eventually("the rows nobody else locks are delivered", || async {
        count_published(&pool).await == 30
    })
    .await;
    // Several leases later, the locked rows are still untouched.
    tokio::time::sleep(Duration::from_millis(300)).await;
    for id in locked_by_other {
        assert!(calls.of(*id).is_empty(), "event {id} delivered through another's lock");
    }
    other.rollback().await.unwrap();
    eventually("every row is delivered", || async { count_published(&pool).await == 40 }).await;
    let counts = relay.stop().await;

    for id in &ids {
        assert_eq!(calls.of(*id).len(), 1, "event {id}: delivered once");
    }
    assert_eq!((counts.delivered, counts.failed), (40, 0), "{counts:?}");
}

// ---------------------------------------------------------------------------------------------
// A relay that stops answering
// ---------------------------------------------------------------------------------------------

async fn records_job(ctx: EventContext<Calls>, _: JobRun) -> Result<(), HandlerError> {
    ctx.state().record(&ctx);
    Ok(())
}

/// The backends of the lease connections in this database that are in a transaction (one per
/// batch in flight).
async fn lease_backends_in_transaction(pool: &PgPool) -> Vec<i32> {
    sqlx::query_scalar(
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() \
         AND application_name = $1 AND xact_start IS NOT NULL",
    )
    .bind(LEASE_CONNECTION)
    .fetch_all(pool)
    .await
    .unwrap()
}

const STOP_EVENTS: u64 = 2_000;
const STOP_LEASE_MS: u64 = 2_000;

#[sqlx::test(migrations = false)]
async fn the_server_ends_the_transaction_of_a_relay_that_stopped_answering(pool: PgPool) {
    let _burner = CpuBurner::start(BURN_LIMIT);
    migrated(&pool).await;
    sqlx::query(
        "CREATE TABLE deliveries \
         (event_id uuid NOT NULL, attempt int NOT NULL, pid int NOT NULL, ok bool NOT NULL)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let jobs: Vec<JobRun> = (0..STOP_EVENTS).map(|n| JobRun { job: n, n }).collect();
    let ids = emit_committed(&pool, &jobs).await;

    let lease_ms = STOP_LEASE_MS.to_string();
    let relay = RelayProcess::spawn(
        &pool,
        &[
            ("RELAY_HELD_TRANSACTION", "1"),
            ("RELAY_LEASE_TIMEOUT_MS", &lease_ms),
            ("RELAY_BATCH_SIZE", "50"),
            ("RELAY_CONCURRENCY", "16"),
            ("HANDLER_SLEEP_MS", "20"),
        ],
    );
    let recorded = || async {
        sqlx::query_scalar::<_, i64>("SELECT count(*) FROM deliveries")
            .fetch_one(&pool)
            .await
            .unwrap()
    };
    eventually("the relay delivers some events", || async { recorded().await >= 100 }).await;

    // Stopped mid-batch: its transaction open and holding rows. Between batches it holds
    // nothing, so then it goes on a moment and is stopped again.
    let mut tries = 0;
    let (backends, held_at_stop) = loop {
        relay.signal("-STOP");
        // Time for a statement under way when it stopped to finish, and its locks to show.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let backends = lease_backends_in_transaction(&pool).await;
        if !backends.is_empty() {
            let held = locked(&pool, &ids).await;
            if !held.is_empty() {
                break (backends, held);
            }
        }
        tries += 1;
        assert!(tries < 50, "never stopped the relay mid-batch");
        relay.signal("-CONT");
        tokio::time::sleep(Duration::from_millis(fastrand::u64(5..40))).await;
    };
    let stopped_at = Instant::now();
    assert!(recorded().await < STOP_EVENTS as i64, "stopped before the end of the drain");

    // The server ends each transaction (one per batch in flight) once it has waited a lease
    // timeout for a statement.
    let margin = Duration::from_secs(15);
    let ended = Duration::from_millis(STOP_LEASE_MS) + margin;
    while sqlx::query_scalar::<_, bool>(
        "SELECT EXISTS (SELECT 1 FROM pg_stat_activity \
                        WHERE pid = ANY($1) AND xact_start IS NOT NULL)",
    )
    .bind(&backends)
    .fetch_one(&pool)
    .await
    .unwrap()
    {
        let waited = stopped_at.elapsed();
        assert!(waited < ended, "the stopped relay's transaction is still open after {waited:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    println!(
        "the transaction of the stopped relay, holding {} rows, ended {:?} after the stop",
        held_at_stop.len(),
        stopped_at.elapsed()
    );
    let freed: Vec<Uuid> = held_at_stop.iter().copied().collect();
    assert_eq!(locked(&pool, &freed).await, HashSet::new(), "its rows are free");

    // A relay of the written mode takes them over.
    let calls = Calls::default();
    let other = Running::start(
        fast(Relay::builder(pool.clone())).state(calls.clone()).handler(records_job),
    );
    eventually("the other relay drains the outbox", || async {
        count_published(&pool).await == STOP_EVENTS as i64
    })
    .await;
    let counts = other.stop().await;

    let taken_over = calls.ids();
    assert!(held_at_stop.is_subset(&taken_over), "the other relay delivers the rows it held");
    let by_stopped: HashSet<Uuid> = sqlx::query_scalar("SELECT event_id FROM deliveries")
        .fetch_all(&pool)
        .await
        .unwrap()
        .into_iter()
        .collect();
    assert!(ids.iter().all(|id| taken_over.contains(id) || by_stopped.contains(id)));
    // The held relay wrote no lease, so taking its rows over counts no expired one.
    let counted: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox.events WHERE attempts > 0 OR expired_leases > 0",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(counted, 0, "no attempt and no expired lease counted");
    assert_eq!(counts.delivered, calls.len() as u64);
    drop(relay); // SIGKILL, stopped as it is
}
