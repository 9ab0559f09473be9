//! `emit` on SQLite and MariaDB against the bare tools: a transaction of one UPDATE and one
//! event, written by `emit` or by one plain INSERT of the same row into a table with only a
//! primary key, in alternating rounds; and `emit_all` batches of 100.
//!
//! The drain on each against the bare tools: one relay (defaults, a handler that decodes and
//! counts) delivers a backlog, and a hand-written loop drains the same backlog in the same
//! table, each batch of 100 read, decoded and marked published in one transaction (SQLite's
//! write lock or MySQL's `FOR UPDATE SKIP LOCKED` as its lease), which is the least a relay can
//! do: no lease survives a crash, and nothing is fenced or retried.
//!
//! SQLite runs one producer (it writes one transaction at a time: more would only queue on its
//! lock) on a file in the temporary directory, with sqlx's defaults (a rollback journal, each
//! commit synced); MariaDB runs 8 producers on a database of its own on the server at
//! `MYSQL_URL` (`mysql://root@127.0.0.1:3306` when unset).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use outbox_runtime::{EventContext, OutboxEvent, Relay};
use sqlx::mysql::{MySqlPool, MySqlPoolOptions};
use sqlx::sqlite::{SqliteConnectOptions, SqlitePool, SqlitePoolOptions};
use uuid::Uuid;

use crate::emit::{batches, per_second};
use crate::events::Credited;

/// Transactions per second with `emit` and with the bare INSERT, and events per second with
/// `emit_all`, each summed over `rounds` rounds of `duration`, alternating.
pub struct EmitRates {
    pub emit: f64,
    pub bare: f64,
    pub emit_all: f64,
}

/// The workload on both backends; `bare_first` alternates which goes first across runs.
macro_rules! emit_workload {
    ($name:ident, $pool:ty, $producers:expr, $update:literal, $bare_insert:literal) => {
        async fn $name(
            pool: &$pool,
            duration: Duration,
            rounds: usize,
            bare_first: bool,
        ) -> EmitRates {
            let business = |bare: bool| {
                per_second($producers, duration, move |p, until| {
                    let pool = pool.clone();
                    async move {
                        let mut done = 0;
                        let mut account = p as i64 * 97;
                        while Instant::now() < until {
                            account = (account + 7) % 1_000;
                            let event = Credited { account: account as u32, cents: 1 };
                            let mut tx = pool.begin().await.unwrap();
                            sqlx::query($update).bind(account).execute(&mut *tx).await.unwrap();
                            if bare {
                                sqlx::query($bare_insert)
                                    .bind(Uuid::now_v7())
                                    .bind(Credited::AGGREGATE_TYPE)
                                    .bind(event.account.to_string())
                                    .bind(Credited::EVENT_TYPE)
                                    .bind(serde_json::to_string(&event).unwrap())
                                    .bind("{}")
                                    .execute(&mut *tx)
                                    .await
                                    .unwrap();
                            } else {
                                outbox_runtime::emit(&mut tx, &event).await.unwrap();
                            }
                            tx.commit().await.unwrap();
                            done += 1;
                        }
                        done
                    }
                })
            };
            let (mut emit, mut bare) = (0.0, 0.0);
            for round in 0..rounds {
                if (round % 2 == 0) == bare_first {
                    bare += business(true).await;
                    emit += business(false).await;
                } else {
                    emit += business(false).await;
                    bare += business(true).await;
                }
            }
            let emit_all = batches(pool, $producers, duration).await;
            EmitRates { emit, bare, emit_all }
        }
    };
}

emit_workload!(
    sqlite_rates,
    SqlitePool,
    1,
    "UPDATE accounts SET balance = balance + 1 WHERE id = ?1",
    "INSERT INTO bare_events (event_id, aggregate_type, aggregate_id, event_type, payload, \
                              headers) VALUES (?1, ?2, ?3, ?4, ?5, ?6)"
);

emit_workload!(
    mysql_rates,
    MySqlPool,
    8,
    "UPDATE accounts SET balance = balance + 1 WHERE id = ?",
    "INSERT INTO bare_events (event_id, aggregate_type, aggregate_id, event_type, payload, \
                              headers) VALUES (?, ?, ?, ?, ?, ?)"
);

/// Events per second of the relay and of the bare loop, each draining a backlog of `events`.
pub struct DrainRates {
    pub relay: f64,
    pub bare: f64,
}

/// The drain workload on both backends: `$take` selects (and on MySQL locks) the oldest 100
/// pending rows, `$publish` marks the seqs of a JSON array published.
macro_rules! drain_workload {
    ($name:ident, $pool:ty, $begin:literal, $take:literal, $publish:literal) => {
        async fn $name(pool: &$pool, events: usize, bare_first: bool) -> DrainRates {
            let fill = || async {
                let backlog: Vec<Credited> = (0..events)
                    .map(|i| Credited { account: (i % 1_000) as u32, cents: 1 })
                    .collect();
                for chunk in backlog.chunks(1_000) {
                    let mut tx = pool.begin().await.unwrap();
                    outbox_runtime::emit_all(&mut tx, chunk).await.unwrap();
                    tx.commit().await.unwrap();
                }
            };
            let relay = || async {
                fill().await;
                let delivered = Arc::new(AtomicUsize::new(0));
                let count = {
                    let delivered = delivered.clone();
                    move |_: EventContext, _: Credited| {
                        delivered.fetch_add(1, Ordering::Relaxed);
                        async { Ok::<(), std::io::Error>(()) }
                    }
                };
                let relay = Relay::builder(pool.clone()).handler(count).build().unwrap();
                let started = Instant::now();
                relay
                    .run_until(async {
                        while delivered.load(Ordering::Relaxed) < events {
                            tokio::time::sleep(Duration::from_millis(1)).await;
                        }
                    })
                    .await
                    .unwrap();
                events as f64 / started.elapsed().as_secs_f64()
            };
            let bare = || async {
                fill().await;
                let started = Instant::now();
                let mut delivered = 0;
                while delivered < events {
                    let mut tx = pool.begin_with($begin).await.unwrap();
                    let rows: Vec<(i64, String)> =
                        sqlx::query_as($take).fetch_all(&mut *tx).await.unwrap();
                    let mut seqs = Vec::with_capacity(rows.len());
                    for (seq, payload) in rows {
                        let _: Credited = serde_json::from_str(&payload).unwrap();
                        seqs.push(seq);
                    }
                    let seqs_json = serde_json::to_string(&seqs).unwrap();
                    sqlx::query($publish).bind(seqs_json).execute(&mut *tx).await.unwrap();
                    tx.commit().await.unwrap();
                    delivered += seqs.len();
                }
                events as f64 / started.elapsed().as_secs_f64()
            };
            let (relay, bare) = if bare_first {
                let bare = bare().await;
                (relay().await, bare)
            } else {
                let relay = relay().await;
                (relay, bare().await)
            };
            DrainRates { relay, bare }
        }
    };
}

drain_workload!(
    sqlite_drain,
    SqlitePool,
    "BEGIN IMMEDIATE",
    "SELECT seq, payload FROM outbox_events \
     WHERE published_at IS NULL AND dead_at IS NULL \
       AND aggregate_type = 'account' AND event_type = 'account.credited' AND subscriber = '' \
       AND available_at <= strftime('%Y-%m-%d %H:%M:%f', 'now') \
     ORDER BY available_at, seq LIMIT 100",
    "UPDATE outbox_events SET published_at = strftime('%Y-%m-%d %H:%M:%f', 'now') \
     WHERE seq IN (SELECT value FROM json_each(?1))"
);

drain_workload!(
    mysql_drain,
    MySqlPool,
    "BEGIN",
    "SELECT seq, CAST(payload AS CHAR) FROM outbox_events \
     WHERE published_at IS NULL AND dead_at IS NULL \
       AND aggregate_type = 'account' AND event_type = 'account.credited' AND subscriber = '' \
       AND available_at <= UTC_TIMESTAMP(6) \
     ORDER BY available_at, seq LIMIT 100 FOR UPDATE SKIP LOCKED",
    "UPDATE JSON_TABLE(?, '$[*]' COLUMNS (seq BIGINT PATH '$')) j \
     STRAIGHT_JOIN outbox_events e ON e.seq = j.seq SET e.published_at = UTC_TIMESTAMP(6)"
);

/// A fresh SQLite file in the temporary directory, and its migrated pool.
async fn sqlite_file() -> (std::path::PathBuf, SqlitePool) {
    let path = std::env::temp_dir().join(format!("outbox-bench-{}.db", Uuid::new_v4()));
    let options = SqliteConnectOptions::new().filename(&path).create_if_missing(true);
    let pool = SqlitePoolOptions::new().max_connections(2).connect_with(options).await.unwrap();
    outbox_runtime::migrate(&pool).await.unwrap();
    (path, pool)
}

fn remove(path: &std::path::Path) {
    for suffix in ["", "-journal", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
}

/// The drain workload on a fresh SQLite file, removed after.
pub async fn sqlite_drains(events: usize, bare_first: bool) -> DrainRates {
    let (path, pool) = sqlite_file().await;
    let rates = sqlite_drain(&pool, events, bare_first).await;
    pool.close().await;
    remove(&path);
    rates
}

/// The drain workload on a fresh database of the MySQL server, dropped after.
pub async fn mysql_drains(events: usize, bare_first: bool) -> DrainRates {
    let (admin, name, pool) = mysql_database().await;
    let rates = mysql_drain(&pool, events, bare_first).await;
    pool.close().await;
    drop_database(admin, &name).await;
    rates
}

/// The workload on a fresh SQLite file, removed after.
pub async fn sqlite(duration: Duration, rounds: usize, bare_first: bool) -> EmitRates {
    let (path, pool) = sqlite_file().await;
    for statement in [
        "CREATE TABLE accounts (id INTEGER PRIMARY KEY, balance INTEGER NOT NULL)",
        "WITH RECURSIVE i(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM i WHERE n < 999) \
         INSERT INTO accounts SELECT n, 0 FROM i",
        "CREATE TABLE bare_events ( \
             event_id BLOB PRIMARY KEY, aggregate_type TEXT NOT NULL, aggregate_id TEXT NOT NULL, \
             event_type TEXT NOT NULL, payload TEXT NOT NULL, headers TEXT NOT NULL DEFAULT '{}', \
             created_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')), \
             available_at TEXT NOT NULL DEFAULT (strftime('%Y-%m-%d %H:%M:%f', 'now')), \
             attempts INTEGER NOT NULL DEFAULT 0, last_error TEXT, published_at TEXT)",
    ] {
        sqlx::query(statement).execute(&pool).await.unwrap();
    }
    let rates = sqlite_rates(&pool, duration, rounds, bare_first).await;
    pool.close().await;
    remove(&path);
    rates
}

/// A fresh database on the MySQL server at `MYSQL_URL`: the server's pool, the database's
/// name, and its migrated pool.
async fn mysql_database() -> (MySqlPool, String, MySqlPool) {
    let server =
        std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".to_owned());
    let name = format!("outbox_bench_{}", std::process::id());
    let admin = MySqlPoolOptions::new().max_connections(1).connect(&server).await.unwrap();
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name}")).execute(&admin).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&admin).await.unwrap();
    let url = format!("{server}/{name}");
    let pool = MySqlPoolOptions::new().max_connections(16).connect(&url).await.unwrap();
    outbox_runtime::migrate(&pool).await.unwrap();
    (admin, name, pool)
}

async fn drop_database(admin: MySqlPool, name: &str) {
    sqlx::query(&format!("DROP DATABASE {name}")).execute(&admin).await.unwrap();
    admin.close().await;
}

/// The workload on a fresh database of the MySQL server, dropped after.
pub async fn mysql(duration: Duration, rounds: usize, bare_first: bool) -> EmitRates {
    let (admin, name, pool) = mysql_database().await;
    for statement in [
        "CREATE TABLE accounts (id INT PRIMARY KEY, balance BIGINT NOT NULL)",
        "INSERT INTO accounts WITH RECURSIVE i(n) AS (SELECT 0 UNION ALL SELECT n + 1 FROM i \
         WHERE n < 999) SELECT n, 0 FROM i",
        "CREATE TABLE bare_events ( \
             event_id BINARY(16) PRIMARY KEY, aggregate_type VARCHAR(128) NOT NULL, \
             aggregate_id VARCHAR(255) NOT NULL, event_type VARCHAR(128) NOT NULL, \
             payload JSON NOT NULL, headers JSON NOT NULL DEFAULT ('{}'), \
             created_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)), \
             available_at DATETIME(6) NOT NULL DEFAULT (UTC_TIMESTAMP(6)), \
             attempts INT NOT NULL DEFAULT 0, last_error TEXT, published_at DATETIME(6))",
    ] {
        sqlx::query(statement).execute(&pool).await.unwrap();
    }
    let rates = mysql_rates(&pool, duration, rounds, bare_first).await;
    pool.close().await;
    drop_database(admin, &name).await;
    rates
}
