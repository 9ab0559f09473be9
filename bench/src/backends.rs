//! `emit` on SQLite and MariaDB against the bare tools: a transaction of one UPDATE and one
//! event, written by `emit` or by one plain INSERT of the same row into a table with only a
//! primary key, in alternating rounds; and `emit_all` batches of 100.
//!
//! SQLite runs one producer (it writes one transaction at a time: more would only queue on its
//! lock) on a file in the temporary directory, with sqlx's defaults (a rollback journal, each
//! commit synced); MariaDB runs 8 producers on a database of its own on the server at
//! `MYSQL_URL` (`mysql://root@127.0.0.1:3306` when unset).

use std::time::{Duration, Instant};

use outbox_runtime::OutboxEvent;
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

/// The workload on a fresh SQLite file, removed after.
pub async fn sqlite(duration: Duration, rounds: usize, bare_first: bool) -> EmitRates {
    let path = std::env::temp_dir().join(format!("outbox-bench-{}.db", Uuid::new_v4()));
    let options = SqliteConnectOptions::new().filename(&path).create_if_missing(true);
    let pool = SqlitePoolOptions::new().max_connections(2).connect_with(options).await.unwrap();
    outbox_runtime::migrate(&pool).await.unwrap();
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
    for suffix in ["", "-wal", "-shm"] {
        let _ = std::fs::remove_file(format!("{}{suffix}", path.display()));
    }
    rates
}

/// The workload on a fresh database of the MySQL server, dropped after.
pub async fn mysql(duration: Duration, rounds: usize, bare_first: bool) -> EmitRates {
    let server =
        std::env::var("MYSQL_URL").unwrap_or_else(|_| "mysql://root@127.0.0.1:3306".to_owned());
    let name = format!("outbox_bench_{}", std::process::id());
    let admin = MySqlPoolOptions::new().max_connections(1).connect(&server).await.unwrap();
    sqlx::query(&format!("DROP DATABASE IF EXISTS {name}")).execute(&admin).await.unwrap();
    sqlx::query(&format!("CREATE DATABASE {name}")).execute(&admin).await.unwrap();
    let url = format!("{server}/{name}");
    let pool = MySqlPoolOptions::new().max_connections(16).connect(&url).await.unwrap();
    outbox_runtime::migrate(&pool).await.unwrap();
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
    sqlx::query(&format!("DROP DATABASE {name}")).execute(&admin).await.unwrap();
    admin.close().await;
    rates
}
