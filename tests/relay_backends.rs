//! The relay on SQLite and on MariaDB (MySQL's statements), against the real databases:
//! delivery once each, order per aggregate, retries and dead letters, payloads that do not
//! decode, a relay that dies holding leases, two relays on one database, retention, what
//! `build` refuses, and the plans of every statement whatever the statistics. The same suite
//! runs on both (the macro below); the plans, which each backend explains its own way, follow.

mod support;

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::forward::Forward;
use outbox_runtime::{
    emit, Backoff, BuildError, EventContext, LeaseMode, OutboxEvent, Reject, Relay, RelayCounts,
    TransactionContext,
};
use serde::{Deserialize, Serialize};
use support::backends::{MySqlDatabase, SqliteFile};
use support::redis::{Entry, Streams};
use support::{placed, OrderPlaced};
use tokio::sync::{oneshot, Notify};
use uuid::Uuid;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "account", event_type = "account.posted", ordered)]
struct Posted {
    #[outbox(id)]
    account: String,
    n: i64,
}

/// What handlers saw, and a wake-up for each delivery.
#[derive(Clone, Default)]
struct Seen {
    deliveries: Arc<Mutex<Vec<Uuid>>>,
    changed: Arc<Notify>,
}

impl Seen {
    fn record(&self, event_id: Uuid) {
        self.deliveries.lock().unwrap().push(event_id);
        self.changed.notify_waiters();
    }

    /// A handler of `E` that records each delivery and succeeds.
    fn handler<E: OutboxEvent + Send + 'static>(
        &self,
    ) -> impl Fn(EventContext, E) -> std::future::Ready<Result<(), std::io::Error>>
           + Clone
           + Send
           + Sync
           + 'static {
        let seen = self.clone();
        move |ctx: EventContext, _: E| {
            seen.record(ctx.event_id());
            std::future::ready(Ok(()))
        }
    }

    fn ids(&self) -> Vec<Uuid> {
        self.deliveries.lock().unwrap().clone()
    }

    /// Waits until `done` holds of the deliveries (at most 30 s).
    async fn until(&self, done: impl Fn(&[Uuid]) -> bool) {
        let waiting = async {
            loop {
                let changed = self.changed.notified();
                if done(&self.ids()) {
                    return;
                }
                let _ = tokio::time::timeout(Duration::from_millis(50), changed).await;
            }
        };
        tokio::time::timeout(Duration::from_secs(30), waiting)
            .await
            .unwrap_or_else(|_| panic!("deliveries so far: {:?}", self.ids()));
    }
}

/// Runs `relay` until `until` completes, then shuts it down; returns its counts.
async fn run_until<S: Clone + Send + Sync + 'static>(
    relay: Relay<S>,
    until: impl Future<Output = ()>,
) -> RelayCounts {
    let (stop, stopped) = oneshot::channel::<()>();
    let running = tokio::spawn(relay.run_until(async {
        let _ = stopped.await;
    }));
    until.await;
    let _ = stop.send(());
    running.await.unwrap().unwrap()
}

/// Polls `check` every 20 ms until it holds (at most 30 s).
async fn eventually<F: Future<Output = bool>>(what: &str, check: impl Fn() -> F) {
    let polling = async {
        while !check().await {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(30), polling)
        .await
        .unwrap_or_else(|_| panic!("never: {what}"));
}

fn quick_retries() -> Backoff {
    Backoff { base: Duration::from_millis(10), cap: Duration::from_millis(20), jitter: false }
}

/// The suite, for one backend: `$setup` makes `(guard, pool)` for a fresh database, `$teardown`
/// takes the guard back; `$name` is the backend's name in `build`'s errors.
macro_rules! backend_suite {
    ($backend:ident, $pool:ty, $name:literal, $setup:expr, $teardown:expr) => {
        mod $backend {
            use super::*;

            type Pool = $pool;

        /// Emits each event in a transaction of its own; returns their ids.
        async fn emit_each<E: OutboxEvent>(pool: &Pool, events: &[E]) -> Vec<Uuid> {
            let mut ids = Vec::new();
            for event in events {
                let mut tx = pool.begin().await.unwrap();
                ids.push(emit(&mut tx, event).await.unwrap());
                tx.commit().await.unwrap();
            }
            ids
        }

        /// `(attempts, expired_leases, last_error, published, dead)` of an event's row.
        async fn row(pool: &Pool, event_id: Uuid) -> (i32, i32, Option<String>, bool, bool) {
            let (attempts, expired_leases, last_error, published, dead): (i32, i32, Option<String>, i64, i64) =
                sqlx::query_as(
                    "SELECT attempts, expired_leases, CAST(last_error AS CHAR), \
                            published_at IS NOT NULL, dead_at IS NOT NULL \
                     FROM outbox_events WHERE event_id = ?",
                )
                .bind(event_id)
                .fetch_one(pool)
                .await
                .unwrap();
            (attempts, expired_leases, last_error, published != 0, dead != 0)
        }

        /// How many events are not published.
        async fn unpublished(pool: &Pool) -> i64 {
            sqlx::query_scalar("SELECT count(*) FROM outbox_events WHERE published_at IS NULL")
                .fetch_one(pool)
                .await
                .unwrap()
        }

        /// The ids of the rows left, in `seq` order.
        async fn event_ids(pool: &Pool) -> Vec<Uuid> {
            sqlx::query_scalar("SELECT event_id FROM outbox_events ORDER BY seq")
                .fetch_all(pool)
                .await
                .unwrap()
        }

        /// Sets a column of an event's row to an SQL value.
        async fn set(pool: &Pool, event_id: Uuid, assignment: &'static str) {
            let sql = match assignment {
                "payload" => "UPDATE outbox_events SET payload = '{\"order_id\": 5}' WHERE event_id = ?",
                "published long ago" => {
                    "UPDATE outbox_events SET published_at = '2000-01-01 00:00:00.000' WHERE event_id = ?"
                }
                "dead long ago" => {
                    "UPDATE outbox_events SET dead_at = '2000-01-01 00:00:00.000' WHERE event_id = ?"
                }
                other => panic!("no assignment {other}"),
            };
            sqlx::query(sql).bind(event_id).execute(pool).await.unwrap();
        }

        #[tokio::test]
        async fn delivers_each_event_once_and_marks_it_published() {
            let (guard, pool) = $setup;
            let events: Vec<OrderPlaced> = (0..50).map(placed).collect();
            let emitted = emit_each(&pool, &events).await;
            let seen = Seen::default();
            let handler = seen.handler::<OrderPlaced>();
            let relay = Relay::builder(pool.clone()).handler(handler).build().unwrap();
            let counts = run_until(relay, seen.until(|ids| ids.len() >= 50)).await;

            let delivered = seen.ids();
            assert_eq!(delivered.len(), 50, "each event once");
            assert_eq!(delivered.iter().collect::<HashSet<_>>(), emitted.iter().collect());
            assert_eq!(counts.delivered, 50);
            assert_eq!(unpublished(&pool).await, 0);
            let stats = outbox_runtime::stats(&pool).await.unwrap();
            assert_eq!((stats.pending, stats.dead, stats.oldest_pending_age), (0, 0, None));
            pool.close().await;
            $teardown(guard).await;
        }

        #[tokio::test]
        async fn ordered_events_of_an_aggregate_arrive_in_order_one_at_a_time() {
            let (guard, pool) = $setup;
            let accounts = ["a", "b", "c"];
            let events: Vec<Posted> = (0..10)
                .flat_map(|n| accounts.map(|account| Posted { account: account.to_owned(), n }))
                .collect();
            emit_each(&pool, &events).await;
            let order: Arc<Mutex<HashMap<String, Vec<i64>>>> = Arc::default();
            let in_flight: Arc<Mutex<HashSet<String>>> = Arc::default();
            let seen = Seen::default();
            let handler = {
                let (order, in_flight, seen) = (order.clone(), in_flight.clone(), seen.clone());
                move |ctx: EventContext, event: Posted| {
                    let (order, in_flight, seen) = (order.clone(), in_flight.clone(), seen.clone());
                    async move {
                        let alone = in_flight.lock().unwrap().insert(event.account.clone());
                        assert!(alone, "two events of account {} at once", event.account);
                        tokio::time::sleep(Duration::from_millis(2)).await;
                        order.lock().unwrap().entry(event.account.clone()).or_default().push(event.n);
                        in_flight.lock().unwrap().remove(&event.account);
                        seen.record(ctx.event_id());
                        Ok::<(), std::io::Error>(())
                    }
                }
            };
            let relay = Relay::builder(pool.clone()).handler(handler).concurrency(8).build().unwrap();
            let counts = run_until(relay, seen.until(|ids| ids.len() >= 30)).await;

            assert_eq!(counts.delivered, 30);
            let order = order.lock().unwrap().clone();
            for account in accounts {
                assert_eq!(order[account], (0..10).collect::<Vec<_>>(), "account {account}");
            }
            pool.close().await;
            $teardown(guard).await;
        }

        #[tokio::test]
        async fn a_failing_handler_retries_then_its_event_dies_with_the_error() {
            let (guard, pool) = $setup;
            let failing = emit_each(&pool, &[placed(1)]).await[0];
            let fine = emit_each(&pool, &[Posted { account: "a".into(), n: 1 }]).await[0];
            let tries = Seen::default();
            let fails = {
                let tries = tries.clone();
                move |ctx: EventContext, _: OrderPlaced| {
                    let tries = tries.clone();
                    async move {
                        tries.record(ctx.event_id());
                        Err::<(), _>(std::io::Error::other(format!("boom #{}", ctx.attempts() + 1)))
                    }
                }
            };
            let seen = Seen::default();
            let works = seen.handler::<Posted>();
            let relay = Relay::builder(pool.clone())
                .handler(fails)
                .handler(works)
                .max_attempts(3)
                .backoff(quick_retries())
                .build()
                .unwrap();
            let dead = async {
                eventually("the failing event dead", || async { row(&pool, failing).await.4 }).await;
                seen.until(|ids| !ids.is_empty()).await;
            };
            let counts = run_until(relay, dead).await;

            assert_eq!(tries.ids(), vec![failing; 3], "three attempts, then no more");
            let (attempts, _, last_error, published, dead) = row(&pool, failing).await;
            assert_eq!((attempts, published, dead), (3, false, true));
            assert_eq!(last_error.as_deref(), Some("boom #3"));
            assert_eq!(seen.ids(), vec![fine], "the other type is not held back");
            assert_eq!((counts.failed, counts.dead, counts.delivered), (3, 1, 1));
            let stats = outbox_runtime::stats(&pool).await.unwrap();
            assert_eq!((stats.pending, stats.dead), (0, 1));
            pool.close().await;
            $teardown(guard).await;
        }

        #[tokio::test]
        async fn a_rejected_event_dies_at_its_first_attempt() {
            let (guard, pool) = $setup;
            let rejected = emit_each(&pool, &[placed(1)]).await[0];
            let handler = |_: EventContext, _: OrderPlaced| async {
                Err::<(), _>(Reject::new(std::io::Error::other("order 1 is not ours")))
            };
            let relay = Relay::builder(pool.clone()).handler(handler).max_attempts(5).build().unwrap();
            let counts = run_until(relay, async {
                eventually("the rejected event dead", || async { row(&pool, rejected).await.4 }).await;
            })
            .await;
            let (attempts, _, last_error, _, dead) = row(&pool, rejected).await;
            assert_eq!((attempts, dead), (1, true));
            assert!(last_error.unwrap().contains("order 1 is not ours"));
            assert_eq!(counts.rejected, 1);
            pool.close().await;
            $teardown(guard).await;
        }

        #[tokio::test]
        async fn a_payload_that_does_not_decode_fails_without_calling_the_handler() {
            let (guard, pool) = $setup;
            let ids = emit_each(&pool, &[placed(1), placed(2)]).await;
            // Written by other means than `emit`: valid JSON, not an `OrderPlaced`.
            set(&pool, ids[0], "payload").await;
            let seen = Seen::default();
            let handler = seen.handler::<OrderPlaced>();
            let relay = Relay::builder(pool.clone())
                .handler(handler)
                .max_attempts(2)
                .backoff(quick_retries())
                .build()
                .unwrap();
            run_until(relay, async {
                eventually("the bad payload dead", || async { row(&pool, ids[0]).await.4 }).await;
                seen.until(|delivered| !delivered.is_empty()).await;
            })
            .await;
            assert_eq!(seen.ids(), vec![ids[1]], "the handler never saw the bad payload");
            let (attempts, _, last_error, _, _) = row(&pool, ids[0]).await;
            assert_eq!(attempts, 2);
            let last_error = last_error.unwrap();
            assert!(last_error.contains("order_id"), "{last_error}");
            pool.close().await;
            $teardown(guard).await;
        }

        #[tokio::test]
        async fn a_relay_that_dies_holding_a_lease_leaves_the_event_to_the_next_after_the_lease() {
            let (guard, pool) = $setup;
            let event_id = emit_each(&pool, &[placed(1)]).await[0];
            let started = Seen::default();
            let hangs = {
                let started = started.clone();
                move |ctx: EventContext, _: OrderPlaced| {
                    let started = started.clone();
                    async move {
                        started.record(ctx.event_id());
                        std::future::pending::<Result<(), std::io::Error>>().await
                    }
                }
            };
            let lease = Duration::from_millis(500);
            let first = Relay::builder(pool.clone()).handler(hangs).lease_timeout(lease).build().unwrap();
            let dying = tokio::spawn(first.run_until(std::future::pending()));
            started.until(|ids| !ids.is_empty()).await;
            // Killed mid-delivery: nothing of it acknowledges or renews the lease again.
            dying.abort();
            let _ = dying.await;

            let seen: Arc<Mutex<Vec<(Uuid, u32)>>> = Arc::default();
            let delivered = Seen::default();
            let handler = {
                let (seen, delivered) = (seen.clone(), delivered.clone());
                move |ctx: EventContext, _: OrderPlaced| {
                    let (seen, delivered) = (seen.clone(), delivered.clone());
                    async move {
                        seen.lock().unwrap().push((ctx.event_id(), ctx.expired_leases()));
                        delivered.record(ctx.event_id());
                        Ok::<(), std::io::Error>(())
                    }
                }
            };
            let second =
                Relay::builder(pool.clone()).handler(handler).lease_timeout(lease).build().unwrap();
            run_until(second, delivered.until(|ids| !ids.is_empty())).await;
            assert_eq!(*seen.lock().unwrap(), vec![(event_id, 1)], "delivered again, its expiry counted");
            let (attempts, expired_leases, _, published, _) = row(&pool, event_id).await;
            assert_eq!((attempts, expired_leases, published), (0, 1, true));
            pool.close().await;
            $teardown(guard).await;
        }

        #[tokio::test]
        async fn an_event_whose_leases_expire_too_often_dies() {
            let (guard, pool) = $setup;
            let event_id = emit_each(&pool, &[placed(1)]).await[0];
            // A lease taken by a relay that died, as its statement leaves it: the lease is over.
            sqlx::query(
                "UPDATE outbox_events SET lease_token = ?, available_at = '2000-01-01 00:00:00.000' \
                 WHERE event_id = ?",
            )
            .bind(Uuid::new_v4())
            .bind(event_id)
            .execute(&pool)
            .await
            .unwrap();
            let calls = Seen::default();
            let handler = {
                let calls = calls.clone();
                move |ctx: EventContext, _: OrderPlaced| {
                    let calls = calls.clone();
                    async move {
                        calls.record(ctx.event_id());
                        Ok::<(), std::io::Error>(())
                    }
                }
            };
            let relay =
                Relay::builder(pool.clone()).handler(handler).max_expired_leases(1).build().unwrap();
            run_until(relay, async {
                eventually("the event dead", || async { row(&pool, event_id).await.4 }).await;
            })
            .await;
            assert!(calls.ids().is_empty(), "a dead event is not delivered");
            let (_, expired_leases, last_error, published, _) = row(&pool, event_id).await;
            assert_eq!((expired_leases, published), (1, false));
            assert_eq!(
                last_error.as_deref(),
                Some("its lease expired 1 times before a relay acknowledged it")
            );
            pool.close().await;
            $teardown(guard).await;
        }

        #[tokio::test]
        async fn two_relays_on_one_database_deliver_each_event_once() {
            let (guard, pool) = $setup;
            let events: Vec<OrderPlaced> = (0..200).map(placed).collect();
            let emitted = emit_each(&pool, &events).await;
            let seen = Seen::default();
            let relays = [guard.pool().await, guard.pool().await].map(|pool| {
                let handler = seen.handler::<OrderPlaced>();
                Relay::builder(pool).handler(handler).concurrency(4).batch_size(10).build().unwrap()
            });
            let [first, second] = relays;
            let all = || seen.until(|ids| ids.len() >= 200);
            let (a, b) = tokio::join!(run_until(first, all()), run_until(second, all()));
            let delivered = seen.ids();
            assert_eq!(delivered.len(), 200, "no event twice");
            assert_eq!(delivered.iter().collect::<HashSet<_>>(), emitted.iter().collect());
            assert_eq!(a.delivered + b.delivered, 200);
            pool.close().await;
            $teardown(guard).await;
        }

        #[tokio::test]
        async fn retention_purges_published_events_and_keeps_the_rest() {
            let (guard, pool) = $setup;
            let ids = emit_each(&pool, &[placed(1), placed(2), placed(3)]).await;
            set(&pool, ids[0], "published long ago").await;
            set(&pool, ids[1], "dead long ago").await;
            let handler = |_: EventContext, _: OrderPlaced| async { Ok::<(), std::io::Error>(()) };
            let relay = Relay::builder(pool.clone())
                .handler(handler)
                .retention(Duration::from_secs(86_400))
                .build()
                .unwrap();
            run_until(relay, async {
                eventually("the old published event purged", || async {
                    !event_ids(&pool).await.contains(&ids[0])
                })
                .await;
            })
            .await;
            assert_eq!(event_ids(&pool).await, ids[1..], "the dead event and the one delivered just now stay");
            pool.close().await;
            $teardown(guard).await;
        }

        #[tokio::test]
        async fn forwarding_sends_each_event_once_and_an_aggregates_in_order() {
            let (guard, pool) = $setup;
            let streams = Streams::create().await;
            let placed_ids = emit_each(&pool, &(0..5).map(placed).collect::<Vec<_>>()).await;
            let posted: Vec<Posted> =
                (0..10).map(|n| Posted { account: "a".to_owned(), n }).collect();
            let posted_ids = emit_each(&pool, &posted).await;
            let destination = format!("{}.{{aggregate_type}}.{{event_type}}", streams.prefix);
            let forward = Forward::to(streams.sink().await).destination(&destination);
            let relay = Relay::builder(pool.clone()).forward(forward).build().unwrap();
            let counts = run_until(relay, async {
                eventually("every event published", || async { unpublished(&pool).await == 0 })
                    .await;
            })
            .await;
            assert_eq!(counts.delivered, 15);
            let ids = |entries: Vec<Entry>| -> Vec<Uuid> {
                let id = |entry: &Entry| entry.1.iter().find(|(name, _)| name == "id").unwrap().1.parse().unwrap();
                entries.iter().map(id).collect()
            };
            let key = |kind: &str| format!("{}.{kind}", streams.prefix);
            let mut forwarded = ids(streams.entries(&key("order.order.placed")).await);
            forwarded.sort();
            let mut emitted = placed_ids.clone();
            emitted.sort();
            assert_eq!(forwarded, emitted, "each event once");
            let forwarded = ids(streams.entries(&key("account.account.posted")).await);
            assert_eq!(forwarded, posted_ids, "an aggregate's ordered events in emit order");
            pool.close().await;
            $teardown(guard).await;
        }

        #[tokio::test]
        async fn build_refuses_what_the_relay_does_not_do_here_yet() {
            let (guard, pool) = $setup;
            let plain = |_: EventContext, _: OrderPlaced| async { Ok::<(), std::io::Error>(()) };
            let held =
                Relay::builder(pool.clone()).handler(plain).lease_mode(LeaseMode::HeldTransaction).build();
            let unsupported = |what| BuildError::Unsupported { backend: $name, what };
            assert_eq!(held.err(), Some(unsupported("`LeaseMode::HeldTransaction`")));
            let subscribed = Relay::builder(pool.clone()).subscriber("receipts", plain).build();
            assert_eq!(subscribed.err(), Some(unsupported("subscribers")));
            let transactional =
                |_: TransactionContext, _: OrderPlaced| async { Ok::<(), std::io::Error>(()) };
            let error = Relay::builder(pool.clone()).handler(transactional).build().err().unwrap();
            assert_eq!(
                error.to_string(),
                format!(
                    "a handler that writes in the acknowledgement's transaction (`TransactionContext`) \
                     is not available on {} yet: use PostgreSQL for it (the README's table of \
                     guarantees per database says what each one gives)",
                    $name
                )
            );
            pool.close().await;
            $teardown(guard).await;
        }
        }
    };
}

async fn sqlite() -> (SqliteFile, sqlx::SqlitePool) {
    let file = SqliteFile::new();
    let pool = file.pool().await;
    outbox_runtime::migrate(&pool).await.unwrap();
    (file, pool)
}

async fn mysql() -> (MySqlDatabase, sqlx::MySqlPool) {
    let database = MySqlDatabase::create().await;
    let pool = database.pool().await;
    outbox_runtime::migrate(&pool).await.unwrap();
    (database, pool)
}

async fn keep(_file: SqliteFile) {}

backend_suite!(sqlite, sqlx::SqlitePool, "SQLite", sqlite().await, keep);
backend_suite!(mysql, sqlx::MySqlPool, "MySQL", mysql().await, MySqlDatabase::drop_it);

/// Every statement of the relay on SQLite, planned with the statistics of an empty outbox and
/// again once a backlog is analyzed: each reaches `outbox_events` by an index (or its rowid),
/// never by a scan of the table, and the lease's candidates by the pending index.
#[tokio::test]
async fn every_relay_statement_on_sqlite_is_planned_on_an_index_whatever_the_statistics() {
    use outbox_runtime::__private::test_hooks::sqlite as statements;
    let (_file, pool) = sqlite().await;
    sqlx::query("ANALYZE").execute(&pool).await.unwrap();
    let check = |when: &'static str| {
        let pool = pool.clone();
        async move {
            for (name, sql) in statements::ALL {
                let plan: Vec<(i64, i64, i64, String)> =
                    sqlx::query_as(sqlx::static_sql(format!("EXPLAIN QUERY PLAN {sql}")))
                        .fetch_all(&pool)
                        .await
                        .unwrap_or_else(|e| panic!("{name}: {e}"));
                let details: Vec<&str> = plan.iter().map(|step| step.3.as_str()).collect();
                for detail in &details {
                    let table = detail.strip_prefix("SCAN ").and_then(|t| t.split(' ').next());
                    let ours = table.is_some_and(|t| ["outbox_events", "e", "r", "p"].contains(&t));
                    let scans_table = ours && !detail.contains("INDEX");
                    assert!(!scans_table, "{name} ({when}) scans the table: {details:?}");
                }
                let expected = match *name {
                    "lease candidates" => "SEARCH r USING INDEX outbox_events_pending_by_type",
                    "publish" | "publish delete" | "fail" | "release" | "snooze" | "renew"
                    | "still leased" => "SEARCH e USING INDEX sqlite_autoindex_outbox_events_1",
                    "lease" | "lease expired" => "SEARCH outbox_events USING INTEGER PRIMARY KEY",
                    "purge published" => {
                        "SEARCH outbox_events USING COVERING INDEX outbox_events_published"
                    }
                    _ => "",
                };
                let found = details.iter().any(|d| d.starts_with(expected));
                assert!(found, "{name} ({when}) does not {expected}: {details:?}");
            }
        }
    };
    check("empty statistics").await;
    let backlog: Vec<OrderPlaced> = (0..500).map(placed).collect();
    let mut tx = pool.begin().await.unwrap();
    outbox_runtime::emit_all(&mut tx, &backlog).await.unwrap();
    tx.commit().await.unwrap();
    sqlx::query("UPDATE outbox_events SET published_at = created_at WHERE seq % 2 = 0")
        .execute(&pool)
        .await
        .unwrap();
    sqlx::query("ANALYZE").execute(&pool).await.unwrap();
    check("a backlog analyzed").await;
}

/// Every statement of the relay on MariaDB, explained with the statistics of an empty outbox
/// (kept: no automatic recalculation) and again once a backlog is analyzed: each reaches
/// `outbox_events` through the index it names, never by a scan of the table, and a batch's
/// rows by their keys.
#[tokio::test]
async fn every_relay_statement_on_mysql_is_planned_on_an_index_whatever_the_statistics() {
    use outbox_runtime::__private::test_hooks::mysql as statements;
    let (database, pool) = mysql().await;
    sqlx::query("ALTER TABLE outbox_events STATS_AUTO_RECALC = 0").execute(&pool).await.unwrap();
    sqlx::query("ANALYZE TABLE outbox_events").execute(&pool).await.unwrap();
    let backlog: Vec<OrderPlaced> = (0..2_000).map(placed).collect();
    let mut tx = pool.begin().await.unwrap();
    outbox_runtime::emit_all(&mut tx, &backlog).await.unwrap();
    tx.commit().await.unwrap();
    sqlx::query("UPDATE outbox_events SET published_at = created_at WHERE seq % 2 = 0")
        .execute(&pool)
        .await
        .unwrap();
    // The statistics of the empty table, as a restarted server reads them back.
    sqlx::query("FLUSH TABLES outbox_events").execute(&pool).await.unwrap();
    let pairs = format!(r#"[["{}", "{}"]]"#, Uuid::nil().simple(), Uuid::nil().simple());
    for analyzed in [false, true] {
        if analyzed {
            sqlx::query("ANALYZE TABLE outbox_events").execute(&pool).await.unwrap();
        }
        for (name, sql) in statements::ALL {
            let explain = format!("EXPLAIN {sql}");
            let query = sqlx::query(sqlx::static_sql(explain));
            // Each statement's values, as the relay binds them.
            let query = match *name {
                "head" => query.bind("order").bind("order.placed").bind("").bind(1).bind(false),
                "lease candidates" => {
                    query.bind("order").bind("order.placed").bind("").bind(1).bind(false).bind(10)
                }
                "next pending type" => query.bind("").bind("").bind(""),
                "lease" => query.bind("[[1, 0, false, null]]").bind(Uuid::nil()).bind(1_000),
                "fenced" | "still leased" => query.bind(&pairs),
                "renew" => query.bind("[[1]]").bind(1_000),
                "fail" => query.bind(r#"[[1, 1, false, "boom", 1000]]"#),
                "snooze" => query.bind("[[1, 1000]]"),
                "leased" | "publish" | "publish delete" | "release" => query.bind("[[1]]"),
                "purge published" => query.bind(1_000).bind(10),
                _ => query,
            };
            let plan = query.fetch_all(&pool).await.unwrap_or_else(|e| panic!("{name}: {e}"));
            let steps: Vec<(String, String, Option<String>)> = plan
                .iter()
                .map(|row| {
                    let text = |column: &str| {
                        let value: Option<String> = sqlx::Row::try_get(row, column).ok().flatten();
                        value.unwrap_or_default()
                    };
                    (text("table"), text("type"), sqlx::Row::try_get(row, "key").ok().flatten())
                })
                .collect();
            for (table, access, key) in &steps {
                let ours = ["e", "r", "p", "outbox_events"].contains(&table.as_str());
                assert!(
                    !ours || access != "ALL" && key.is_some(),
                    "{name} (analyzed {analyzed}) scans {table}: {steps:?}"
                );
            }
            let expected = match *name {
                "head" | "lease candidates" => Some(("r", "outbox_events_pending_by_type")),
                "fenced" | "still leased" => Some(("e", "outbox_events_event_id")),
                "purge published" => Some(("outbox_events", "outbox_events_published")),
                "lease" | "leased" | "publish" | "publish delete" | "fail" | "release"
                | "snooze" | "renew" => Some(("e", "PRIMARY")),
                _ => None,
            };
            if let Some((table, index)) = expected {
                let found =
                    steps.iter().any(|(t, _, key)| t == table && key.as_deref() == Some(index));
                assert!(found, "{name} (analyzed {analyzed}) does not use {index}: {steps:?}");
            }
        }
    }
    pool.close().await;
    database.drop_it().await;
}
