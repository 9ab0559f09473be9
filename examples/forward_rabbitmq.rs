//! Forwarding to RabbitMQ end to end: a relay runs beside the application, as in a service,
//! and publishes each committed event to a topic exchange with `{aggregate_type}.{event_type}`
//! as its routing key; a consumer (in any language) reads it from a queue bound to that
//! exchange, with the event id as `message_id` and the event's headers as AMQP headers. An
//! order's events are `ordered`: its cancellation never arrives before its placement.
//!
//! Run with `cargo run --example forward_rabbitmq` against the PostgreSQL in `DATABASE_URL` and
//! the RabbitMQ on 127.0.0.1:5672 (`AMQP_URL` to change it, default
//! `amqp://guest:guest@127.0.0.1:5672/%2f`). It declares the topic exchange
//! `outbox-example.forward_rabbitmq` (declaring is idempotent, and it stays, as broker topology
//! does) and a queue of its own, exclusive, which the broker deletes when the example
//! disconnects.

use std::collections::HashMap;
use std::time::Duration;

use futures_util::StreamExt;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{Connection, ConnectionProperties, ExchangeKind};
use outbox_runtime::forward::rabbitmq::RabbitSink;
use outbox_runtime::forward::Forward;
use outbox_runtime::{emit_with, EmitOptions, OutboxEvent, Relay};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// The aggregate type `forward_rabbitmq.order` is this example's own: its relay forwards only
/// these events, never those of other programs sharing the outbox.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "forward_rabbitmq.order", event_type = "order.placed", ordered)]
struct OrderPlaced {
    #[outbox(id)]
    order_id: Uuid,
    total_cents: i64,
}

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "forward_rabbitmq.order", event_type = "order.cancelled", ordered)]
struct OrderCancelled {
    #[outbox(id)]
    order_id: Uuid,
    reason: String,
}

const EXCHANGE: &str = "outbox-example.forward_rabbitmq";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let amqp_url = std::env::var("AMQP_URL")
        .unwrap_or_else(|_| "amqp://guest:guest@127.0.0.1:5672/%2f".into());
    let pool = sqlx::PgPool::connect(&database_url).await?;
    outbox_runtime::migrate(&pool).await?;

    // The consumer's topology: the exchange the relay publishes to, and a queue of this run's
    // own bound to it for every routing key of the aggregate type. The queue exists before the
    // relay starts: a message no queue takes would be refused as unroutable (and retried).
    let consumer_connection =
        Connection::connect(&amqp_url, ConnectionProperties::default()).await?;
    let channel = consumer_connection.create_channel().await?;
    channel
        .exchange_declare(
            EXCHANGE.into(),
            ExchangeKind::Topic,
            ExchangeDeclareOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let queue = format!("outbox-example.forward_rabbitmq.{}", Uuid::new_v4().simple());
    let exclusive = QueueDeclareOptions { exclusive: true, ..Default::default() };
    channel.queue_declare(queue.as_str().into(), exclusive, FieldTable::default()).await?;
    let binding = format!("{}.#", OrderPlaced::AGGREGATE_TYPE);
    channel
        .queue_bind(
            queue.as_str().into(),
            EXCHANGE.into(),
            binding.as_str().into(),
            QueueBindOptions::default(),
            FieldTable::default(),
        )
        .await?;

    // The forwarding relay, in the background until shutdown. `from_uri` connects by itself,
    // and again whenever the broker restarted or the network dropped.
    let sink = RabbitSink::from_uri(&amqp_url, ConnectionProperties::default(), EXCHANGE);
    let forward = Forward::to(sink).destination("{aggregate_type}.{event_type}").only([
        (OrderPlaced::AGGREGATE_TYPE, OrderPlaced::EVENT_TYPE),
        (OrderCancelled::AGGREGATE_TYPE, OrderCancelled::EVENT_TYPE),
    ]);
    let relay = Relay::builder(pool.clone()).forward(forward).build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let relay = tokio::spawn(relay.run_until(async {
        let _ = stopped.await;
    }));

    // Producer: the events commit with the business change (here, just the events).
    let (kept, cancelled) = (Uuid::now_v7(), Uuid::now_v7());
    let request = EmitOptions::new().header("request_id", "req-7");
    let mut tx = pool.begin().await?;
    let mut ids = Vec::new();
    for (order_id, total_cents) in [(kept, 1_200), (cancelled, 4_200)] {
        let placed = OrderPlaced { order_id, total_cents };
        ids.push(emit_with(&mut tx, &placed, request.clone()).await?);
    }
    let cancellation = OrderCancelled { order_id: cancelled, reason: "changed my mind".into() };
    ids.push(emit_with(&mut tx, &cancellation, request).await?);
    tx.commit().await?;
    println!("emitted 3 events");

    // Consumer: takes the messages off the queue as they arrive, acknowledging each.
    let mut consumer = channel
        .basic_consume(
            queue.as_str().into(),
            "forward_rabbitmq".into(),
            BasicConsumeOptions::default(),
            FieldTable::default(),
        )
        .await?;
    let mut arrived = Vec::new();
    while !ids.iter().all(|id| arrived.contains(id)) {
        let next = tokio::time::timeout(Duration::from_secs(10), consumer.next()).await;
        let delivery = next.map_err(|_| "no message arrived within 10 s: is the relay running?")?;
        let delivery = delivery.ok_or("the consumer was cancelled")??;
        let properties = &delivery.properties;
        let headers: HashMap<String, String> = properties
            .headers()
            .iter()
            .flatten()
            .filter_map(|(name, value)| match value {
                AMQPValue::LongString(text) => Some((name.to_string(), text.to_string())),
                _ => None,
            })
            .collect();
        let message_id = properties.message_id().as_ref().map(ToString::to_string);
        let header = |name: &str| headers.get(name).map_or("?", String::as_str);
        println!(
            "consumer: {} message_id={} outbox-event-type={} request_id={} payload={}",
            delivery.routing_key,
            message_id.as_deref().unwrap_or("?"),
            header("outbox-event-type"),
            header("request_id"),
            String::from_utf8_lossy(&delivery.data),
        );
        // Messages of an interrupted earlier run's events may come too: printed, not waited for.
        if let Some(id) = message_id.and_then(|id| id.parse::<Uuid>().ok()) {
            arrived.push(id);
        }
        delivery.ack(BasicAckOptions::default()).await?;
    }

    let _ = stop.send(());
    let counts = relay.await??;
    println!("relay forwarded {} events ({} failed)", counts.delivered, counts.failed);
    // The cancellation after the placement of its order, as they were emitted.
    let position = |id| arrived.iter().position(|arrived| *arrived == id);
    if position(ids[1]) > position(ids[2]) {
        return Err("the cancellation arrived before its order's placement".into());
    }
    // Closing the connection deletes the exclusive queue.
    consumer_connection.close(200, "done".into()).await?;
    Ok(())
}
