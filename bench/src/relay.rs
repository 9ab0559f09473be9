//! Our relay: draining a backlog, and steady state with producers running.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use outbox_runtime::{EventContext, LeaseMode, OutboxEvent, Relay, RelayMetrics};
use sqlx::PgPool;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::events::{Credited, Posted};

/// Handler calls, shared by every relay of a drain.
pub type Calls = Arc<AtomicU64>;

/// Does nothing but count its calls.
async fn noop<E>(ctx: EventContext<Calls>, _: E) -> Result<(), std::convert::Infallible> {
    ctx.state().fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// What one drain measured.
pub struct Drained {
    pub events_per_second: f64,
    /// From the relays' start to the first delivery: their start-up and first lease.
    pub first_delivery: Duration,
    /// Handler calls beyond one per event.
    pub duplicates: u64,
}

/// How to run the relays of one drain.
#[derive(Clone, Copy)]
pub struct Setup {
    pub relays: usize,
    pub concurrency: usize,
    /// `None` leaves the relay's default lease sizing (no `batch_size` call).
    pub batch_size: Option<u32>,
    pub ordered: bool,
    /// `delete_on_publish(true)`: delivered rows are deleted instead of marked published.
    pub delete: bool,
    pub lease_mode: LeaseMode,
}

impl Setup {
    /// `relays` relays of `concurrency`, leasing 100 rows at most, unordered, marking published.
    pub fn new(relays: usize, concurrency: usize) -> Setup {
        Setup {
            relays,
            concurrency,
            batch_size: Some(100),
            ordered: false,
            delete: false,
            lease_mode: LeaseMode::Written,
        }
    }

    /// `relays` relays with the relay's defaults: concurrency 16, and leases sized by the relay.
    pub fn defaults(relays: usize) -> Setup {
        Setup { batch_size: None, ..Setup::new(relays, 16) }
    }

    /// One relay of this setup, its handler counting its calls in `calls`.
    pub fn relay(&self, pool: &PgPool, calls: &Calls) -> Relay<Calls> {
        let builder = Relay::builder(pool.clone())
            .state(calls.clone())
            .concurrency(self.concurrency)
            .delete_on_publish(self.delete)
            .lease_mode(self.lease_mode);
        let builder = match self.batch_size {
            Some(rows) => builder.batch_size(rows),
            None => builder,
        };
        let builder = if self.ordered {
            builder.handler(noop::<Posted>)
        } else {
            builder.handler(noop::<Credited>)
        };
        builder.build().unwrap()
    }
}

/// A relay running in a task of its own until [`Running::stop`].
pub struct Running {
    metrics: RelayMetrics,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<outbox_runtime::RelayCounts, outbox_runtime::Error>>,
}

impl Running {
    pub fn start<S: Clone + Send + Sync + 'static>(relay: Relay<S>) -> Running {
        let metrics = relay.metrics();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(relay.run_until(async {
            let _ = stopped.await;
        }));
        Running { metrics, stop, task }
    }

    /// Events delivered so far.
    pub fn delivered(&self) -> u64 {
        self.metrics.counts().delivered
    }

    /// Stops the relay gracefully; panics if it failed.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}

/// How fast relays delivered: events/s from their start (start-up included) to the last
/// delivery, and when the first came.
pub struct Rate {
    pub events_per_second: f64,
    pub first_delivery: Duration,
}

/// Starts `relays` and runs them until together they delivered `events`.
pub async fn until_delivered<S: Clone + Send + Sync + 'static>(
    relays: Vec<Relay<S>>,
    events: usize,
) -> Rate {
    let started = Instant::now();
    let running: Vec<Running> = relays.into_iter().map(Running::start).collect();
    let mut first_delivery = None;
    loop {
        let delivered = running.iter().map(Running::delivered).sum::<u64>();
        if delivered > 0 {
            first_delivery.get_or_insert_with(|| started.elapsed());
        }
        if delivered >= events as u64 {
            break;
        }
        if running.iter().any(|r| r.task.is_finished()) {
            // A relay stopped early (a sink failing its start check): show why.
            for relay in running {
                relay.stop().await;
            }
            panic!("a relay stopped before delivering {events} events");
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    let rate = Rate {
        events_per_second: events as f64 / started.elapsed().as_secs_f64(),
        first_delivery: first_delivery.unwrap_or_default(),
    };
    for relay in running {
        relay.stop().await;
    }
    rate
}

/// Runs relays until `events` events are delivered.
pub async fn drain(pool: &PgPool, events: usize, setup: Setup) -> Drained {
    let calls = Calls::default();
    let relays = (0..setup.relays).map(|_| setup.relay(pool, &calls)).collect();
    let Rate { events_per_second, first_delivery } = until_delivered(relays, events).await;
    let duplicates = calls.load(Ordering::Relaxed) - events as u64;
    Drained { events_per_second, first_delivery, duplicates }
}

/// `producers` tasks each commit one event per transaction for `duration`, as fast as they can
/// or, with `rate`, at that many events per second together (each producer at its share, on a
/// timer). Returns each event's id and the instant its COMMIT returned to the producer.
pub async fn produce(
    pool: &PgPool,
    producers: usize,
    duration: Duration,
    rate: Option<f64>,
) -> Vec<(Uuid, Instant)> {
    let until = Instant::now() + duration;
    let period = rate.map(|rate| Duration::from_secs_f64(producers as f64 / rate));
    let producers: Vec<_> = (0..producers)
        .map(|p| {
            let pool = pool.clone();
            tokio::spawn(async move {
                let mut ticks = period.map(tokio::time::interval);
                let mut committed = Vec::new();
                while Instant::now() < until {
                    if let Some(ticks) = ticks.as_mut() {
                        ticks.tick().await;
                    }
                    let mut tx = pool.begin().await.unwrap();
                    let event = Credited { account: p as u32, cents: 1 };
                    let id = outbox_runtime::emit(&mut tx, &event).await.unwrap();
                    tx.commit().await.unwrap();
                    committed.push((id, Instant::now()));
                }
                committed
            })
        })
        .collect();
    let mut committed = Vec::new();
    for producer in producers {
        committed.extend(producer.await.unwrap());
    }
    committed
}

/// Latencies from each commit to its arrival (at a handler or a consumer), sorted. One can
/// arrive before the producer's COMMIT returned: that counts as zero.
pub fn latencies(committed: &[(Uuid, Instant)], arrived: &HashMap<Uuid, Instant>) -> Vec<Duration> {
    let mut latencies: Vec<Duration> =
        committed.iter().map(|(id, at)| arrived[id].saturating_duration_since(*at)).collect();
    latencies.sort();
    latencies
}

/// Steady state: `producers` tasks each commit one event per transaction for `duration`, as
/// fast as they can or at `rate` events/s together, while one relay (defaults) delivers.
/// Returns (delivered events/s, latencies from the end of each emitting commit, as the producer
/// saw it, to the handler call). At a few events a second every event finds the relay asleep:
/// the latencies are those of its wake-ups.
pub async fn paced(
    pool: &PgPool,
    producers: usize,
    duration: Duration,
    rate: Option<f64>,
) -> (f64, Vec<Duration>) {
    paced_in(pool, producers, duration, rate, LeaseMode::Written).await
}

/// [`paced`] with a relay in `lease_mode`.
pub async fn paced_in(
    pool: &PgPool,
    producers: usize,
    duration: Duration,
    rate: Option<f64>,
    lease_mode: LeaseMode,
) -> (f64, Vec<Duration>) {
    type Times = Arc<Mutex<HashMap<Uuid, Instant>>>;
    async fn timed(ctx: EventContext<Times>, _: Credited) -> Result<(), std::io::Error> {
        ctx.state().lock().unwrap().insert(ctx.event_id(), Instant::now());
        Ok(())
    }
    let handled: Times = Arc::default();
    let relay = Relay::builder(pool.clone())
        .state(handled.clone())
        .handler(timed)
        .lease_mode(lease_mode)
        .build()
        .unwrap();
    let running = Running::start(relay);
    tokio::time::sleep(Duration::from_millis(300)).await;

    let committed = produce(pool, producers, duration, rate).await;
    while running.delivered() < committed.len() as u64 {
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    running.stop().await;
    let latencies = latencies(&committed, &handled.lock().unwrap());
    (committed.len() as f64 / duration.as_secs_f64(), latencies)
}

/// [`paced`]'s producers against plain SQL instead of a relay: `workers` tasks, each on a
/// connection of its own, loop over one transaction that selects up to 100 of the oldest pending
/// rows of the type `FOR UPDATE SKIP LOCKED`, records their arrival, marks them published and
/// commits; a worker that found nothing sleeps `poll` first. Returns (events/s, latencies).
pub async fn polled(
    pool: &PgPool,
    producers: usize,
    duration: Duration,
    workers: usize,
    poll: Duration,
) -> (f64, Vec<Duration>) {
    let arrived: Arc<Mutex<HashMap<Uuid, Instant>>> = Arc::default();
    let producing = Arc::new(AtomicBool::new(true));
    let workers: Vec<_> = (0..workers)
        .map(|_| {
            let (pool, arrived, producing) = (pool.clone(), arrived.clone(), producing.clone());
            tokio::spawn(async move {
                let mut conn = pool.acquire().await.unwrap();
                loop {
                    // Read before the select: one that starts after the last commit and finds
                    // nothing leaves nothing behind (rows another worker locked, it handles).
                    let last_look = !producing.load(Ordering::Relaxed);
                    let mut tx = sqlx::Connection::begin(&mut *conn).await.unwrap();
                    let ids: Vec<Uuid> = sqlx::query_scalar(
                        "SELECT event_id FROM outbox.events \
                         WHERE aggregate_type = $1 AND event_type = $2 \
                           AND published_at IS NULL AND dead_at IS NULL \
                           AND available_at <= now() \
                         ORDER BY available_at, seq LIMIT 100 FOR UPDATE SKIP LOCKED",
                    )
                    .bind(Credited::AGGREGATE_TYPE)
                    .bind(Credited::EVENT_TYPE)
                    .fetch_all(&mut *tx)
                    .await
                    .unwrap();
                    let now = Instant::now();
                    arrived.lock().unwrap().extend(ids.iter().map(|id| (*id, now)));
                    sqlx::query(
                        "UPDATE outbox.events SET published_at = now() WHERE event_id = ANY($1)",
                    )
                    .bind(&ids)
                    .execute(&mut *tx)
                    .await
                    .unwrap();
                    tx.commit().await.unwrap();
                    if ids.is_empty() {
                        if last_look {
                            break;
                        }
                        tokio::time::sleep(poll).await;
                    }
                }
            })
        })
        .collect();
    let committed = produce(pool, producers, duration, None).await;
    producing.store(false, Ordering::Relaxed);
    for worker in workers {
        worker.await.unwrap();
    }
    let latencies = latencies(&committed, &arrived.lock().unwrap());
    (committed.len() as f64 / duration.as_secs_f64(), latencies)
}

/// Events/s of one relay with the defaults and one handler draining `events` in a database of
/// its own: the reference of the subscribers' workload.
pub async fn drain_one(url: &str, events: usize) -> f64 {
    let db = crate::db::Database::fresh(url, "drain_one").await;
    crate::db::backlog_with(&db.pool, events, crate::events::credited, crate::db::Stats::Vacuumed)
        .await;
    let drained = drain(&db.pool, events, Setup::defaults(1)).await;
    db.drop().await;
    drained.events_per_second
}
