//! The outbox end to end: a business update and its events commit together, then a relay
//! delivers them to typed handlers, in order (both event types are `ordered`, so one order's
//! events arrive as they were emitted).
//!
//! Run with `cargo run --example quickstart` against the PostgreSQL in `DATABASE_URL`
//! (default: postgres://postgres@127.0.0.1:5432/postgres, set in .cargo/config.toml), or with
//! no server at all on SQLite: `DATABASE_URL=sqlite://quickstart.db?mode=rwc cargo run
//! --example quickstart`, or on MySQL or MariaDB: `DATABASE_URL=mysql://root@127.0.0.1:3306/db`
//! (created if missing). The steps are the same on each: `run` below; only the
//! application's own SQL differs (`Orders`).

use std::time::Duration;

mod shop;

use outbox_runtime::{emit, Backend, EventContext, Relay};
use shop::{OrderCancelled, OrderPlaced};
use tokio::sync::mpsc;
use uuid::Uuid;

/// What the handlers share: here, a channel to report deliveries to `main`.
#[derive(Clone)]
struct AppState {
    delivered: mpsc::UnboundedSender<Uuid>,
}

async fn on_placed(ctx: EventContext<AppState>, event: OrderPlaced) -> Result<(), std::io::Error> {
    println!(
        "handler: order {} placed for {} cents (event {}, earlier failures {}, request {})",
        event.order_id,
        event.total_cents,
        ctx.event_id(),
        ctx.attempts(),
        ctx.header("request_id").unwrap_or("-"),
    );
    let _ = ctx.state().delivered.send(ctx.event_id());
    Ok(())
}

async fn on_cancelled(
    ctx: EventContext<AppState>,
    event: OrderCancelled,
) -> Result<(), std::io::Error> {
    println!("handler: order {} cancelled: {}", event.order_id, event.reason);
    let _ = ctx.state().delivered.send(ctx.event_id());
    Ok(())
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    if url.starts_with("sqlite:") {
        run(sqlx::SqlitePool::connect(&url).await?, Orders::NUMBERED).await
    } else if url.starts_with("mysql:") || url.starts_with("mariadb:") {
        use sqlx::migrate::MigrateDatabase;
        if !sqlx::MySql::database_exists(&url).await? {
            sqlx::MySql::create_database(&url).await?;
        }
        run(sqlx::MySqlPool::connect(&url).await?, Orders::MYSQL).await
    } else {
        run(sqlx::PgPool::connect(&url).await?, Orders::NUMBERED).await
    }
}

/// The application's own statements: its table, placing an order, cancelling it.
struct Orders {
    create: &'static str,
    place: &'static str,
    cancel: &'static str,
}

impl Orders {
    /// PostgreSQL's, which SQLite takes too.
    const NUMBERED: Orders = Orders {
        create: "CREATE TABLE IF NOT EXISTS quickstart_orders \
                 (id uuid PRIMARY KEY, total_cents bigint NOT NULL, state text NOT NULL)",
        place: "INSERT INTO quickstart_orders (id, total_cents, state) VALUES ($1, $2, 'placed')",
        cancel: "UPDATE quickstart_orders SET state = 'cancelled' WHERE id = $1",
    };
    const MYSQL: Orders = Orders {
        create: "CREATE TABLE IF NOT EXISTS quickstart_orders \
                 (id BINARY(16) PRIMARY KEY, total_cents BIGINT NOT NULL, state TEXT NOT NULL)",
        place: "INSERT INTO quickstart_orders (id, total_cents, state) VALUES (?, ?, 'placed')",
        cancel: "UPDATE quickstart_orders SET state = 'cancelled' WHERE id = ?",
    };
}

/// The example on any of the databases. The bounds say that sqlx runs the example's own
/// statements on it (a uuid and an integer bound): an application written for one database
/// needs none of them.
async fn run<DB>(pool: sqlx::Pool<DB>, orders: Orders) -> Result<(), Box<dyn std::error::Error>>
where
    DB: Backend,
    for<'c> &'c mut DB::Connection: sqlx::Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: sqlx::IntoArguments<'q, DB>,
    Uuid: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
    i64: for<'q> sqlx::Encode<'q, DB> + sqlx::Type<DB>,
{
    // 1. Schema: the application's own table, and the outbox's.
    sqlx::query(orders.create).execute(&pool).await?;
    outbox_runtime::migrate(&pool).await?;

    // 2. A business update and its events, in one transaction: both commit or neither does.
    let order_id = Uuid::now_v7();
    let mut tx = pool.begin().await?;
    sqlx::query(orders.place).bind(order_id).bind(4_200_i64).execute(&mut *tx).await?;
    let placed = outbox_runtime::emit_with(
        &mut tx,
        &OrderPlaced { order_id, total_cents: 4_200 },
        outbox_runtime::EmitOptions::new().header("request_id", "req-1"),
    )
    .await?;
    sqlx::query(orders.cancel).bind(order_id).execute(&mut *tx).await?;
    let cancelled =
        emit(&mut tx, &OrderCancelled { order_id, reason: "changed my mind".into() }).await?;
    tx.commit().await?;
    println!("emitted {placed} (order.placed) and {cancelled} (order.cancelled)");

    // 3. The relay delivers them to the typed handlers.
    let (delivered, mut deliveries) = mpsc::unbounded_channel();
    let relay = Relay::builder(pool.clone())
        .state(AppState { delivered })
        .handler(on_placed)
        .handler(on_cancelled)
        .build()?;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run_until(async {
        let _ = stopped.await;
    }));

    let mut waiting = vec![placed, cancelled];
    while !waiting.is_empty() {
        let id = tokio::time::timeout(Duration::from_secs(30), deliveries.recv())
            .await?
            .ok_or("relay stopped")?;
        waiting.retain(|w| *w != id);
    }
    let _ = stop.send(());
    let counts = running.await??;
    let stats = outbox_runtime::stats(&pool).await?;
    println!(
        "relay delivered {} events ({} failed); outbox now has {} pending, {} dead",
        counts.delivered, counts.failed, stats.pending, stats.dead
    );
    Ok(())
}
