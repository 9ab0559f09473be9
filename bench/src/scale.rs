//! Scale (issue #16): does the drain rate hold with a million events waiting? The same drain of
//! a big backlog and of a small one, by 1 relay and by 4 (the relay's defaults: concurrency 16,
//! leases sized by the relay), each in a database of its own. During the big drain by 1 relay,
//! the probe (probe.rs) takes snapshots at the start (before the relay starts), the middle
//! (about half delivered) and the end (all delivered): the lease's EXPLAIN ANALYZE, the table's
//! tuple counts, every relation's size; and every 2 s it samples dead tuples and the pending
//! index's size, so bloat shows over time.

use std::fmt::Write;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::db::{self, Database};
use crate::events::credited;
use crate::probe::{self, mib, Snapshot};
use crate::relay::{self, Calls, Setup};

/// How often the probe samples during the big drain.
const EVERY: Duration = Duration::from_secs(2);

/// What the scale workload measured.
pub struct Scale {
    /// Events/s of the big drain and of the small one, by 1 relay.
    pub one: (f64, f64),
    /// The same by 4 relays.
    pub four: (f64, f64),
    /// Start, middle and end of the big drain by 1 relay.
    pub snapshots: Vec<Snapshot>,
    /// Handler calls beyond one per event, every drain together.
    pub duplicates: u64,
    /// The report's text: the snapshots and the samples.
    pub report: String,
}

/// Drains `big` and `small` events by 1 relay, then by 4.
pub async fn run(url: &str, big: usize, small: usize) -> Scale {
    let mut duplicates = 0;
    let mut drain = async |events, relays| {
        let db = Database::fresh(url, "scale").await;
        db::backlog(&db.pool, events, credited).await;
        let drained = relay::drain(&db.pool, events, Setup::defaults(relays)).await;
        db.drop().await;
        duplicates += drained.duplicates;
        drained.events_per_second
    };
    let small_one = drain(small, 1).await;
    let small_four = drain(small, 4).await;
    let big_four = drain(big, 4).await;
    let observed = observed(url, big).await;
    duplicates += observed.duplicates;

    let mut report = String::new();
    let _ = writeln!(
        report,
        "scale: drain {big} vs {small} events, relays with the defaults (concurrency 16)\n\
         1 relay:  {:.0} vs {small_one:.0} events/s ({:.2}x)\n\
         4 relays: {big_four:.0} vs {small_four:.0} events/s ({:.2}x)\n\
         duplicate handler calls: {duplicates}\n\n\
         Snapshots of the big drain by 1 relay. The lease is the relay's own statement (generic \
         plan, the relay's session settings), run by EXPLAIN ANALYZE in a transaction rolled \
         back, {} times at each point:\n{}\n\
         pg_stat_user_tables lags the backends by a second or so.\n",
        observed.rate,
        observed.rate / small_one,
        big_four / small_four,
        probe::LEASES,
        observed.lease,
    );
    for snapshot in &observed.snapshots {
        snapshot.render(&mut report);
    }
    let _ = writeln!(
        report,
        "== dead tuples and the pending index's size over time (every {} s)\n\
         seconds  delivered  n_dead_tup  {} MiB",
        EVERY.as_secs(),
        probe::PENDING_INDEX
    );
    for s in &observed.samples {
        let _ = writeln!(
            report,
            "{:7.1}  {:9}  {:10}  {:.1}",
            s.seconds,
            s.delivered,
            s.dead,
            mib(s.pending_index)
        );
    }
    Scale {
        one: (observed.rate, small_one),
        four: (big_four, small_four),
        snapshots: observed.snapshots,
        duplicates,
        report,
    }
}

/// One sample of the big drain.
struct Sample {
    seconds: f64,
    delivered: u64,
    dead: i64,
    pending_index: i64,
}

/// The big drain by 1 relay, watched.
struct Observed {
    rate: f64,
    /// The EXECUTE of the relay's lease statement that the snapshots explain.
    lease: String,
    duplicates: u64,
    snapshots: Vec<Snapshot>,
    samples: Vec<Sample>,
}

/// Drains `events` by 1 relay while a task of its own probes: the middle snapshot once half is
/// delivered, a sample every [`EVERY`]; the start and end snapshots around the drain.
async fn observed(url: &str, events: usize) -> Observed {
    let db = Database::fresh(url, "scale").await;
    let laying = Instant::now();
    db::backlog(&db.pool, events, credited).await;
    eprintln!("  scale: {events} events laid down in {:.1} s", laying.elapsed().as_secs_f64());
    let (mut conn, lease) = probe::connect(&db.url).await;
    let calls = Calls::default();
    let relay = Setup::defaults(1).relay(&db.pool, &calls);
    let metrics = relay.metrics();
    let start = Snapshot::take(&mut conn, &lease, "start", 0.0, 0).await;

    let started = Instant::now();
    let done = AtomicBool::new(false);
    // Polled beside the drain in this task (sqlx's borrowed executors make the probe's future
    // one a spawned task cannot take).
    let watcher = async {
        let (mut middle, mut samples) = (None, Vec::new());
        let mut next = started;
        while !done.load(Ordering::Relaxed) {
            let delivered = metrics.counts().delivered;
            let seconds = started.elapsed().as_secs_f64();
            if middle.is_none() && delivered >= events as u64 / 2 {
                middle =
                    Some(Snapshot::take(&mut conn, &lease, "middle", seconds, delivered).await);
            }
            if Instant::now() >= next {
                let dead = probe::table_stats(&mut conn).await.dead;
                let pending_index = probe::pending_index_size(&mut conn).await;
                samples.push(Sample { seconds, delivered, dead, pending_index });
                next += EVERY;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        (middle, samples)
    };
    let drain = async {
        let rate = relay::until_delivered(vec![relay], events).await.events_per_second;
        done.store(true, Ordering::Relaxed);
        rate
    };
    let (rate, (middle, samples)) = tokio::join!(drain, watcher);
    let seconds = started.elapsed().as_secs_f64();
    let end = Snapshot::take(&mut conn, &lease, "end", seconds, metrics.counts().delivered).await;
    drop(conn);
    db.drop().await;
    let duplicates = calls.load(Ordering::Relaxed) - events as u64;
    let snapshots = [Some(start), middle, Some(end)].into_iter().flatten().collect();
    Observed { rate, lease, duplicates, snapshots, samples }
}
