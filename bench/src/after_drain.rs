//! After a big drain (issue #22): what a lease costs the relay that has caught up, and for how
//! long. Draining leaves each delivered row's dead entries at the head of the pending index,
//! where a caught-up relay starts every lease, until vacuum removes them. Behind a history of
//! published rows, 1 relay drains a burst; then the probe explains the caught-up lease (from the
//! head, as the relay runs it) every few seconds for a while, beside the dead tuples and the
//! autovacuums so far, and whether the server runs autovacuum at all.

use std::time::{Duration, Instant};

use crate::db::{self, Database};
use crate::events::credited;
use crate::probe;
use crate::relay::{self, Setup};

/// How often the probe explains the lease after the drain.
const EVERY: Duration = Duration::from_secs(5);

/// The caught-up leases after the drain.
pub struct Watched {
    /// The lease's execution time and buffers at the end of the drain.
    pub at_end: (f64, u64),
    /// Seconds from the end of the drain until a lease read fewer than a tenth of the buffers
    /// it read at the end; `None` if none did within the watch.
    pub cheap_after: Option<f64>,
    /// The last lease's time and buffers, at the end of the watch.
    pub last: (f64, u64),
    pub autovacuums: i64,
    /// The server's `autovacuum` setting: with it off, only vacuum by hand cleans the head.
    pub autovacuum_on: bool,
    /// `seconds  ms  buffers  dead  autovacuums`, one line per sample.
    pub samples: String,
}

/// Lays `history` published rows, drains `burst` events by 1 relay, then watches the caught-up
/// lease for `watch`.
pub async fn run(url: &str, history: usize, burst: usize, watch: Duration) -> Watched {
    let db = Database::fresh(url, "after_drain").await;
    let autovacuum: String =
        sqlx::query_scalar("SHOW autovacuum").fetch_one(&db.pool).await.unwrap();
    db::history(&db.pool, history).await;
    db::backlog(&db.pool, burst, credited).await;
    relay::drain(&db.pool, burst, Setup::defaults(1)).await;

    let (mut conn, lease) = probe::connect(&db.url).await;
    let ended = Instant::now();
    let at_end = probe::explain_lease(&mut conn, &lease).await;
    let at_end = (at_end.execution_ms, at_end.buffers);
    let (mut cheap_after, mut last, mut samples) = (None, at_end, String::new());
    let mut autovacuums = 0;
    while ended.elapsed() < watch {
        tokio::time::sleep(EVERY).await;
        let seconds = ended.elapsed().as_secs_f64();
        let explained = probe::explain_lease(&mut conn, &lease).await;
        let stats = probe::table_stats(&mut conn).await;
        autovacuums = stats.autovacuums;
        last = (explained.execution_ms, explained.buffers);
        if cheap_after.is_none() && explained.buffers * 10 < at_end.1 {
            cheap_after = Some(seconds);
        }
        samples.push_str(&format!(
            "{seconds:7.1}  {:8.2}  {:8}  {:10}  {}\n",
            explained.execution_ms, explained.buffers, stats.dead, stats.autovacuums
        ));
    }
    drop(conn);
    db.drop().await;
    Watched { at_end, cheap_after, last, autovacuums, autovacuum_on: autovacuum == "on", samples }
}
