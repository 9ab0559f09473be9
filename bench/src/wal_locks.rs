//! What the outbox costs the database beyond time (issue #16): WAL per event emitted and
//! delivered (against a bare INSERT), connections per relay, and lock waits among 8 relays.
//!
//! WAL is measured twice. `pg_wal_lsn_diff` of `pg_current_wal_lsn()` before and after counts
//! the whole cluster: no other bench database runs meanwhile, but the cluster may serve others,
//! so it comes with the commits other databases made during it (`pg_stat_database`, which lags
//! by a second or so). And `pg_walinspect` reads the records written in between and keeps this
//! database's: those touching its relations, and every record (commits included) of the
//! transactions that did. That figure holds on a shared cluster; its full-page images (the
//! first change of a page after a checkpoint logs the whole page) are counted apart, since
//! whether a checkpoint fell inside a measurement is chance.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sqlx::{Connection, PgConnection, Row};

use crate::bare;
use crate::cpu::Cpu;
use crate::db::{self, Database};
use crate::events::credited;
use crate::probe;
use crate::relay::{self, Calls, Running, Setup};

/// WAL per event, of this database's records (`own`) and of the whole cluster.
#[derive(Default)]
pub struct PerEvent {
    pub own: f64,
    /// Of `own`, full-page images.
    pub full_pages: f64,
    pub cluster: f64,
}

/// WAL per event written by emitting, by bare inserts and by delivering.
pub struct Wal {
    /// Per event committed by the producers, one `emit` per transaction.
    pub emitted: PerEvent,
    /// Per row committed the same way by one bare INSERT.
    pub bare: PerEvent,
    /// Per event delivered by one relay draining a backlog.
    pub delivered: PerEvent,
    /// Commits in other databases while the three were measured.
    pub other_commits: i64,
}

/// WAL per event: `producers` emitting for `duration`, then the same with bare INSERTs, then a
/// drain of `events` by one relay (defaults).
pub async fn wal(url: &str, producers: usize, duration: Duration, events: usize) -> Wal {
    let db = Database::fresh(url, "wal").await;
    bare::schema(&db.pool).await;
    let mut conn = connect(&db.url).await;

    let meter = Meter::start(&mut conn).await;
    let emitted = relay::produce(&db.pool, producers, duration, None).await.len();
    let (emitted, mut others) = meter.per_event(&mut conn, emitted as f64).await;

    let meter = Meter::start(&mut conn).await;
    let inserted = bare::inserts(&db.pool, producers, duration, bare::Writer::Bare).await
        * duration.as_secs_f64();
    let (bare, other) = meter.per_event(&mut conn, inserted).await;
    others += other;
    conn.close().await.unwrap();
    db.drop().await;

    let db = Database::fresh(url, "wal").await;
    let mut conn = connect(&db.url).await;
    db::backlog(&db.pool, events, credited).await;
    let meter = Meter::start(&mut conn).await;
    let drained = relay::drain(&db.pool, events, Setup::defaults(1)).await;
    let (delivered, other) = meter.per_event(&mut conn, events as f64).await;
    assert_eq!(drained.duplicates, 0, "the WAL drain delivered an event twice");
    others += other;
    conn.close().await.unwrap();
    db.drop().await;
    Wal { emitted, bare, delivered, other_commits: others }
}

/// A connection to the database at `url` that can read the WAL's records.
async fn connect(url: &str) -> PgConnection {
    let mut conn = PgConnection::connect(url).await.unwrap();
    sqlx::query("CREATE EXTENSION IF NOT EXISTS pg_walinspect").execute(&mut conn).await.unwrap();
    conn
}

/// A WAL measurement under way: the position it started at, and the other databases' commits.
struct Meter {
    lsn: String,
    others: i64,
}

impl Meter {
    async fn start(conn: &mut PgConnection) -> Meter {
        Meter { others: other_commits(conn).await, lsn: probe::wal_lsn(conn).await }
    }

    /// (WAL since the start over `events`, commits in other databases since the start).
    async fn per_event(&self, conn: &mut PgConnection, events: f64) -> (PerEvent, i64) {
        let cluster = probe::wal_since(conn, &self.lsn).await;
        let (own, full_pages): (f64, f64) = sqlx::query_as(
            "WITH db AS (SELECT 'rel \\d+/' || oid || '/' AS rel FROM pg_database \
                         WHERE datname = current_database()), \
                  r AS (SELECT xid::text AS xid, record_length, fpi_length, block_ref \
                        FROM pg_get_wal_records_info($1::pg_lsn, pg_current_wal_flush_lsn())), \
                  ours AS (SELECT DISTINCT r.xid FROM r, db \
                           WHERE r.block_ref ~ db.rel AND r.xid <> '0') \
             SELECT coalesce(sum(record_length), 0)::float8, \
                    coalesce(sum(fpi_length), 0)::float8 \
             FROM r, db WHERE r.block_ref ~ db.rel OR r.xid IN (SELECT xid FROM ours)",
        )
        .bind(&self.lsn)
        .fetch_one(&mut *conn)
        .await
        .unwrap();
        let others = other_commits(conn).await - self.others;
        let per = PerEvent {
            own: own / events,
            full_pages: full_pages / events,
            cluster: cluster / events,
        };
        (per, others)
    }
}

/// Commits so far in every database but this connection's.
async fn other_commits(conn: &mut PgConnection) -> i64 {
    sqlx::query_scalar(
        "SELECT coalesce(sum(xact_commit), 0)::int8 FROM pg_stat_database \
         WHERE datname IS DISTINCT FROM current_database()",
    )
    .fetch_one(conn)
    .await
    .unwrap()
}

/// The most connections one relay held, the bench's own not counted.
pub struct Connections {
    /// The bench's own connections to the database while the relay drained (its pool's).
    pub bench: i64,
    /// Most seen while the relay had nothing to do, and while it drained.
    pub idle: i64,
    pub draining: i64,
    /// Every connection seen at the draining maximum, the bench's included, by
    /// `application_name`.
    pub by_name: String,
}

/// Connections of one relay (defaults): client backends of the bench database in
/// `pg_stat_activity`, the probe's own excepted, sampled every 10 ms while the relay idles on
/// an empty outbox for `idle`, then while another drains `events`; less those the bench held
/// before each started.
pub async fn connections(url: &str, idle: Duration, events: usize) -> Connections {
    let db = Database::fresh(url, "connections").await;
    let mut conn = PgConnection::connect(&db.url).await.unwrap();
    let calls = Calls::default();

    let before_idle = clients(&mut conn).await.0;
    let running = Running::start(Setup::defaults(1).relay(&db.pool, &calls));
    let until = Instant::now() + idle;
    let mut most_idle = 0;
    while Instant::now() < until {
        most_idle = most_idle.max(clients(&mut conn).await.0);
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    running.stop().await;

    db::backlog(&db.pool, events, credited).await;
    let bench = clients(&mut conn).await.0;
    let running = Running::start(Setup::defaults(1).relay(&db.pool, &calls));
    let (mut most, mut by_name) = (0, String::new());
    while running.delivered() < events as u64 {
        let (seen, names) = clients(&mut conn).await;
        if seen > most {
            (most, by_name) = (seen, names);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    running.stop().await;
    conn.close().await.unwrap();
    db.drop().await;
    Connections { bench, idle: most_idle - before_idle, draining: most - bench, by_name }
}

/// (client backends of this connection's database but itself, `name count` of each).
async fn clients(conn: &mut PgConnection) -> (i64, String) {
    let rows = sqlx::query(
        "SELECT coalesce(nullif(application_name, ''), '(unnamed)'), count(*) \
         FROM pg_stat_activity \
         WHERE datname = current_database() AND pid <> pg_backend_pid() \
           AND backend_type = 'client backend' \
         GROUP BY 1 ORDER BY 1",
    )
    .fetch_all(conn)
    .await
    .unwrap();
    let total = rows.iter().map(|row| row.get::<i64, _>(1)).sum();
    let names: Vec<String> = rows
        .iter()
        .map(|row| format!("{} {}", row.get::<String, _>(0), row.get::<i64, _>(1)))
        .collect();
    (total, names.join(", "))
}

/// Lock waits seen among the relays.
#[derive(Default)]
pub struct Waits {
    pub events_per_second: f64,
    pub samples: u64,
    /// Samples with a backend waiting on a heavyweight lock, and the most waiting at once.
    pub lock_samples: u64,
    pub most_lock: i64,
    /// The same for lightweight locks (buffer content, WAL insertion, ...).
    pub lwlock_samples: u64,
    pub most_lwlock: i64,
    /// Waiting backends seen, by `wait_event_type:wait_event`, over all samples.
    pub by_event: BTreeMap<String, u64>,
    pub duplicates: u64,
    /// The share of the machine's cores busy during the drain (every process), 0 to 1.
    pub cpu_busy: f64,
}

impl Waits {
    /// The percentage of samples with a backend waiting on a heavyweight lock.
    pub fn lock_percent(&self) -> f64 {
        self.percent(self.lock_samples)
    }

    /// The percentage of samples with a backend waiting on a lightweight lock.
    pub fn lwlock_percent(&self) -> f64 {
        self.percent(self.lwlock_samples)
    }

    fn percent(&self, samples: u64) -> f64 {
        100.0 * samples as f64 / self.samples as f64
    }
}

/// `relays` relays (defaults) drain `events` together while a connection of its own
/// samples `pg_stat_activity` every 5 ms for backends of the database waiting on a lock.
pub async fn lock_waits(url: &str, relays: usize, events: usize) -> Waits {
    let db = Database::fresh(url, "locks").await;
    db::backlog(&db.pool, events, credited).await;
    let done = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn(sample_waits(db.url.clone(), done.clone()));
    let cpu = Cpu::now();
    let drained = relay::drain(&db.pool, events, Setup::defaults(relays)).await;
    let cpu_busy = cpu.since().utilization;
    done.store(true, Ordering::Relaxed);
    let mut waits = sampler.await.unwrap();
    db.drop().await;
    waits.events_per_second = drained.events_per_second;
    waits.duplicates = drained.duplicates;
    waits.cpu_busy = cpu_busy;
    waits
}

async fn sample_waits(url: String, done: Arc<AtomicBool>) -> Waits {
    let mut conn = PgConnection::connect(&url).await.unwrap();
    let mut waits = Waits::default();
    let mut every = tokio::time::interval(Duration::from_millis(5));
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while !done.load(Ordering::Relaxed) {
        every.tick().await;
        let rows: Vec<(String, String)> = sqlx::query_as(
            "SELECT wait_event_type, wait_event FROM pg_stat_activity \
             WHERE datname = current_database() AND pid <> pg_backend_pid() \
               AND wait_event_type IN ('Lock', 'LWLock')",
        )
        .fetch_all(&mut conn)
        .await
        .unwrap();
        let count = |kind: &str| rows.iter().filter(|(t, _)| t == kind).count() as i64;
        let (lock, lwlock) = (count("Lock"), count("LWLock"));
        waits.samples += 1;
        waits.lock_samples += u64::from(lock > 0);
        waits.lwlock_samples += u64::from(lwlock > 0);
        waits.most_lock = waits.most_lock.max(lock);
        waits.most_lwlock = waits.most_lwlock.max(lwlock);
        for (kind, event) in rows {
            *waits.by_event.entry(format!("{kind}:{event}")).or_default() += 1;
        }
    }
    let _ = conn.close().await;
    waits
}
