//! Replaying published events: the rows of a type published in a time range are delivered
//! again, with their ids, in their aggregate's order, counted before acting.

mod support;

use std::time::Duration;

use chrono::Utc;
use outbox_runtime::{replay, Relay};
use sqlx::PgPool;
use support::accounts::{log_noted, log_posted, noted, posted, Log};
use support::*;
use uuid::Uuid;

/// Marks `id` published `hours` ago, as a relay would have.
async fn published_hours_ago(pool: &PgPool, id: Uuid, hours: i32) {
    sqlx::query(
        "UPDATE outbox.events SET published_at = now() - $2 * interval '1 hour', attempts = 2 \
         WHERE event_id = $1",
    )
    .bind(id)
    .bind(hours)
    .execute(pool)
    .await
    .unwrap();
}

#[sqlx::test(migrations = false)]
async fn events_published_in_the_range_are_delivered_again_in_their_order(pool: PgPool) {
    migrated(&pool).await;
    // Account 1: two ordered events published an hour ago, a third still pending behind them.
    let ids = emit_committed(&pool, &[posted(1, 1), posted(1, 2)]).await;
    let old = emit_committed(&pool, &[posted(2, 1)]).await[0];
    let other_type = emit_committed(&pool, &[noted(1, 1)]).await[0];
    for &id in &ids {
        published_hours_ago(&pool, id, 1).await;
    }
    published_hours_ago(&pool, old, 5).await;
    published_hours_ago(&pool, other_type, 1).await;
    let pending = emit_committed(&pool, &[posted(1, 3)]).await[0];

    let (from, until) = (Utc::now() - chrono::Duration::hours(2), Utc::now());
    assert_eq!(replay::count(&pool, "account", "account.posted", from, until).await.unwrap(), 2);
    assert_eq!(replay::replay(&pool, "account", "account.posted", from, until).await.unwrap(), 2);
    let replayed = row_state(&pool, ids[0]).await;
    assert_eq!((replayed.published, replayed.attempts), (false, 0), "pending, attempts reset");
    assert!(row_state(&pool, old).await.published, "published before the range");
    assert!(row_state(&pool, other_type).await.published, "another type");

    let log = Log::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(log.clone())
            .handler(log_posted)
            .handler(log_noted),
    );
    eventually("the replayed events and the pending one are delivered", || async {
        log.len() == 3
    })
    .await;
    relay.stop().await;
    assert_eq!(log.of(1), [(1, 1), (2, 1), (3, 1)], "in emit order, the pending one last");
    assert_eq!(log.ids_of(1), [ids[0], ids[1], pending], "with their own ids");
    // Published again, now: out of the range replayed, in one that reaches the present.
    assert_eq!(replay::count(&pool, "account", "account.posted", from, until).await.unwrap(), 0);
    let now = Utc::now();
    assert_eq!(replay::count(&pool, "account", "account.posted", until, now).await.unwrap(), 3);
}

#[sqlx::test(migrations = false)]
async fn replay_wakes_a_sleeping_relay(pool: PgPool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[posted(1, 1)]).await[0];
    let log = Log::default();
    let relay = Running::start(
        Relay::builder(pool.clone())
            .state(log.clone())
            .handler(log_posted)
            .poll_interval(Duration::from_secs(3600)),
    );
    eventually("delivered once, and published", || async { row_state(&pool, id).await.published })
        .await;
    let from = Utc::now() - chrono::Duration::minutes(1);
    assert_eq!(
        replay::replay(&pool, "account", "account.posted", from, Utc::now()).await.unwrap(),
        1
    );
    eventually("delivered again, without waiting for the hourly poll", || async { log.len() == 2 })
        .await;
    relay.stop().await;
    assert_eq!(log.ids_of(1), [id, id]);
}
