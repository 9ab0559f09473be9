//! What a handler can say besides "failed": rejected (dead now, with a reason) and snoozed
//! (again later, not counted); and handler options that differ from the relay's settings.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context as _;
use chrono::{DateTime, Utc};
use outbox_runtime::dead_letters::{self, DeadFilter};
use outbox_runtime::{
    Backoff, BoxError, BuildError, EventContext, HandlerOptions, Reject, Relay, Snooze,
    TransactionContext,
};
use sqlx::PgPool;
use support::accounts::{posted, Posted};
use support::*;
use uuid::Uuid;

/// One handler call: `(event id, attempts before it, when)`.
type Call = (Uuid, u32, DateTime<Utc>);

/// Every handler call.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<Call>>>);

impl Calls {
    fn record<S>(&self, ctx: &EventContext<S>) {
        self.0.lock().unwrap().push((ctx.event_id(), ctx.attempts(), Utc::now()));
    }
    fn of(&self, id: Uuid) -> Vec<(u32, DateTime<Utc>)> {
        let calls = self.0.lock().unwrap();
        calls.iter().filter(|(event, ..)| *event == id).map(|&(_, n, at)| (n, at)).collect()
    }
}

async fn rejects(ctx: EventContext<Calls>, event: OrderPlaced) -> Result<(), BoxError> {
    ctx.state().record(&ctx);
    Err(Reject::new(format!("order {} was deleted", event.order_id)).into())
}

#[sqlx::test(migrations = false)]
async fn a_rejected_event_is_dead_at_once_with_its_reason(pool: PgPool) {
    migrated(&pool).await;
    let event = placed(1);
    let id = emit_committed(&pool, std::slice::from_ref(&event)).await[0];

    let calls = Calls::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone())).state(calls.clone()).handler(rejects).max_attempts(10),
    );
    eventually("the event is dead", || async { row_state(&pool, id).await.dead }).await;
    // Time for the relay to (wrongly) deliver it again.
    tokio::time::sleep(Duration::from_millis(300)).await;
    let counts = relay.stop().await;

    assert_eq!(calls.of(id).len(), 1, "a rejected event is not retried");
    let row = row_state(&pool, id).await;
    assert_eq!(row.attempts, 1, "the rejection counts as the attempt it was");
    let reason = format!("rejected by its handler: order {} was deleted", event.order_id);
    assert_eq!(row.last_error.as_deref(), Some(reason.as_str()));
    assert_eq!((counts.failed, counts.dead, counts.rejected, counts.delivered), (1, 1, 1, 0));
    let dead = dead_letters::list(&pool, &DeadFilter::all(), None, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!((dead[0].event_id, dead[0].last_error.as_deref()), (id, Some(reason.as_str())));
}

#[sqlx::test(migrations = false)]
async fn a_rejection_is_found_inside_the_handlers_own_errors(pool: PgPool) {
    migrated(&pool).await;
    let ids = emit_committed(&pool, &[placed(1), placed(2)]).await;

    /// An application error enum with the rejection as one variant's source.
    #[derive(Debug, thiserror::Error)]
    enum Billing {
        #[error("the customer is gone")]
        Gone(#[source] Reject),
    }
    async fn through_anyhow(_: EventContext, event: OrderPlaced) -> anyhow::Result<()> {
        if event.total_cents == 1 {
            Err(Reject::new("no such customer")).context("charging the card")
        } else {
            Err(Billing::Gone(Reject::new("account closed")).into())
        }
    }
    let relay = Running::start(fast(Relay::builder(pool.clone())).handler(through_anyhow));
    for &id in &ids {
        eventually("the event is dead", || async { row_state(&pool, id).await.dead }).await;
    }
    let counts = relay.stop().await;

    let errors = [
        "charging the card: rejected by its handler: no such customer",
        "the customer is gone: rejected by its handler: account closed",
    ];
    for (id, error) in ids.into_iter().zip(errors) {
        let row = row_state(&pool, id).await;
        assert_eq!((row.attempts, row.last_error.as_deref()), (1, Some(error)));
    }
    assert_eq!(counts.rejected, 2);
}

#[sqlx::test(migrations = false)]
async fn a_transactional_handler_that_rejects_writes_nothing(pool: PgPool) {
    migrated(&pool).await;
    sqlx::query("CREATE TABLE receipts (order_id uuid PRIMARY KEY)").execute(&pool).await.unwrap();
    let id = emit_committed(&pool, &[placed(-5)]).await[0];

    async fn receipt(mut ctx: TransactionContext, event: OrderPlaced) -> Result<(), BoxError> {
        sqlx::query("INSERT INTO receipts (order_id) VALUES ($1)")
            .bind(event.order_id)
            .execute(&mut **ctx.tx())
            .await?;
        if event.total_cents < 0 {
            return Err(Reject::new(format!("negative total {}", event.total_cents)).into());
        }
        Ok(())
    }
    let relay = Running::start(fast(Relay::builder(pool.clone())).handler(receipt));
    eventually("the event is dead", || async { row_state(&pool, id).await.dead }).await;
    let counts = relay.stop().await;

    let receipts: i64 =
        sqlx::query_scalar("SELECT count(*) FROM receipts").fetch_one(&pool).await.unwrap();
    assert_eq!(receipts, 0, "the handler's write rolled back with the rejection");
    let row = row_state(&pool, id).await;
    assert_eq!(row.last_error.as_deref(), Some("rejected by its handler: negative total -5"));
    assert_eq!((counts.rejected, counts.dead), (1, 1));
}

const SNOOZE: Duration = Duration::from_secs(2);

/// Snoozes each event's first delivery for [`SNOOZE`], then handles it.
async fn snoozes_once(ctx: EventContext<Calls>, _: OrderPlaced) -> Result<(), Snooze> {
    ctx.state().record(&ctx);
    match ctx.state().of(ctx.event_id()).len() {
        1 => Err(Snooze::after(SNOOZE)),
        _ => Ok(()),
    }
}

#[sqlx::test(migrations = false)]
async fn a_snoozed_event_comes_back_after_its_delay_with_no_attempt_counted(pool: PgPool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];

    let calls = Calls::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone())).state(calls.clone()).handler(snoozes_once),
    );
    eventually("the snooze is recorded", || async {
        let row = row_state(&pool, id).await;
        calls.of(id).len() == 1 && !row.leased && !row.available_now
    })
    .await;
    let row = row_state(&pool, id).await;
    assert_eq!((row.attempts, row.last_error, row.dead), (0, None, false), "not a failure");
    until_published(&pool, id).await;
    let counts = relay.stop().await;

    let calls = calls.of(id);
    assert_eq!(calls.len(), 2);
    assert_eq!((calls[0].0, calls[1].0), (0, 0), "the snooze counted no attempt");
    let waited = (calls[1].1 - calls[0].1).to_std().unwrap();
    assert!(waited >= SNOOZE - Duration::from_millis(100), "delivered again after {waited:?}");
    assert_eq!((counts.snoozed, counts.failed, counts.delivered), (1, 0, 1));
    assert_eq!(row_state(&pool, id).await.attempts, 0);
}

#[sqlx::test(migrations = false)]
async fn a_snoozed_ordered_event_holds_back_the_rest_of_its_aggregate(pool: PgPool) {
    migrated(&pool).await;
    let ids = emit_committed(&pool, &[posted(7, 1), posted(7, 2), posted(7, 3)]).await;

    /// Snoozes the aggregate's first event once.
    async fn first_snoozes(ctx: EventContext<Calls>, event: Posted) -> Result<(), Snooze> {
        ctx.state().record(&ctx);
        if event.n == 1 && ctx.state().of(ctx.event_id()).len() == 1 {
            return Err(Snooze::after(Duration::from_millis(500)));
        }
        Ok(())
    }
    let calls = Calls::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone())).state(calls.clone()).handler(first_snoozes),
    );
    until_published(&pool, ids[2]).await;
    relay.stop().await;

    let order: Vec<Uuid> = calls.0.lock().unwrap().iter().map(|&(id, ..)| id).collect();
    assert_eq!(order, [ids[0], ids[0], ids[1], ids[2]], "nothing overtook the snoozed event");
}

#[sqlx::test(migrations = false)]
async fn a_snooze_until_a_time_waits_for_that_time(pool: PgPool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];

    async fn snoozes_an_hour(_: EventContext, _: OrderPlaced) -> Result<(), Snooze> {
        Err(Snooze::until(Utc::now() + chrono::Duration::hours(1)))
    }
    let relay = Running::start(fast(Relay::builder(pool.clone())).handler(snoozes_an_hour));
    eventually("the snooze is recorded", || async { relay.metrics.counts().snoozed == 1 }).await;
    relay.stop().await;

    let due_in = (available_at(&pool, id).await - Utc::now()).to_std().unwrap();
    let hour = Duration::from_secs(3600);
    assert!(due_in > hour - Duration::from_secs(60) && due_in <= hour, "due in {due_in:?}");
}

async fn fails(_: EventContext, _: OrderPlaced) -> Result<(), HandlerError> {
    Err(HandlerError("card declined".into()))
}

async fn fails_cancelled(_: EventContext, _: OrderCancelled) -> Result<(), HandlerError> {
    Err(HandlerError("mail server down".into()))
}

#[sqlx::test(migrations = false)]
async fn a_handlers_max_attempts_overrides_the_relays(pool: PgPool) {
    migrated(&pool).await;
    let placed_id = emit_committed(&pool, &[placed(1)]).await[0];
    let cancelled = OrderCancelled { order_id: Uuid::now_v7(), reason: "r".into() };
    let cancelled_id = emit_committed(&pool, &[cancelled]).await[0];

    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .handler_with(fails, HandlerOptions::new().max_attempts(2))
            .handler(fails_cancelled)
            .max_attempts(4),
    );
    for id in [placed_id, cancelled_id] {
        eventually("the event is dead", || async { row_state(&pool, id).await.dead }).await;
    }
    relay.stop().await;

    assert_eq!(row_state(&pool, placed_id).await.attempts, 2, "the handler's own limit");
    assert_eq!(row_state(&pool, cancelled_id).await.attempts, 4, "the relay's limit");
}

#[sqlx::test(migrations = false)]
async fn a_handlers_backoff_overrides_the_relays(pool: PgPool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];

    let slow =
        Backoff { base: Duration::from_secs(40), cap: Duration::from_secs(600), jitter: false };
    let relay = Running::start(
        fast(Relay::builder(pool.clone())).handler_with(fails, HandlerOptions::new().backoff(slow)),
    );
    eventually("the failure is recorded", || async { row_state(&pool, id).await.attempts == 1 })
        .await;
    relay.stop().await;

    // The relay's own backoff (`fast`) would retry within 50 ms.
    let retry_in = (available_at(&pool, id).await - Utc::now()).to_std().unwrap();
    let base = Duration::from_secs(40);
    assert!(retry_in > base - Duration::from_secs(10) && retry_in <= base, "{retry_in:?}");
}

#[sqlx::test(migrations = false)]
async fn a_handlers_timeout_overrides_the_relays(pool: PgPool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];

    async fn hangs_first(ctx: EventContext, _: OrderPlaced) -> Result<(), HandlerError> {
        if ctx.attempts() == 0 {
            std::future::pending::<()>().await;
        }
        Ok(())
    }
    let options = HandlerOptions::new().timeout(Some(Duration::from_millis(300)));
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .handler_with(hangs_first, options)
            .handler_timeout(Some(Duration::from_secs(3600))),
    );
    until_published(&pool, id).await;
    let counts = relay.stop().await;

    let row = row_state(&pool, id).await;
    assert_eq!(row.last_error.as_deref(), Some("handler timed out after 300ms"));
    assert_eq!((counts.failed, counts.delivered), (1, 1));
}

#[sqlx::test(migrations = false)]
async fn build_refuses_a_handler_option_out_of_range(pool: PgPool) {
    let build = |attempts| {
        Relay::builder(pool.clone())
            .handler_with(fails, HandlerOptions::new().max_attempts(attempts))
            .build()
            .err()
    };
    let refused = Some(BuildError::InvalidSetting("max_attempts must be between 1 and i32::MAX"));
    assert_eq!(build(0), refused);
    assert_eq!(build(u32::MAX), refused);
    assert_eq!(build(1), None);
}
