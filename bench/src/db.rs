//! Fresh databases per workload, and the rows they start with.

use outbox_runtime::OutboxEvent;
use sqlx::postgres::PgPoolOptions;
use sqlx::{Connection, PgConnection, PgPool};

/// A migrated database of its own, dropped with [`Database::drop`].
pub struct Database {
    pub pool: PgPool,
    pub url: String,
    admin_url: String,
    name: String,
}

impl Database {
    pub async fn fresh(admin_url: &str, tag: &str) -> Database {
        let name = format!("outbox_bench_{tag}_{}", std::process::id());
        let mut admin = PgConnection::connect(admin_url).await.expect("connect to DATABASE_URL");
        sqlx::query(&format!("DROP DATABASE IF EXISTS {name} WITH (FORCE)"))
            .execute(&mut admin)
            .await
            .unwrap();
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut admin).await.unwrap();
        // The same server and parameters (`?sslmode=...`), another database.
        let (path, query) = admin_url.split_once('?').map_or((admin_url, ""), |(p, q)| (p, q));
        let base = path.rsplit_once('/').map_or(path, |(base, _)| base);
        let url = if query.is_empty() {
            format!("{base}/{name}")
        } else {
            format!("{base}/{name}?{query}")
        };
        let pool = PgPoolOptions::new().max_connections(16).connect(&url).await.unwrap();
        outbox_runtime::migrate(&pool).await.unwrap();
        Database { pool, url, admin_url: admin_url.to_owned(), name }
    }

    pub async fn drop(self) {
        self.pool.close().await;
        let mut admin = PgConnection::connect(&self.admin_url).await.unwrap();
        sqlx::query(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name))
            .execute(&mut admin)
            .await
            .unwrap();
    }
}

/// What the planner knows of the outbox when a drain starts.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Stats {
    /// `VACUUM ANALYZE` after filling, as every other workload leaves it.
    Vacuumed,
    /// Autovacuum off and `ANALYZE` while the table was empty, nothing after filling: the
    /// planner believes the outbox is empty, as it may when a relay starts after an outage.
    Empty,
    /// As [`Stats::Empty`], then `ANALYZE` after filling: the same table with fresh statistics.
    Analyzed,
}

/// Commits `events` events with `emit_all`, 1,000 per transaction, then vacuums.
pub async fn backlog<E: OutboxEvent>(pool: &PgPool, events: usize, make: impl Fn(usize) -> E) {
    backlog_with(pool, events, make, Stats::Vacuumed).await;
}

/// [`backlog`] with the table statistics left as `stats` says.
pub async fn backlog_with<E: OutboxEvent>(
    pool: &PgPool,
    events: usize,
    make: impl Fn(usize) -> E,
    stats: Stats,
) {
    if stats != Stats::Vacuumed {
        sqlx::query("ALTER TABLE outbox.events SET (autovacuum_enabled = false)")
            .execute(pool)
            .await
            .unwrap();
        analyze(pool).await;
    }
    for start in (0..events).step_by(1_000) {
        let batch: Vec<E> = (start..events.min(start + 1_000)).map(&make).collect();
        let mut tx = pool.begin().await.unwrap();
        outbox_runtime::emit_all(&mut tx, &batch).await.unwrap();
        tx.commit().await.unwrap();
    }
    match stats {
        Stats::Vacuumed => vacuum(pool).await,
        Stats::Empty => {}
        Stats::Analyzed => analyze(pool).await,
    }
}

/// `rows` published events of another type, as years of history would leave them.
pub async fn history(pool: &PgPool, rows: usize) {
    for start in (0..rows).step_by(500_000) {
        let n = (rows - start).min(500_000) as i64;
        sqlx::query(
            "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, \
                                        payload, created_at, available_at, published_at) \
             SELECT gen_random_uuid(), 'account', (i % 1000)::text, 'account.credited', \
                    jsonb_build_object('account', i % 1000, 'cents', i), \
                    now() - interval '1 day', now() - interval '1 day', now() - interval '1 day' \
             FROM generate_series(1, $1) AS i",
        )
        .bind(n)
        .execute(pool)
        .await
        .unwrap();
    }
    vacuum(pool).await;
}

pub async fn vacuum(pool: &PgPool) {
    sqlx::query("VACUUM ANALYZE outbox.events").execute(pool).await.unwrap();
}

async fn analyze(pool: &PgPool) {
    sqlx::query("ANALYZE outbox.events").execute(pool).await.unwrap();
}
