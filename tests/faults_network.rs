//! The relay against an unreliable network: its connections killed by the server, and the
//! database cut off entirely for a while (through a TCP proxy the test controls,
//! `support::proxy`, so the shared server itself stays up).

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::{EventContext, Relay, RelayCounts};
use sqlx::PgPool;
use support::proxy::Proxy;
use support::*;
use tokio::sync::oneshot;
use uuid::Uuid;

/// Deliveries per event id.
#[derive(Clone, Default)]
struct Seen(Arc<Mutex<HashMap<Uuid, usize>>>);

impl Seen {
    fn total(&self) -> usize {
        self.0.lock().unwrap().values().sum()
    }
    fn distinct(&self) -> usize {
        self.0.lock().unwrap().len()
    }
}

async fn record(ctx: EventContext<Seen>, _: OrderPlaced) -> Result<(), std::io::Error> {
    *ctx.state().0.lock().unwrap().entry(ctx.event_id()).or_default() += 1;
    Ok(())
}

struct Running {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<RelayCounts, outbox_runtime::Error>>,
}

fn start(relay: Relay<Seen>) -> Running {
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(relay.run_until(async {
        let _ = stopped.await;
    }));
    Running { stop, task }
}

impl Running {
    async fn stop(self) -> RelayCounts {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap()
    }
}

#[sqlx::test(migrations = false)]
async fn a_relay_started_while_the_database_is_away_delivers_once_it_is_back(pool: PgPool) {
    migrated(&pool).await;
    let proxy = Proxy::to_database(&pool).await;
    proxy.cut();
    let seen = Seen::default();
    let relay = Relay::builder(proxy.pool(&pool))
        .state(seen.clone())
        .handler(record)
        .poll_interval(Duration::from_millis(100))
        .build()
        .unwrap();
    let relay = start(relay);
    emit_committed(&pool, &(0..200).map(placed).collect::<Vec<_>>()).await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(seen.total(), 0, "nothing can be delivered while the database is away");

    proxy.restore();
    eventually("all 200 events are published", || async { count_published(&pool).await == 200 })
        .await;
    relay.stop().await;
    assert_eq!((seen.distinct(), seen.total()), (200, 200));
}

#[sqlx::test(migrations = false)]
async fn losing_the_database_mid_run_loses_nothing(pool: PgPool) {
    migrated(&pool).await;
    let proxy = Proxy::to_database(&pool).await;
    let seen = Seen::default();
    let relay = Relay::builder(proxy.pool(&pool))
        .state(seen.clone())
        .handler(record)
        .poll_interval(Duration::from_millis(50))
        .build()
        .unwrap();
    let relay = start(relay);
    emit_committed(&pool, &(0..300).map(placed).collect::<Vec<_>>()).await;
    eventually("delivery is under way", || async { seen.total() > 0 }).await;

    // Three outages of a second each, each cutting every open connection.
    for _ in 0..3 {
        proxy.cut();
        emit_committed(&pool, &(0..100).map(placed).collect::<Vec<_>>()).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        proxy.restore();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    eventually("all 600 events are published", || async { count_published(&pool).await == 600 })
        .await;
    let counts = relay.stop().await;
    assert_eq!(seen.distinct(), 600, "every event was delivered");
    // A delivery whose acknowledgement was cut off is delivered again once its lease expires:
    // at least once, so repeats are allowed, but only for acknowledgements the outages hit.
    println!("deliveries {} for 600 events; counts {counts:?}", seen.total());
    assert!(seen.total() - 600 <= counts.lost_leases as usize + 100);
}

#[sqlx::test(migrations = false)]
async fn killed_connections_reconnect_and_wake_ups_keep_working(pool: PgPool) {
    migrated(&pool).await;
    let seen = Seen::default();
    let relay = Relay::builder(pool.clone())
        .state(seen.clone())
        .handler(record)
        .poll_interval(Duration::from_secs(3600))
        .build()
        .unwrap();
    let relay = start(relay);

    let kill_relay_connections = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name LIKE 'outbox-relay%'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let mut total = 0;
    for round in 0..5 {
        emit_committed(&pool, &(0..50).map(placed).collect::<Vec<_>>()).await;
        total += 50;
        tokio::time::sleep(Duration::from_millis(100)).await;
        let killed = kill_relay_connections().await;
        println!("round {round}: killed {killed} relay connections");
        eventually("the round's events are delivered", || async {
            count_published(&pool).await == total
        })
        .await;
    }
    // Only NOTIFY can wake the relay now (the poll interval is an hour): the LISTEN
    // connection came back.
    eventually("the relay LISTENs again", || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(*) FROM pg_stat_activity \
             WHERE datname = current_database() AND application_name = 'outbox-relay-listen' \
               AND query ILIKE 'LISTEN%'",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
            == 1
    })
    .await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let before = seen.distinct();
    emit_committed(&pool, &[placed(1)]).await;
    eventually("a new event wakes the relay", || async { seen.distinct() == before + 1 }).await;
    relay.stop().await;
    assert_eq!(seen.distinct(), total as usize + 1);
}
