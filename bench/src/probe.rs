//! What PostgreSQL says about the outbox while a workload runs: the lease's plan and cost, the
//! table's tuple counts and sizes, the WAL position. Read on a connection of the probe's own.

use std::fmt::Write;

use sqlx::{Connection, Executor, PgConnection, Row};

/// The outbox's partial index of pending rows, the one every lease reads.
pub const PENDING_INDEX: &str = "events_pending_by_type";

/// The lease's arguments as a relay with the default settings binds them: `$1` 100 rows, `$2`
/// a fresh token, `$3` a 30 s lease, `$4` 30 expiries, `$5` dead ordered events block, `$6` to
/// `$8` the benchmark's one type up to version 1. Any later parameter (`$9`, `$10`: where each
/// type's scan starts, while the relay drains) is NULL: the scan from the head of the index,
/// which the relay runs when caught up and at least once a second.
const LEASE_ARGUMENTS: [&str; 8] = [
    "100",
    "gen_random_uuid()",
    "30000000",
    "30",
    "false",
    "ARRAY['account']",
    "ARRAY['account.credited']",
    "ARRAY[1]",
];

/// A connection for probes, with the relay's session settings (its lease plan is the generic
/// one, index-driven) and the relay's own lease statement prepared under the name `lease`;
/// returns it with the EXECUTE that runs the lease.
pub async fn connect(url: &str) -> (PgConnection, String) {
    use outbox_runtime::__private::test_hooks::{LEASE, RELAY_SESSION};
    let mut conn = PgConnection::connect(url).await.unwrap();
    conn.execute(RELAY_SESSION).await.unwrap();
    // The statement is the relay's (`test-hooks`), not a copy, prepared by name so EXPLAIN
    // EXECUTE shows the generic plan the relay reuses. Its parameters' types are the server's
    // reading of its casts, and the arguments past the known ones NULL of those types: the
    // statement is the relay's to change.
    conn.execute(format!("PREPARE lease AS {LEASE}").as_str()).await.unwrap();
    let types: Vec<String> = sqlx::query_scalar(
        "SELECT t.name::regtype::text FROM pg_prepared_statements, \
                unnest(parameter_types) WITH ORDINALITY AS t(name, i) \
         WHERE pg_prepared_statements.name = 'lease' ORDER BY t.i",
    )
    .fetch_all(&mut conn)
    .await
    .unwrap();
    let arguments: Vec<String> = types
        .iter()
        .enumerate()
        .map(|(i, ty)| match LEASE_ARGUMENTS.get(i) {
            Some(known) => (*known).to_owned(),
            None if ty.ends_with("[]") => format!("ARRAY[NULL]::{ty}"),
            None => format!("NULL::{ty}"),
        })
        .collect();
    (conn, format!("EXECUTE lease({})", arguments.join(", ")))
}

/// The lease (`execute`, from [`connect`]), explained with ANALYZE inside a transaction that
/// is rolled back: it reads and locks what a real lease would, and leases nothing.
pub async fn explain_lease(conn: &mut PgConnection, execute: &str) -> Explained {
    let mut tx = conn.begin().await.unwrap();
    let explain = format!("EXPLAIN (ANALYZE, BUFFERS, FORMAT TEXT) {execute}");
    let rows = sqlx::raw_sql(&explain).fetch_all(&mut *tx).await.unwrap();
    tx.rollback().await.unwrap();
    let lines: Vec<String> = rows.iter().map(|row| row.get(0)).collect();
    Explained::parse(lines.join("\n"))
}

/// A lease's EXPLAIN ANALYZE and the figures read from it.
pub struct Explained {
    pub text: String,
    pub execution_ms: f64,
    /// Shared buffers hit plus read by the whole statement (the top node's count).
    pub buffers: u64,
}

impl Explained {
    fn parse(text: String) -> Explained {
        let execution_ms = text
            .lines()
            .find_map(|line| line.trim().strip_prefix("Execution Time:"))
            .and_then(|v| v.trim().trim_end_matches("ms").trim().parse().ok())
            .unwrap_or(f64::NAN);
        // The first `Buffers:` line is the top node's, which counts its children's.
        let top = text.lines().find_map(|line| line.trim().strip_prefix("Buffers:"));
        let count = |what: &str| -> u64 {
            top.and_then(|b| b.split_whitespace().find_map(|w| w.strip_prefix(what)))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        let buffers = count("hit=") + count("read=");
        Explained { text, execution_ms, buffers }
    }
}

/// `pg_stat_user_tables` of `outbox.events` (the counts lag the backends by up to a second or
/// so: each flushes its statistics at most once a second).
pub struct TableStats {
    pub live: i64,
    pub dead: i64,
    pub updated: i64,
    pub hot_updated: i64,
    pub autovacuums: i64,
}

pub async fn table_stats(conn: &mut PgConnection) -> TableStats {
    let row = sqlx::query(
        "SELECT n_live_tup, n_dead_tup, n_tup_upd, n_tup_hot_upd, autovacuum_count \
         FROM pg_stat_user_tables WHERE schemaname = 'outbox' AND relname = 'events'",
    )
    .fetch_one(&mut *conn)
    .await
    .unwrap();
    TableStats {
        live: row.get(0),
        dead: row.get(1),
        updated: row.get(2),
        hot_updated: row.get(3),
        autovacuums: row.get(4),
    }
}

/// Sizes in bytes of `outbox.events`: `("table", heap)`, `("indexes", all of them)`, then each
/// index by name.
pub async fn sizes(conn: &mut PgConnection) -> Vec<(String, i64)> {
    let totals =
        sqlx::query("SELECT pg_relation_size('outbox.events'), pg_indexes_size('outbox.events')")
            .fetch_one(&mut *conn)
            .await
            .unwrap();
    let mut sizes =
        vec![("table".to_owned(), totals.get(0)), ("indexes".to_owned(), totals.get(1))];
    let indexes = sqlx::query(
        "SELECT c.relname::text, pg_relation_size(c.oid) FROM pg_index i \
         JOIN pg_class c ON c.oid = i.indexrelid \
         WHERE i.indrelid = 'outbox.events'::regclass ORDER BY c.relname",
    )
    .fetch_all(&mut *conn)
    .await
    .unwrap();
    sizes.extend(indexes.iter().map(|row| (row.get(0), row.get(1))));
    sizes
}

/// The size in bytes of the pending index alone (cheap enough to sample often).
pub async fn pending_index_size(conn: &mut PgConnection) -> i64 {
    sqlx::query_scalar("SELECT pg_relation_size('outbox.events_pending_by_type')")
        .fetch_one(conn)
        .await
        .unwrap()
}

/// Everything at one point of a drain.
pub struct Snapshot {
    pub label: &'static str,
    pub seconds: f64,
    pub delivered: u64,
    pub stats: TableStats,
    pub sizes: Vec<(String, i64)>,
    /// The median of [`LEASES`] leases explained one after another, by execution time.
    pub lease: Explained,
    /// The execution times of all of them, in ms.
    pub lease_times: Vec<f64>,
}

/// Leases explained per snapshot: one lease's time on a busy machine is noise.
pub const LEASES: usize = 3;

impl Snapshot {
    /// Statistics and sizes first, so the lease explained last does not count in them.
    pub async fn take(
        conn: &mut PgConnection,
        execute: &str,
        label: &'static str,
        seconds: f64,
        delivered: u64,
    ) -> Snapshot {
        let stats = table_stats(conn).await;
        let sizes = sizes(conn).await;
        let mut leases = Vec::with_capacity(LEASES);
        for _ in 0..LEASES {
            leases.push(explain_lease(conn, execute).await);
        }
        leases.sort_by(|a, b| a.execution_ms.total_cmp(&b.execution_ms));
        let lease_times = leases.iter().map(|lease| lease.execution_ms).collect();
        let lease = leases.swap_remove(LEASES / 2);
        Snapshot { label, seconds, delivered, stats, sizes, lease, lease_times }
    }

    /// The size of `relation` (`"table"`, `"indexes"` or an index's name), in bytes.
    pub fn size(&self, relation: &str) -> i64 {
        self.sizes.iter().find(|(name, _)| name == relation).map_or(-1, |(_, size)| *size)
    }

    /// The snapshot as the report prints it.
    pub fn render(&self, out: &mut String) {
        let s = &self.stats;
        let _ = writeln!(
            out,
            "== {} (t = {:.1} s, delivered {})\n\
             pg_stat_user_tables: n_live_tup {}, n_dead_tup {}, n_tup_upd {}, n_tup_hot_upd {}, \
             autovacuum_count {}",
            self.label,
            self.seconds,
            self.delivered,
            s.live,
            s.dead,
            s.updated,
            s.hot_updated,
            s.autovacuums
        );
        for (name, bytes) in &self.sizes {
            let _ = writeln!(out, "size {name}: {bytes} bytes ({:.1} MiB)", mib(*bytes));
        }
        let _ = writeln!(
            out,
            "lease (EXPLAIN ANALYZE, rolled back; the median of {LEASES}, which took {:.3?} ms): \
             {:.3} ms, shared buffers hit+read {}\n{}\n",
            self.lease_times, self.lease.execution_ms, self.lease.buffers, self.lease.text
        );
    }
}

pub fn mib(bytes: i64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

/// The current WAL insert position.
pub async fn wal_lsn(conn: &mut PgConnection) -> String {
    sqlx::query_scalar("SELECT pg_current_wal_lsn()::text").fetch_one(conn).await.unwrap()
}

/// WAL bytes written since `lsn`, by the whole cluster.
pub async fn wal_since(conn: &mut PgConnection, lsn: &str) -> f64 {
    sqlx::query_scalar("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), $1::pg_lsn)::float8")
        .bind(lsn)
        .fetch_one(conn)
        .await
        .unwrap()
}
