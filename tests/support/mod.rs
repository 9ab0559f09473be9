//! Events and helpers shared by the integration tests.
#![allow(dead_code)] // each test binary uses its own part

pub mod accounts;
pub mod backends;
pub mod browser;
pub mod console;
pub mod counting;
mod db;
pub mod forwarding;
pub mod inbox;
pub mod kafka;
pub mod nats;
pub mod pgbouncer;
pub mod plans;
pub mod proxy;
pub mod rabbitmq;
pub mod redis;
pub mod relay_process;

use std::future::Future;
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_runtime::{Backoff, EmitOptions, OutboxEvent, RelayBuilder, RelayCounts, RelayMetrics};
use serde::{Deserialize, Serialize};
use sqlx::{PgExecutor, PgPool, Postgres, Transaction};
use tokio::sync::{oneshot, Notify};
use tokio::task::JoinHandle;
use uuid::Uuid;

pub use db::*;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
pub struct OrderPlaced {
    #[outbox(id)]
    pub order_id: Uuid,
    pub total_cents: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.cancelled")]
pub struct OrderCancelled {
    #[outbox(id)]
    pub order_id: Uuid,
    pub reason: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "customer", event_type = "customer.renamed")]
pub struct CustomerRenamed {
    #[outbox(id)]
    pub customer_id: i64,
    pub name: String,
}

/// Readings whose floats test what JSON can hold (NaN, infinities, exact decimals).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "sensor", event_type = "sensor.read")]
pub struct SensorRead {
    #[outbox(id)]
    pub sensor: String,
    pub value: f64,
    pub by_pair: std::collections::BTreeMap<String, f64>,
}

pub fn placed(n: i64) -> OrderPlaced {
    OrderPlaced { order_id: Uuid::now_v7(), total_cents: n }
}

/// Which delivery of its event a handler call is, from 1: the failed attempts and expired
/// leases before it, plus one (snoozes not counted).
pub trait Delivery {
    fn delivery(&self) -> u32;
}

impl<S> Delivery for outbox_runtime::EventContext<S> {
    fn delivery(&self) -> u32 {
        self.attempts() + self.expired_leases() + 1
    }
}

/// A handler error that is just its message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct HandlerError(pub String);

/// Emits `event` with `options` in one committed transaction; returns its id.
pub async fn commit_with<E: OutboxEvent>(pool: &PgPool, event: &E, options: EmitOptions) -> Uuid {
    let mut tx = pool.begin().await.unwrap();
    let id = outbox_runtime::emit_with(&mut tx, event, options).await.unwrap();
    tx.commit().await.unwrap();
    id
}

/// Every row of `outbox.events` that `executor` sees, whatever its state.
pub async fn count_rows<'e>(executor: impl PgExecutor<'e>) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox.events").fetch_one(executor).await.unwrap()
}

/// Polls `check` until it returns true; panics after 30 s so a hung relay fails the test.
pub async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !check().await {
        assert!(tokio::time::Instant::now() < deadline, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Waits for a signal; panics after 30 s so a missing one fails the test instead of hanging it.
pub async fn signalled(notify: &Notify, what: &str) {
    within(notify.notified(), what).await;
}

/// Awaits `future`; panics after 30 s so a hung one fails the test instead of hanging it.
pub async fn within<T>(future: impl Future<Output = T>, what: &str) -> T {
    tokio::time::timeout(Duration::from_secs(30), future)
        .await
        .unwrap_or_else(|_| panic!("timed out waiting until {what}"))
}

/// The backend process id of the transaction's connection.
pub async fn backend_pid(tx: &mut Transaction<'_, Postgres>) -> i32 {
    sqlx::query_scalar("SELECT pg_backend_pid()").fetch_one(&mut **tx).await.unwrap()
}

/// Whether the backend `pid` is blocked waiting for a lock.
pub async fn waits_for_lock(pool: &PgPool, pid: i32) -> bool {
    sqlx::query_scalar::<_, bool>(
        "SELECT coalesce(bool_or(wait_event_type = 'Lock'), false) FROM pg_stat_activity \
         WHERE pid = $1",
    )
    .bind(pid)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// When the row becomes available to a relay.
pub async fn available_at(pool: &PgPool, id: Uuid) -> DateTime<Utc> {
    sqlx::query_scalar("SELECT available_at FROM outbox.events WHERE event_id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A `(published, dead, attempts, expired leases, last_error, leased, available)` view of one row.
#[derive(Debug, sqlx::FromRow)]
pub struct RowState {
    pub published: bool,
    pub dead: bool,
    pub attempts: i32,
    pub expired_leases: i32,
    pub last_error: Option<String>,
    pub leased: bool,
    pub available_now: bool,
}

/// Marks the event dead with `error`, as a relay does once it gives up on it.
pub async fn mark_dead(pool: &PgPool, event_id: Uuid, error: &str) {
    sqlx::query("UPDATE outbox.events SET dead_at = now(), last_error = $2 WHERE event_id = $1")
        .bind(event_id)
        .bind(error)
        .execute(pool)
        .await
        .unwrap();
}

pub async fn row_state(pool: &PgPool, event_id: Uuid) -> RowState {
    sqlx::query_as(
        "SELECT published_at IS NOT NULL AS published, dead_at IS NOT NULL AS dead, attempts, \
                expired_leases, last_error, lease_token IS NOT NULL AS leased, available_at <= now() AS available_now \
         FROM outbox.events WHERE event_id = $1",
    )
    .bind(event_id)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// The row's current lease token.
pub async fn lease_token(pool: &PgPool, id: Uuid) -> Option<Uuid> {
    sqlx::query_scalar("SELECT lease_token FROM outbox.events WHERE event_id = $1")
        .bind(id)
        .fetch_one(pool)
        .await
        .unwrap()
}

/// Ends the row's lease now, as if its holder had not renewed it in time.
pub async fn expire_lease(pool: &PgPool, id: Uuid) {
    sqlx::query("UPDATE outbox.events SET available_at = now() WHERE event_id = $1")
        .bind(id)
        .execute(pool)
        .await
        .unwrap();
}

pub async fn count_published(pool: &PgPool) -> i64 {
    sqlx::query_scalar("SELECT count(*) FROM outbox.events WHERE published_at IS NOT NULL")
        .fetch_one(pool)
        .await
        .unwrap()
}

/// A relay running in the background until `stop`.
pub struct Running {
    /// The relay's live counters.
    pub metrics: RelayMetrics,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<RelayCounts, outbox_runtime::Error>>,
}

impl Running {
    pub fn start<S: Clone + Send + Sync + 'static>(builder: RelayBuilder<S>) -> Self {
        let relay = builder.build().expect("relay builds");
        let metrics = relay.metrics();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(relay.run_until(async {
            let _ = stopped.await;
        }));
        Running { metrics, stop, task }
    }

    pub async fn stop(self) -> RelayCounts {
        let _ = self.stop.send(());
        self.task.await.unwrap().expect("relay stops cleanly")
    }
}

/// Waits until the event `id` is published.
pub async fn until_published(pool: &PgPool, id: Uuid) {
    eventually("the event is published", || async { row_state(pool, id).await.published }).await;
}

/// Runs a relay until the event `id` is published, then stops it; returns what it did.
pub async fn deliver<S: Clone + Send + Sync + 'static>(
    pool: &PgPool,
    builder: RelayBuilder<S>,
    id: Uuid,
) -> RelayCounts {
    let relay = Running::start(builder);
    until_published(pool, id).await;
    relay.stop().await
}

/// Fast settings so tests do not wait on production defaults.
pub fn fast<S: Clone + Send + Sync + 'static>(builder: RelayBuilder<S>) -> RelayBuilder<S> {
    builder.poll_interval(Duration::from_millis(50)).backoff(Backoff {
        base: Duration::from_millis(10),
        cap: Duration::from_millis(50),
        jitter: false,
    })
}

/// Keeps every core busy with a plain spinning loop while it lives, so timing-sensitive
/// guarantees (leases, renewals, timeouts) are tested on a starved CPU too. Bounded: the
/// threads stop by themselves after `limit`, should the owner leak it.
pub struct CpuBurner {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    threads: Vec<std::thread::JoinHandle<u64>>,
}

impl CpuBurner {
    pub fn start(limit: Duration) -> Self {
        use std::sync::atomic::Ordering::Relaxed;
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let cores = std::thread::available_parallelism().map_or(2, usize::from);
        let threads = (0..cores)
            .map(|_| {
                let stop = stop.clone();
                std::thread::spawn(move || {
                    let until = std::time::Instant::now() + limit;
                    let mut spins = 0_u64;
                    while !stop.load(Relaxed) && std::time::Instant::now() < until {
                        for _ in 0..10_000 {
                            spins = std::hint::black_box(spins.wrapping_add(1));
                        }
                    }
                    spins
                })
            })
            .collect();
        CpuBurner { stop, threads }
    }
}

impl Drop for CpuBurner {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        for thread in self.threads.drain(..) {
            let _ = thread.join();
        }
    }
}
