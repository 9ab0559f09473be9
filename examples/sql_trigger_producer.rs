//! A producer in SQL: a trigger on an application table calls `outbox.emit`, so every change
//! of an order's status becomes an event in the same transaction as the change, whoever makes
//! it (a Rust service, a script, psql). A typed Rust relay then handles those events like any
//! emitted from Rust, in commit order per order (the trigger emits them `ordered`).
//!
//! Run with `cargo run --example sql_trigger_producer` against the PostgreSQL in
//! `DATABASE_URL` (default: postgres://postgres@127.0.0.1:5432/postgres, set in
//! .cargo/config.toml). It creates (or replaces) the table `sql_trigger_producer_orders` with its
//! trigger and function, and deletes its own orders at the end.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::{EventContext, OutboxEvent, Relay};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use uuid::Uuid;

/// The event the trigger writes, as the Rust side reads it: the names in `#[outbox]` are the
/// ones the trigger passes to `outbox.emit`, the fields its payload's keys.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "sql_trigger_producer.order", event_type = "order.status_changed", ordered)]
struct OrderStatusChanged {
    #[outbox(id)]
    order_id: Uuid,
    status: String,
    total_cents: i64,
}

/// The application's table and its trigger. Every statement replaces what an earlier run made,
/// so a changed trigger takes effect on the next run; the advisory lock keeps two runs at once
/// from replacing the function together (PostgreSQL refuses concurrent replacements).
const SCHEMA: &str = "
SELECT pg_advisory_xact_lock(hashtext('sql_trigger_producer schema'));

CREATE TABLE IF NOT EXISTS sql_trigger_producer_orders (
    id          uuid   PRIMARY KEY,
    status      text   NOT NULL,
    total_cents bigint NOT NULL
);

CREATE OR REPLACE FUNCTION sql_trigger_producer_orders_outbox() RETURNS trigger
    LANGUAGE plpgsql AS $$
BEGIN
    -- In the transaction of the change: both commit, or neither does.
    PERFORM outbox.emit(
        aggregate_type => 'sql_trigger_producer.order',
        aggregate_id   => NEW.id::text,
        event_type     => 'order.status_changed',
        payload        => jsonb_build_object('order_id', NEW.id, 'status', NEW.status,
                                             'total_cents', NEW.total_cents),
        headers        => jsonb_build_object('table', TG_TABLE_NAME, 'operation', TG_OP),
        ordered        => true);
    RETURN NULL;
END
$$;

-- Inserts, and updates that set `status`: other changes emit nothing.
CREATE OR REPLACE TRIGGER sql_trigger_producer_orders_outbox
    AFTER INSERT OR UPDATE OF status ON sql_trigger_producer_orders
    FOR EACH ROW EXECUTE FUNCTION sql_trigger_producer_orders_outbox();
";

/// Every event the handler received, in the order it received them.
type Received = Arc<Mutex<Vec<OrderStatusChanged>>>;

async fn on_status_changed(
    ctx: EventContext<Received>,
    event: OrderStatusChanged,
) -> Result<(), std::io::Error> {
    println!(
        "handler: order {} is {} ({} cents), from {} on {}",
        event.order_id,
        event.status,
        event.total_cents,
        ctx.header("operation").unwrap_or("?"),
        ctx.header("table").unwrap_or("?"),
    );
    ctx.state().lock().unwrap().push(event);
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
    // The outbox first: the trigger's function calls `outbox.emit`, which a migration makes.
    outbox_runtime::migrate(&pool).await?;
    let mut tx = pool.begin().await?;
    sqlx::raw_sql(SCHEMA).execute(&mut *tx).await?;
    tx.commit().await?;

    // Plain SQL, no outbox code: the trigger emits.
    let (order, abandoned) = (Uuid::now_v7(), Uuid::now_v7());
    let execute = |sql: &'static str, id: Uuid| sqlx::query(sql).bind(id).execute(&pool);
    execute("INSERT INTO sql_trigger_producer_orders VALUES ($1, 'placed', 4200)", order).await?;
    execute("UPDATE sql_trigger_producer_orders SET status = 'paid' WHERE id = $1", order).await?;
    // A transaction that rolls back takes the events its triggers wrote with it.
    let mut tx = pool.begin().await?;
    sqlx::query("INSERT INTO sql_trigger_producer_orders VALUES ($1, 'placed', 100)")
        .bind(abandoned)
        .execute(&mut *tx)
        .await?;
    sqlx::query("UPDATE sql_trigger_producer_orders SET status = 'cancelled' WHERE id = $1")
        .bind(order)
        .execute(&mut *tx)
        .await?;
    tx.rollback().await?;
    // Not a status change: no event.
    execute("UPDATE sql_trigger_producer_orders SET total_cents = 4300 WHERE id = $1", order)
        .await?;
    execute("UPDATE sql_trigger_producer_orders SET status = 'shipped' WHERE id = $1", order)
        .await?;
    println!("order {order}: placed, paid, (cancelled, rolled back), repriced, shipped");

    let received = Received::default();
    let relay =
        Relay::builder(pool.clone()).state(received.clone()).handler(on_status_changed).build()?;
    // Events of an interrupted earlier run are delivered too, and left out of what is checked.
    let ours = {
        let received = received.clone();
        move || -> Vec<OrderStatusChanged> {
            let received = received.lock().unwrap();
            received.iter().filter(|event| event.order_id == order).cloned().collect()
        }
    };
    let three_received = {
        let ours = ours.clone();
        async move {
            while ours().len() < 3 {
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    let counts = tokio::time::timeout(Duration::from_secs(20), relay.run_until(three_received))
        .await
        .map_err(|_| "the trigger's events were not delivered within 20 s")??;
    println!("relay delivered {} events ({} failed)", counts.delivered, counts.failed);

    let rows: Vec<(String, i64)> = sqlx::query_as(
        "SELECT aggregate_id, count(*) FROM outbox.events \
         WHERE aggregate_type = $1 AND aggregate_id IN ($2, $3) GROUP BY aggregate_id",
    )
    .bind(OrderStatusChanged::AGGREGATE_TYPE)
    .bind(order.to_string())
    .bind(abandoned.to_string())
    .fetch_all(&pool)
    .await?;
    sqlx::query("DELETE FROM sql_trigger_producer_orders WHERE id = $1")
        .bind(order)
        .execute(&pool)
        .await?;

    let changed = |status: &str, total_cents| OrderStatusChanged {
        order_id: order,
        status: status.into(),
        total_cents,
    };
    let expected = [changed("placed", 4200), changed("paid", 4200), changed("shipped", 4300)];
    if ours() != expected {
        return Err(format!("expected {expected:?} in this order, got {:?}", ours()).into());
    }
    if rows != [(order.to_string(), 3)] {
        return Err(format!("expected 3 events of the order and none else, got {rows:?}").into());
    }
    println!("three committed status changes delivered in commit order; nothing rolled back");
    Ok(())
}
