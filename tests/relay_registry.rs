//! The relays' entries in `outbox.relays`, as `outbox status` lists them: written while a relay
//! runs, refreshed by its heartbeat, removed when it stops; a relay that dies leaves an entry
//! that turns silent.

mod support;

use std::sync::Arc;
use std::time::Duration;

use outbox_runtime::forward::Forward;
use outbox_runtime::relays::{self, RelayStatus, SILENT_AFTER};
use outbox_runtime::{EventContext, LeaseMode, Relay};
use sqlx::PgPool;
use support::*;
use tokio::sync::Semaphore;

async fn ok(_: EventContext, _: OrderPlaced) -> Result<(), std::io::Error> {
    Ok(())
}

/// Waits for a permit, so its rows stay held until the test adds permits.
async fn gated(ctx: EventContext<Arc<Semaphore>>, _: OrderPlaced) -> Result<(), std::io::Error> {
    ctx.state().acquire().await.unwrap().forget();
    Ok(())
}

async fn only_entry(pool: &PgPool) -> Option<RelayStatus> {
    let mut entries = relays::relays(pool).await.unwrap();
    assert!(entries.len() <= 1, "{entries:?}");
    entries.pop()
}

/// Sets every entry's heartbeat `ago` back.
async fn age_heartbeats(pool: &PgPool, ago: Duration) {
    sqlx::query("UPDATE outbox.relays SET heartbeat_at = now() - $1::float8 * interval '1 second'")
        .bind(ago.as_secs_f64())
        .execute(pool)
        .await
        .unwrap();
}

#[sqlx::test(migrations = false)]
async fn a_running_relay_is_listed_with_what_it_delivered_and_withdraws_when_it_stops(
    pool: PgPool,
) {
    migrated(&pool).await;
    let relay = Running::start(fast(Relay::builder(pool.clone())).handler(ok));
    eventually("the relay's entry is written", || async { only_entry(&pool).await.is_some() })
        .await;
    let entry = only_entry(&pool).await.unwrap();
    assert_eq!(entry.pid, std::process::id());
    assert_eq!(entry.host, gethostname::gethostname().to_string_lossy());
    assert_eq!(entry.version, env!("CARGO_PKG_VERSION"), "the runtime's version, as this one's");
    assert_eq!(entry.lease_mode, "written");
    assert_eq!(entry.handles, ["order/order.placed"]);
    assert_eq!(entry.forwards, None);
    assert!(!entry.silent && entry.since_heartbeat < SILENT_AFTER, "{entry:?}");

    emit_committed(&pool, &[placed(1), placed(2), placed(3)]).await;
    eventually("the next heartbeat counts the three delivered", || async {
        only_entry(&pool).await.is_some_and(|entry| entry.delivered == 3 && entry.held == 0)
    })
    .await;
    let counts = relay.stop().await;
    assert_eq!(counts.delivered, 3);
    assert_eq!(only_entry(&pool).await, None, "a relay that stopped is not listed");
}

#[sqlx::test(migrations = false)]
async fn a_held_relay_counts_the_rows_its_batches_hold(pool: PgPool) {
    migrated(&pool).await;
    let gate = Arc::new(Semaphore::new(0));
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(gate.clone())
            .lease_mode(LeaseMode::HeldTransaction)
            .handler(gated),
    );
    emit_committed(&pool, &[placed(1), placed(2), placed(3)]).await;
    eventually("the heartbeat counts three rows held", || async {
        only_entry(&pool).await.is_some_and(|entry| entry.held == 3)
    })
    .await;
    assert_eq!(only_entry(&pool).await.unwrap().lease_mode, "held_transaction");
    gate.add_permits(3);
    eventually("and none once they are delivered", || async {
        only_entry(&pool).await.is_some_and(|entry| entry.held == 0 && entry.delivered == 3)
    })
    .await;
    relay.stop().await;
    assert_eq!(only_entry(&pool).await, None);
}

#[sqlx::test(migrations = false)]
async fn a_relay_that_died_turns_silent_and_is_forgotten_after_a_day(pool: PgPool) {
    migrated(&pool).await;
    let relay = Relay::builder(pool.clone()).handler(ok).build().unwrap();
    // Dropping the running relay's future stands for a killed process: nothing withdraws it.
    let running = tokio::spawn(relay.run_until(std::future::pending()));
    eventually("the relay's entry is written", || async { only_entry(&pool).await.is_some() })
        .await;
    running.abort();
    let _ = running.await;
    let died = only_entry(&pool).await.expect("a relay that died stays listed");

    age_heartbeats(&pool, SILENT_AFTER + Duration::from_secs(1)).await;
    let silent = only_entry(&pool).await.unwrap();
    assert_eq!(silent.relay_id, died.relay_id);
    assert!(silent.silent && silent.since_heartbeat > SILENT_AFTER, "{silent:?}");

    // A day later, the next relay to start removes it, and lists itself.
    age_heartbeats(&pool, Duration::from_secs(24 * 3600 + 60)).await;
    let next = Running::start(fast(Relay::builder(pool.clone())).handler(ok));
    eventually("only the new relay is listed", || async {
        only_entry(&pool).await.is_some_and(|entry| entry.relay_id != died.relay_id)
    })
    .await;
    next.stop().await;
}

#[sqlx::test(migrations = false)]
async fn each_relay_says_what_it_handles_and_forwards(pool: PgPool) {
    migrated(&pool).await;
    let stream = support::nats::Stream::create(Duration::from_secs(120)).await;
    let destination = format!("{}.{{event_type}}", stream.prefix);
    let every_other = Forward::to(stream.sink()).destination(&destination);
    let handles_and_forwards =
        Running::start(fast(Relay::builder(pool.clone())).handler(ok).forward(every_other));
    let only_users =
        Forward::to(stream.sink()).destination(&destination).only([("user", "user.created")]);
    let forwards_only = Running::start(fast(Relay::builder(pool.clone())).forward(only_users));

    let listed = || async {
        let mut entries = relays::relays(&pool).await.unwrap();
        entries.sort_by_key(|entry| entry.handles.len());
        entries.into_iter().map(|e| (e.handles, e.forwards)).collect::<Vec<_>>()
    };
    eventually("both relays are listed", || async { listed().await.len() == 2 }).await;
    assert_eq!(
        listed().await,
        [
            (vec![], Some(vec!["user/user.created".to_owned()])),
            (vec!["order/order.placed".to_owned()], Some(vec!["*".to_owned()])),
        ]
    );
    forwards_only.stop().await;
    handles_and_forwards.stop().await;
    assert!(relays::relays(&pool).await.unwrap().is_empty());
}

/// What the console charts: every relay adds its deliveries to the minute's row of
/// `outbox.activity`, the first heartbeat of a minute stores a reading of the outbox, and rows
/// older than a day go.
#[sqlx::test(migrations = false)]
async fn relays_record_their_deliveries_and_a_reading_by_the_minute(pool: PgPool) {
    migrated(&pool).await;
    dead_row(&pool, "order", "order.placed", "refused").await;
    sqlx::query(
        "INSERT INTO outbox.activity (minute, delivered, read) \
         VALUES (date_trunc('minute', now()) - interval '25 hours', 7, true)",
    )
    .execute(&pool)
    .await
    .unwrap();
    let relays = [
        Running::start(fast(Relay::builder(pool.clone())).handler(ok)),
        Running::start(fast(Relay::builder(pool.clone())).handler(ok)),
    ];
    emit_committed(&pool, &[placed(1), placed(2), placed(3), placed(4), placed(5)]).await;
    eventually("both relays' deliveries are recorded, each minute read", || async {
        let (delivered, unread, old): (Option<i64>, i64, i64) = sqlx::query_as(
            "SELECT sum(delivered) FILTER (WHERE minute > now() - interval '1 hour')::int8, \
                    count(*) FILTER (WHERE NOT read), \
                    count(*) FILTER (WHERE minute < now() - interval '1 day') \
             FROM outbox.activity",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        delivered == Some(5) && unread == 0 && old == 0
    })
    .await;
    let dead: Vec<Option<i64>> =
        sqlx::query_scalar("SELECT dead FROM outbox.activity").fetch_all(&pool).await.unwrap();
    assert!(
        dead.iter().all(|dead| *dead == Some(1)),
        "each reading counts the dead letter: {dead:?}"
    );
    for relay in relays {
        relay.stop().await;
    }
}
