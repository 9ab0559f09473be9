//! A relay SIGKILLed mid-drain on SQLite and on MariaDB (MySQL's statements), as
//! `faults_crash.rs` does on PostgreSQL: restarted, it loses nothing and delivers again only
//! what the killed one held. The relay is the `relay-process` binary on the database's URL; its
//! handler records every delivery in a `deliveries` table, apart from the acknowledgement. Both
//! cores are kept busy the whole time.

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use support::backends::{MySqlDatabase, SqliteFile};
use support::relay_process::{JobRun, RelayProcess};
use support::CpuBurner;
use tokio::time::Instant;
use uuid::Uuid;

const EVENTS: u64 = 1_500;
const KILLS: u64 = 3;

/// Short leases, so a killed relay's rows come back quickly.
const SETTINGS: [(&str, &str); 6] = [
    ("RELAY_CONCURRENCY", "16"),
    ("RELAY_BATCH_SIZE", "50"),
    ("RELAY_LEASE_TIMEOUT_MS", "3000"),
    ("RELAY_MAX_ATTEMPTS", "100"),
    ("RELAY_POLL_INTERVAL_MS", "50"),
    ("HANDLER_SLEEP_MS", "2"),
];

/// The test on one backend: `$url` where the relay finds the database of `$pool`.
macro_rules! crash_test {
    ($name:ident, $setup:expr, $teardown:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $name() {
            let _burner = CpuBurner::start(Duration::from_secs(600));
            let (guard, url, pool) = $setup;
            outbox_runtime::migrate(&pool).await.unwrap();
            sqlx::query(
                "CREATE TABLE deliveries (event_id BINARY(16) NOT NULL, attempt INT NOT NULL, \
                                          pid INT NOT NULL, ok BOOLEAN NOT NULL)",
            )
            .execute(&pool)
            .await
            .unwrap();
            let jobs: Vec<JobRun> = (0..EVENTS).map(|n| JobRun { job: n, n }).collect();
            let mut ids = HashSet::new();
            for batch in jobs.chunks(500) {
                let mut tx = pool.begin().await.unwrap();
                ids.extend(outbox_runtime::emit_all(&mut tx, batch).await.unwrap());
                tx.commit().await.unwrap();
            }

            let count = |condition: &'static str| {
                let pool = pool.clone();
                async move {
                    let sql = format!("SELECT count(*) FROM outbox_events WHERE {condition}");
                    let n: i64 =
                        sqlx::query_scalar(sqlx::static_sql(sql)).fetch_one(&pool).await.unwrap();
                    n as u64
                }
            };
            let mut held_at_kill: Vec<HashSet<Uuid>> = Vec::new();
            let mut relay = RelayProcess::spawn_at(&url, &SETTINGS);
            for kill in 1..=KILLS {
                let target = EVENTS * kill / (KILLS + 1);
                let deadline = Instant::now() + Duration::from_secs(120);
                while count("published_at IS NOT NULL").await < target {
                    assert!(Instant::now() < deadline, "{target} never published: {}", relay.log());
                    tokio::time::sleep(Duration::from_millis(10)).await;
                }
                let log = relay.kill();
                let held: HashSet<Uuid> = sqlx::query_scalar(
                    "SELECT event_id FROM outbox_events \
                     WHERE published_at IS NULL AND lease_token IS NOT NULL",
                )
                .fetch_all(&pool)
                .await
                .unwrap()
                .into_iter()
                .collect();
                let pending = count("published_at IS NULL AND dead_at IS NULL").await;
                println!("kill {kill}: {pending} pending, {} leased; log: {log}", held.len());
                assert!(pending > 0, "kill {kill} came after the drain");
                held_at_kill.push(held);
                relay = RelayProcess::spawn_at(&url, &SETTINGS);
            }
            assert!(held_at_kill.iter().any(|held| !held.is_empty()), "no kill caught a batch");
            let deadline = Instant::now() + Duration::from_secs(120);
            while count("published_at IS NULL AND dead_at IS NULL").await > 0 {
                assert!(Instant::now() < deadline, "the last relay never drained: {}", relay.log());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let (last, _) = relay.terminate().await;
            assert_eq!(last.lost_leases, 0, "one relay at a time: no lease taken from a live one");

            let rows: Vec<(Uuid, i32, i32, i64, i64)> = sqlx::query_as(
                "SELECT event_id, attempts, expired_leases, published_at IS NOT NULL, \
                        dead_at IS NOT NULL FROM outbox_events",
            )
            .fetch_all(&pool)
            .await
            .unwrap();
            assert_eq!(rows.iter().map(|row| row.0).collect::<HashSet<_>>(), ids);
            let mut seen: HashMap<Uuid, Vec<i32>> = HashMap::new();
            let deliveries: Vec<(Uuid, i32)> =
                sqlx::query_as("SELECT event_id, attempt FROM deliveries")
                    .fetch_all(&pool)
                    .await
                    .unwrap();
            for (id, attempt) in deliveries {
                seen.entry(id).or_default().push(attempt);
            }
            let mut duplicates = 0;
            for (id, attempts, expired_leases, published, dead) in rows {
                assert!(
                    published == 1 && dead == 0,
                    "event {id} is published, not pending or dead"
                );
                assert_eq!(attempts, 0, "event {id}: no delivery failed");
                let mut delivered = seen.remove(&id).unwrap_or_default();
                delivered.sort_unstable();
                assert!(!delivered.is_empty(), "event {id} was never delivered");
                assert_eq!(delivered.last(), Some(&(expired_leases + 1)), "event {id}");
                let times_held = held_at_kill.iter().filter(|held| held.contains(&id)).count();
                assert!(
                    delivered.len() <= 1 + times_held,
                    "event {id} delivered {} times, held by a killed relay {times_held} times",
                    delivered.len()
                );
                duplicates += delivered.len() - 1;
            }
            let bound: usize = held_at_kill.iter().map(HashSet::len).sum();
            println!("{EVENTS} events, {KILLS} kills: {duplicates} duplicates, bound {bound}");
            pool.close().await;
            $teardown(guard).await;
        }
    };
}

async fn sqlite() -> (SqliteFile, String, sqlx::SqlitePool) {
    let file = SqliteFile::new();
    let pool = file.pool().await;
    let url = format!("sqlite://{}", file.path.display());
    (file, url, pool)
}

async fn mysql() -> (MySqlDatabase, String, sqlx::MySqlPool) {
    let database = MySqlDatabase::create().await;
    let pool = database.pool().await;
    let url = database.url.clone();
    (database, url, pool)
}

async fn keep(_file: SqliteFile) {}

crash_test!(
    a_relay_killed_mid_drain_on_sqlite_loses_nothing_and_repeats_only_what_it_held,
    sqlite().await,
    keep
);
crash_test!(
    a_relay_killed_mid_drain_on_mysql_loses_nothing_and_repeats_only_what_it_held,
    mysql().await,
    MySqlDatabase::drop_it
);
