//! An HTTP service with the outbox: `POST /orders` inserts the order and emits its
//! `OrderPlaced` in one sqlx transaction, so an order is never saved without its event nor
//! announced without being saved; a relay in the same process delivers the events; and one
//! signal shuts both down gracefully (the server finishes its requests, the relay its
//! deliveries).
//!
//! A service waits for Ctrl-C or SIGTERM; this example, to end by itself, also sends the
//! signal once it made a few requests (with a plain HTTP/1.1 client over a `TcpStream`) and saw
//! their events delivered.
//!
//! Run with `cargo run --example axum_service` against the PostgreSQL in `DATABASE_URL`
//! (default: postgres://postgres@127.0.0.1:5432/postgres, set in .cargo/config.toml). It
//! listens on a free port of 127.0.0.1, stores orders in `axum_service_orders` and deletes its
//! own at the end.

use std::net::SocketAddr;
use std::time::Duration;

use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::routing::post;
use axum::{Json, Router};
use outbox_runtime::{emit_with, EmitOptions, EventContext, OutboxEvent, Relay};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

/// An order was placed. The aggregate type is this example's own: its relay leases only these
/// events, never those of other programs sharing the outbox.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "axum_service.order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: Uuid,
    customer: String,
    total_cents: i64,
}

/// The request body of `POST /orders`.
#[derive(Deserialize)]
struct NewOrder {
    customer: String,
    total_cents: i64,
}

/// The response to `POST /orders`.
#[derive(Serialize, Deserialize)]
struct Created {
    order_id: Uuid,
    event_id: Uuid,
}

/// `POST /orders`: the order and its event in one transaction.
async fn create_order(
    State(pool): State<PgPool>,
    headers: HeaderMap,
    Json(order): Json<NewOrder>,
) -> Result<(StatusCode, Json<Created>), (StatusCode, String)> {
    if order.total_cents <= 0 {
        return Err((StatusCode::UNPROCESSABLE_ENTITY, "total_cents must be positive\n".into()));
    }
    let request_id = headers.get("x-request-id").and_then(|v| v.to_str().ok()).unwrap_or("-");
    let order_id = Uuid::now_v7();
    let mut tx = pool.begin().await.map_err(internal)?;
    sqlx::query("INSERT INTO axum_service_orders (id, customer, total_cents) VALUES ($1, $2, $3)")
        .bind(order_id)
        .bind(&order.customer)
        .bind(order.total_cents)
        .execute(&mut *tx)
        .await
        .map_err(internal)?;
    let placed = OrderPlaced { order_id, customer: order.customer, total_cents: order.total_cents };
    // The request id travels with the event, for the handler's logs.
    let options = EmitOptions::new().header("request_id", request_id);
    let event_id = emit_with(&mut tx, &placed, options).await.map_err(internal)?;
    // Until here an error drops `tx`, which rolls back the order and its event together.
    tx.commit().await.map_err(internal)?;
    Ok((StatusCode::CREATED, Json(Created { order_id, event_id })))
}

/// A 500 that logs the cause and does not show it to the client.
fn internal(error: impl std::fmt::Display) -> (StatusCode, String) {
    eprintln!("server: {error}");
    (StatusCode::INTERNAL_SERVER_ERROR, "internal error\n".into())
}

/// The relay's handler: here it reports each delivered order to `main`, where a service would
/// send a confirmation mail.
async fn send_confirmation(
    ctx: EventContext<mpsc::UnboundedSender<Uuid>>,
    event: OrderPlaced,
) -> Result<(), std::io::Error> {
    println!(
        "relay: confirming order {} to {} ({} cents, request {})",
        event.order_id,
        event.customer,
        event.total_cents,
        ctx.header("request_id").unwrap_or("-")
    );
    let _ = ctx.state().send(event.order_id);
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
    sqlx::query(
        "CREATE TABLE IF NOT EXISTS axum_service_orders (id uuid PRIMARY KEY, \
         customer text NOT NULL, total_cents bigint NOT NULL)",
    )
    .execute(&pool)
    .await?;

    // One signal for the server and the relay: each waits on its own clone of the token. Here
    // Ctrl-C sends it (in a container, SIGTERM too, through `tokio::signal::unix`), and `main`
    // once its requests are done.
    let shutdown = CancellationToken::new();
    tokio::spawn({
        let shutdown = shutdown.clone();
        async move {
            let _ = tokio::signal::ctrl_c().await;
            shutdown.cancel();
        }
    });

    let (delivered, mut deliveries) = mpsc::unbounded_channel();
    let relay = Relay::builder(pool.clone())
        .state(delivered)
        .handler(send_confirmation)
        // Shutdown must end within the grace period the service's supervisor gives it.
        .shutdown_timeout(Duration::from_secs(10))
        .build()?;
    let relay = tokio::spawn(relay.run_until(shutdown.clone().cancelled_owned()));

    let app = Router::new().route("/orders", post(create_order)).with_state(pool.clone());
    // Port 0: a free port, so runs at the same time do not clash.
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let server =
        axum::serve(listener, app).with_graceful_shutdown(shutdown.clone().cancelled_owned());
    let server = tokio::spawn(async move { server.await });
    println!("serving http://{addr}/orders");

    // The client's part: three orders and one the service refuses.
    let mut created = Vec::new();
    for (n, (customer, total_cents)) in
        [("alice", 1_200), ("bob", 4_200), ("carol", 990)].into_iter().enumerate()
    {
        let body = serde_json::json!({ "customer": customer, "total_cents": total_cents });
        let (status, body) =
            http_post(addr, "/orders", &format!("req-{n}"), &body.to_string()).await?;
        println!("client: POST /orders for {customer} -> {status} {}", body.trim());
        if status != 201 {
            return Err(format!("expected 201 Created, got {status}").into());
        }
        created.push(serde_json::from_str::<Created>(&body)?.order_id);
    }
    let refused = r#"{"customer": "mallory", "total_cents": -5}"#;
    let (status, body) = http_post(addr, "/orders", "req-refused", refused).await?;
    println!("client: POST /orders for mallory -> {status} {}", body.trim());
    if status != 422 {
        return Err(format!("expected 422 for a negative total, got {status}").into());
    }

    // Once the relay delivered this run's orders, the signal.
    let mut waiting = created.clone();
    while !waiting.is_empty() {
        let next = tokio::time::timeout(Duration::from_secs(15), deliveries.recv()).await;
        let order_id = next.map_err(|_| "not every order was delivered within 15 s")?;
        let order_id = order_id.ok_or("the relay stopped")?;
        waiting.retain(|waiting| *waiting != order_id);
    }
    println!("signalling shutdown");
    shutdown.cancel();
    server.await??;
    let counts = relay.await??;
    println!(
        "server stopped; relay stopped after {} deliveries ({} failed)",
        counts.delivered, counts.failed
    );

    let saved: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM axum_service_orders WHERE id = ANY($1) OR customer = 'mallory'",
    )
    .bind(&created)
    .fetch_one(&pool)
    .await?;
    sqlx::query("DELETE FROM axum_service_orders WHERE id = ANY($1)")
        .bind(&created)
        .execute(&pool)
        .await?;
    if saved != 3 {
        return Err(format!("expected the 3 accepted orders saved, found {saved}").into());
    }
    println!("3 orders saved, each delivered to the relay's handler; the refused one neither");
    Ok(())
}

/// A minimal HTTP/1.1 client: one `POST` with a JSON body on a connection of its own; returns
/// the status code and the body.
async fn http_post(
    addr: SocketAddr,
    path: &str,
    request_id: &str,
    body: &str,
) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect(addr).await?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nX-Request-Id: {request_id}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await?;
    // `Connection: close`: the server closes the connection after its response.
    let mut response = String::new();
    stream.read_to_string(&mut response).await?;
    let status = response.split(' ').nth(1).and_then(|code| code.parse().ok());
    let status = status.ok_or_else(|| std::io::Error::other("no HTTP status line"))?;
    let body = response.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    Ok((status, body.to_owned()))
}
