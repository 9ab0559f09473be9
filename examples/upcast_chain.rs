//! Evolving events: a handler of today's type receives the rows of every older version, as
//! today's type.
//!
//! `OrderEvent` is an enum family: one Rust type, one handler, for the event types
//! `order.placed` and `order.cancelled` of one aggregate. Its `order.placed` variant holds
//! `OrderPlaced`, version 3, which reads version 2 through its `upcast_from` chain
//! (`OrderPlacedV2`, kept for that alone) and version 1, whose struct was deleted long ago,
//! through a JSON upcaster registered on the relay. The old versions' rows are written here
//! with plain SQL, as the producers of the day wrote them.
//!
//! Run with `cargo run --example upcast_chain` against the PostgreSQL in `DATABASE_URL`
//! (default: postgres://postgres@127.0.0.1:5432/postgres, set in .cargo/config.toml).

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::{emit, EventContext, OutboxEvent, Relay};
use serde::{Deserialize, Serialize};
use serde_json::json;
use sqlx::PgPool;
use uuid::Uuid;

// Version 1 of `order.placed` was `{"order_id": ..., "total": 12}`, the total in whole euros.
// Its struct is gone; the relay's JSON upcaster below turns its rows into version 2's JSON.

// The aggregate type `upcast_chain.order` is this example's own: its relay leases only these
// events, never those of other programs sharing the outbox.

/// Version 2 of `order.placed`: the total in cents. Kept only to read the rows written at
/// version 2, and as the start of the `upcast_from` chain.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "upcast_chain.order", event_type = "order.placed", version = 2)]
struct OrderPlacedV2 {
    #[outbox(id)]
    order_id: Uuid,
    total_cents: i64,
}

/// Version 3, today's: the amount with its currency.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(
    aggregate = "upcast_chain.order",
    event_type = "order.placed",
    version = 3,
    upcast_from = OrderPlacedV2
)]
struct OrderPlaced {
    #[outbox(id)]
    order_id: Uuid,
    amount_cents: i64,
    currency: String,
}

/// Before version 3 every order was in euros.
impl From<OrderPlacedV2> for OrderPlaced {
    fn from(v2: OrderPlacedV2) -> Self {
        OrderPlaced { order_id: v2.order_id, amount_cents: v2.total_cents, currency: "EUR".into() }
    }
}

/// Every event of an order, for one handler. A newtype variant reads every version its struct
/// reads; a struct variant is an event type of the family's own.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "upcast_chain.order")]
enum OrderEvent {
    #[outbox(event_type = "order.placed")]
    Placed(OrderPlaced),
    #[outbox(event_type = "order.cancelled")]
    Cancelled {
        #[outbox(id)]
        order_id: Uuid,
        reason: String,
    },
}

/// What the handler received, by event id: the version the row was written at, and the event.
type Received = Arc<Mutex<HashMap<Uuid, (u32, OrderEvent)>>>;

async fn on_order(ctx: EventContext<Received>, event: OrderEvent) -> Result<(), Infallible> {
    println!("handler: stored at version {}, received as {event:?}", ctx.version());
    ctx.state().lock().unwrap().insert(ctx.event_id(), (ctx.version(), event));
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

    // Rows as the old producers wrote them: plain INSERTs, the version in `event_version`
    // (`event_id` defaults to a time-ordered id made by the database).
    let (first, second, third) = (Uuid::now_v7(), Uuid::now_v7(), Uuid::now_v7());
    let v1 = insert_old(&pool, first, 1, json!({ "order_id": first, "total": 12 })).await?;
    let v2 =
        insert_old(&pool, second, 2, json!({ "order_id": second, "total_cents": 4_250 })).await?;
    println!("old producers wrote {v1} (version 1) and {v2} (version 2)");

    // Today's producer emits the family's values: each is stored as its variant's event type.
    let placed = OrderPlaced { order_id: third, amount_cents: 990, currency: "USD".into() };
    let cancelled = OrderEvent::Cancelled { order_id: first, reason: "out of stock".into() };
    let mut tx = pool.begin().await?;
    let v3 = emit(&mut tx, &OrderEvent::Placed(placed.clone())).await?;
    let cancel = emit(&mut tx, &cancelled).await?;
    tx.commit().await?;
    println!("today's producer emitted {v3} (version 3) and {cancel} (order.cancelled)");

    // What the handler must get: every row as today's `OrderEvent`.
    let euros = |order_id, amount_cents| {
        OrderEvent::Placed(OrderPlaced { order_id, amount_cents, currency: "EUR".into() })
    };
    let expected = HashMap::from([
        (v1, (1, euros(first, 1_200))),
        (v2, (2, euros(second, 4_250))),
        (v3, (3, OrderEvent::Placed(placed))),
        (cancel, (1, cancelled)),
    ]);

    let received = Received::default();
    let relay = Relay::builder(pool.clone())
        .state(received.clone())
        .handler(on_order)
        // Version 1 -> 2: the last step the Rust types cannot take. The relay runs it, then the
        // `upcast_from` chain (2 -> 3). `build` checks that the handler's type needs it.
        .upcast_json::<OrderEvent, _>(OrderPlaced::EVENT_TYPE, 1, |mut v1| {
            let total = v1["total"].as_i64().ok_or("`total` is not an integer")?;
            v1["total_cents"] = (total * 100).into();
            Ok::<_, &str>(v1)
        })
        .build()?;
    let all_received = {
        let received = received.clone();
        let ids: Vec<Uuid> = expected.keys().copied().collect();
        async move {
            while !ids.iter().all(|id| received.lock().unwrap().contains_key(id)) {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let counts = tokio::time::timeout(Duration::from_secs(20), relay.run_until(all_received))
        .await
        .map_err(|_| "the handler did not receive every event within 20 s")??;
    println!("relay delivered {} events ({} failed)", counts.delivered, counts.failed);

    // Rows of an interrupted earlier run may have come along too: only this run's are checked.
    let received = received.lock().unwrap();
    for (id, want) in &expected {
        if received.get(id) != Some(want) {
            return Err(format!("event {id}: expected {want:?}, got {:?}", received.get(id)).into());
        }
    }
    println!("versions 1, 2 and 3 all reached the handler as today's OrderEvent");
    Ok(())
}

/// Inserts an `order.placed` row written at `version`, as a producer of that version did.
async fn insert_old(
    pool: &PgPool,
    order_id: Uuid,
    version: i32,
    payload: serde_json::Value,
) -> Result<Uuid, sqlx::Error> {
    sqlx::query_scalar(
        "INSERT INTO outbox.events (aggregate_type, aggregate_id, event_type, event_version, \
                                    payload) \
         VALUES ($1, $2, $3, $4, $5) RETURNING event_id",
    )
    .bind(OrderPlaced::AGGREGATE_TYPE)
    .bind(order_id.to_string())
    .bind(OrderPlaced::EVENT_TYPE)
    .bind(version)
    .bind(payload)
    .fetch_one(pool)
    .await
}
