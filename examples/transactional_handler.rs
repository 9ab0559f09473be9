//! A transactional handler: its writes and the event's acknowledgement commit in one
//! transaction, so a projection counts each event exactly once, even when a delivery fails
//! after it wrote (those writes roll back with the failed attempt) and the relay retries it.
//!
//! Three orders are placed, each an `OrderPlaced` event; a handler taking `TransactionContext`
//! adds each order to its customer's row of a projection table through `ctx.tx()`. Its first
//! delivery of one order fails right after the write, as a crash or a lost connection would:
//! the projection still counts that order once.
//!
//! Run with `cargo run --example transactional_handler` against the PostgreSQL in
//! `DATABASE_URL` (default: postgres://postgres@127.0.0.1:5432/postgres, set in
//! .cargo/config.toml). Its table is `transactional_handler_customers`; each run projects
//! customers of its own and deletes their rows at the end.

use std::collections::HashSet;
use std::sync::atomic::{AtomicU32, Ordering::Relaxed};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::{emit, Backoff, BoxError, OutboxEvent, Relay, TransactionContext};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

/// An order was placed. The aggregate type is this example's own: its relay leases only these
/// events, never those of other programs sharing the outbox.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "transactional_handler.order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: Uuid,
    customer_id: Uuid,
    total_cents: i64,
}

/// What the handler shares with `main`: which orders to fail once after the write, and how
/// often it was called.
#[derive(Clone, Default)]
struct Harness {
    fail_once: Arc<Mutex<HashSet<Uuid>>>,
    calls: Arc<AtomicU32>,
}

/// Adds the order to its customer's totals, in the transaction the event is acknowledged in.
async fn project(mut ctx: TransactionContext<Harness>, event: OrderPlaced) -> Result<(), BoxError> {
    ctx.state().calls.fetch_add(1, Relaxed);
    // `&mut **ctx.tx()` is an executor: this write commits with the acknowledgement, or not at
    // all. No "already applied?" bookkeeping is needed, unlike a handler with its own
    // transaction, where a crash between its commit and the acknowledgement applies it twice.
    sqlx::query(
        "INSERT INTO transactional_handler_customers (customer_id, orders, total_cents) \
         VALUES ($1, 1, $2) \
         ON CONFLICT (customer_id) DO UPDATE SET \
             orders = transactional_handler_customers.orders + 1, \
             total_cents = transactional_handler_customers.total_cents + EXCLUDED.total_cents",
    )
    .bind(event.customer_id)
    .bind(event.total_cents)
    .execute(&mut **ctx.tx())
    .await?;
    if ctx.state().fail_once.lock().unwrap().remove(&event.order_id) {
        println!("handler: order {} written, then failing: the write rolls back", event.order_id);
        return Err("simulated failure after the write".into());
    }
    println!("handler: order {} of {} cents projected", event.order_id, event.total_cents);
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let pool = PgPool::connect(&url).await?;
    outbox_runtime::migrate(&pool).await?;
    // The projection: one row per customer. Its rows are keyed by customers made up per run,
    // so rows left by an interrupted run (or its events, delivered late) never mix with these.
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS transactional_handler_customers \
         (customer_id uuid PRIMARY KEY, orders integer NOT NULL, total_cents bigint NOT NULL)",
    )
    .execute(&pool)
    .await?;

    let (alice, bob) = (Uuid::now_v7(), Uuid::now_v7());
    let orders = [(alice, 1_200), (alice, 3_000), (bob, 990)];
    let mut tx = pool.begin().await?;
    let mut ids = Vec::new();
    let mut placed = Vec::new();
    for (customer_id, total_cents) in orders {
        let order_id = Uuid::now_v7();
        ids.push(emit(&mut tx, &OrderPlaced { order_id, customer_id, total_cents }).await?);
        placed.push(order_id);
    }
    tx.commit().await?;
    println!("placed 3 orders: 2 for alice ({alice}), 1 for bob ({bob})");

    // Alice's second order fails once after its write; a retry 100-200 ms later succeeds.
    let harness = Harness::default();
    harness.fail_once.lock().unwrap().insert(placed[1]);
    let relay = Relay::builder(pool.clone())
        .state(harness.clone())
        .handler(project)
        .poll_interval(Duration::from_millis(100))
        .backoff(Backoff { base: Duration::from_millis(200), ..Backoff::default() })
        .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run_until(async {
        let _ = stopped.await;
    }));
    tokio::time::timeout(Duration::from_secs(20), all_published(&pool, &ids))
        .await
        .map_err(|_| "the events were not all delivered within 20 s")??;
    let _ = stop.send(());
    let counts = running.await??;
    println!(
        "relay: {} deliveries, {} failed; the handler was called {} times",
        counts.delivered,
        counts.failed,
        harness.calls.load(Relaxed)
    );

    // The projection afterwards: every order once, the failed attempt's write gone.
    let rows: Vec<(Uuid, i32, i64)> = sqlx::query_as(
        "SELECT customer_id, orders, total_cents FROM transactional_handler_customers \
         WHERE customer_id = ANY($1) ORDER BY customer_id",
    )
    .bind([alice, bob])
    .fetch_all(&pool)
    .await?;
    println!("transactional_handler_customers:");
    for (customer_id, orders, total_cents) in &rows {
        let name = if *customer_id == alice { "alice" } else { "bob" };
        println!("  {name:5} {customer_id}  orders={orders}  total_cents={total_cents}");
    }
    sqlx::query("DELETE FROM transactional_handler_customers WHERE customer_id = ANY($1)")
        .bind([alice, bob])
        .execute(&pool)
        .await?;

    if !harness.fail_once.lock().unwrap().is_empty() {
        return Err("the handler never failed after its write: nothing was shown".into());
    }
    let mut expected = vec![(alice, 2, 4_200), (bob, 1, 990)];
    expected.sort(); // as the query orders them
    if rows != expected {
        return Err(format!("the projection counts an order twice or not at all: {rows:?}").into());
    }
    println!("each order projected exactly once, though one was written twice");
    Ok(())
}

/// Resolves once every event in `ids` is published; fails at once if one is dead.
async fn all_published(pool: &PgPool, ids: &[Uuid]) -> Result<(), Box<dyn std::error::Error>> {
    loop {
        let (pending, dead): (i64, i64) = sqlx::query_as(
            "SELECT count(*) FILTER (WHERE published_at IS NULL), \
                    count(*) FILTER (WHERE dead_at IS NOT NULL) \
             FROM outbox.events WHERE event_id = ANY($1)",
        )
        .bind(ids)
        .fetch_one(pool)
        .await?;
        if dead > 0 {
            return Err(format!("{dead} of the events are dead letters").into());
        }
        if pending == 0 {
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
