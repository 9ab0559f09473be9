//! Per-aggregate ordering against the real PostgreSQL: events of an `ordered` type are delivered
//! one at a time per aggregate, in emit (commit) order, by several relays at once, through
//! concurrent emitters, rollbacks and retries; an earlier event of the aggregate that is not
//! committed yet holds the later one back (a rolled-back one does not); unordered types keep
//! their parallelism; a failing or dead ordered event blocks only its own aggregate, unless the
//! relay is told to skip past dead ones.

mod support;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::{Backoff, DeadOrderedEvents, EventContext, LeaseMode, Relay, RelayCounts};
use sqlx::postgres::PgPoolOptions;
use sqlx::{PgPool, Postgres, Transaction};
use support::accounts::*;
use support::*;
use tokio::sync::{oneshot, Barrier, Notify, Semaphore};
use tokio::task::JoinSet;
use uuid::Uuid;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

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
    mix((u64::from(n) << 32) | u64::from(attempt)).is_multiple_of(5)
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
    let fails = soak_fails(event.n, ctx.delivery());
    if !fails {
        soak.0.delivered.lock().unwrap().entry(event.account).or_default().push(event.n);
    }
    soak.0.in_flight.lock().unwrap().remove(&event.account);
    if fails {
        return Err(HandlerError(format!(
            "random failure of {} on attempt {}",
            event.n,
            ctx.delivery()
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
    let other = emit_committed(&pool, &[posted(2, 1)]).await[0];
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
    let ids = emit_committed(&pool, &(0..N).map(|n| noted(1, n)).collect::<Vec<_>>()).await;

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
    emit_committed(&pool, &events).await;

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
    let a_ids = emit_committed(&pool, &[posted(a, 1), posted(a, 2)]).await;
    let b_ids = emit_committed(&pool, &(1..=5).map(|n| posted(b, n)).collect::<Vec<_>>()).await;

    // A1 fails twice, then its third attempt waits to be released.
    async fn a1_fails_twice(ctx: EventContext<Blocked>, event: Posted) -> Result<(), HandlerError> {
        let state = ctx.state();
        state.log.record(&ctx, event.account, event.n);
        if ctx.event_id() == state.head {
            if ctx.delivery() < 3 {
                return Err(HandlerError(format!("A1 fails attempt {}", ctx.delivery())));
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
    let a = emit_committed(pool, &[posted(1, 1), posted(1, 2), posted(1, 3)]).await;
    let b = emit_committed(pool, &[posted(2, 1)]).await[0];
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

/// The most rows leased at once (written leases push `available_at` past now) while `drained`
/// is not yet true, sampled every 5 ms.
async fn most_leased_until(pool: &PgPool, drained: impl Fn() -> bool) -> i64 {
    let mut most = 0;
    while !drained() {
        let leased: i64 = sqlx::query_scalar(
            "SELECT count(*) FROM outbox.events WHERE published_at IS NULL AND available_at > now()",
        )
        .fetch_one(pool)
        .await
        .unwrap();
        most = most.max(leased);
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    most
}

/// Takes 10 ms, so leases run ahead of the handlers if the relay sizes them up.
async fn slow_noted(ctx: EventContext<Log>, event: Noted) -> Result<(), HandlerError> {
    tokio::time::sleep(Duration::from_millis(10)).await;
    log_noted(ctx, event).await
}

async fn slow_posted(ctx: EventContext<Log>, event: Posted) -> Result<(), HandlerError> {
    tokio::time::sleep(Duration::from_millis(10)).await;
    log_posted(ctx, event).await
}

#[sqlx::test(migrations = false)]
async fn a_relay_of_ordered_events_keeps_its_leases_small(pool: PgPool) {
    migrated(&pool).await;
    // Unordered first: the default sizing grows leases while they come back full (the test's
    // measure can see it), then the same backlog ordered, over 1,000 accounts.
    let unordered: Vec<Noted> = (0..3_000).map(|n| noted(n % 1_000, n / 1_000)).collect();
    emit_committed(&pool, &unordered).await;
    let log = Log::default();
    let relay =
        Running::start(fast(Relay::builder(pool.clone())).state(log.clone()).handler(slow_noted));
    let grown = most_leased_until(&pool, || log.len() >= 3_000).await;
    relay.stop().await;
    assert!(grown > 300, "unordered leases grow with the backlog: at most {grown} leased at once");

    let ordered: Vec<Posted> = (0..3_000).map(|n| posted(n % 1_000, n / 1_000)).collect();
    emit_committed(&pool, &ordered).await;
    let log = Log::default();
    let relay =
        Running::start(fast(Relay::builder(pool.clone())).state(log.clone()).handler(slow_posted));
    let most = most_leased_until(&pool, || log.len() >= 3_000).await;
    relay.stop().await;
    // Leases of 100, the next one once half the last is started: a few hundred at most, with
    // the deliveries waiting for their acknowledgement.
    assert!(most <= 300, "ordered leases stay at 100 rows: {most} leased at once");
    for account in [0, 517, 999] {
        assert_eq!(log.numbers_of(account), [0, 1, 2]);
    }
}

// ---------------------------------------------------------------------------------------------
// 7. Behind a hot aggregate
// ---------------------------------------------------------------------------------------------

/// Leases of one row, with account 1's eight events emitted first: behind its first event, in
/// flight, its seven others wait at the head of the pending index, and the other accounts'
/// events lie behind them. Each account in emit order, account 2's dead first event skipped
/// past, and account 1 holding nobody back.
async fn events_behind_a_hot_aggregate(pool: PgPool, mode: LeaseMode) {
    migrated(&pool).await;
    emit_committed(&pool, &(1..=8).map(|n| posted(1, n)).collect::<Vec<_>>()).await;
    let behind = [posted(2, 1), posted(2, 2), posted(3, 1), posted(3, 2)];
    let behind = emit_committed(&pool, &behind).await;
    mark_dead(&pool, behind[0], "poison").await;
    let log = Log::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(log.clone())
            .handler(slow_posted)
            .batch_size(1)
            .lease_mode(mode)
            .dead_ordered_events(DeadOrderedEvents::SkipPast),
    );
    eventually("every live event is published", || async {
        outbox_runtime::stats(&pool).await.unwrap().pending == 0
    })
    .await;
    let counts = relay.stop().await;

    assert_eq!(log.numbers_of(1), (1..=8).collect::<Vec<_>>(), "account 1 in emit order");
    assert_eq!(log.numbers_of(2), [2], "account 2's dead event skipped past");
    assert_eq!(log.numbers_of(3), [1, 2], "account 3 in emit order");
    assert_eq!(counts.delivered, 11, "each live event once");
    let position = |account, n| log.all().iter().position(|s| (s.account, s.n) == (account, n));
    assert!(
        position(3, 2) < position(1, 8),
        "account 3 waited for account 1's backlog: {:?}",
        log.all().iter().map(|s| (s.account, s.n)).collect::<Vec<_>>()
    );
}

#[sqlx::test(migrations = false)]
async fn events_behind_a_hot_aggregate_are_not_held_back(pool: PgPool) {
    events_behind_a_hot_aggregate(pool, LeaseMode::Written).await;
}

#[sqlx::test(migrations = false)]
async fn events_behind_a_hot_aggregate_are_not_held_back_in_a_held_transaction(pool: PgPool) {
    events_behind_a_hot_aggregate(pool, LeaseMode::HeldTransaction).await;
}
