//! Per-aggregate ordering, transactional handlers, idempotent emit and delayed events against
//! the real PostgreSQL.

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_runtime::{
    Backoff, BoxError, DeadOrderedEvents, EmitOptions, Error, EventContext, InvalidEvent,
    OutboxEvent, Relay, RelayCounts, TransactionContext,
};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres, Transaction};
use support::*;
use tokio::sync::{oneshot, Barrier, Notify, Semaphore};
use tokio::task::JoinSet;
use uuid::Uuid;

// ---------------------------------------------------------------------------------------------
// Events
// ---------------------------------------------------------------------------------------------

/// An ordered event: delivered one at a time per account, in emit order.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "account", event_type = "account.posted", ordered)]
struct Posted {
    #[outbox(id)]
    account: u32,
    n: u32,
}

/// An unordered event of the same aggregate type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "account", event_type = "account.noted")]
struct Noted {
    #[outbox(id)]
    account: u32,
    n: u32,
}

/// An unordered event of another aggregate type (idempotency scope, follow-up events).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "audit", event_type = "audit.recorded")]
struct Audited {
    #[outbox(id)]
    account: u32,
    n: u32,
}

fn posted(account: u32, n: u32) -> Posted {
    Posted { account, n }
}

fn noted(account: u32, n: u32) -> Noted {
    Noted { account, n }
}

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct HandlerError(String);

/// One handler call.
#[derive(Debug, Clone)]
struct Seen {
    event_id: Uuid,
    account: u32,
    n: u32,
    attempt: u32,
    at: DateTime<Utc>,
}

/// Every handler call, in the order the handlers were entered.
#[derive(Clone, Default)]
struct Log(Arc<Mutex<Vec<Seen>>>);

impl Log {
    fn record<S>(&self, ctx: &EventContext<S>, account: u32, n: u32) {
        let seen =
            Seen { event_id: ctx.event_id(), account, n, attempt: ctx.attempt(), at: Utc::now() };
        self.0.lock().unwrap().push(seen);
    }

    fn all(&self) -> Vec<Seen> {
        self.0.lock().unwrap().clone()
    }

    fn len(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    /// `(n, attempt)` of every call for `account`, in call order.
    fn of(&self, account: u32) -> Vec<(u32, u32)> {
        self.all().iter().filter(|s| s.account == account).map(|s| (s.n, s.attempt)).collect()
    }

    fn ids_of(&self, account: u32) -> Vec<Uuid> {
        self.all().iter().filter(|s| s.account == account).map(|s| s.event_id).collect()
    }

    fn first_of(&self, account: u32, n: u32) -> Seen {
        self.all().into_iter().find(|s| s.account == account && s.n == n).unwrap()
    }
}

async fn log_posted(ctx: EventContext<Log>, event: Posted) -> Result<(), HandlerError> {
    ctx.state().record(&ctx, event.account, event.n);
    Ok(())
}

async fn log_noted(ctx: EventContext<Log>, event: Noted) -> Result<(), HandlerError> {
    ctx.state().record(&ctx, event.account, event.n);
    Ok(())
}

/// Emits `events` in one committed transaction; returns their ids.
async fn commit_all<E: OutboxEvent>(pool: &PgPool, events: &[E]) -> Vec<Uuid> {
    let mut tx = pool.begin().await.unwrap();
    let ids = outbox_runtime::emit_all(&mut tx, events).await.unwrap();
    tx.commit().await.unwrap();
    ids
}

async fn commit_with<E: OutboxEvent>(pool: &PgPool, event: &E, options: EmitOptions) -> Uuid {
    let mut tx = pool.begin().await.unwrap();
    let id = outbox_runtime::emit_with(&mut tx, event, options).await.unwrap();
    tx.commit().await.unwrap();
    id
}

/// Waits for a signal; panics after 30 s so a missing one fails the test instead of hanging it.
async fn signalled(notify: &Notify, what: &str) {
    within(notify.notified(), what).await;
}

async fn within<T>(future: impl Future<Output = T>, what: &str) -> T {
    tokio::time::timeout(Duration::from_secs(30), future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting until {what}"))
}

async fn backend_pid(tx: &mut Transaction<'_, Postgres>) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut **tx).await.unwrap()
}

/// Whether the backend `pid` is blocked waiting for a lock.
async fn waits_for_lock(pool: &PgPool, pid: i32) -> bool {
    sqlx::query_scalar::<_, bool>(
        "SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) FROM pg_stat_activity \
         WHERE pid = $1",
    )
    .bind(pid)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn available_at(pool: &PgPool, id: Uuid) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT available_at FROM outbox.events WHERE event_id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn seq(pool: &PgPool, id: Uuid) -> i64 {
    sqlx::query_scalar("SELECT seq FROM outbox.events WHERE event_id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

async fn count_events(pool: &PgPool, aggregate_type: &str, aggregate_id: &str) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM outbox.events WHERE aggregate_type = $1 AND aggregate_id = $2",
    )
    .bind(aggregate_type)
    .bind(aggregate_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// A row that no relay has touched: pending, never leased, never failed.
async fn untouched(pool: &PgPool, id: Uuid) -> bool {
    let row = row_state(pool, id).await;
    !row.published && !row.leased && !row.dead && row.attempts == 0
}

/// splitmix64: a deterministic stand-in for randomness.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

// ---------------------------------------------------------------------------------------------
// 1. Soak: many aggregates, concurrent emitters, several relays, random failures
// ---------------------------------------------------------------------------------------------

const AGGREGATES: u32 = 40;
const PER_AGGREGATE: usize = 15;
const EMITTERS: usize = 6;
/// Accounts 0 and 1 are emitted by the long transaction's task only.
const LONG_ACCOUNTS: [u32; 2] = [0, 1];

/// Whether the soak handler fails attempt `attempt` of event `n` (about one in five).
fn soak_fails(n: u32, attempt: u32) -> bool {
    mix((u64::from(n) << 32) | u64::from(attempt)) % 5 == 0
}

/// How many times the soak handler fails event `n` before it succeeds.
fn soak_failures(n: u32) -> u32 {
    (1..).take_while(|&attempt| soak_fails(n, attempt)).count() as u32
}

/// What the emitters did: the emit order per account, as `n`s.
#[derive(Clone, Default)]
struct Book(Arc<BookInner>);

#[derive(Default)]
struct BookInner {
    next: AtomicU32,
    emitted: Mutex<BTreeMap<u32, Vec<u32>>>,
    rolled_back: Mutex<Vec<u32>>,
}

impl Book {
    /// Emits one event per entry of `accounts` (ascending, so concurrent transactions take the
    /// aggregate locks in one order and cannot deadlock), runs of one account as one batch.
    ///
    /// An emit is recorded when it returns: from then on this transaction holds the aggregate's
    /// lock, so no other transaction can emit for that account before this one ends, and the
    /// order of the records per account is the emit (and commit) order.
    async fn emit(&self, tx: &mut Transaction<'_, Postgres>, accounts: &[u32], commits: bool) {
        for run in accounts.chunk_by(|a, b| a == b) {
            let events: Vec<Posted> = run
                .iter()
                .map(|&account| posted(account, self.0.next.fetch_add(1, SeqCst)))
                .collect();
            if let [event] = &events[..] {
                outbox_runtime::emit(tx, event).await.unwrap();
            } else {
                outbox_runtime::emit_all(tx, &events).await.unwrap();
            }
            if commits {
                let mut emitted = self.0.emitted.lock().unwrap();
                for event in &events {
                    emitted.entry(event.account).or_default().push(event.n);
                }
            } else {
                self.0.rolled_back.lock().unwrap().extend(events.iter().map(|e| e.n));
            }
        }
    }

    fn emitted(&self) -> BTreeMap<u32, Vec<u32>> {
        self.0.emitted.lock().unwrap().clone()
    }

    fn rolled_back(&self) -> Vec<u32> {
        self.0.rolled_back.lock().unwrap().clone()
    }
}

/// A small deterministic generator for the emit plan.
struct Rng(u64);

impl Rng {
    fn below(&mut self, bound: usize) -> usize {
        self.0 = mix(self.0);
        (self.0 % bound as u64) as usize
    }

    fn shuffle<T>(&mut self, items: &mut [T]) {
        for i in (1..items.len()).rev() {
            items.swap(i, self.below(i + 1));
        }
    }
}

/// Transactions of 1–4 events over accounts 2.., shuffled, dealt to the emitters.
fn emit_plan(rng: &mut Rng) -> Vec<Vec<Vec<u32>>> {
    let mut slots: Vec<u32> =
        (2..AGGREGATES).flat_map(|account| std::iter::repeat_n(account, PER_AGGREGATE)).collect();
    rng.shuffle(&mut slots);
    let mut plan = vec![Vec::new(); EMITTERS];
    let (mut rest, mut i) = (&slots[..], 0);
    while !rest.is_empty() {
        let size = (1 + rng.below(4)).min(rest.len());
        let mut accounts = rest[..size].to_vec();
        accounts.sort_unstable();
        plan[i % EMITTERS].push(accounts);
        rest = &rest[size..];
        i += 1;
    }
    plan
}

/// Runs its transactions one after the other; every ninth is first emitted and rolled back.
async fn emitter(pool: PgPool, book: Book, committed: Arc<Semaphore>, plan: Vec<Vec<u32>>) {
    for (i, accounts) in plan.iter().enumerate() {
        if i % 9 == 4 {
            let mut tx = pool.begin().await.unwrap();
            book.emit(&mut tx, accounts, false).await;
            tx.rollback().await.unwrap();
        }
        let mut tx = pool.begin().await.unwrap();
        book.emit(&mut tx, accounts, true).await;
        tx.commit().await.unwrap();
        committed.add_permits(1);
        tokio::task::yield_now().await;
    }
}

/// Emits the first events of accounts 0 and 1 in a transaction that stays open while later
/// transactions (with higher `seq`s) of other accounts commit and are delivered, then the rest.
async fn long_transaction(pool: PgPool, book: Book, committed: Arc<Semaphore>, soak: Soak) {
    let [a, b] = LONG_ACCOUNTS;
    let mut tx = pool.begin().await.unwrap();
    book.emit(&mut tx, &[a, a, a, b, b], true).await;
    within(committed.acquire_many(20), "20 later transactions committed").await.unwrap().forget();
    eventually("other accounts are delivered while the long transaction is open", || async {
        soak.successes() > 0
    })
    .await;
    tx.commit().await.unwrap();

    let mut rest: Vec<u32> = std::iter::repeat_n(a, PER_AGGREGATE - 3)
        .chain(std::iter::repeat_n(b, PER_AGGREGATE - 2))
        .collect();
    Rng(7).shuffle(&mut rest);
    for chunk in rest.chunks(3) {
        let mut accounts = chunk.to_vec();
        accounts.sort_unstable();
        let mut tx = pool.begin().await.unwrap();
        book.emit(&mut tx, &accounts, true).await;
        tx.commit().await.unwrap();
    }
}

/// What the soak handler saw.
#[derive(Clone, Default)]
struct Soak(Arc<SoakInner>);

#[derive(Default)]
struct SoakInner {
    in_flight: Mutex<HashSet<u32>>,
    /// Deliveries that started while another delivery of the same account was in flight.
    overlaps: Mutex<Vec<Posted>>,
    /// Successful deliveries per account, as `n`s, in delivery order.
    delivered: Mutex<BTreeMap<u32, Vec<u32>>>,
}

impl Soak {
    fn successes(&self) -> usize {
        self.0.delivered.lock().unwrap().values().map(Vec::len).sum()
    }
}

async fn soak_handler(ctx: EventContext<Soak>, event: Posted) -> Result<(), HandlerError> {
    let soak = ctx.state();
    if !soak.0.in_flight.lock().unwrap().insert(event.account) {
        soak.0.overlaps.lock().unwrap().push(event.clone());
    }
    // Stay in flight for a moment, so an overlapping delivery would be caught.
    tokio::time::sleep(Duration::from_millis(mix(u64::from(event.n)) % 3)).await;
    let fails = soak_fails(event.n, ctx.attempt());
    if !fails {
        soak.0.delivered.lock().unwrap().entry(event.account).or_default().push(event.n);
    }
    soak.0.in_flight.lock().unwrap().remove(&event.account);
    if fails {
        return Err(HandlerError(format!(
            "random failure of {} on attempt {}",
            event.n,
            ctx.attempt()
        )));
    }
    Ok(())
}

#[derive(Debug, sqlx::FromRow)]
struct SoakRow {
    #[allow(dead_code)] // shown in failure messages
    event_id: Uuid,
    aggregate_id: String,
    n: i64,
    attempts: i32,
    published: bool,
    dead: bool,
    last_error: Option<String>,
}

#[sqlx::test(migrations = false)]
async fn soak_every_aggregate_is_delivered_in_emit_order(pool: PgPool) {
    migrated(&pool).await;
    let total = AGGREGATES as usize * PER_AGGREGATE;

    let soak = Soak::default();
    let relays: Vec<Running> = [3, 5, 7]
        .into_iter()
        .map(|batch| {
            Running::start(
                Relay::builder(pool.clone())
                    .state(soak.clone())
                    .handler(soak_handler)
                    .concurrency(8)
                    .batch_size(batch)
                    .max_attempts(50)
                    // No relay dies here, so no lease should ever expire; a short one makes a
                    // row that was stranded anyway come back (and show) within the test.
                    .lease_timeout(Duration::from_secs(5))
                    .poll_interval(Duration::from_millis(20))
                    .backoff(Backoff {
                        base: Duration::from_millis(5),
                        cap: Duration::from_millis(20),
                        jitter: true,
                    }),
            )
        })
        .collect();

    // The emitters' transactions get a pool of their own: the test pool holds only 5.
    let emitters = PgPoolOptions::new()
        .max_connections(8)
        .connect_with((*pool.connect_options()).clone())
        .await
        .unwrap();
    let book = Book::default();
    let committed = Arc::new(Semaphore::new(0));
    let mut tasks = JoinSet::new();
    for plan in emit_plan(&mut Rng(2024)) {
        tasks.spawn(emitter(emitters.clone(), book.clone(), committed.clone(), plan));
    }
    tasks.spawn(long_transaction(emitters.clone(), book.clone(), committed.clone(), soak.clone()));
    while let Some(done) = tasks.join_next().await {
        done.expect("emitter task");
    }
    emitters.close().await;

    eventually("every event is published", || async {
        count_published(&pool).await == total as i64
    })
    .await;
    let mut counts = Vec::new();
    for relay in relays {
        counts.push(relay.stop().await);
    }

    // What was emitted, in emit order and in `seq` order.
    let emitted = book.emitted();
    assert_eq!(emitted.len(), AGGREGATES as usize);
    assert!(emitted.values().all(|ns| ns.len() == PER_AGGREGATE));
    let rows: Vec<SoakRow> = sqlx::query_as(
        "SELECT event_id, aggregate_id, (payload->>'n')::int8 AS n, attempts, \
                published_at IS NOT NULL AS published, dead_at IS NOT NULL AS dead, last_error \
         FROM outbox.events ORDER BY seq",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(rows.len(), total, "one row per committed emit, none from rolled-back ones");
    let expired: Vec<&SoakRow> = rows
        .iter()
        .filter(|row| row.last_error.as_deref().is_some_and(|e| e.starts_with("lease expired")))
        .collect();
    assert!(
        expired.is_empty(),
        "no relay died, yet these rows waited for their leases to expire: {expired:#?}"
    );
    let mut by_seq: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for row in &rows {
        let n = u32::try_from(row.n).unwrap();
        by_seq.entry(row.aggregate_id.parse().unwrap()).or_default().push(n);
        assert!(row.published && !row.dead, "event {n} is published");
        assert_eq!(row.attempts as u32, soak_failures(n), "event {n}: one attempt per failure");
    }
    assert_eq!(by_seq, emitted, "per account, seq order is the emit order");

    // What was delivered.
    assert_eq!(*soak.0.overlaps.lock().unwrap(), [], "two deliveries of one account overlapped");
    let delivered = soak.0.delivered.lock().unwrap().clone();
    for (account, order) in &emitted {
        assert_eq!(
            delivered.get(account),
            Some(order),
            "account {account} in emit order, once each"
        );
    }
    assert_eq!(delivered.len(), emitted.len());
    let rolled_back = book.rolled_back();
    assert!(!rolled_back.is_empty());
    assert!(
        delivered.values().flatten().all(|n| !rolled_back.contains(n)),
        "no event of a rolled-back transaction is delivered"
    );

    let expected_failures: u64 =
        emitted.values().flatten().map(|&n| u64::from(soak_failures(n))).sum();
    assert!(expected_failures > 60, "the soak exercises retries: {expected_failures} failures");
    let sum = |f: fn(&RelayCounts) -> u64| counts.iter().map(f).sum::<u64>();
    assert_eq!(sum(|c| c.delivered), total as u64);
    assert_eq!(sum(|c| c.failed), expected_failures);
    assert_eq!((sum(|c| c.dead), sum(|c| c.lost_leases)), (0, 0));
    assert!(counts.iter().all(|c| c.delivered > 0), "every relay took work: {counts:?}");
    let stats = outbox_runtime::stats(&pool).await.unwrap();
    assert_eq!((stats.pending, stats.dead), (0, 0));
}

// ---------------------------------------------------------------------------------------------
// 2. An earlier event of the aggregate that is not committed yet
// ---------------------------------------------------------------------------------------------

/// tx1 emits E1 for account 1 and stays open; tx2 emits E2 for account 1 and must wait; a relay
/// runs all along. Then tx1 commits (or rolls back).
async fn uncommitted_earlier_event(pool: PgPool, tx1_commits: bool) {
    migrated(&pool).await;
    let log = Log::default();
    let relay =
        Running::start(fast(Relay::builder(pool.clone())).state(log.clone()).handler(log_posted));

    let mut tx1 = pool.begin().await.unwrap();
    let e1 = outbox_runtime::emit(&mut tx1, &posted(1, 1)).await.unwrap();

    let (pid_tx, pid_rx) = oneshot::channel();
    let returned = Arc::new(AtomicBool::new(false));
    let second = tokio::spawn({
        let (pool, returned) = (pool.clone(), returned.clone());
        async move {
            let mut tx2 = pool.begin().await.unwrap();
            pid_tx.send(backend_pid(&mut tx2).await).unwrap();
            let e2 = outbox_runtime::emit(&mut tx2, &posted(1, 2)).await.unwrap();
            returned.store(true, SeqCst);
            tx2.commit().await.unwrap();
            e2
        }
    });
    let pid = pid_rx.await.unwrap();
    eventually("tx2's emit waits for tx1", || async { waits_for_lock(&pool, pid).await }).await;

    // The relay keeps delivering other accounts meanwhile (their seqs are above E1's).
    let other = commit_all(&pool, &[posted(2, 1)]).await[0];
    eventually("another account's event is delivered", || async {
        row_state(&pool, other).await.published
    })
    .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(log.of(1), [], "nothing of account 1 is delivered while tx1 is open");
    assert!(!returned.load(SeqCst) && !second.is_finished(), "tx2's emit still waits for tx1");
    assert!(waits_for_lock(&pool, pid).await);

    if tx1_commits {
        tx1.commit().await.unwrap();
    } else {
        tx1.rollback().await.unwrap();
    }
    let e2 = within(second, "tx2 commits").await.unwrap();
    eventually("E2 is published", || async { row_state(&pool, e2).await.published }).await;
    let counts = relay.stop().await;

    if tx1_commits {
        assert!(row_state(&pool, e1).await.published);
        assert!(seq(&pool, e1).await < seq(&pool, e2).await);
        assert_eq!(log.ids_of(1), [e1, e2], "E1 then E2");
        assert_eq!(log.of(1), [(1, 1), (2, 1)]);
        assert_eq!(counts.delivered, 3);
    } else {
        assert_eq!(log.ids_of(1), [e2], "only E2 exists");
        assert_eq!(count_events(&pool, "account", "1").await, 1);
        assert_eq!(counts.delivered, 2);
    }
}

#[sqlx::test(migrations = false)]
async fn an_uncommitted_earlier_event_holds_back_the_later_one(pool: PgPool) {
    uncommitted_earlier_event(pool, true).await;
}

#[sqlx::test(migrations = false)]
async fn a_rolled_back_earlier_event_lets_the_later_one_through(pool: PgPool) {
    uncommitted_earlier_event(pool, false).await;
}

// ---------------------------------------------------------------------------------------------
// 3. Unordered types keep their parallelism
// ---------------------------------------------------------------------------------------------

/// Per-account deliveries in flight, with the most seen at once.
#[derive(Clone, Default)]
struct InFlight(Arc<Mutex<HashMap<u32, (usize, usize)>>>);

impl InFlight {
    fn enter(&self, account: u32) {
        let mut map = self.0.lock().unwrap();
        let (now, most) = map.entry(account).or_default();
        *now += 1;
        *most = (*most).max(*now);
    }

    fn leave(&self, account: u32) {
        self.0.lock().unwrap().get_mut(&account).unwrap().0 -= 1;
    }

    fn most(&self, account: u32) -> usize {
        self.0.lock().unwrap()[&account].1
    }
}

#[derive(Clone)]
struct Parallel {
    log: Log,
    in_flight: InFlight,
    barrier: Arc<Barrier>,
}

impl Parallel {
    fn new(parties: usize) -> Self {
        Parallel {
            log: Log::default(),
            in_flight: InFlight::default(),
            barrier: Arc::new(Barrier::new(parties)),
        }
    }

    /// Waits until `parties` handlers wait here at once.
    async fn meet(&self) -> Result<(), HandlerError> {
        tokio::time::timeout(Duration::from_secs(10), self.barrier.wait())
            .await
            .map(drop)
            .map_err(|_| HandlerError("the other handlers never ran alongside".into()))
    }
}

#[sqlx::test(migrations = false)]
async fn unordered_events_of_one_aggregate_run_in_parallel(pool: PgPool) {
    migrated(&pool).await;
    const N: u32 = 4;
    let ids = commit_all(&pool, &(0..N).map(|n| noted(1, n)).collect::<Vec<_>>()).await;

    // Each handler waits until all N run at once.
    async fn meets(ctx: EventContext<Parallel>, event: Noted) -> Result<(), HandlerError> {
        let state = ctx.state();
        state.log.record(&ctx, event.account, event.n);
        state.in_flight.enter(event.account);
        let met = state.meet().await;
        state.in_flight.leave(event.account);
        met
    }
    let state = Parallel::new(N as usize);
    let relay = Running::start(
        fast(Relay::builder(pool.clone())).state(state.clone()).handler(meets).concurrency(8),
    );
    eventually("all are published", || async { count_published(&pool).await == i64::from(N) })
        .await;
    let counts = relay.stop().await;

    assert_eq!(state.in_flight.most(1), N as usize, "all {N} events of account 1 ran at once");
    assert!(state.log.all().iter().all(|s| s.attempt == 1), "{:?}", state.log.all());
    assert_eq!((counts.delivered, counts.failed), (u64::from(N), 0));
    assert!(ids.iter().all(|id| state.log.ids_of(1).contains(id)));
}

#[sqlx::test(migrations = false)]
async fn ordered_events_of_one_aggregate_never_overlap(pool: PgPool) {
    migrated(&pool).await;
    const ACCOUNTS: u32 = 4;
    const PER_ACCOUNT: u32 = 5;
    // Interleaved across accounts, each account's events in n order.
    let events: Vec<Posted> = (0..PER_ACCOUNT)
        .flat_map(|n| (1..=ACCOUNTS).map(move |account| posted(account, n)))
        .collect();
    commit_all(&pool, &events).await;

    // The first event of every account waits until all accounts' first events run at once
    // (different aggregates stay parallel); the others take a moment, which would show an
    // overlap within an account.
    async fn ordered(ctx: EventContext<Parallel>, event: Posted) -> Result<(), HandlerError> {
        let state = ctx.state();
        state.log.record(&ctx, event.account, event.n);
        state.in_flight.enter(event.account);
        let result = if event.n == 0 {
            state.meet().await
        } else {
            tokio::time::sleep(Duration::from_millis(10)).await;
            Ok(())
        };
        state.in_flight.leave(event.account);
        result
    }
    let state = Parallel::new(ACCOUNTS as usize);
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(state.clone())
            .handler(ordered)
            .concurrency(8)
            .batch_size(20),
    );
    let total = i64::from(ACCOUNTS * PER_ACCOUNT);
    eventually("all are published", || async { count_published(&pool).await == total }).await;
    let counts = relay.stop().await;

    for account in 1..=ACCOUNTS {
        assert_eq!(state.in_flight.most(account), 1, "account {account} had two in flight");
        let order: Vec<(u32, u32)> = (0..PER_ACCOUNT).map(|n| (n, 1)).collect();
        assert_eq!(state.log.of(account), order, "account {account} in emit order, first try");
    }
    assert_eq!((counts.delivered, counts.failed), (total as u64, 0));
}

// ---------------------------------------------------------------------------------------------
// 4. A failing ordered event blocks only its aggregate
// ---------------------------------------------------------------------------------------------

#[derive(Clone)]
struct Blocked {
    log: Log,
    pool: PgPool,
    head: Uuid,
    third_attempt: Arc<Notify>,
    release: Arc<Notify>,
    /// Whether the head was published when the next event of its account ran.
    head_published_then: Arc<Mutex<Option<bool>>>,
}

#[sqlx::test(migrations = false)]
async fn a_failing_ordered_event_blocks_only_its_aggregate(pool: PgPool) {
    migrated(&pool).await;
    let (a, b) = (1, 2);
    let a_ids = commit_all(&pool, &[posted(a, 1), posted(a, 2)]).await;
    let b_ids = commit_all(&pool, &(1..=5).map(|n| posted(b, n)).collect::<Vec<_>>()).await;

    // A1 fails twice, then its third attempt waits to be released.
    async fn a1_fails_twice(ctx: EventContext<Blocked>, event: Posted) -> Result<(), HandlerError> {
        let state = ctx.state();
        state.log.record(&ctx, event.account, event.n);
        if ctx.event_id() == state.head {
            if ctx.attempt() < 3 {
                return Err(HandlerError(format!("A1 fails attempt {}", ctx.attempt())));
            }
            state.third_attempt.notify_one();
            state.release.notified().await;
        } else if event.account == 1 {
            let published = row_state(&state.pool, state.head).await.published;
            *state.head_published_then.lock().unwrap() = Some(published);
        }
        Ok(())
    }
    let state = Blocked {
        log: Log::default(),
        pool: pool.clone(),
        head: a_ids[0],
        third_attempt: Arc::default(),
        release: Arc::default(),
        head_published_then: Arc::default(),
    };
    let relay = Running::start(
        fast(Relay::builder(pool.clone())).state(state.clone()).handler(a1_fails_twice),
    );
    signalled(&state.third_attempt, "A1's third attempt runs").await;

    // B flows while A1 is still undelivered.
    for id in &b_ids {
        eventually("B's events are published", || async { row_state(&pool, *id).await.published })
            .await;
    }
    assert!(!row_state(&pool, a_ids[0]).await.published);
    tokio::time::sleep(Duration::from_millis(200)).await; // a few polls that must not take A2
    assert!(untouched(&pool, a_ids[1]).await, "A2 waits for A1");
    assert_eq!(state.log.of(a), [(1, 1), (1, 2), (1, 3)]);

    state.release.notify_one();
    eventually("A2 is published", || async { row_state(&pool, a_ids[1]).await.published }).await;
    let counts = relay.stop().await;

    assert_eq!(state.log.of(a), [(1, 1), (1, 2), (1, 3), (2, 1)], "A2 after A1's success");
    assert_eq!(*state.head_published_then.lock().unwrap(), Some(true), "A1 was published first");
    assert_eq!(state.log.of(b), (1..=5).map(|n| (n, 1)).collect::<Vec<_>>());
    assert_eq!(row_state(&pool, a_ids[0]).await.attempts, 2);
    assert_eq!((counts.delivered, counts.failed), (7, 2));
}

// ---------------------------------------------------------------------------------------------
// 5. A dead ordered event
// ---------------------------------------------------------------------------------------------

async fn a1_always_fails(ctx: EventContext<Log>, event: Posted) -> Result<(), HandlerError> {
    ctx.state().record(&ctx, event.account, event.n);
    if (event.account, event.n) == (1, 1) {
        return Err(HandlerError("A1 is poison".into()));
    }
    Ok(())
}

/// A1, A2, A3 of account 1 and B1 of account 2; A1 always fails.
async fn poisoned_account(pool: &PgPool) -> (Vec<Uuid>, Uuid) {
    migrated(pool).await;
    let a = commit_all(pool, &[posted(1, 1), posted(1, 2), posted(1, 3)]).await;
    let b = commit_all(pool, &[posted(2, 1)]).await[0];
    (a, b)
}

#[sqlx::test(migrations = false)]
async fn a_dead_ordered_event_blocks_its_aggregate_by_default(pool: PgPool) {
    let (a, b) = poisoned_account(&pool).await;
    let log = Log::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(log.clone())
            .handler(a1_always_fails)
            .max_attempts(2),
    );
    eventually("A1 is dead", || async { row_state(&pool, a[0]).await.dead }).await;
    eventually("B1 is published", || async { row_state(&pool, b).await.published }).await;
    tokio::time::sleep(Duration::from_millis(400)).await; // polls that must not take A2 or A3
    let counts = relay.stop().await;

    assert_eq!(log.of(1), [(1, 1), (1, 2)], "only A1's two attempts ran");
    assert!(untouched(&pool, a[1]).await && untouched(&pool, a[2]).await);
    let stats = outbox_runtime::stats(&pool).await.unwrap();
    assert_eq!((stats.pending, stats.dead), (2, 1), "A2 and A3 show as pending");
    assert!(stats.oldest_pending_age.is_some());
    assert_eq!((counts.delivered, counts.failed, counts.dead), (1, 2, 1));
}

#[sqlx::test(migrations = false)]
async fn skip_past_delivers_the_events_after_a_dead_one(pool: PgPool) {
    let (a, b) = poisoned_account(&pool).await;
    let log = Log::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(log.clone())
            .handler(a1_always_fails)
            .max_attempts(2)
            .dead_ordered_events(DeadOrderedEvents::SkipPast),
    );
    eventually("A3 is published", || async { row_state(&pool, a[2]).await.published }).await;
    eventually("B1 is published", || async { row_state(&pool, b).await.published }).await;
    let counts = relay.stop().await;

    assert!(row_state(&pool, a[0]).await.dead);
    assert!(row_state(&pool, a[1]).await.published);
    assert_eq!(log.of(1), [(1, 1), (1, 2), (2, 1), (3, 1)], "A2 and A3 after A1 died, in order");
    let stats = outbox_runtime::stats(&pool).await.unwrap();
    assert_eq!((stats.pending, stats.dead), (0, 1));
    assert_eq!((counts.delivered, counts.failed, counts.dead), (3, 2, 1));
}

// ---------------------------------------------------------------------------------------------
// 6. Delayed events
// ---------------------------------------------------------------------------------------------

#[sqlx::test(migrations = false)]
async fn delayed_events_wait_and_hold_back_their_aggregate(pool: PgPool) {
    migrated(&pool).await;
    let log = Log::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(log.clone())
            .handler(log_posted)
            .handler(log_noted),
    );

    // Unordered, 1.5 s: read available_at before any relay can lease (and move) it.
    let delay = Duration::from_millis(1_500);
    let unordered = commit_with(&pool, &noted(1, 1), EmitOptions::new().delay(delay)).await;
    let unordered_at = available_at(&pool, unordered).await;
    let created_at: DateTime<Utc> =
        sqlx::query_scalar("SELECT created_at FROM outbox.events WHERE event_id = $1")
            .bind(unordered)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(unordered_at - created_at, chrono::Duration::milliseconds(1_500));

    // Ordered: account 2's first event is delayed too; its second, emitted later, is not.
    // Account 3 is a control that nothing holds back.
    let head = commit_with(&pool, &posted(2, 1), EmitOptions::new().delay(delay)).await;
    let head_at = available_at(&pool, head).await;
    let next = commit_all(&pool, &[posted(2, 2)]).await[0];
    let control = commit_all(&pool, &[posted(3, 1)]).await[0];

    for id in [unordered, head, next, control] {
        eventually("every event is published", || async { row_state(&pool, id).await.published })
            .await;
    }
    relay.stop().await;

    let seen = log.first_of(1, 1);
    assert_eq!(seen.attempt, 1);
    assert!(seen.at >= unordered_at, "handled at {} before available_at {unordered_at}", seen.at);
    assert_eq!(log.ids_of(2), [head, next], "the delayed event first, then the later one");
    assert!(log.first_of(2, 1).at >= head_at, "the delayed head waited for its time");
    assert!(log.first_of(2, 2).at >= head_at, "the later event waited for the delayed one");
    assert!(
        log.first_of(3, 1).at < head_at,
        "the relay was delivering other accounts meanwhile, so the wait was ordering's"
    );
    assert!(log.all().iter().all(|s| s.attempt == 1));
}

// ---------------------------------------------------------------------------------------------
// 7. Transactional handlers
// ---------------------------------------------------------------------------------------------

async fn create_projection(pool: &PgPool) {
    sqlx::query("CREATE TABLE projection (event_id uuid NOT NULL, attempt int4 NOT NULL)")
        .execute(pool)
        .await
        .unwrap();
}

/// The committed projection rows: `(event_id, attempt)`.
async fn projection(pool: &PgPool) -> Vec<(Uuid, i32)> {
    sqlx::query_as("SELECT event_id, attempt FROM projection ORDER BY attempt")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// Writes the delivery into the projection, in the handler's transaction.
async fn project<S>(ctx: &mut TransactionContext<S>) -> Result<(), sqlx::Error> {
    let (event_id, attempt) = (ctx.event_id(), i32::try_from(ctx.attempt()).unwrap());
    sqlx::query("INSERT INTO projection (event_id, attempt) VALUES ($1, $2)")
        .bind(event_id)
        .bind(attempt)
        .execute(&mut **ctx.tx())
        .await?;
    Ok(())
}

/// State of the transactional handlers that stall.
#[derive(Clone, Default)]
struct Stall {
    log: Log,
    started: Arc<Notify>,
    finish: Arc<Notify>,
}

#[sqlx::test(migrations = false)]
async fn a_transactional_handler_commits_its_writes_with_the_acknowledgement(pool: PgPool) {
    migrated(&pool).await;
    create_projection(&pool).await;
    let id = commit_all(&pool, &[noted(1, 1)]).await[0];

    async fn projects(mut ctx: TransactionContext<Log>, event: Noted) -> Result<(), BoxError> {
        ctx.state().record(&ctx, event.account, event.n);
        project(&mut ctx).await?;
        Ok(())
    }
    let log = Log::default();
    let counts =
        deliver(&pool, fast(Relay::builder(pool.clone())).state(log.clone()).handler(projects), id)
            .await;

    assert_eq!(projection(&pool).await, [(id, 1)]);
    assert_eq!(log.len(), 1, "the handler ran once");
    let row = row_state(&pool, id).await;
    assert_eq!((row.published, row.attempts), (true, 0));
    assert_eq!((counts.delivered, counts.failed, counts.lost_leases), (1, 0, 0));
}

#[sqlx::test(migrations = false)]
async fn a_failing_transactional_handler_leaves_no_writes(pool: PgPool) {
    migrated(&pool).await;
    create_projection(&pool).await;
    let id = commit_all(&pool, &[noted(1, 1)]).await[0];

    async fn writes_then_fails_once(
        mut ctx: TransactionContext<Log>,
        event: Noted,
    ) -> Result<(), BoxError> {
        ctx.state().record(&ctx, event.account, event.n);
        project(&mut ctx).await?;
        if ctx.attempt() == 1 {
            return Err("the read model rejected it after writing".into());
        }
        Ok(())
    }
    let log = Log::default();
    let counts = deliver(
        &pool,
        fast(Relay::builder(pool.clone())).state(log.clone()).handler(writes_then_fails_once),
        id,
    )
    .await;

    assert_eq!(projection(&pool).await, [(id, 2)], "only the second attempt's write stands");
    assert_eq!(log.of(1), [(1, 1), (1, 2)]);
    let row = row_state(&pool, id).await;
    assert_eq!(row.attempts, 1);
    assert_eq!(row.last_error.as_deref(), Some("the read model rejected it after writing"));
    assert_eq!((counts.delivered, counts.failed), (1, 1));
}

#[sqlx::test(migrations = false)]
async fn a_relay_killed_inside_a_transactional_handler_leaves_no_writes(pool: PgPool) {
    migrated(&pool).await;
    create_projection(&pool).await;
    let id = commit_all(&pool, &[noted(1, 1)]).await[0];

    // The first attempt writes, then hangs until the relay dies.
    async fn writes_then_hangs_once(
        mut ctx: TransactionContext<Stall>,
        event: Noted,
    ) -> Result<(), BoxError> {
        ctx.state().log.record(&ctx, event.account, event.n);
        project(&mut ctx).await?;
        if ctx.attempt() == 1 {
            ctx.state().started.notify_one();
            std::future::pending::<()>().await;
        }
        Ok(())
    }
    let stall = Stall::default();
    let doomed = Relay::builder(pool.clone())
        .state(stall.clone())
        .handler(writes_then_hangs_once)
        .lease_timeout(Duration::from_secs(1))
        .build()
        .unwrap();
    let doomed = tokio::spawn(doomed.run_until(std::future::pending()));
    signalled(&stall.started, "the handler wrote and hangs").await;
    assert_eq!(projection(&pool).await, [], "the write is not committed yet");

    doomed.abort(); // the relay dies inside the handler
    let _ = doomed.await;
    assert_eq!(projection(&pool).await, []);
    let row = row_state(&pool, id).await;
    assert!(!row.published && row.leased, "the event is neither published nor handed back");
    eventually("the dead relay's transaction is rolled back", || async {
        let open: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND state LIKE 'idle in transaction%'",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        open == 0
    })
    .await;

    // Once the lease expires, another relay delivers it, and the projection is written once.
    let heir_stall = Stall::default();
    let heir = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(heir_stall.clone())
            .handler(writes_then_hangs_once),
    );
    eventually("the heir publishes the event", || async { row_state(&pool, id).await.published })
        .await;
    let counts = heir.stop().await;

    assert_eq!(projection(&pool).await, [(id, 2)], "written exactly once, by the second attempt");
    assert_eq!(stall.log.of(1), [(1, 1)]);
    assert_eq!(heir_stall.log.of(1), [(1, 2)], "the expired lease counts as an attempt");
    assert_eq!(counts.delivered, 1);
}

#[sqlx::test(migrations = false)]
async fn a_transactional_handler_cannot_commit_under_a_stolen_lease(pool: PgPool) {
    migrated(&pool).await;
    create_projection(&pool).await;
    let id = commit_all(&pool, &[noted(1, 1)]).await[0];

    async fn writes_then_waits(
        mut ctx: TransactionContext<Stall>,
        event: Noted,
    ) -> Result<(), BoxError> {
        let stall = ctx.state().clone();
        stall.log.record(&ctx, event.account, event.n);
        project(&mut ctx).await?;
        stall.started.notify_one();
        stall.finish.notified().await;
        Ok(())
    }
    // A 30 s lease is renewed every 10 s: the renewer does not notice the theft in this test.
    let stall = Stall::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(stall.clone())
            .handler(writes_then_waits)
            .lease_timeout(Duration::from_secs(30)),
    );
    signalled(&stall.started, "the handler wrote").await;
    let stolen: Uuid = sqlx::query_scalar(
        "UPDATE outbox.events SET lease_token = gen_random_uuid() WHERE event_id = $1 \
         RETURNING lease_token",
    )
    .bind(id)
    .fetch_one(&pool)
    .await
    .unwrap();
    stall.finish.notify_one();
    eventually("the relay counts the lost lease", || async {
        relay.metrics.counts().lost_leases == 1
    })
    .await;

    assert_eq!(projection(&pool).await, [], "the handler's write is rolled back");
    assert!(!row_state(&pool, id).await.published);
    assert_eq!(lease_token(&pool, id).await, Some(stolen), "the new lease holder keeps the row");
    let counts = relay.stop().await;
    assert_eq!((counts.delivered, counts.failed, counts.lost_leases), (0, 0, 1));
    assert_eq!(stall.log.len(), 1);
}

#[sqlx::test(migrations = false)]
async fn a_follow_up_event_exists_iff_the_delivery_committed(pool: PgPool) {
    migrated(&pool).await;
    let id = commit_all(&pool, &[noted(1, 1)]).await[0];

    type FollowUps = Arc<Mutex<Vec<(u32, Uuid)>>>;
    async fn emits_follow_up(
        mut ctx: TransactionContext<FollowUps>,
        event: Noted,
    ) -> Result<(), BoxError> {
        let attempt = ctx.attempt();
        let follow_up = Audited { account: event.account, n: attempt };
        let follow_id = outbox_runtime::emit(ctx.tx(), &follow_up).await?;
        ctx.state().lock().unwrap().push((attempt, follow_id));
        if attempt == 1 {
            return Err("failed after emitting".into());
        }
        Ok(())
    }
    let follow_ups = FollowUps::default();
    let counts = deliver(
        &pool,
        fast(Relay::builder(pool.clone())).state(follow_ups.clone()).handler(emits_follow_up),
        id,
    )
    .await;

    let emitted = follow_ups.lock().unwrap().clone();
    assert_eq!(emitted.len(), 2);
    let stored: Vec<(Uuid, i64)> = sqlx::query_as(
        "SELECT event_id, (payload->>'n')::int8 FROM outbox.events WHERE aggregate_type = 'audit'",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(stored, [(emitted[1].1, 2)], "only the committed delivery's follow-up exists");
    assert_eq!((counts.delivered, counts.failed), (1, 1));
}

// ---------------------------------------------------------------------------------------------
// 8. Idempotent emit
// ---------------------------------------------------------------------------------------------

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

async fn count_all(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox.events").fetch_one(pool).await.unwrap()
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
    assert_eq!(count_all(&pool).await, 1);

    // Another key is another event.
    let second = commit_with(&pool, &noted(1, 5), keyed("req-2")).await;
    assert_ne!(second, first);
    assert_eq!(keyed_rows(&pool, "account", "req-2").await, [(second, 5)]);

    // The same key under another aggregate type is another event.
    let audit = commit_with(&pool, &Audited { account: 1, n: 6 }, keyed("req-1")).await;
    assert_ne!(audit, first);
    assert_eq!(keyed_rows(&pool, "audit", "req-1").await, [(audit, 6)]);
    assert_eq!(keyed_rows(&pool, "account", "req-1").await, [(first, 1)]);
    assert_eq!(count_all(&pool).await, 3);
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
    assert_eq!(count_all(&pool).await, 2);
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
    assert_eq!(count_all(&pool).await, 1);
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
    assert_eq!(count_all(&pool).await, 2);
}

#[sqlx::test(migrations = false)]
async fn a_rolled_back_key_leaves_the_racer_its_own_event(pool: PgPool) {
    migrated(&pool).await;
    race(&pool, noted(1, 1), noted(1, 2), "unordered", false).await;
    race(&pool, posted(1, 1), posted(1, 2), "ordered", false).await;
    assert_eq!(count_all(&pool).await, 2);
}
