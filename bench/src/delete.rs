//! Deleting on publish (issue #16): the relay with `delete_on_publish(true)` against plain SQL
//! that leases and deletes in one held transaction, and the default relay (marking published)
//! beside them; each drains the same backlog in a database of its own, and each is checked to
//! have called the handler once per event and left no pending row.

use std::sync::atomic::Ordering;
use std::time::Instant;

use outbox_runtime::{LeaseMode, OutboxEvent};
use sqlx::{Connection, PgPool, Row};
use uuid::Uuid;

use crate::cpu::Cpu;
use crate::db::{self, Database};
use crate::events::{credited, Credited};
use crate::relay::{self, Calls, Rate, Setup};

/// What one drain achieved, and what it cost per event.
pub struct Drain {
    pub events_per_second: f64,
    /// The rate from the first handler call on: the relay's start-up (its connections, the
    /// schema check) and first lease left out, and plain SQL's first batch.
    pub from_first_delivery: f64,
    /// CPU this process spent per event, in microseconds: the relay (or the plain SQL worker)
    /// with its handler, and the bench's own timer.
    pub own_micros: f64,
    /// CPU the whole machine spent per event (PostgreSQL's backends included), in microseconds.
    pub machine_micros: f64,
}

impl Drain {
    /// Measures `drain`, which drains `events` and returns its rate and when its first delivery
    /// came.
    async fn measure(events: usize, drain: impl std::future::Future<Output = Rate>) -> Drain {
        let cpu = Cpu::now();
        let Rate { events_per_second, first_delivery } = drain.await;
        let (spent, per_event) = (cpu.since(), 1e6 / events as f64);
        let after_start = events as f64 / events_per_second - first_delivery.as_secs_f64();
        Drain {
            events_per_second,
            from_first_delivery: events as f64 / after_start,
            own_micros: spent.own_secs * per_event,
            machine_micros: spent.busy_secs * per_event,
        }
    }
}

/// One relay (defaults: concurrency 16, leases sized by the relay) in `lease_mode` drains
/// `events`, deleting delivered rows if `delete`, else marking them published.
pub async fn relay(url: &str, events: usize, delete: bool, lease_mode: LeaseMode) -> Drain {
    let db = Database::fresh(url, "delete").await;
    db::backlog(&db.pool, events, credited).await;
    let setup = Setup { delete, lease_mode, ..Setup::defaults(1) };
    let mut duplicates = 0;
    let drain = Drain::measure(events, async {
        let drained = relay::drain(&db.pool, events, setup).await;
        duplicates = drained.duplicates;
        Rate {
            events_per_second: drained.events_per_second,
            first_delivery: drained.first_delivery,
        }
    })
    .await;
    assert_eq!(duplicates, 0, "the relay called a handler twice for one event");
    let kept = if delete { 0 } else { events as i64 };
    check(&db.pool, kept).await;
    db.drop().await;
    drain
}

/// The same drain by plain SQL: one worker on one connection, each batch one transaction that
/// selects and locks up to `batch` of the oldest pending rows, decodes each and counts a
/// handler call (the relay's handler does no more), deletes them by id and commits.
///
/// The select names the benchmark's one event type, as the relay's lease does, so it reads the
/// same per-type pending index. Without it no index gives the `available_at, seq` order (the
/// pending rows' only index leads with the type), and every batch would scan and sort every
/// pending row: 64 ms a batch at 20,000 rows, a baseline no one would write twice.
pub async fn plain_sql(url: &str, events: usize, batch: i64) -> Drain {
    let db = Database::fresh(url, "delete_sql").await;
    db::backlog(&db.pool, events, credited).await;
    let calls = Calls::default();
    let mut conn = db.pool.acquire().await.unwrap();
    let drain = Drain::measure(events, drain_by_sql(&mut conn, &calls, events, batch)).await;
    drop(conn);
    assert_eq!(calls.load(Ordering::Relaxed), events as u64, "plain SQL handled an event twice");
    check(&db.pool, 0).await;
    db.drop().await;
    drain
}

/// [`plain_sql`]'s loop on `conn`; returns its rate.
async fn drain_by_sql(
    conn: &mut sqlx::PgConnection,
    calls: &Calls,
    events: usize,
    batch: i64,
) -> Rate {
    let started = Instant::now();
    let (mut delivered, mut first_delivery) = (0, None);
    while delivered < events {
        let mut tx = conn.begin().await.unwrap();
        let rows = sqlx::query(
            "SELECT event_id, aggregate_type, aggregate_id, event_type, payload::text, headers \
             FROM outbox.events \
             WHERE aggregate_type = $1 AND event_type = $2 \
               AND published_at IS NULL AND dead_at IS NULL AND available_at <= now() \
             ORDER BY available_at, seq LIMIT $3 FOR UPDATE SKIP LOCKED",
        )
        .bind(Credited::AGGREGATE_TYPE)
        .bind(Credited::EVENT_TYPE)
        .bind(batch)
        .fetch_all(&mut *tx)
        .await
        .unwrap();
        let mut ids = Vec::with_capacity(rows.len());
        for row in &rows {
            let _: Credited = serde_json::from_str(row.get(4)).unwrap();
            let _: serde_json::Value = row.get(5);
            calls.fetch_add(1, Ordering::Relaxed);
            ids.push(row.get::<Uuid, _>(0));
        }
        first_delivery.get_or_insert_with(|| started.elapsed());
        sqlx::query("DELETE FROM outbox.events WHERE event_id = ANY($1)")
            .bind(&ids)
            .execute(&mut *tx)
            .await
            .unwrap();
        tx.commit().await.unwrap();
        delivered += ids.len();
    }
    let events_per_second = events as f64 / started.elapsed().as_secs_f64();
    Rate { events_per_second, first_delivery: first_delivery.unwrap_or_default() }
}

/// Panics unless no row is pending and `kept` rows are left (published ones, when marking).
/// With one handler call per event, no pending row means each event was delivered once.
async fn check(pool: &PgPool, kept: i64) {
    let (pending, rows): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE published_at IS NULL), count(*) FROM outbox.events",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!((pending, rows), (0, kept), "(pending rows, rows) left after the drain");
}
