//! Retention under load (issue #16): does `purge_published` keep up with producers at full
//! speed? Producers commit as fast as they can while one relay (defaults) delivers and another
//! task calls `purge_published(pool, Duration::ZERO)` in a loop.
//!
//! Only the explicit loop is measured: the relay's built-in `retention(keep_for)` takes any
//! `keep_for`, zero included, but purges once a minute (its interval is fixed), so within a
//! run of seconds it purges once, at the start.
//!
//! Rates are taken over the second half of the run, once the relay and the purge have caught
//! up with the start: in a steady state the purge keeps up if it deletes as fast as producers
//! emit, and it can then exceed them while it works off rows published earlier.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::PgPool;

use crate::db::Database;
use crate::events::{credited, Credited};
use crate::relay::{Calls, Running, Setup};

/// How producers commit.
#[derive(Clone, Copy)]
pub enum Producers {
    /// 8 producers, one `emit` per transaction.
    Single,
    /// 4 producers, `emit_all` of 100 events per transaction.
    Batches,
}

/// Rates over the second half of the run, and what was left at its end.
pub struct Kept {
    pub produced: f64,
    pub delivered: f64,
    pub deleted: f64,
    /// Rows published but not yet purged when the producers stopped.
    pub published: i64,
    /// Rows not yet delivered then.
    pub pending: i64,
}

/// Producers of the kind `producers` commit for `duration` beside one relay and the purge loop.
pub async fn keep_up(url: &str, producers: Producers, duration: Duration) -> Kept {
    let db = Database::fresh(url, "purge").await;
    let calls = Calls::default();
    let running = Running::start(Setup::defaults(1).relay(&db.pool, &calls));
    let (produced, deleted) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let done = Arc::new(AtomicBool::new(false));
    let purge = tokio::spawn(purge(db.pool.clone(), deleted.clone(), done.clone()));

    let started = Instant::now();
    let until = started + duration;
    let tasks: Vec<_> = match producers {
        Producers::Single => (0..8)
            .map(|p| tokio::spawn(single(db.pool.clone(), p, until, produced.clone())))
            .collect(),
        Producers::Batches => (0..4)
            .map(|_| tokio::spawn(batches(db.pool.clone(), until, produced.clone())))
            .collect(),
    };
    tokio::time::sleep(duration / 2).await;
    let counts = |at: Instant| {
        let p = produced.load(Ordering::Relaxed);
        (at, p, running.delivered(), deleted.load(Ordering::Relaxed))
    };
    let half = counts(Instant::now());
    for task in tasks {
        task.await.unwrap();
    }
    let end = counts(Instant::now());
    let (published, pending) = left(&db.pool).await;
    done.store(true, Ordering::Relaxed);
    purge.await.unwrap();
    running.stop().await;
    db.drop().await;

    let seconds = (end.0 - half.0).as_secs_f64();
    let rate = |a: u64, b: u64| (b - a) as f64 / seconds;
    Kept {
        produced: rate(half.1, end.1),
        delivered: rate(half.2, end.2),
        deleted: rate(half.3, end.3),
        published,
        pending,
    }
}

/// Calls `purge_published` with no age until `done`, adding what it deleted to `deleted`; a
/// 10 ms pause after each call (each deletes all it can find), so a caught-up loop does not
/// spin on an empty index.
async fn purge(pool: PgPool, deleted: Arc<AtomicU64>, done: Arc<AtomicBool>) {
    while !done.load(Ordering::Relaxed) {
        let n = outbox_runtime::purge_published(&pool, Duration::ZERO).await.unwrap();
        deleted.fetch_add(n, Ordering::Relaxed);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// One event per transaction until `until`.
async fn single(pool: PgPool, p: u32, until: Instant, produced: Arc<AtomicU64>) {
    while Instant::now() < until {
        let mut tx = pool.begin().await.unwrap();
        outbox_runtime::emit(&mut tx, &Credited { account: p, cents: 1 }).await.unwrap();
        tx.commit().await.unwrap();
        produced.fetch_add(1, Ordering::Relaxed);
    }
}

/// `emit_all` of 100 events per transaction until `until`.
async fn batches(pool: PgPool, until: Instant, produced: Arc<AtomicU64>) {
    let batch: Vec<Credited> = (0..100).map(credited).collect();
    while Instant::now() < until {
        let mut tx = pool.begin().await.unwrap();
        outbox_runtime::emit_all(&mut tx, &batch).await.unwrap();
        tx.commit().await.unwrap();
        produced.fetch_add(100, Ordering::Relaxed);
    }
}

/// (published rows, pending rows) in the outbox now.
async fn left(pool: &PgPool) -> (i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE published_at IS NOT NULL), \
                count(*) FILTER (WHERE published_at IS NULL AND dead_at IS NULL) \
         FROM outbox.events",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}
