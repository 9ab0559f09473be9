//! Delayed events against the real PostgreSQL: an event emitted with a delay is delivered no
//! earlier than its `available_at` (`created_at` plus the delay), and a delayed event of an
//! ordered type holds back the later events of its aggregate while other aggregates flow.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use chrono::{DateTime, Utc};
use outbox_runtime::{EmitOptions, EventContext, Relay};
use sqlx::PgPool;
use support::accounts::*;
use support::*;
use uuid::Uuid;

#[sqlx::test(migrations = false)]
async fn delayed_events_wait_and_hold_back_their_aggregate(pool: PgPool) {
    migrated(&pool).await;
    let log = Log::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(log.clone())
            .handler(log_posted)
            .handler(log_noted),
    );

    // Unordered, 1.5 s: read available_at before any relay can lease (and move) it.
    let delay = Duration::from_millis(1_500);
    let unordered = commit_with(&pool, &noted(1, 1), EmitOptions::new().delay(delay)).await;
    let unordered_at = available_at(&pool, unordered).await;
    let created_at: DateTime<Utc> =
        sqlx::query_scalar("SELECT created_at FROM outbox.events WHERE event_id = $1")
            .bind(unordered)
            .fetch_one(&pool)
            .await
            .unwrap();
    assert_eq!(unordered_at - created_at, chrono::Duration::milliseconds(1_500));

    // Ordered: account 2's first event is delayed too; its second, emitted later, is not.
    // Account 3 is a control that nothing holds back.
    let head = commit_with(&pool, &posted(2, 1), EmitOptions::new().delay(delay)).await;
    let head_at = available_at(&pool, head).await;
    let next = emit_committed(&pool, &[posted(2, 2)]).await[0];
    let control = emit_committed(&pool, &[posted(3, 1)]).await[0];

    for id in [unordered, head, next, control] {
        eventually("every event is published", || async { row_state(&pool, id).await.published })
            .await;
    }
    relay.stop().await;

    let seen = log.first_of(1, 1);
    assert_eq!(seen.attempt, 1);
    assert!(seen.at >= unordered_at, "handled at {} before available_at {unordered_at}", seen.at);
    assert_eq!(log.ids_of(2), [head, next], "the delayed event first, then the later one");
    assert!(log.first_of(2, 1).at >= head_at, "the delayed head waited for its time");
    assert!(log.first_of(2, 2).at >= head_at, "the later event waited for the delayed one");
    assert!(
        log.first_of(3, 1).at < head_at,
        "the relay was delivering other accounts meanwhile, so the wait was ordering's"
    );
    assert!(log.all().iter().all(|s| s.attempt == 1));
}

/// A relay draining a backlog leases each type past the rows it leased last; an event that lands
/// behind that position (scheduled in the past, or committed by a transaction that began long
/// ago) is found by the lease from the head the relay still makes once a second, while the
/// backlog is far from drained.
#[sqlx::test(migrations = false)]
async fn an_event_behind_a_draining_relay_is_delivered_within_a_second(pool: PgPool) {
    migrated(&pool).await;
    const BACKLOG: usize = 10_000;
    for _ in 0..BACKLOG / 5_000 {
        emit_committed(&pool, &(0..5_000).map(|n| placed(n as i64)).collect::<Vec<_>>()).await;
    }
    // Four handlers of at least a millisecond each: the backlog takes 2.5 s or more.
    type Seen = Arc<Mutex<Vec<Uuid>>>;
    async fn slow(ctx: EventContext<Seen>, _: OrderPlaced) -> Result<(), HandlerError> {
        tokio::time::sleep(Duration::from_millis(1)).await;
        ctx.state().lock().unwrap().push(ctx.event_id());
        Ok(())
    }
    let seen = Seen::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone())).state(seen.clone()).concurrency(4).handler(slow),
    );
    eventually("the relay is draining", || async { seen.lock().unwrap().len() >= 1_000 }).await;

    let an_hour_ago = Utc::now() - chrono::Duration::hours(1);
    let behind =
        commit_with(&pool, &placed(-1), EmitOptions::new().available_at(an_hour_ago)).await;
    until_published(&pool, behind).await;
    let delivered_before = seen.lock().unwrap().iter().position(|id| *id == behind).unwrap();
    relay.stop().await;
    assert!(
        delivered_before < BACKLOG - 1_000,
        "the event behind waited until the backlog was nearly drained ({delivered_before} of \
         {BACKLOG} delivered first)"
    );
}
