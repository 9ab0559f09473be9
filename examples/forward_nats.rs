//! Forwarding to NATS JetStream end to end: events committed with a business update are
//! published by a forwarding relay to a JetStream stream, where any consumer (in any language)
//! reads them with their ids and headers.
//!
//! Run with `cargo run --example forward_nats` against the PostgreSQL in `DATABASE_URL` and the
//! NATS server on 127.0.0.1:4222 (`NATS_URL` to change it). It makes a stream of its own and
//! deletes it at the end.

use std::time::Duration;

use outbox_runtime::forward::nats::async_nats::jetstream::{self, stream};
use outbox_runtime::forward::nats::{async_nats, NatsSink};
use outbox_runtime::forward::Forward;
use outbox_runtime::{emit_with, EmitOptions, OutboxEvent, Relay};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed", ordered)]
struct OrderPlaced {
    #[outbox(id)]
    order_id: Uuid,
    total_cents: i64,
}

const STREAM: &str = "OUTBOX_EXAMPLE";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let nats_url = std::env::var("NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".into());
    let pool = sqlx::PgPool::connect(&database_url).await?;
    outbox_runtime::migrate(&pool).await?;

    // The stream the relay publishes into: every subject under `example.`.
    let client = async_nats::connect(&nats_url).await?;
    let js = jetstream::new(client.clone());
    let _ = js.delete_stream(STREAM).await; // a leftover from an interrupted run
    js.create_stream(stream::Config {
        name: STREAM.into(),
        subjects: vec!["example.>".into()],
        duplicate_window: Duration::from_secs(120),
        ..Default::default()
    })
    .await?;

    // Producer: the events commit with the business change (here, just the events).
    let mut ids = Vec::new();
    let mut tx = pool.begin().await?;
    for total_cents in [1_200, 4_200, 990] {
        let event = OrderPlaced { order_id: Uuid::now_v7(), total_cents };
        let options = EmitOptions::new().header("request_id", format!("req-{total_cents}"));
        ids.push(emit_with(&mut tx, &event, options).await?);
    }
    tx.commit().await?;
    println!("emitted {} events", ids.len());

    // The forwarding relay, until every event is published (a service would run it until
    // shutdown instead: `outbox forward` is the same as a command).
    let forward = Forward::to(NatsSink::new(client, STREAM))
        .destination("example.{aggregate_type}.{event_type}")
        .only([(OrderPlaced::AGGREGATE_TYPE, OrderPlaced::EVENT_TYPE)]);
    let relay = Relay::builder(pool.clone()).forward(forward).build()?;
    let pool_for_check = pool.clone();
    let all_published = async move {
        loop {
            let pending: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM outbox.events WHERE event_id = ANY($1) \
                 AND published_at IS NULL",
            )
            .bind(&ids)
            .fetch_one(&pool_for_check)
            .await
            .unwrap_or(1);
            if pending == 0 {
                return;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    };
    let counts = relay.run_until(all_published).await?;
    println!("relay forwarded {} events ({} failed)", counts.delivered, counts.failed);

    // A consumer's view: the messages in the stream, with their headers.
    let mut stream = js.get_stream(STREAM).await?;
    let stored = stream.info().await?.state.messages;
    for seq in 1..=stored {
        let message = stream.get_raw_message(seq).await?;
        let headers = message.headers;
        println!(
            "consumer: {} id={} request_id={} payload={}",
            message.subject,
            headers.get(async_nats::header::NATS_MESSAGE_ID).map_or("?", |v| v.as_str()),
            headers.get("request_id").map_or("?", |v| v.as_str()),
            String::from_utf8_lossy(&message.payload),
        );
    }
    js.delete_stream(STREAM).await?;
    Ok(())
}
