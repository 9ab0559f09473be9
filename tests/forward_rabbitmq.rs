//! Forwarding to RabbitMQ on 127.0.0.1:5672 (the real broker): each test makes an exchange and
//! a queue of its own, bound for routing keys of its own, and deletes them.

mod support;

use outbox_runtime::forward::{rabbitmq::RabbitSink, Forward, SinkStatus};
use outbox_runtime::Relay;
use sqlx::PgPool;
use support::forwarding::{
    assert_in_emit_order, emit_two_and_roll_back_one, first_failure,
    forward_ordered_through_failures, forward_until_published, sink_error_at_start, TRACEPARENT,
};
use support::rabbitmq::{connect, Exchange};
use support::*;
use uuid::Uuid;

async fn forwarding(pool: &PgPool, exchange: &Exchange) -> outbox_runtime::RelayBuilder {
    let destination = format!("{}.{{aggregate_type}}.{{event_type}}", exchange.prefix);
    let forward = Forward::to(exchange.sink().await).destination(&destination);
    fast(Relay::builder(pool.clone())).forward(forward)
}

#[sqlx::test(migrations = false)]
async fn committed_events_arrive_once_with_their_id_key_and_headers(pool: PgPool) {
    migrated(&pool).await;
    let exchange = Exchange::create().await;
    let kept = emit_two_and_roll_back_one(&pool).await;

    forward_until_published(&pool, forwarding(&pool, &exchange).await, 2).await;

    let mut messages = exchange.messages().await;
    assert_eq!(messages.len(), 2, "each committed event once, the rolled-back one never");
    // Two rows published in one batch may be confirmed in either order; match them by id.
    messages.sort_by_key(|m| m.payload["total_cents"].as_i64());
    for (message, id) in messages.iter().zip(&kept) {
        let headers = &message.headers;
        assert_eq!(message.routing_key, format!("{}.order.order.placed", exchange.prefix));
        assert_eq!(message.message_id.as_deref(), Some(id.to_string().as_str()));
        assert_eq!(message.content_type.as_deref(), Some("application/json"));
        assert_eq!(message.delivery_mode, Some(2), "persistent");
        assert_eq!(headers["outbox-event-id"], id.to_string());
        assert_eq!(headers["outbox-event-type"], "order.placed");
        assert_eq!(headers["outbox-aggregate-type"], "order");
        assert_eq!(headers["outbox-aggregate-id"], message.payload["order_id"].as_str().unwrap());
        assert_eq!(headers["traceparent"], TRACEPARENT);
        assert_eq!(headers["tenant"], "acme");
        assert!(headers.contains_key("outbox-created-at"));
    }
    let totals: Vec<i64> =
        messages.iter().map(|m| m.payload["total_cents"].as_i64().unwrap()).collect();
    assert_eq!(totals, [1, 2], "the payloads as stored");
}

#[sqlx::test(migrations = false)]
async fn a_routing_key_no_queue_takes_is_unroutable_and_loses_nothing(pool: PgPool) {
    migrated(&pool).await;
    let exchange = Exchange::create().await;
    let unbound = format!("x{}.{{event_type}}", exchange.prefix);
    let error =
        first_failure(&pool, Forward::to(exchange.sink().await).destination(&unbound)).await;
    assert!(error.starts_with(&format!("x{}.order.placed: ", exchange.prefix)), "{error}");
    assert!(error.contains("unroutable"), "{error}");
    assert!(exchange.messages().await.is_empty());
}

#[sqlx::test(migrations = false)]
async fn a_channel_the_broker_closed_is_reopened_for_the_next_batches(pool: PgPool) {
    migrated(&pool).await;
    let exchange = Exchange::create().await;
    let first = emit_committed(&pool, &[placed(1)]).await[0];
    let relay = Running::start(forwarding(&pool, &exchange).await);
    until_published(&pool, first).await;

    // Publishing to an exchange that is gone makes the broker close the sink's channel: the
    // sink is unavailable (its check finds no exchange) and the event waits, untried.
    exchange.delete_exchange().await;
    let second = emit_committed(&pool, &[placed(2)]).await[0];
    let unavailable = || match relay.metrics.sink_status() {
        Some(SinkStatus::Unavailable { reason, .. }) => Some(reason),
        _ => None,
    };
    eventually("the sink is unavailable", || async { unavailable().is_some() }).await;
    let reason = unavailable().unwrap_or_default();
    assert!(reason.contains("NOT_FOUND"), "{reason}");
    let row = row_state(&pool, second).await;
    assert_eq!((row.published, row.dead, row.attempts), (false, false, 0), "waiting, untried");

    exchange.declare().await;
    until_published(&pool, second).await;
    let third = emit_committed(&pool, &[placed(3)]).await[0];
    until_published(&pool, third).await;
    relay.stop().await;
    let totals: Vec<i64> = exchange
        .messages()
        .await
        .iter()
        .map(|m| m.payload["total_cents"].as_i64().unwrap())
        .collect();
    assert_eq!(totals, [1, 2, 3], "each once, on a new channel after the broker closed one");
}

#[sqlx::test(migrations = false)]
async fn a_missing_exchange_stops_the_relay_at_start(pool: PgPool) {
    migrated(&pool).await;
    let sink = RabbitSink::new(connect().await, format!("missing-{}", Uuid::new_v4().simple()));
    let error = sink_error_at_start(&pool, sink).await;
    assert!(error.destination.starts_with("exchange `missing-"), "{error}");
    assert!(error.reason.contains("NOT_FOUND"), "{error}");
}

#[sqlx::test(migrations = false)]
async fn a_closed_connection_stops_the_relay_at_start(pool: PgPool) {
    migrated(&pool).await;
    let exchange = Exchange::create().await;
    let connection = connect().await;
    connection.close(200, "gone".into()).await.unwrap();
    let sink = RabbitSink::new(connection, &exchange.name);
    let error = sink_error_at_start(&pool, sink).await;
    assert_eq!(error.destination, format!("exchange `{}`", exchange.name), "{error}");
}

#[sqlx::test(migrations = false)]
async fn ordered_events_arrive_in_emit_order_while_the_sink_fails_at_random(pool: PgPool) {
    migrated(&pool).await;
    let exchange = Exchange::create().await;
    forward_ordered_through_failures(&pool, exchange.sink().await, &exchange.prefix).await;
    let messages = exchange.messages().await;
    assert_in_emit_order(
        messages.into_iter().map(|m| (m.routing_key, m.payload["n"].as_u64().unwrap())),
    );
}
