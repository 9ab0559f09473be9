//! Forwarding to NATS JetStream on 127.0.0.1:4222 (the real server): each test makes a stream
//! of its own, on subjects of its own, and deletes it.

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::forward::{nats::NatsSink, Forward, SinkStatus};
use outbox_runtime::{BuildError, EventContext, Relay};
use sqlx::PgPool;
use support::forwarding::{
    a_message_too_large, assert_in_emit_order, emit_two_and_roll_back_one, first_failure,
    forward_ordered_through_failures, forward_until_published, sink_error_at_start, Away,
    TRACEPARENT,
};
use support::nats::Stream;
use support::*;
use uuid::Uuid;

fn forwarding(pool: &PgPool, stream: &Stream) -> outbox_runtime::RelayBuilder {
    let destination = format!("{}.{{aggregate_type}}.{{event_type}}", stream.prefix);
    fast(Relay::builder(pool.clone())).forward(Forward::to(stream.sink()).destination(&destination))
}

#[sqlx::test(migrations = false)]
async fn committed_events_arrive_once_with_their_id_key_and_headers(pool: PgPool) {
    migrated(&pool).await;
    let stream = Stream::create(Duration::from_secs(120)).await;
    let kept = emit_two_and_roll_back_one(&pool).await;

    forward_until_published(&pool, forwarding(&pool, &stream), 2).await;

    let messages = stream.messages().await;
    assert_eq!(messages.len(), 2, "each committed event once, the rolled-back one never");
    for ((subject, headers, payload), id) in messages.iter().zip(&kept) {
        assert_eq!(subject, &format!("{}.order.order.placed", stream.prefix));
        assert_eq!(headers["Nats-Msg-Id"], id.to_string());
        assert_eq!(headers["outbox-event-id"], id.to_string());
        assert_eq!(headers["outbox-event-type"], "order.placed");
        assert_eq!(headers["outbox-aggregate-type"], "order");
        assert_eq!(headers["outbox-aggregate-id"], payload["order_id"].as_str().unwrap());
        assert_eq!(headers["traceparent"], TRACEPARENT);
        assert_eq!(headers["tenant"], "acme");
        assert_eq!(headers["content-type"], "application/json");
        assert_eq!(headers["outbox-event-version"], "1");
        assert!(headers.contains_key("outbox-created-at"));
    }
    let totals: Vec<i64> =
        messages.iter().map(|(_, _, p)| p["total_cents"].as_i64().unwrap()).collect();
    assert_eq!(totals, [1, 2], "the payloads as stored");
}

#[sqlx::test(migrations = false)]
async fn cloudevents_names_the_row_headers_as_binary_mode_does(pool: PgPool) {
    migrated(&pool).await;
    let stream = Stream::create(Duration::from_secs(120)).await;
    let id = emit_committed(&pool, &[placed(5)]).await[0];
    let destination = format!("{}.{{aggregate_type}}.{{event_type}}", stream.prefix);
    let forward = Forward::to(stream.sink()).destination(&destination).cloudevents(true);
    let relay = Running::start(fast(Relay::builder(pool.clone())).forward(forward));
    until_published(&pool, id).await;
    relay.stop().await;

    let messages = stream.messages().await;
    let (_, headers, _) = &messages[0];
    assert_eq!(headers["ce-id"], id.to_string());
    assert_eq!(headers["ce-type"], "order.placed");
    assert_eq!(headers["ce-source"], "/order");
    assert_eq!(headers["ce-specversion"], "1.0");
    assert_eq!(headers["ce-eventversion"], "1");
    assert!(headers.contains_key("ce-subject") && headers.contains_key("ce-time"));
    assert!(!headers.contains_key("outbox-event-id"));
}

#[sqlx::test(migrations = false)]
async fn a_repeated_publish_is_dropped_by_the_duplicate_window(pool: PgPool) {
    migrated(&pool).await;
    let stream = Stream::create(Duration::from_secs(120)).await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];
    let relay = Running::start(forwarding(&pool, &stream));
    until_published(&pool, id).await;
    relay.stop().await;

    // As after a relay crash between the broker's confirmation and the acknowledgement: the
    // row is pending again and published a second time.
    sqlx::query(
        "UPDATE outbox.events SET published_at = NULL, lease_token = NULL, available_at = now() \
         WHERE event_id = $1",
    )
    .bind(id)
    .execute(&pool)
    .await
    .unwrap();
    let relay = Running::start(forwarding(&pool, &stream));
    until_published(&pool, id).await;
    relay.stop().await;
    assert_eq!(stream.messages().await.len(), 1, "JetStream dropped the repeat by Nats-Msg-Id");
}

#[sqlx::test(migrations = false)]
async fn a_subject_no_stream_covers_is_a_failure_naming_it_and_loses_nothing(pool: PgPool) {
    migrated(&pool).await;
    let stream = Stream::create(Duration::from_secs(120)).await;
    let uncovered = format!("x{}.{{event_type}}", stream.prefix);
    let error = first_failure(&pool, Forward::to(stream.sink()).destination(&uncovered)).await;
    assert!(error.starts_with(&format!("x{}.order.placed: ", stream.prefix)), "{error}");
    assert!(stream.messages().await.is_empty());
}

#[sqlx::test(migrations = false)]
async fn a_missing_stream_stops_the_relay_at_start(pool: PgPool) {
    migrated(&pool).await;
    let client = support::nats::connect().await;
    let sink = NatsSink::new(client, format!("MISSING_{}", Uuid::new_v4().simple()));
    let error = sink_error_at_start(&pool, sink).await;
    assert!(error.destination.starts_with("stream `MISSING_"), "{error}");
}

#[sqlx::test(migrations = false)]
async fn ordered_events_arrive_in_emit_order_while_the_sink_fails_at_random(pool: PgPool) {
    migrated(&pool).await;
    let stream = Stream::create(Duration::from_secs(120)).await;
    forward_ordered_through_failures(&pool, stream.sink(), &stream.prefix).await;
    let messages = stream.messages().await;
    assert_in_emit_order(
        messages.into_iter().map(|(subject, _, payload)| (subject, payload["n"].as_u64().unwrap())),
    );
}

/// A message larger than the server takes (NATS refuses payloads over its `max_payload`, 1 MiB
/// by default) fails with the cause named, while the other events go through.
#[sqlx::test(migrations = false)]
async fn a_message_too_large_fails_alone_and_names_the_cause(pool: PgPool) {
    migrated(&pool).await;
    let stream = Stream::create(Duration::from_secs(120)).await;
    let error = a_message_too_large(&pool, forwarding(&pool, &stream)).await;
    let subject = format!("{}.customer.customer.renamed", stream.prefix);
    assert!(error.starts_with(&format!("{subject}: ")), "{error}");
    assert!(error.to_lowercase().contains("payload"), "the cause is named: {error}");
    assert_eq!(stream.messages().await.len(), 2, "the others went through");
}

#[sqlx::test(migrations = false)]
async fn a_handling_relay_and_a_forwarding_relay_share_one_outbox_on_disjoint_types(pool: PgPool) {
    migrated(&pool).await;
    let stream = Stream::create(Duration::from_secs(120)).await;
    let order = emit_committed(&pool, &[placed(1)]).await[0];
    let mut tx = pool.begin().await.unwrap();
    let renamed = CustomerRenamed { customer_id: 7, name: "Ada".into() };
    let customer = outbox_runtime::emit(&mut tx, &renamed).await.unwrap();
    tx.commit().await.unwrap();

    let handled = Arc::new(Mutex::new(Vec::new()));
    let record = |ctx: EventContext<Arc<Mutex<Vec<Uuid>>>>, _: OrderPlaced| async move {
        ctx.state().lock().unwrap().push(ctx.event_id());
        Ok::<_, HandlerError>(())
    };
    let handling =
        Running::start(fast(Relay::builder(pool.clone())).state(handled.clone()).handler(record));
    let destination = format!("{}.{{aggregate_type}}.{{event_type}}", stream.prefix);
    let only_customers = Forward::to(stream.sink())
        .destination(&destination)
        .only([("customer", "customer.renamed")]);
    let forwarding = Running::start(fast(Relay::builder(pool.clone())).forward(only_customers));
    until_published(&pool, order).await;
    until_published(&pool, customer).await;
    handling.stop().await;
    forwarding.stop().await;

    assert_eq!(*handled.lock().unwrap(), [order], "the handler took its type only");
    let messages = stream.messages().await;
    assert_eq!(messages.len(), 1, "the forwarder took its type only");
    assert_eq!(messages[0].1["outbox-event-id"], customer.to_string());
}

#[sqlx::test(migrations = false)]
async fn a_type_both_forwarded_and_handled_is_refused_at_build(pool: PgPool) {
    let stream = Stream::create(Duration::from_secs(120)).await;
    async fn on_placed(_: EventContext, _: OrderPlaced) -> Result<(), HandlerError> {
        Ok(())
    }
    let forward = Forward::to(stream.sink()).only([("order", "order.placed")]);
    let built = Relay::builder(pool).handler(on_placed).forward(forward).build();
    let Err(BuildError::ForwardedAndHandled { aggregate_type, event_type, .. }) = built else {
        panic!("expected ForwardedAndHandled");
    };
    assert_eq!((aggregate_type.as_str(), event_type.as_str()), ("order", "order.placed"));
}

/// A destination placeholder that no row field fills is a build error naming it, not literal
/// text in every subject.
#[sqlx::test(migrations = false)]
async fn an_unknown_destination_placeholder_is_refused_at_build(pool: PgPool) {
    let stream = Stream::create(Duration::from_secs(120)).await;
    let forward = Forward::to(stream.sink()).destination("events.{aggregate}.{event_type}");
    let built = Relay::builder(pool).forward(forward).build();
    let Err(error @ BuildError::InvalidDestination(_)) = built else {
        panic!("expected InvalidDestination");
    };
    assert_eq!(
        error.to_string(),
        "invalid forwarding destination: `{aggregate}` in `events.{aggregate}.{event_type}` is \
         not a placeholder; use {aggregate_type}, {event_type} or {aggregate_id}"
    );
}

#[sqlx::test(migrations = false)]
async fn while_the_broker_is_away_handled_events_flow_and_forwarded_ones_wait_untried(
    pool: PgPool,
) {
    migrated(&pool).await;
    let stream = Stream::create(Duration::from_secs(120)).await;
    let (sink, broker) = Away::new(stream.sink());
    let handled = Arc::new(Mutex::new(Vec::new()));
    let record = |ctx: EventContext<Arc<Mutex<Vec<Uuid>>>>, _: OrderPlaced| async move {
        ctx.state().lock().unwrap().push(ctx.event_id());
        Ok::<_, HandlerError>(())
    };
    let destination = format!("{}.{{aggregate_type}}.{{event_type}}", stream.prefix);
    let customers =
        Forward::to(sink).destination(&destination).only([("customer", "customer.renamed")]);
    // One attempt: a single failure counted would kill the forwarded event.
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(handled.clone())
            .handler(record)
            .forward(customers)
            .max_attempts(1),
    );
    // Past its start check, which would refuse to start without the broker.
    eventually("the relay runs", || async { relay.metrics.is_healthy(Duration::from_secs(60)) })
        .await;
    broker.take_away();
    let mut tx = pool.begin().await.unwrap();
    let renamed = CustomerRenamed { customer_id: 7, name: "Ada".into() };
    let customer = outbox_runtime::emit(&mut tx, &renamed).await.unwrap();
    tx.commit().await.unwrap();
    eventually("the relay sees the broker unavailable", || async {
        matches!(relay.metrics.sink_status(), Some(SinkStatus::Unavailable { .. }))
    })
    .await;
    let orders = emit_committed(&pool, &[placed(1), placed(2), placed(3)]).await;
    for id in &orders {
        until_published(&pool, *id).await;
    }
    let probes = broker.checks();
    eventually("the relay checks the broker again", || async { broker.checks() > probes }).await;
    let row = row_state(&pool, customer).await;
    assert_eq!((row.published, row.dead, row.attempts), (false, false, 0), "waiting, untried");
    assert!(stream.messages().await.is_empty());

    broker.give_back();
    until_published(&pool, customer).await;
    assert_eq!(relay.metrics.sink_status(), Some(SinkStatus::Available));
    let counts = relay.stop().await;
    assert_eq!(*handled.lock().unwrap(), orders, "handled all along");
    assert_eq!(stream.messages().await.len(), 1, "forwarded once the broker was back");
    assert_eq!((counts.failed, counts.dead), (0, 0));
    assert_eq!(row_state(&pool, customer).await.attempts, 0);
}

/// The forwarding subscriber: one of an event type's subscribers, beside a handler; while the
/// broker is away the handler goes on and the forwarding copies wait, no attempt counted.
#[sqlx::test(migrations = false)]
async fn forwarding_as_a_subscriber_beside_a_handler_waits_out_the_broker_alone(pool: PgPool) {
    migrated(&pool).await;
    let stream = Stream::create(Duration::from_secs(120)).await;
    let (sink, broker) = Away::new(stream.sink());
    let destination = format!("{}.{{aggregate_type}}.{{event_type}}", stream.prefix);
    let forward = Forward::to(sink).destination(&destination).only([("order", "order.placed")]);

    #[derive(Clone, Default)]
    struct Receipts(Arc<Mutex<Vec<Uuid>>>);
    async fn receipts(ctx: EventContext<Receipts>, _: OrderPlaced) -> Result<(), HandlerError> {
        ctx.state().0.lock().unwrap().push(ctx.event_id());
        Ok(())
    }
    let sent = Receipts::default();
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .state(sent.clone())
            .subscriber("receipts", receipts)
            .forward_as("broker", forward),
    );
    let pending = || async {
        sqlx::query_as::<_, (i64, i64)>(
            "SELECT count(*), coalesce(sum(attempts), 0) FROM outbox.events \
             WHERE published_at IS NULL AND dead_at IS NULL",
        )
        .fetch_one(&pool)
        .await
        .unwrap()
    };
    let mut ids = emit_committed(&pool, &[placed(1), placed(2), placed(3)]).await;
    eventually("the broker and the handler have the first three", || async {
        stream.message_ids().await.len() == 3 && sent.0.lock().unwrap().len() == 3
    })
    .await;

    broker.take_away();
    ids.extend(emit_committed(&pool, &[placed(4), placed(5), placed(6)]).await);
    eventually("the handler has all six", || async { sent.0.lock().unwrap().len() == 6 }).await;
    eventually("the broker's three copies wait", || async { pending().await.0 == 3 }).await;
    tokio::time::sleep(Duration::from_millis(300)).await; // polls and probes meanwhile
    assert_eq!(pending().await, (3, 0), "waiting copies count no attempt");

    broker.give_back();
    eventually("the broker has all six", || async { stream.message_ids().await.len() == 6 }).await;
    eventually("nothing is pending", || async { pending().await.0 == 0 }).await;
    let counts = relay.stop().await;
    let mut forwarded = stream.message_ids().await;
    forwarded.sort();
    ids.sort();
    assert_eq!(forwarded, ids, "each event once at the broker, under its own id");
    let mut handled = sent.0.lock().unwrap().clone();
    handled.sort();
    assert_eq!(handled, ids, "each event once at the handler");
    assert_eq!((counts.failed, counts.dead), (0, 0));
}

#[tokio::test]
async fn forwarding_as_a_subscriber_needs_the_types_named_and_a_name_of_its_own() {
    let stream = Stream::create(Duration::from_secs(120)).await;
    let pool = || sqlx::PgPool::connect_lazy("postgres://localhost/none").unwrap();
    let every_type = Relay::builder(pool()).forward_as("broker", Forward::to(stream.sink()));
    let error = every_type.build().err();
    assert!(matches!(error, Some(BuildError::InvalidSetting(_))), "{error:?}");

    async fn receipts(_: EventContext, _: OrderPlaced) -> Result<(), HandlerError> {
        Ok(())
    }
    let placed = Forward::to(stream.sink()).only([("order", "order.placed")]);
    let twice = Relay::builder(pool()).subscriber("broker", receipts).forward_as("broker", placed);
    let error = twice.build().err();
    assert!(matches!(error, Some(BuildError::DuplicateSubscriber { .. })), "{error:?}");
    let placed = Forward::to(stream.sink()).only([("order", "order.placed")]);
    let handled = Relay::builder(pool()).handler(receipts).forward_as("broker", placed);
    let error = handled.build().err();
    assert!(matches!(error, Some(BuildError::ForwardedAndHandled { .. })), "{error:?}");
}
