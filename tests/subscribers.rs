//! Several named subscribers per event type, against the real PostgreSQL: each gets every event
//! once however the others fare, has its own attempts, backoff, dead letters and per-aggregate
//! order, and may run in another relay.

mod support;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::dead_letters::DeadFilter;
use outbox_runtime::{
    BuildError, EventContext, HandlerOptions, LeaseMode, OutboxEvent, Reject, Relay, Snooze,
};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use support::*;
use uuid::Uuid;

/// An ordered event: one aggregate's events reach each subscriber in order.
#[derive(Debug, Clone, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "ledger", event_type = "ledger.posted", ordered)]
struct Posted {
    #[outbox(id)]
    ledger_id: i64,
    n: i64,
}

/// One call of a subscriber: `(subscriber, event id, delivery)`.
type Call = (&'static str, Uuid, u32);

/// Every call of each subscriber, in call order.
#[derive(Clone, Default)]
struct Calls(Arc<Mutex<Vec<Call>>>);

impl Calls {
    fn record<S>(&self, subscriber: &'static str, ctx: &EventContext<S>) {
        self.0.lock().unwrap().push((subscriber, ctx.event_id(), ctx.delivery()));
    }

    /// How often `subscriber` was called with each event.
    fn per_event(&self, subscriber: &str) -> HashMap<Uuid, usize> {
        let mut counts = HashMap::new();
        for (name, id, _) in self.0.lock().unwrap().iter() {
            if *name == subscriber {
                *counts.entry(*id).or_default() += 1;
            }
        }
        counts
    }

    fn of(&self, subscriber: &str) -> Vec<(Uuid, u32)> {
        let calls = self.0.lock().unwrap();
        calls.iter().filter(|(name, ..)| *name == subscriber).map(|(_, id, n)| (*id, *n)).collect()
    }
}

/// Rows of the outbox by subscriber: `(pending, published, dead)` copies.
async fn copies(pool: &PgPool, subscriber: &str) -> (i64, i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE published_at IS NULL AND dead_at IS NULL), \
                count(*) FILTER (WHERE published_at IS NOT NULL), \
                count(*) FILTER (WHERE dead_at IS NOT NULL) \
         FROM outbox.events WHERE subscriber = $1",
    )
    .bind(subscriber)
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn pending_events(pool: &PgPool) -> i64 {
    sqlx::query_scalar(
        "SELECT count(*) FROM outbox.events WHERE published_at IS NULL AND dead_at IS NULL",
    )
    .fetch_one(pool)
    .await
    .unwrap()
}

async fn registered(pool: &PgPool) -> Vec<String> {
    sqlx::query_scalar("SELECT subscriber FROM outbox.subscribers ORDER BY subscriber")
        .fetch_all(pool)
        .await
        .unwrap()
}

/// A subscriber that takes every event, recording its calls as `receipts`.
async fn receipts(ctx: EventContext<Calls>, _: OrderPlaced) -> Result<(), HandlerError> {
    ctx.state().record("receipts", &ctx);
    Ok(())
}

/// Another, recording its calls as `search`.
async fn search(ctx: EventContext<Calls>, _: OrderPlaced) -> Result<(), HandlerError> {
    ctx.state().record("search", &ctx);
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn each_subscriber_gets_every_event_once_and_a_failing_one_repeats_nobody(pool: PgPool) {
    migrated(&pool).await;
    let ids = emit_committed(&pool, &(0..60).map(placed).collect::<Vec<_>>()).await;
    let calls = Calls::default();

    // Fails each event's first two deliveries.
    async fn flaky(ctx: EventContext<Calls>, _: OrderPlaced) -> Result<(), HandlerError> {
        ctx.state().record("flaky", &ctx);
        match ctx.delivery() {
            1 | 2 => Err(HandlerError(format!("delivery {} fails", ctx.delivery()))),
            _ => Ok(()),
        }
    }
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(calls.clone())
            .subscriber("receipts", receipts)
            .subscriber("search", search)
            .subscriber("flaky", flaky),
    );
    eventually("every copy of the flaky subscriber is delivered", || async {
        pending_events(&pool).await == 0 && copies(&pool, "flaky").await.1 == 60
    })
    .await;
    let counts = relay.stop().await;

    for healthy in ["receipts", "search"] {
        let per_event = calls.per_event(healthy);
        assert!(ids.iter().all(|id| per_event.get(id) == Some(&1)), "{healthy}: each event once");
        assert_eq!(per_event.len(), 60);
        assert_eq!(copies(&pool, healthy).await, (0, 0, 0), "{healthy} needed no copy");
    }
    // The flaky subscriber's own retries: three calls per event, with its own attempt count,
    // which the event's id in its context names (not the copy's row).
    let flaky = calls.of("flaky");
    assert_eq!(flaky.len(), 180);
    for id in &ids {
        let deliveries: Vec<u32> =
            flaky.iter().filter(|(event, _)| event == id).map(|(_, n)| *n).collect();
        assert_eq!(deliveries, [1, 2, 3], "the flaky subscriber's deliveries of {id}");
    }
    assert_eq!(copies(&pool, "flaky").await, (0, 60, 0));
    assert_eq!(counts.delivered, 180, "60 events, 3 subscribers");
    assert_eq!(counts.failed, 120);
    assert_eq!(registered(&pool).await, ["flaky", "receipts", "search"]);
}

#[sqlx::test(migrations = false)]
async fn subscribers_in_different_relays_each_get_every_event_once(pool: PgPool) {
    migrated(&pool).await;
    let calls = Calls::default();
    let builder = || fast(Relay::builder(pool.clone())).state(calls.clone());
    let first = Running::start(builder().subscriber("receipts", receipts));
    let second = Running::start(builder().subscriber("search", search));
    eventually("both subscribers are registered", || async { registered(&pool).await.len() == 2 })
        .await;
    let ids = emit_committed(&pool, &(0..300).map(placed).collect::<Vec<_>>()).await;
    eventually("every event reached both", || async {
        calls.per_event("receipts").len() == 300 && calls.per_event("search").len() == 300
    })
    .await;
    eventually("nothing is pending", || async { pending_events(&pool).await == 0 }).await;
    first.stop().await;
    second.stop().await;
    for subscriber in ["receipts", "search"] {
        let per_event = calls.per_event(subscriber);
        assert!(ids.iter().all(|id| per_event.get(id) == Some(&1)), "{subscriber}: each once");
    }
    // Whichever relay leased an event delivered it to its own subscriber and copied it for the
    // other's: one copy per event in all.
    let copied = copies(&pool, "receipts").await.1 + copies(&pool, "search").await.1;
    assert_eq!(copied, 300);
}

#[sqlx::test(migrations = false)]
async fn a_rejected_event_is_dead_for_its_subscriber_only_and_requeued_for_it_alone(pool: PgPool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];
    let calls = Calls::default();
    let rejecting = Arc::new(std::sync::atomic::AtomicBool::new(true));

    #[derive(Clone)]
    struct State(Calls, Arc<std::sync::atomic::AtomicBool>);
    async fn receipts(ctx: EventContext<State>, _: OrderPlaced) -> Result<(), HandlerError> {
        ctx.state().0.record("receipts", &ctx);
        Ok(())
    }
    async fn audit(
        ctx: EventContext<State>,
        _: OrderPlaced,
    ) -> Result<(), outbox_runtime::BoxError> {
        ctx.state().0.record("audit", &ctx);
        if ctx.state().1.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(Reject::new("the audit log refuses it").into());
        }
        Ok(())
    }
    let builder = || {
        fast(Relay::builder(pool.clone()))
            .state(State(calls.clone(), rejecting.clone()))
            .subscriber("receipts", receipts)
            .subscriber("audit", audit)
    };
    let relay = Running::start(builder());
    eventually("the audit copy is dead", || async { copies(&pool, "audit").await.2 == 1 }).await;
    assert!(row_state(&pool, id).await.published, "the event itself is published");
    let dead =
        outbox_runtime::dead_letters::list(&pool, &DeadFilter::all(), None, 10).await.unwrap();
    assert_eq!(dead.len(), 1);
    assert_eq!(dead[0].event_type, "order.placed");
    assert!(dead[0].last_error.as_deref().unwrap().contains("the audit log refuses it"));

    rejecting.store(false, std::sync::atomic::Ordering::SeqCst);
    let requeued = outbox_runtime::dead_letters::requeue(&pool, &DeadFilter::all()).await.unwrap();
    assert_eq!(requeued, 1);
    eventually("the audit copy is delivered", || async { copies(&pool, "audit").await.1 == 1 })
        .await;
    relay.stop().await;
    assert_eq!(calls.of("receipts").len(), 1, "requeueing the copy does not repeat receipts");
    let audit: Vec<Uuid> = calls.of("audit").into_iter().map(|(event, _)| event).collect();
    assert_eq!(audit, [id, id], "the audit subscriber saw the event's own id both times");
}

#[sqlx::test(migrations = false)]
async fn a_subscriber_behind_on_an_aggregate_keeps_its_order_and_holds_back_no_one_else(
    pool: PgPool,
) {
    migrated(&pool).await;
    let mut tx = pool.begin().await.unwrap();
    let mut ids = Vec::new();
    for n in 0..5 {
        ids.push(outbox_runtime::emit(&mut tx, &Posted { ledger_id: 7, n }).await.unwrap());
    }
    tx.commit().await.unwrap();

    #[derive(Clone, Default)]
    struct State {
        calls: Calls,
        /// The slow subscriber fails event 0 until this is set.
        released: Arc<std::sync::atomic::AtomicBool>,
        order: Arc<Mutex<HashMap<&'static str, Vec<i64>>>>,
    }
    async fn fast_one(ctx: EventContext<State>, event: Posted) -> Result<(), HandlerError> {
        ctx.state().calls.record("fast", &ctx);
        ctx.state().order.lock().unwrap().entry("fast").or_default().push(event.n);
        Ok(())
    }
    async fn slow_one(ctx: EventContext<State>, event: Posted) -> Result<(), HandlerError> {
        ctx.state().calls.record("slow", &ctx);
        if event.n == 0 && !ctx.state().released.load(std::sync::atomic::Ordering::SeqCst) {
            return Err(HandlerError("not yet".into()));
        }
        ctx.state().order.lock().unwrap().entry("slow").or_default().push(event.n);
        Ok(())
    }
    let state = State::default();
    let _busy = CpuBurner::start(Duration::from_secs(60));
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(state.clone())
            .max_attempts(1_000)
            .subscriber("fast", fast_one)
            .subscriber("slow", slow_one),
    );
    eventually("the fast subscriber has all five", || async {
        state.order.lock().unwrap().get("fast").map_or(0, Vec::len) == 5
    })
    .await;
    assert_eq!(state.order.lock().unwrap().get("fast").unwrap(), &[0, 1, 2, 3, 4]);
    assert!(state.order.lock().unwrap().get("slow").is_none(), "slow is stuck on event 0");
    // Every later event waits for the slow subscriber as a copy behind its copy of event 0 (the
    // last one's is written with its acknowledgement, after the fast subscriber's call).
    eventually("the slow subscriber has five copies waiting", || async {
        copies(&pool, "slow").await.0 == 5
    })
    .await;
    assert!(state.order.lock().unwrap().get("slow").is_none(), "slow is still stuck on event 0");
    state.released.store(true, std::sync::atomic::Ordering::SeqCst);
    eventually("the slow subscriber has all five", || async {
        state.order.lock().unwrap().get("slow").map_or(0, Vec::len) == 5
    })
    .await;
    relay.stop().await;
    assert_eq!(state.order.lock().unwrap().get("slow").unwrap(), &[0, 1, 2, 3, 4]);
    assert!(calls_once_each(&state.calls, "fast", &ids));
}

fn calls_once_each(calls: &Calls, subscriber: &str, ids: &[Uuid]) -> bool {
    let per_event = calls.per_event(subscriber);
    per_event.len() == ids.len() && ids.iter().all(|id| per_event.get(id) == Some(&1))
}

#[sqlx::test(migrations = false)]
async fn a_snoozing_subscriber_gets_a_copy_for_later_without_an_attempt(pool: PgPool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];
    let calls = Calls::default();
    async fn limited(ctx: EventContext<Calls>, _: OrderPlaced) -> Result<(), Snooze> {
        ctx.state().record("limited", &ctx);
        if ctx.state().of("limited").len() == 1 {
            return Err(Snooze::after(Duration::from_millis(300)));
        }
        Ok(())
    }
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(calls.clone())
            .subscriber("receipts", receipts)
            .subscriber("limited", limited),
    );
    eventually("the limited copy is delivered", || async { copies(&pool, "limited").await.1 == 1 })
        .await;
    let counts = relay.stop().await;
    assert!(row_state(&pool, id).await.published);
    assert_eq!(calls.of("receipts"), [(id, 1)]);
    // The snooze counted no attempt: the second call is still the first delivery.
    assert_eq!(calls.of("limited"), [(id, 1), (id, 1)]);
    assert_eq!((counts.delivered, counts.failed, counts.snoozed), (2, 0, 1));
}

#[sqlx::test(migrations = false)]
async fn deleting_on_publish_keeps_the_payload_in_the_copies(pool: PgPool) {
    migrated(&pool).await;
    let events: Vec<OrderPlaced> = (0..20).map(placed).collect();
    let ids = emit_committed(&pool, &events).await;
    #[derive(Clone, Default)]
    struct Seen(Arc<Mutex<Vec<(Uuid, i64)>>>);
    async fn receipts(_: EventContext<Seen>, _: OrderPlaced) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn once_failing(ctx: EventContext<Seen>, e: OrderPlaced) -> Result<(), HandlerError> {
        if ctx.attempts() == 0 {
            return Err(HandlerError("first delivery fails".into()));
        }
        ctx.state().0.lock().unwrap().push((ctx.event_id(), e.total_cents));
        Ok(())
    }
    let seen = Seen::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(seen.clone())
            .delete_on_publish(true)
            .subscriber("receipts", receipts)
            .subscriber_with("retried", once_failing, HandlerOptions::new().max_attempts(5)),
    );
    eventually("the outbox is empty", || async { count_rows(&pool).await == 0 }).await;
    relay.stop().await;
    let mut seen = seen.0.lock().unwrap().clone();
    seen.sort_by_key(|(_, total)| *total);
    let expected: Vec<(Uuid, i64)> = ids.iter().copied().zip(0..20).collect();
    assert_eq!(seen, expected, "each copy carried its event's id and payload");
}

#[test]
fn build_refuses_subscribers_it_cannot_run() {
    async fn one(_: EventContext, _: OrderPlaced) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn two(_: EventContext, _: OrderPlaced) -> Result<(), HandlerError> {
        Ok(())
    }
    let pool = || sqlx::PgPool::connect_lazy("postgres://localhost/none").unwrap();
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    let _guard = runtime.enter();
    let error = |builder: outbox_runtime::RelayBuilder| builder.build().err().unwrap();

    assert_eq!(
        error(Relay::builder(pool()).subscriber("Receipts", one)),
        BuildError::InvalidSubscriberName { name: "Receipts".into() }
    );
    assert_eq!(
        error(Relay::builder(pool()).subscriber("", one)),
        BuildError::InvalidSubscriberName { name: String::new() }
    );
    assert_eq!(
        error(Relay::builder(pool()).subscriber("receipts", one).subscriber("receipts", two)),
        BuildError::DuplicateSubscriber {
            subscriber: "receipts".into(),
            aggregate_type: "order".into(),
            event_type: "order.placed".into(),
        }
    );
    let both =
        BuildError::HandledAndSubscribed { aggregate_type: "order", event_type: "order.placed" };
    assert_eq!(error(Relay::builder(pool()).handler(one).subscriber("receipts", two)), both);
    assert_eq!(error(Relay::builder(pool()).subscriber("receipts", two).handler(one)), both);
    assert!(matches!(
        error(
            Relay::builder(pool())
                .lease_mode(LeaseMode::HeldTransaction)
                .subscriber("receipts", one)
        ),
        BuildError::InvalidSetting(_)
    ));
    let message = both.to_string();
    assert!(message.contains("register the handler as a subscriber too"), "{message}");
}

#[sqlx::test(migrations = false)]
async fn a_relay_that_dies_mid_delivery_leaves_the_event_to_the_next_for_every_subscriber(
    pool: PgPool,
) {
    migrated(&pool).await;
    let ids = emit_committed(&pool, &[placed(1), placed(2)]).await;

    #[derive(Clone, Default)]
    struct State {
        calls: Calls,
        /// Set: the search subscriber hangs, as in a relay that stopped answering.
        hang: Arc<std::sync::atomic::AtomicBool>,
        hanging: Arc<tokio::sync::Notify>,
    }
    async fn receipts(ctx: EventContext<State>, _: OrderPlaced) -> Result<(), HandlerError> {
        ctx.state().calls.record("receipts", &ctx);
        Ok(())
    }
    async fn search(ctx: EventContext<State>, _: OrderPlaced) -> Result<(), HandlerError> {
        if ctx.state().hang.load(std::sync::atomic::Ordering::SeqCst) {
            ctx.state().hanging.notify_one();
            std::future::pending::<()>().await;
        }
        ctx.state().calls.record("search", &ctx);
        Ok(())
    }
    let builder = |state: &State| {
        fast(Relay::builder(pool.clone()))
            .state(state.clone())
            .lease_timeout(Duration::from_secs(1))
            .subscriber("receipts", receipts)
            .subscriber("search", search)
    };
    let doomed_state = State::default();
    doomed_state.hang.store(true, std::sync::atomic::Ordering::SeqCst);
    let doomed = builder(&doomed_state).build().unwrap();
    let doomed = tokio::spawn(doomed.run_until(std::future::pending()));
    doomed_state.hanging.notified().await;
    doomed.abort(); // dies mid-delivery: no acknowledgement, no copies
    let _ = doomed.await;

    let state = State::default();
    let _busy = CpuBurner::start(Duration::from_secs(60));
    let heir = Running::start(builder(&state));
    eventually("both events are published", || async { count_published(&pool).await == 2 }).await;
    eventually("nothing is pending", || async { pending_events(&pool).await == 0 }).await;
    heir.stop().await;
    // The heir delivered each event to both subscribers, at once: nothing was copied.
    assert!(calls_once_each(&state.calls, "receipts", &ids));
    assert!(calls_once_each(&state.calls, "search", &ids));
    assert_eq!(copies(&pool, "search").await, (0, 0, 0));
    assert_eq!(copies(&pool, "receipts").await, (0, 0, 0));
    // An event the dead relay held came back after its lease: the heir saw the expired lease.
    let expired: Vec<u32> = {
        let calls = state.calls.0.lock().unwrap();
        calls.iter().filter(|(name, ..)| *name == "search").map(|(_, _, n)| *n).collect()
    };
    assert!(expired.contains(&2), "a delivery after an expired lease: {expired:?}");
}

#[sqlx::test(migrations = false)]
async fn each_subscriber_is_counted_under_its_own_name(pool: PgPool) {
    use support::counting::Counted;
    migrated(&pool).await;
    emit_committed(&pool, &[placed(1)]).await;
    let counted = Counted::default();
    // This test's thread only: the runtime of `sqlx::test` runs every task on it.
    let _recorder = metrics::set_default_local_recorder(&counted);
    async fn ok(_: EventContext, _: OrderPlaced) -> Result<(), HandlerError> {
        Ok(())
    }
    async fn flaky(ctx: EventContext, _: OrderPlaced) -> Result<(), HandlerError> {
        match ctx.delivery() {
            1 => Err(HandlerError("first delivery fails".into())),
            _ => Ok(()),
        }
    }
    let relay = Running::start(
        fast(Relay::builder(pool.clone())).subscriber("ok", ok).subscriber("flaky", flaky),
    );
    eventually("the flaky copy is delivered", || async { copies(&pool, "flaky").await.1 == 1 })
        .await;
    relay.stop().await;
    let mut counted: Vec<(String, Vec<String>)> =
        counted.increments().into_iter().map(|(name, labels, _)| (name, labels)).collect();
    counted.sort();
    let of = |name: &str, subscriber: &str| {
        let labels = vec!["event_type=order.placed".to_owned(), format!("subscriber={subscriber}")];
        (name.to_owned(), labels)
    };
    assert_eq!(
        counted,
        [
            of("outbox_delivered_total", "flaky"),
            of("outbox_delivered_total", "ok"),
            of("outbox_failed_total", "flaky"),
            of("outbox_retried_total", "flaky"),
        ]
    );
}

#[sqlx::test(migrations = false)]
async fn an_outbox_from_before_subscribers_keeps_its_pending_events_and_dead_letters(pool: PgPool) {
    // The schema of the release before subscribers, with a backlog and a dead letter in it.
    migrated_up_to(&pool, 20261207000004).await;
    let pending = emit_committed(&pool, &(0..20).map(placed).collect::<Vec<_>>()).await;
    let dead = emit_committed(&pool, &[placed(99)]).await[0];
    mark_dead(&pool, dead, "refused before the upgrade").await;
    migrated(&pool).await;

    let calls = Calls::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(calls.clone())
            .subscriber("receipts", receipts)
            .subscriber("search", search),
    );
    eventually("the backlog reached both", || async {
        calls.per_event("receipts").len() == 20 && calls.per_event("search").len() == 20
    })
    .await;
    // The dead letter is still one, and requeued it goes to every subscriber.
    let listed = outbox_runtime::dead_letters::list(&pool, &DeadFilter::all(), None, 10).await;
    let listed: Vec<Uuid> = listed.unwrap().into_iter().map(|e| e.event_id).collect();
    assert_eq!(listed, [dead]);
    outbox_runtime::dead_letters::requeue(&pool, &DeadFilter::event(dead)).await.unwrap();
    eventually("the requeued event reached both", || async {
        calls.per_event("receipts").len() == 21 && calls.per_event("search").len() == 21
    })
    .await;
    relay.stop().await;
    let all: Vec<Uuid> = pending.iter().copied().chain([dead]).collect();
    assert!(calls_once_each(&calls, "receipts", &all));
    assert!(calls_once_each(&calls, "search", &all));
}
