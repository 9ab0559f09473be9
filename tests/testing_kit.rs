//! The test kit (`outbox_runtime::testing`) against the real PostgreSQL:
//! - `emitted` sees exactly the open transaction's events (savepoints included), typed, in
//!   emit order, through families and versions; not another transaction's, committed before or
//!   meanwhile, nor rolled-back ones.
//! - `drain` reports each outcome (delivered, delivered after failures, dead, pending behind a
//!   delay or a dead ordered event) and returns once nothing is due; past its timeout it fails
//!   naming what is still due.
//! - `Faults` fails, panics and delays chosen calls of each event, counts them, and wraps plain
//!   and transactional handlers alike.

mod support;

use std::time::Duration;

use outbox_runtime::testing::{self, Drain, DrainError, EmittedError, Faults, Outcome};
use outbox_runtime::{
    emit, emit_all, emit_with, DeadOrderedEvents, EmitOptions, EventContext, OutboxEvent, Relay,
    RelayCounts, TransactionContext,
};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use support::*;
use tokio::time::Instant;
use uuid::Uuid;

/// One variant's struct of the family below.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "cart", event_type = "cart.item_added", ordered)]
struct ItemAdded {
    #[outbox(id)]
    cart_id: Uuid,
    sku: String,
}

/// Every event of a cart, in one type.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "cart", ordered)]
enum CartEvent {
    #[outbox(event_type = "cart.item_added")]
    ItemAdded(ItemAdded),
    #[outbox(event_type = "cart.checked_out", version = 2)]
    CheckedOut {
        #[outbox(id)]
        cart_id: Uuid,
        total_cents: i64,
    },
}

/// Version 1 of a shipment: the weight in kilograms.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "shipment", event_type = "shipment.sent")]
struct ShipmentSentV1 {
    #[outbox(id)]
    shipment_id: i64,
    kilograms: i64,
}

/// Version 2: the weight in grams.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "shipment", event_type = "shipment.sent", version = 2, upcast_from = ShipmentSentV1)]
struct ShipmentSent {
    #[outbox(id)]
    shipment_id: i64,
    grams: i64,
}

impl From<ShipmentSentV1> for ShipmentSent {
    fn from(v1: ShipmentSentV1) -> Self {
        ShipmentSent { shipment_id: v1.shipment_id, grams: v1.kilograms * 1000 }
    }
}

async fn succeeds<E>(_: EventContext, _: E) -> Result<(), HandlerError> {
    Ok(())
}

async fn refuses<E>(_: EventContext, _: E) -> Result<(), HandlerError> {
    Err(HandlerError("downstream refuses".into()))
}

fn counts(delivered: u64, failed: u64, dead: u64) -> RelayCounts {
    let mut counts = RelayCounts::default();
    (counts.delivered, counts.failed, counts.dead) = (delivered, failed, dead);
    counts
}

#[sqlx::test(migrations = false)]
async fn emitted_sees_this_transactions_events_only_typed_and_in_order(pool: PgPool) {
    migrated(&pool).await;
    emit_committed(&pool, &[placed(1)]).await;
    let mut rolled_back = pool.begin().await.unwrap();
    emit(&mut rolled_back, &placed(2)).await.unwrap();
    rolled_back.rollback().await.unwrap();

    let mut tx = pool.begin().await.unwrap();
    assert!(testing::emitted::<OrderPlaced>(&mut tx).await.unwrap().is_empty(), "nothing yet");
    let (first, second) = (placed(3), placed(4));
    let headers = EmitOptions::new().header("request_id", "req-7");
    let first_id = emit_with(&mut tx, &first, headers).await.unwrap();
    // Other types, of this aggregate and another, are not `OrderPlaced`'s.
    let cancelled = OrderCancelled { order_id: first.order_id, reason: "late".into() };
    emit(&mut tx, &cancelled).await.unwrap();
    emit(&mut tx, &CustomerRenamed { customer_id: 1, name: "Ada".into() }).await.unwrap();
    let second_id = emit(&mut tx, &second).await.unwrap();
    // Committed while this transaction is open, and visible to it (read committed).
    emit_committed(&pool, &[placed(5)]).await;
    assert_eq!(count_rows(&mut *tx).await, 6, "the one committed meanwhile is visible");

    // A savepoint's events are this transaction's; a rolled-back savepoint's are gone.
    let mut savepoint = sqlx::Connection::begin(&mut *tx).await.unwrap();
    let third = placed(6);
    emit(&mut savepoint, &third).await.unwrap();
    savepoint.commit().await.unwrap();
    let mut savepoint = sqlx::Connection::begin(&mut *tx).await.unwrap();
    emit(&mut savepoint, &placed(7)).await.unwrap();
    savepoint.rollback().await.unwrap();

    let emitted = testing::emitted::<OrderPlaced>(&mut tx).await.unwrap();
    assert_eq!(emitted, [first.clone(), second, third]);
    let records = testing::emitted_records::<OrderPlaced>(&mut tx).await.unwrap();
    let ids: Vec<Uuid> = records.iter().map(|record| record.event_id).collect();
    assert_eq!(ids[..2], [first_id, second_id]);
    let record = &records[0];
    assert_eq!(record.headers, serde_json::json!({ "request_id": "req-7" }));
    assert_eq!(
        (record.event_type, record.version, record.aggregate_id.clone()),
        ("order.placed", 1, first.order_id.to_string())
    );
    let [renamed] = &testing::emitted_records::<CustomerRenamed>(&mut tx).await.unwrap()[..] else {
        panic!("one `customer.renamed`")
    };
    assert_eq!(renamed.event, CustomerRenamed { customer_id: 1, name: "Ada".into() });
    tx.commit().await.unwrap();

    let mut next = pool.begin().await.unwrap();
    assert!(testing::emitted::<OrderPlaced>(&mut next).await.unwrap().is_empty());
}

#[sqlx::test(migrations = false)]
async fn emitted_reads_families_and_older_versions_as_the_relay_does(pool: PgPool) {
    migrated(&pool).await;
    let cart_id = Uuid::now_v7();
    let tea = ItemAdded { cart_id, sku: "tea".into() };
    let family =
        [CartEvent::ItemAdded(tea.clone()), CartEvent::CheckedOut { cart_id, total_cents: 900 }];
    let mut tx = pool.begin().await.unwrap();
    emit_all(&mut tx, &family).await.unwrap();
    // The variant's struct writes the family's rows too.
    let cup = ItemAdded { cart_id, sku: "cup".into() };
    emit(&mut tx, &cup).await.unwrap();

    let carts = testing::emitted::<CartEvent>(&mut tx).await.unwrap();
    assert_eq!(carts, [family[0].clone(), family[1].clone(), CartEvent::ItemAdded(cup.clone())]);
    let records = testing::emitted_records::<CartEvent>(&mut tx).await.unwrap();
    let types: Vec<_> = records.iter().map(|record| (record.event_type, record.version)).collect();
    assert_eq!(types, [("cart.item_added", 1), ("cart.checked_out", 2), ("cart.item_added", 1)]);
    assert_eq!(testing::emitted::<ItemAdded>(&mut tx).await.unwrap(), [tea, cup]);

    // A version 1 row reads as version 2 through the `upcast_from` chain...
    emit(&mut tx, &ShipmentSentV1 { shipment_id: 1, kilograms: 2 }).await.unwrap();
    let sent = testing::emitted::<ShipmentSent>(&mut tx).await.unwrap();
    assert_eq!(sent, [ShipmentSent { shipment_id: 1, grams: 2000 }]);
    // ...and a version 2 row does not read as version 1: a typed error naming the row.
    let id = emit(&mut tx, &ShipmentSent { shipment_id: 2, grams: 5 }).await.unwrap();
    let error = testing::emitted::<ShipmentSentV1>(&mut tx).await.unwrap_err();
    let EmittedError::Decode { event_id, version, ref source, .. } = error else {
        panic!("a decode error expected: {error:?}")
    };
    assert_eq!((event_id, version), (id, 2));
    assert_eq!(
        error.to_string(),
        format!("cannot read emitted event {id} (`shipment.sent` version 2)")
    );
    assert!(source.to_string().contains("is newer than"), "{source}");
}

#[sqlx::test(migrations = false)]
async fn drain_reports_delivered_failed_dead_and_pending_events(pool: PgPool) {
    migrated(&pool).await;
    let fine = emit_committed(&pool, &[placed(1)]).await[0];
    let delayed =
        commit_with(&pool, &placed(2), EmitOptions::new().delay(Duration::from_secs(3600))).await;
    let cancelled = OrderCancelled { order_id: Uuid::now_v7(), reason: "late".into() };
    let flaky = emit_committed(&pool, &[cancelled]).await[0];
    let doomed =
        emit_committed(&pool, &[CustomerRenamed { customer_id: 1, name: "Ada".into() }]).await[0];

    let faults = Faults::new().fail_first(2);
    let builder = || {
        Relay::builder(pool.clone())
            .handler(succeeds::<OrderPlaced>)
            .handler(faults.wrap(succeeds::<OrderCancelled>))
            .handler(refuses::<CustomerRenamed>)
            .max_attempts(3)
    };
    let report = testing::drain(builder()).await.unwrap();

    let outcomes: Vec<_> = report.events().iter().map(|e| (e.event_id, e.outcome)).collect();
    assert_eq!(
        outcomes,
        [
            (fine, Outcome::Delivered),
            (delayed, Outcome::Pending),
            (flaky, Outcome::Delivered),
            (doomed, Outcome::Dead),
        ],
        "every event of the relay's types, in emit order"
    );
    let event = |id| report.event(id).unwrap();
    assert_eq!((event(fine).attempts, event(fine).last_error.as_deref()), (0, None));
    assert_eq!(event(flaky).attempts, 2);
    assert_eq!(event(flaky).last_error.as_deref(), Some("injected failure (call 2)"));
    assert_eq!(event(doomed).attempts, 3);
    assert_eq!(event(doomed).last_error.as_deref(), Some("downstream refuses"));
    assert!(event(fine).next_attempt_at.is_none() && event(doomed).next_attempt_at.is_none());
    let later = event(delayed).next_attempt_at.unwrap();
    assert!(later > chrono::Utc::now() + chrono::Duration::minutes(59), "{later}");
    assert_eq!(report.counts(), counts(2, 2 + 3, 1));
    assert_eq!((faults.calls_for(flaky), faults.handler_calls()), (3, 1));

    // The rows the first drain settled are not in the next one's report.
    let report = testing::drain(builder()).await.unwrap();
    let left: Vec<_> = report.events().iter().map(|e| (e.event_id, e.outcome)).collect();
    assert_eq!(left, [(delayed, Outcome::Pending)]);
    assert_eq!(report.counts(), RelayCounts::default());
}

#[sqlx::test(migrations = false)]
async fn a_failure_that_retries_past_the_horizon_is_reported_failed(pool: PgPool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];
    // The caller's backoff stays: the retry comes after the drain's horizon.
    let backoff = outbox_runtime::Backoff { base: Duration::from_secs(60), ..Default::default() };
    let builder = Relay::builder(pool.clone()).handler(refuses::<OrderPlaced>).backoff(backoff);
    let report = testing::drain(builder).await.unwrap();
    let event = report.event(id).unwrap();
    assert_eq!((event.outcome, event.attempts), (Outcome::Failed, 1));
    assert_eq!(event.last_error.as_deref(), Some("downstream refuses"));
}

#[sqlx::test(migrations = false)]
async fn an_ordered_event_behind_a_dead_one_is_pending_unless_the_relay_skips_it(pool: PgPool) {
    migrated(&pool).await;
    let cart_id = Uuid::now_v7();
    let events = [
        CartEvent::ItemAdded(ItemAdded { cart_id, sku: "poison".into() }),
        CartEvent::CheckedOut { cart_id, total_cents: 900 },
    ];
    let ids = emit_committed(&pool, &events).await;
    async fn refuses_poison(_: EventContext, event: CartEvent) -> Result<(), HandlerError> {
        match event {
            CartEvent::ItemAdded(item) if item.sku == "poison" => {
                Err(HandlerError("poison".into()))
            }
            _ => Ok(()),
        }
    }
    let builder = || Relay::builder(pool.clone()).handler(refuses_poison).max_attempts(2);

    // The checkout waits for the dead item forever: not due, so the drain does not wait.
    let report = testing::drain(builder()).await.unwrap();
    assert_eq!(report.outcome(ids[0]), Some(Outcome::Dead));
    assert_eq!(report.outcome(ids[1]), Some(Outcome::Pending));

    let skipping = builder().dead_ordered_events(DeadOrderedEvents::SkipPast);
    let report = testing::drain(skipping).await.unwrap();
    assert_eq!(report.outcome(ids[1]), Some(Outcome::Delivered));
}

#[sqlx::test(migrations = false)]
async fn an_injected_panic_is_a_recorded_failure(pool: PgPool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];
    let faults = Faults::new().panic_first(1).fail_first(1);
    let builder = Relay::builder(pool.clone()).handler(faults.wrap(succeeds::<OrderPlaced>));
    let report = testing::drain(builder).await.unwrap();

    let event = report.event(id).unwrap();
    assert_eq!((event.outcome, event.attempts), (Outcome::Delivered, 2));
    assert_eq!(report.counts(), counts(1, 2, 0));
    assert_eq!((faults.calls(), faults.handler_calls()), (3, 1));

    // The panic's text as the relay records it.
    let id = emit_committed(&pool, &[placed(2)]).await[0];
    let faults = Faults::new().panic_first(1);
    let builder =
        Relay::builder(pool.clone()).handler(faults.wrap(succeeds::<OrderPlaced>)).max_attempts(1);
    let report = testing::drain(builder).await.unwrap();
    let event = report.event(id).unwrap();
    assert_eq!(event.outcome, Outcome::Dead);
    assert_eq!(event.last_error.as_deref(), Some("handler panicked: injected panic (call 1)"));
}

#[sqlx::test(migrations = false)]
async fn an_injected_delay_holds_the_delivery_and_counts_against_the_handler_timeout(pool: PgPool) {
    migrated(&pool).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];
    let delay = Duration::from_millis(300);
    let faults = Faults::new().delay(delay);
    let builder = Relay::builder(pool.clone()).handler(faults.wrap(succeeds::<OrderPlaced>));
    let started = Instant::now();
    let report = testing::drain(builder).await.unwrap();
    assert!(started.elapsed() >= delay, "the drain waited for the delayed delivery");
    assert_eq!((report.outcome(id), faults.handler_calls()), (Some(Outcome::Delivered), 1));

    let id = emit_committed(&pool, &[placed(2)]).await[0];
    let faults = Faults::new().delay(Duration::from_secs(3600));
    let builder = Relay::builder(pool.clone())
        .handler(faults.wrap(succeeds::<OrderPlaced>))
        .handler_timeout(Some(Duration::from_millis(50)))
        .max_attempts(2);
    let report = testing::drain(builder).await.unwrap();
    let event = report.event(id).unwrap();
    assert_eq!(event.outcome, Outcome::Dead);
    assert_eq!(event.last_error.as_deref(), Some("handler timed out after 50ms"));
    assert_eq!((faults.calls_for(id), faults.handler_calls()), (2, 0));
}

#[sqlx::test(migrations = false)]
async fn a_drain_that_cannot_finish_times_out_naming_what_is_due(pool: PgPool) {
    migrated(&pool).await;
    let stuck = emit_committed(&pool, &[placed(1)]).await[0];
    let faults = Faults::new().delay(Duration::from_secs(3600));
    let builder = Relay::builder(pool.clone()).handler(faults.wrap(succeeds::<OrderPlaced>));
    let started = Instant::now();
    let error = Drain::new(builder).timeout(Duration::from_millis(500)).run().await.unwrap_err();
    assert!(started.elapsed() < Duration::from_secs(10), "the hung handler is not waited for");

    let message = error.to_string();
    assert!(
        message.starts_with("drain timed out after 500ms with 1 events still due: `order.placed`"),
        "{message}"
    );
    assert!(message.contains(&stuck.to_string()), "{message}");
    let DrainError::TimedOut { report, .. } = error else { panic!("a timeout expected") };
    assert_eq!(report.outcome(stuck), Some(Outcome::Due));
    assert_eq!(faults.calls_for(stuck), 1);
}

#[sqlx::test(migrations = false)]
async fn faults_wrap_a_transactional_handler(pool: PgPool) {
    migrated(&pool).await;
    sqlx::query("CREATE TABLE receipts (order_id uuid PRIMARY KEY)").execute(&pool).await.unwrap();
    async fn record_receipt(
        mut ctx: TransactionContext,
        event: OrderPlaced,
    ) -> Result<(), sqlx::Error> {
        sqlx::query("INSERT INTO receipts VALUES ($1)")
            .bind(event.order_id)
            .execute(&mut **ctx.tx())
            .await?;
        Ok(())
    }
    let order = placed(1);
    let id = emit_committed(&pool, std::slice::from_ref(&order)).await[0];
    let faults = Faults::new().fail_first(1);
    let builder = Relay::builder(pool.clone()).handler(faults.wrap(record_receipt));
    let report = testing::drain(builder).await.unwrap();

    assert_eq!(report.outcome(id), Some(Outcome::Delivered));
    assert_eq!(report.counts(), counts(1, 1, 0));
    let receipts: Vec<Uuid> =
        sqlx::query_scalar("SELECT order_id FROM receipts").fetch_all(&pool).await.unwrap();
    assert_eq!(receipts, [order.order_id]);
}

#[sqlx::test(migrations = false)]
async fn a_drain_with_nothing_due_returns_at_once(pool: PgPool) {
    migrated(&pool).await;
    let report = testing::drain(Relay::builder(pool.clone()).handler(succeeds::<OrderPlaced>))
        .await
        .unwrap();
    assert!(report.events().is_empty());

    let error = testing::drain(Relay::builder(pool.clone())).await.unwrap_err();
    assert!(matches!(error, DrainError::Build(_)), "{error:?}");
}
