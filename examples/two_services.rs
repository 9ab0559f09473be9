//! Two services, each with its own database, joined by NATS JetStream and exactly-once at both
//! ends: `orders` commits an order with its `OrderPlaced` event and a forwarding relay publishes
//! it; `billing` consumes the stream through its inbox, writing each invoice and emitting its
//! own `InvoiceIssued` in the transaction that records the message. The broker is made to deliver
//! one message twice: billing writes one invoice per order all the same.
//!
//! Run with `cargo run --example two_services` against the PostgreSQL server in `DATABASE_URL`
//! (it creates the databases `outbox_example_orders` and `outbox_example_billing` there) and NATS
//! on 127.0.0.1:4222 (`NATS_URL`). It makes a stream of its own and deletes it at the end.

use std::str::FromStr;
use std::time::Duration;

use outbox_runtime::forward::nats::async_nats::jetstream::{self, consumer, stream};
use outbox_runtime::forward::nats::{async_nats, NatsSink};
use outbox_runtime::forward::Forward;
use outbox_runtime::inbox::{self, Inbox, InboxContext};
use outbox_runtime::{emit, OutboxEvent, Relay};
use serde::{Deserialize, Serialize};
use sqlx::postgres::PgConnectOptions;
use sqlx::PgPool;
use uuid::Uuid;

/// Published by `orders`, read by `billing` (each service declares it; the derive and the
/// headers agree on the type and version).
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: Uuid,
    total_cents: i64,
}

/// `billing`'s own event, emitted in the inbox's transaction.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "invoice", event_type = "invoice.issued")]
struct InvoiceIssued {
    #[outbox(id)]
    order_id: Uuid,
    cents: i64,
}

const STREAM: &str = "OUTBOX_TWO_SERVICES";
const ORDERS: usize = 5;

/// A database of the example's own on the server of `DATABASE_URL`, migrated.
async fn service_database(server: &PgPool, url: &str, name: &str) -> Result<PgPool, sqlx::Error> {
    let exists: bool =
        sqlx::query_scalar("SELECT EXISTS (SELECT FROM pg_database WHERE datname = $1)")
            .bind(name)
            .fetch_one(server)
            .await?;
    if !exists {
        // A name of this example's own, not input: formatting it in is safe.
        sqlx::raw_sql(&format!("CREATE DATABASE {name}")).execute(server).await?;
    }
    let pool = PgPool::connect_with(PgConnectOptions::from_str(url)?.database(name)).await?;
    outbox_runtime::migrate(&pool).await.map_err(|e| sqlx::Error::Protocol(e.to_string()))?;
    Ok(pool)
}

/// `billing`'s handler: the invoice and its event, with the inbox's record, or nothing.
async fn bill(mut ctx: InboxContext, order: OrderPlaced) -> Result<(), outbox_runtime::BoxError> {
    sqlx::query("INSERT INTO invoices (order_id, cents) VALUES ($1, $2)")
        .bind(order.order_id)
        .bind(order.total_cents)
        .execute(&mut **ctx.tx())
        .await?;
    emit(ctx.tx(), &InvoiceIssued { order_id: order.order_id, cents: order.total_cents }).await?;
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), outbox_runtime::BoxError> {
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let nats_url = std::env::var("NATS_URL").unwrap_or_else(|_| "127.0.0.1:4222".into());
    let server = PgPool::connect(&url).await?;
    let orders = service_database(&server, &url, "outbox_example_orders").await?;
    let billing = service_database(&server, &url, "outbox_example_billing").await?;
    sqlx::raw_sql(
        "CREATE TABLE IF NOT EXISTS invoices (order_id uuid PRIMARY KEY, cents bigint NOT NULL); \
         TRUNCATE invoices, outbox.inbox, outbox.events", // the example's own, from a last run
    )
    .execute(&billing)
    .await?;

    let client = async_nats::connect(&nats_url).await?;
    let js = jetstream::new(client.clone());
    let _ = js.delete_stream(STREAM).await; // a leftover from an interrupted run
    let stream = js
        .create_stream(stream::Config {
            name: STREAM.into(),
            subjects: vec!["shop.>".into()],
            ..Default::default()
        })
        .await?;

    // orders: each order commits with its event; a forwarding relay publishes them.
    let mut tx = orders.begin().await?;
    for n in 1..=ORDERS as i64 {
        emit(&mut tx, &OrderPlaced { order_id: Uuid::now_v7(), total_cents: n * 1_000 }).await?;
    }
    tx.commit().await?;
    let forward =
        Forward::to(NatsSink::new(client.clone(), STREAM)).destination("shop.{event_type}");
    let relay = Relay::builder(orders.clone()).forward(forward).build()?;
    let (stop_relay, relay_stopped) = tokio::sync::oneshot::channel::<()>();
    let relay = tokio::spawn(relay.run_until(async {
        let _ = relay_stopped.await;
    }));

    // billing: a durable consumer of the stream, through its inbox.
    let consumer = stream
        .create_consumer(consumer::pull::Config {
            durable_name: Some("billing".into()),
            ..Default::default()
        })
        .await?;
    let inbox = Inbox::builder(billing.clone(), "billing").handler(bill).build()?;
    let (stop_billing, billing_stopped) = tokio::sync::oneshot::channel::<()>();
    let consuming = tokio::spawn(async move {
        inbox::nats::consume(&inbox, &consumer, async {
            let _ = billing_stopped.await;
        })
        .await
    });

    // The broker delivers the first order again (a redelivery after a lost acknowledgement
    // looks the same to billing): published anew under another message id.
    let first = loop {
        match stream.clone().get_raw_message(1).await {
            Ok(message) => break message,
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    };
    let mut headers = first.headers.clone();
    headers.insert(async_nats::header::NATS_MESSAGE_ID, Uuid::new_v4().to_string().as_str());
    js.publish_with_headers(first.subject.to_string(), headers, first.payload.clone())
        .await?
        .await?;

    // Until billing has handled every message the stream holds, the copy included.
    let count = |pool: PgPool, sql: &'static str| async move {
        sqlx::query_scalar::<_, i64>(sql).fetch_one(&pool).await
    };
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while count(billing.clone(), "SELECT count(*) FROM outbox.inbox WHERE handled_at IS NOT NULL")
        .await?
        < ORDERS as i64
        || stream.clone().info().await?.state.messages < ORDERS as u64 + 1
        || consumer_pending(&js).await? > 0
    {
        assert!(tokio::time::Instant::now() < deadline, "billing did not catch up within 60 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = stop_billing.send(());
    consuming.await??;
    let _ = stop_relay.send(());
    relay.await??;

    let messages = stream.clone().info().await?.state.messages;
    let invoices = count(billing.clone(), "SELECT count(*) FROM invoices").await?;
    let issued = count(billing.clone(), "SELECT count(*) FROM outbox.events").await?;
    println!(
        "orders: {ORDERS} orders placed, {messages} messages in the stream (one delivered twice)"
    );
    println!("billing: {invoices} invoices written, {issued} InvoiceIssued events in its outbox");
    assert_eq!((invoices, issued), (ORDERS as i64, ORDERS as i64), "each order billed once");
    js.delete_stream(STREAM).await?;
    Ok(())
}

/// Messages billing's consumer has yet to deliver or to have acknowledged.
async fn consumer_pending(js: &jetstream::Context) -> Result<u64, outbox_runtime::BoxError> {
    let mut consumer: consumer::PullConsumer =
        js.get_stream(STREAM).await?.get_consumer("billing").await?;
    let info = consumer.info().await?;
    Ok(info.num_pending + info.num_ack_pending as u64)
}
