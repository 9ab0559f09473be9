//! The held-transaction mode ([`LeaseMode::HeldTransaction`](crate::LeaseMode)): each batch in
//! a transaction of the relay's own that locks the rows (`store::hold`), delivers them and
//! writes their outcomes before it commits.
//!
//! The row locks are the lease: every other relay's lease skips the rows (`SKIP LOCKED`), and
//! the rows that must wait for them (the next events of an ordered aggregate) stay behind them
//! until the commit, since the locked rows are still pending. Nothing is written to a row but
//! its outcome. The deliveries are the written mode's (`deliver.rs`), each under a deadline
//! (`held.rs`) that a keep-alive statement in the batch's transaction moves while it answers.
//! When one fails the connection is gone and the server has released the locks: the batch's
//! deliveries are cancelled at once, and its rows are delivered again, here or elsewhere.
//!
//! Up to four batches overlap, each on a connection of its own: once half of a batch's
//! deliveries have started, the next batch is leased, and its deliveries take the slots the
//! first one frees while the first writes its outcomes. So the database leases and writes while
//! the relay delivers, as the written mode's lease runs beside its deliveries (`work.rs`).

use std::collections::{HashMap, HashSet, VecDeque};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::future::BoxFuture;
use futures_util::stream::{FuturesUnordered, StreamExt};
use futures_util::FutureExt;
use sqlx::{PgConnection, PgPool, Postgres, Transaction};
use tokio::sync::{mpsc, oneshot, watch, Notify, Semaphore};
use tokio::task::JoinSet;
use tokio::time::Instant;
use uuid::Uuid;

use crate::error::{Error, ErrorChain};
use crate::relay::acker::{Ack, Outcome};
use crate::relay::connections::Connections;
use crate::relay::cursor::Cursor;
use crate::relay::deliver::Delivery;
use crate::relay::held::Held;
use crate::relay::idle::Idle;
use crate::relay::pace::{BatchSize, Pace};
use crate::relay::work::{log_panic, FIRST_LEASE_RETRY};
use crate::relay::{Relay, LAST_ACKS_GRACE};
use crate::store::{
    self, Failures, LeasePlan, LeasedEvent, OnPublish, Positions, RowAddress, Scan, Snoozes,
};

/// Batches in flight at once, each on its own connection of the lease pool. Four, not two: with
/// producers running, a relay caught up finds a few rows per lease, and an event committed
/// meanwhile waits for the next lease to begin; four leases under way shorten that wait (latency
/// p50 1.01x and 0.94x four plain SQL workers polling every millisecond, against 1.14x and 1.18x
/// with two, in alternating runs; BENCHMARKS.md).
pub(crate) const BATCHES_IN_FLIGHT: u32 = 4;

/// The longest time between two statements of a batch's transaction: how late, at worst, the
/// relay learns that its connection (and so its locks) is gone, and cancels the deliveries.
const MOST_BETWEEN_KEEP_ALIVES: Duration = Duration::from_secs(1);

/// A lease statement under way, with what recording its rows needs.
struct Lease<'r> {
    rows: BoxFuture<'r, Result<Locked, sqlx::Error>>,
    plan: &'r LeasePlan,
    sink_down: bool,
    asked: u32,
    from_head: bool,
    sent_at: Instant,
}

/// A lease's transaction and the rows it locked (none: the transaction has ended).
struct Locked {
    tx: Option<Transaction<'static, Postgres>>,
    rows: Vec<(LeasedEvent, RowAddress)>,
}

/// What the next lease waits for.
enum Next<'r> {
    /// Nothing: lease now, with this plan (`true`: the plan for while the sink is down).
    Lease(&'r LeasePlan, bool),
    /// A batch in flight: to end (the last lease found nothing, or two are in flight), or to
    /// have started half its deliveries.
    Batches,
    /// A wake-up or the poll interval: the last lease found nothing and no batch is in flight.
    Idle,
    /// This time: the last lease failed.
    Retry(Instant),
    /// The sink, which is away (the relay only forwards).
    Sink(&'r crate::forward::SinkHealth),
}

/// Leases, delivers and acknowledges batches until `shutdown`; returns early only on a fatal
/// error.
pub(crate) async fn run<S: Clone + Send + Sync + 'static>(
    relay: &Relay<S>,
    connections: &Connections,
    wake: &Notify,
    shutdown: impl Future<Output = ()>,
) -> Result<(), Error> {
    let lease_pool =
        connections.lease.postgres().expect("`build` refuses held transactions but on PostgreSQL");
    let mut shutdown = std::pin::pin!(shutdown.fuse());
    let mut idle = Idle::new(relay.plan.wakes_for.clone(), relay.config.poll_interval);
    let (stop, stopping) = watch::channel(false);
    let slots = Arc::new(Semaphore::new(relay.config.concurrency));
    let pace = Pace::default();
    let mut batch_size = BatchSize::new(relay.config.batch_size);
    let (mut cursor, mut cursor_while_sink_down) = (Cursor::default(), Cursor::default());
    let mut leasing: Option<Lease<'_>> = None;
    let mut batches = FuturesUnordered::new();
    // Fires once the newest batch has started half its deliveries.
    let mut half_started: Option<oneshot::Receiver<()>> = None;
    let mut caught_up = false;
    let mut retry = FIRST_LEASE_RETRY;
    let mut retry_at = None;
    let result = loop {
        let next = if leasing.is_some() {
            Next::Batches
        } else {
            next(relay, batches.len(), half_started.is_some(), caught_up, retry_at)
        };
        if let Next::Lease(plan, sink_down) = next {
            let cursor = if sink_down { &cursor_while_sink_down } else { &cursor };
            let asked = pace.lease_limit(
                relay.config.concurrency,
                relay.config.lease_timeout / 3,
                batch_size.next(),
            );
            leasing = Some(lease(plan, sink_down, cursor, asked, lease_pool));
        }
        tokio::select! {
            biased;
            () = &mut shutdown => break Ok(()),
            locked = lease_rows(&mut leasing) => {
                let lease = leasing.take().expect("only a lease under way finishes");
                match locked.map_err(Error::from) {
                    Ok(Locked { tx, rows }) => {
                        retry = FIRST_LEASE_RETRY;
                        relay.metrics.database_reached();
                        batch_size.found(lease.asked, rows.len());
                        let cursor =
                            if lease.sink_down { &mut cursor_while_sink_down } else { &mut cursor };
                        let leased = rows.iter().map(|(row, _)| row);
                        cursor.leased(lease.plan, lease.from_head, lease.asked, leased);
                        caught_up = rows.is_empty();
                        if let Some(tx) = tx {
                            let (started, half) = oneshot::channel();
                            half_started = Some(half);
                            let batch = Batch::new(relay, tx, rows, lease.sent_at, &pace);
                            batches.push(batch.run(relay, slots.clone(), stopping.clone(), started));
                            idle.found_work(&connections.relay).await;
                        }
                    }
                    Err(Error::SchemaMissing) => break Err(Error::SchemaMissing),
                    Err(error) => {
                        tracing::warn!(error = %ErrorChain(&error), retry_in = ?retry, "cannot lease outbox events");
                        retry_at = Some(Instant::now() + retry);
                        retry = retry.saturating_mul(2).min(Duration::from_secs(30));
                    }
                }
            }
            Some(()) = batches.next() => caught_up = false,
            _ = half(&mut half_started) => half_started = None,
            () = until_lease(&next, &mut idle, connections, wake) => match next {
                Next::Idle => caught_up = false,
                Next::Retry(_) => retry_at = None,
                _ => {}
            },
        }
    };
    // A lease under way is dropped, its transaction rolled back: its rows were never delivered.
    drop(leasing);
    let _ = stop.send(true);
    while batches.next().await.is_some() {}
    idle.unregister(&connections.relay).await;
    result
}

/// What the next lease waits for, when no lease is under way.
fn next<'r, S>(
    relay: &'r Relay<S>,
    in_flight: usize,
    newest_starting: bool,
    caught_up: bool,
    retry_at: Option<Instant>,
) -> Next<'r> {
    if in_flight >= BATCHES_IN_FLIGHT as usize || newest_starting {
        return Next::Batches;
    }
    if let Some(at) = retry_at {
        return Next::Retry(at);
    }
    if caught_up {
        // Rows may come free when a batch in flight ends (failures, hand-backs): look again
        // then, and sleep only when nothing is in flight.
        return if in_flight > 0 { Next::Batches } else { Next::Idle };
    }
    match relay.lease_plan_now() {
        Ok((plan, sink_down)) => Next::Lease(plan, sink_down),
        Err(health) => Next::Sink(health),
    }
}

/// Starts a lease: begins a transaction and locks up to `asked` rows in it with `plan`, from
/// where `cursor` says. It runs while the loop goes on.
fn lease<'r>(
    plan: &'r LeasePlan,
    sink_down: bool,
    cursor: &Cursor,
    asked: u32,
    pool: &PgPool,
) -> Lease<'r> {
    // Owned, so that the statement outlives this borrow of the loop's state.
    let positions: Option<Positions> = match cursor.scan() {
        Scan::Full => None,
        Scan::From(positions) => Some(positions.clone()),
    };
    let from_head = positions.is_none();
    let pool = pool.clone();
    let rows = async move {
        let mut tx = pool.begin().await?;
        let scan = positions.as_ref().map_or(Scan::Full, Scan::From);
        let token = Uuid::new_v4();
        let rows = store::hold(&mut tx, plan, scan, i64::from(asked), token).await?;
        if rows.is_empty() {
            tx.commit().await?;
            return Ok(Locked { tx: None, rows });
        }
        Ok(Locked { tx: Some(tx), rows })
    };
    Lease { rows: rows.boxed(), plan, sink_down, asked, from_head, sent_at: Instant::now() }
}

/// The rows of the lease under way; never resolves without one.
async fn lease_rows(leasing: &mut Option<Lease<'_>>) -> Result<Locked, sqlx::Error> {
    match leasing {
        Some(lease) => lease.rows.as_mut().await,
        None => std::future::pending().await,
    }
}

/// Completes when the newest batch has started half its deliveries (or ended); never without
/// one.
async fn half(half_started: &mut Option<oneshot::Receiver<()>>) {
    match half_started {
        Some(half) => {
            let _ = half.await;
        }
        None => std::future::pending().await,
    }
}

/// Waits until what holds back the next lease is over; never resolves if nothing does.
async fn until_lease(next: &Next<'_>, idle: &mut Idle, connections: &Connections, wake: &Notify) {
    match next {
        Next::Idle => idle.wait(&connections.relay, wake).await,
        Next::Retry(at) => tokio::time::sleep_until(*at).await,
        Next::Sink(health) => health.available().await,
        Next::Lease(..) | Next::Batches => std::future::pending().await,
    }
}

/// One batch: its transaction, holding its rows' locks, and the deliveries of those rows.
struct Batch<S> {
    tx: Transaction<'static, Postgres>,
    /// The batch's leases and their deadlines, which its deliveries watch.
    held: Held,
    addresses: HashMap<Uuid, RowAddress>,
    deliveries: VecDeque<Delivery<S>>,
    outcomes: mpsc::UnboundedReceiver<Ack>,
}

impl<S: Clone + Send + Sync + 'static> Batch<S> {
    fn new(
        relay: &Relay<S>,
        tx: Transaction<'static, Postgres>,
        rows: Vec<(LeasedEvent, RowAddress)>,
        sent_at: Instant,
        pace: &Pace,
    ) -> Self {
        let held = Held::new(&relay.held_rows);
        let deadline = sent_at + relay.config.lease_timeout;
        let (acks, outcomes) = mpsc::unbounded_channel();
        let mut addresses = HashMap::with_capacity(rows.len());
        let mut deliveries = VecDeque::with_capacity(rows.len());
        for (row, address) in rows {
            if let Some(lease) = held.lease(row.event_id, row.lease_token, deadline) {
                addresses.insert(row.event_id, address);
                deliveries.push_back(relay.delivery(row, lease, &acks, pace));
            }
        }
        Batch { tx, held, addresses, deliveries, outcomes }
    }

    /// Runs the batch's deliveries as `slots` free up, keeping its transaction alive, then
    /// writes their outcomes and commits. `half_started` fires once half of them have started.
    /// Once `stopping`, it starts no more deliveries and waits for the running ones until the
    /// shutdown timeout.
    fn run<'r>(
        self,
        relay: &'r Relay<S>,
        slots: Arc<Semaphore>,
        mut stopping: watch::Receiver<bool>,
        half_started: oneshot::Sender<()>,
    ) -> BoxFuture<'r, ()> {
        let Batch { mut tx, held, addresses, mut deliveries, mut outcomes } = self;
        let config = &relay.config;
        async move {
            let mut half_started = Some(half_started);
            let half = deliveries.len().div_ceil(2);
            let mut started = 0;
            let mut tasks = JoinSet::new();
            // Not `interval`, whose first tick, due at once, waits for the timer's next
            // millisecond: the deliveries would start up to a millisecond late.
            let every = (config.lease_timeout / 3).min(MOST_BETWEEN_KEEP_ALIVES);
            let mut keep_alive = tokio::time::interval_at(Instant::now() + every, every);
            keep_alive.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut stop_at = None;
            loop {
                if started >= half || deliveries.is_empty() {
                    if let Some(half_started) = half_started.take() {
                        let _ = half_started.send(());
                    }
                }
                if tasks.is_empty() && deliveries.is_empty() {
                    break;
                }
                let queued = !deliveries.is_empty() && stop_at.is_none();
                tokio::select! {
                    biased;
                    // Sent once, after this batch began: any change is the stop.
                    _ = stopping.changed(), if stop_at.is_none() => {
                        stop_at = Some(Instant::now() + config.shutdown_timeout);
                        deliveries.drain(..).for_each(Delivery::hand_back);
                    }
                    () = sleep_until(stop_at), if stop_at.is_some() => {
                        tracing::warn!(
                            cancelled = tasks.len(),
                            "outbox handlers still running at the shutdown timeout; cancelling them"
                        );
                        tasks.shutdown().await; // cancelled deliveries hand their rows back
                    }
                    Some(joined) = tasks.join_next() => log_panic(joined),
                    Ok(slot) = slots.clone().acquire_owned(), if queued => {
                        let delivery = deliveries.pop_front().expect("a delivery is queued");
                        started += 1;
                        // Boxed: spawning moves a future several times, and a delivery's is
                        // large (its handler's future, span and timer): 10% of the relay's CPU
                        // per event, unboxed (BENCHMARKS.md).
                        tasks.spawn(
                            async move {
                                delivery.run().await;
                                drop(slot);
                            }
                            .boxed(),
                        );
                    }
                    _ = keep_alive.tick() => keep_alive_in(&mut tx, &held, config.lease_timeout).await,
                }
            }
            // Every delivery has sent its outcome: the senders are gone.
            let mut acks = Vec::new();
            while let Some(ack) = outcomes.recv().await {
                acks.push(ack);
            }
            let writing = async {
                let dead = write(&mut tx, &acks, &addresses, config.on_publish).await?;
                tx.commit().await.map(|()| dead)
            };
            // A database that hangs holds the batch no longer than a lease, or at shutdown than
            // the shutdown timeout and a moment: then the rows are delivered again.
            let written = match stop_at {
                None => tokio::time::timeout(config.lease_timeout, writing).await,
                Some(at) => {
                    let until = at.max(Instant::now() + LAST_ACKS_GRACE);
                    tokio::time::timeout_at(until, writing).await
                }
            };
            match written {
                Ok(Ok(dead)) => count(relay, &acks, &dead),
                Ok(Err(error)) => tracing::error!(
                    error = %ErrorChain(&error),
                    rows = acks.len(),
                    "cannot write the outcomes of an outbox batch; its rows will be delivered again"
                ),
                Err(_) => tracing::error!(
                    rows = acks.len(),
                    "the outcomes of an outbox batch were not written in time; its rows will be \
                     delivered again"
                ),
            }
        }
        .boxed()
    }
}

/// Runs a statement in a batch's transaction: while it answers, the locks are held, and the
/// deliveries' deadlines move; once it fails they are not, and the deliveries stop.
async fn keep_alive_in(tx: &mut PgConnection, held: &Held, lease_timeout: Duration) {
    let sent_at = Instant::now();
    match sqlx::query("SELECT 1").execute(tx).await {
        Ok(_) => held.extend_all(sent_at + lease_timeout),
        Err(error) => {
            tracing::warn!(
                error = %ErrorChain(&error),
                "outbox batch's transaction lost, and with it the rows' locks: deliveries \
                 cancelled, the rows will be delivered again"
            );
            held.expire_all();
        }
    }
}

/// Sleeps until `at`; never completes without it.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Writes a batch's outcomes in its transaction, one statement per kind; returns the rows that
/// died of their failure. Rows handed back are left as they were: available.
async fn write(
    tx: &mut PgConnection,
    acks: &[Ack],
    addresses: &HashMap<Uuid, RowAddress>,
    on_publish: OnPublish,
) -> Result<HashSet<Uuid>, sqlx::Error> {
    let mut delivered = Vec::new();
    let (mut failures, mut failed) = (Failures::default(), 0);
    let (mut snoozes, mut snoozed) = (Snoozes::default(), 0);
    // The locks fence these rows: no token is checked.
    let token = Uuid::nil();
    for ack in acks {
        match &ack.outcome {
            Outcome::Delivered => delivered.extend(addresses.get(&ack.event_id)),
            Outcome::Failed(failure) => {
                // A rejected row dies at any count of attempts.
                let max_attempts = if failure.rejected { 0 } else { failure.max_attempts };
                let error = failure.error.clone();
                failures.push(ack.event_id, token, error, failure.retry_in, max_attempts);
                failed += 1;
            }
            Outcome::Snoozed { delay } => {
                snoozes.push(ack.event_id, token, *delay);
                snoozed += 1;
            }
            // Subscribers need the written lease mode (`build` refuses them here).
            Outcome::HandedBack | Outcome::Published | Outcome::LeaseLost => {}
            Outcome::FannedOut(_) => {}
        }
    }
    if !delivered.is_empty() {
        store::publish_held(&mut *tx, &delivered, on_publish).await?;
    }
    let mut dead = HashSet::new();
    if failed > 0 {
        let written = store::fail_held(&mut *tx, &failures).await?;
        dead.extend(written.into_iter().filter(|(_, died)| *died).map(|(id, _)| id));
    }
    if snoozed > 0 {
        store::snooze_held(&mut *tx, &snoozes).await?;
    }
    Ok(dead)
}

/// Counts a committed batch's outcomes.
fn count<S>(relay: &Relay<S>, acks: &[Ack], dead: &HashSet<Uuid>) {
    let metrics = &relay.metrics;
    let mut handed_back = 0;
    for ack in acks {
        match &ack.outcome {
            Outcome::Delivered | Outcome::Published => {
                metrics.delivered(&ack.event_type, &ack.subscriber, ack.created_at)
            }
            Outcome::Failed(failure) => {
                let died = dead.contains(&ack.event_id);
                metrics.failed(&ack.event_type, &ack.subscriber, died, failure.rejected)
            }
            Outcome::Snoozed { .. } => metrics.snoozed(&ack.event_type, &ack.subscriber),
            Outcome::HandedBack | Outcome::LeaseLost | Outcome::FannedOut(_) => handed_back += 1,
        }
    }
    metrics.handed_back(handed_back);
    if !dead.is_empty() {
        tracing::warn!(?dead, "outbox events exhausted their attempts and are now dead");
    }
}
