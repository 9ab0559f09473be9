//! Forwarding to Redis Streams end to end: a relay runs beside the application, as in a
//! service, and appends each committed event to its aggregate type's stream, where a consumer
//! (in any language) reads it with its id, headers and payload as entry fields. An order's
//! events are `ordered`: its cancellation never arrives before its placement.
//!
//! Run with `cargo run --example forward_redis` against the PostgreSQL in `DATABASE_URL` and the
//! Redis on 127.0.0.1:6379 (`REDIS_URL` to change it). It appends to a stream of its own and
//! deletes it at the end.

mod shop;

use outbox_runtime::forward::redis::redis::streams::{StreamReadOptions, StreamReadReply};
use outbox_runtime::forward::redis::redis::{self, AsyncCommands};
use outbox_runtime::forward::redis::{RedisSink, Trim};
use outbox_runtime::forward::Forward;
use outbox_runtime::{emit, OutboxEvent, Relay};
use shop::{OrderCancelled, OrderPlaced};
use uuid::Uuid;

/// The stream the destination template below makes for the aggregate type `order`.
const STREAM: &str = "outbox-example:order";

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let database_url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let redis_url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379".into());
    let pool = sqlx::PgPool::connect(&database_url).await?;
    outbox_runtime::migrate(&pool).await?;
    let client = redis::Client::open(redis_url)?;
    let sink_connection = client.get_connection_manager().await?;
    // The consumer's own connection: a blocking read holds up every command behind it.
    let mut consumer = client.get_multiplexed_async_connection().await?;
    let _: () = consumer.del(STREAM).await?; // a leftover from an interrupted run

    // The forwarding relay, in the background until shutdown; each append trims the stream to
    // about 10,000 entries.
    let forward = Forward::to(RedisSink::new(sink_connection).trim(Trim::MaxLen(10_000)))
        .destination("outbox-example:{aggregate_type}")
        .only([
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
    let mut tx = pool.begin().await?;
    emit(&mut tx, &OrderPlaced { order_id: kept, total_cents: 1_200 }).await?;
    emit(&mut tx, &OrderPlaced { order_id: cancelled, total_cents: 4_200 }).await?;
    emit(&mut tx, &OrderCancelled { order_id: cancelled, reason: "changed my mind".into() })
        .await?;
    tx.commit().await?;
    println!("emitted 3 events");

    // Consumer: reads the entries as they arrive.
    let options = StreamReadOptions::default().block(10_000).count(10);
    let (mut last, mut seen) = ("0".to_owned(), 0);
    while seen < 3 {
        let reply: StreamReadReply = consumer.xread_options(&[STREAM], &[&last], &options).await?;
        if reply.keys.is_empty() {
            return Err("no entry arrived within 10 s: is the relay running?".into());
        }
        for entry in reply.keys.iter().flat_map(|stream| &stream.ids) {
            let field = |name| entry.get::<String>(name).unwrap_or_default();
            println!(
                "consumer: entry {} {} of order {}: id={} payload={}",
                entry.id,
                field("h:outbox-event-type"),
                field("key"),
                field("id"),
                field("payload"),
            );
            last.clone_from(&entry.id);
            seen += 1;
        }
    }

    let _ = stop.send(());
    let counts = relay.await??;
    println!("relay forwarded {} events ({} failed)", counts.delivered, counts.failed);
    let _: () = consumer.del(STREAM).await?;
    Ok(())
}
