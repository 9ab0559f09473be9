//! Pausing an event type: every relay, in either lease mode, stops leasing its rows at once and
//! leaves them pending, other types go on, and resuming wakes the relays; with both cores busy.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::{pauses, testing, EventContext, LeaseMode, Relay, RelayBuilder};
use sqlx::PgPool;
use support::*;
use uuid::Uuid;

/// Every event id handled, by any relay of a test.
#[derive(Clone, Default)]
struct Handled(Arc<Mutex<Vec<Uuid>>>);

impl Handled {
    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }

    fn contains(&self, id: Uuid) -> bool {
        self.0.lock().unwrap().contains(&id)
    }
}

/// Takes a little while, so a drain of a backlog is still under way when the test pauses it.
async fn on_placed(ctx: EventContext<Handled>, _: OrderPlaced) -> Result<(), HandlerError> {
    tokio::time::sleep(Duration::from_millis(5)).await;
    ctx.state().0.lock().unwrap().push(ctx.event_id());
    Ok(())
}

async fn on_renamed(ctx: EventContext<Handled>, _: CustomerRenamed) -> Result<(), HandlerError> {
    ctx.state().0.lock().unwrap().push(ctx.event_id());
    Ok(())
}

/// A relay of both types that polls hourly: only a wake-up brings it back in time.
fn relay(pool: &PgPool, handled: &Handled, mode: LeaseMode) -> RelayBuilder<Handled> {
    Relay::builder(pool.clone())
        .state(handled.clone())
        .lease_mode(mode)
        .poll_interval(Duration::from_secs(3600))
        .handler(on_placed)
        .handler(on_renamed)
}

async fn pending(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM outbox.events WHERE published_at IS NULL AND dead_at IS NULL",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

#[sqlx::test(migrations = false)]
async fn no_relay_leases_a_paused_type_and_resuming_wakes_them(pool: PgPool) {
    migrated(&pool).await;
    let _busy = CpuBurner::start(Duration::from_secs(120));
    let handled = Handled::default();
    let written = Running::start(relay(&pool, &handled, LeaseMode::Written));
    let held = Running::start(relay(&pool, &handled, LeaseMode::HeldTransaction));
    assert!(pauses::pause(&pool, "order", "order.placed", Some("mailer down")).await.unwrap());
    assert!(!pauses::pause(&pool, "order", "order.placed", None).await.unwrap(), "already");

    let placed_ids = emit_committed(&pool, &[placed(1), placed(2), placed(3)]).await;
    let renamed = CustomerRenamed { customer_id: 1, name: "n".into() };
    let renamed_id = emit_committed(&pool, &[renamed]).await[0];
    eventually("the other type is delivered", || async { handled.contains(renamed_id) }).await;
    // The relays woke for both events, and leased again since: the paused ones stay.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(handled.count(), 1, "no paused event was delivered");
    assert_eq!(pending(&pool).await, 3);
    let listed = pauses::paused(&pool).await.unwrap();
    assert_eq!(listed.len(), 1);
    assert_eq!(
        (listed[0].aggregate_type.as_str(), listed[0].event_type.as_str()),
        ("order", "order.placed")
    );
    assert_eq!(listed[0].reason.as_deref(), Some("mailer down"), "the first pause's reason");

    assert!(pauses::resume(&pool, "order", "order.placed").await.unwrap());
    assert!(!pauses::resume(&pool, "order", "order.placed").await.unwrap(), "not paused");
    eventually("the resumed events are delivered, the relays woken", || async {
        placed_ids.iter().all(|id| handled.contains(*id))
    })
    .await;
    written.stop().await;
    held.stop().await;
    assert_eq!(handled.count(), 4, "each event once");
}

#[sqlx::test(migrations = false)]
async fn a_pause_stops_a_draining_backlog_with_its_next_lease(pool: PgPool) {
    migrated(&pool).await;
    let _busy = CpuBurner::start(Duration::from_secs(120));
    let backlog: Vec<OrderPlaced> = (0..10_000).map(placed).collect();
    emit_committed(&pool, &backlog).await;
    let handled = Handled::default();
    let written = Running::start(relay(&pool, &handled, LeaseMode::Written).batch_size(100));
    let held = Running::start(relay(&pool, &handled, LeaseMode::HeldTransaction).batch_size(100));
    eventually("the drain is under way", || async { handled.count() >= 200 }).await;
    pauses::pause(&pool, "order", "order.placed", None).await.unwrap();

    // What was leased before the pause is delivered; then nothing more is.
    eventually("the rows leased before the pause are acknowledged", || async {
        // Written leases push `available_at` past now; held ones lock their rows.
        let leased: i64 = sqlx::query_scalar(
            "SELECT (SELECT count(*) FROM outbox.events \
                     WHERE published_at IS NULL AND available_at > now()) \
                  + (SELECT count(*) FROM outbox.events WHERE published_at IS NULL) \
                  - (SELECT count(*) FROM (SELECT 1 FROM outbox.events \
                     WHERE published_at IS NULL FOR UPDATE SKIP LOCKED) unlocked)",
        )
        .fetch_one(&pool)
        .await
        .unwrap();
        leased == 0
    })
    .await;
    let stopped_at = handled.count();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(handled.count(), stopped_at, "no lease after the pause");
    let left = pending(&pool).await;
    assert!(left > 0, "the pause stopped the drain before its end");
    assert_eq!(left as usize, 10_000 - stopped_at);

    pauses::resume(&pool, "order", "order.placed").await.unwrap();
    eventually("the rest is delivered", || async { pending(&pool).await == 0 }).await;
    written.stop().await;
    held.stop().await;
    assert_eq!(handled.count(), 10_000, "each event once");
}

#[sqlx::test(migrations = false)]
async fn a_drain_does_not_wait_for_a_paused_type(pool: PgPool) {
    migrated(&pool).await;
    pauses::pause(&pool, "order", "order.placed", None).await.unwrap();
    emit_committed(&pool, &[placed(1)]).await;
    let renamed = CustomerRenamed { customer_id: 1, name: "n".into() };
    let renamed_id = emit_committed(&pool, &[renamed]).await[0];
    let handled = Handled::default();
    let builder = relay(&pool, &handled, LeaseMode::Written);
    let report = testing::drain(builder).await.unwrap();
    assert!(handled.contains(renamed_id));
    assert_eq!(handled.count(), 1);
    assert_eq!(report.with_outcome(testing::Outcome::Pending).count(), 1, "{report:?}");
}
