//! A panic in the relay's own code around a handler (here a metrics recorder that panics when
//! the handler's duration is recorded), outside the guard that turns a handler's panic into its
//! failure: the delivery counts as a failed attempt naming the panic, so an event whose delivery
//! panics every time ends dead after its attempts, instead of being handed back and delivered
//! again forever.

mod support;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use outbox_runtime::{EventContext, Relay};
use sqlx::PgPool;
use support::*;

/// Panics when a handler's duration is recorded; records nothing else.
struct PanicsOnHandlerDuration;

impl Recorder for PanicsOnHandlerDuration {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, _: &Key, _: &Metadata<'_>) -> Counter {
        Counter::noop()
    }

    fn register_gauge(&self, _: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::noop()
    }

    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        assert_ne!(key.name(), "outbox_handler_duration_seconds", "the recorder is broken");
        Histogram::noop()
    }
}

#[sqlx::test(migrations = false)]
async fn a_panic_outside_the_handler_is_a_failed_attempt_not_an_endless_hand_back(pool: PgPool) {
    metrics::set_global_recorder(PanicsOnHandlerDuration).expect("the only recorder");
    migrated(&pool).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];
    let calls = Arc::new(AtomicUsize::new(0));
    let counts = |ctx: EventContext<Arc<AtomicUsize>>, _: OrderPlaced| async move {
        ctx.state().fetch_add(1, Ordering::SeqCst);
        Ok::<_, HandlerError>(())
    };
    let relay = Running::start(
        fast(Relay::builder(pool.clone())).state(calls.clone()).handler(counts).max_attempts(2),
    );
    eventually("the event is dead", || async { row_state(&pool, id).await.dead }).await;
    let counted = relay.stop().await;

    let row = row_state(&pool, id).await;
    assert_eq!(row.attempts, 2);
    let error = row.last_error.unwrap_or_default();
    assert!(error.contains("panicked") && error.contains("outside its handler"), "{error}");
    assert_eq!(calls.load(Ordering::SeqCst), 2, "delivered once per attempt");
    assert_eq!((counted.delivered, counted.failed, counted.dead), (0, 2, 1));
}
