//! A running relay that serves Prometheus metrics and a health check over HTTP.
//!
//! `cargo run --example metrics_server`, then `curl 127.0.0.1:9464/metrics` and
//! `curl -i 127.0.0.1:9464/health`. A producer emits an event every 100 ms; one in ten
//! fails once, so the failure and retry counters move too. Ctrl-C stops it gracefully.
//! `METRICS_ADDR` changes the address, `RUN_FOR_SECS` stops it by itself.

use std::time::Duration;

use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use outbox_runtime::{EventContext, OutboxEvent, Relay, RelayMetrics};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: Uuid,
    n: u64,
}

async fn on_placed(ctx: EventContext, event: OrderPlaced) -> Result<(), std::io::Error> {
    if event.n.is_multiple_of(10) && ctx.attempts() == 0 {
        return Err(std::io::Error::other("simulated downstream hiccup"));
    }
    Ok(())
}

/// A relay is healthy when it is running and reached the database within the last 30 s.
async fn health(relay: RelayMetrics) -> (StatusCode, &'static str) {
    if relay.is_healthy(Duration::from_secs(30)) {
        (StatusCode::OK, "ok\n")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "relay not running or database unreachable\n")
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .init();
    let prometheus: PrometheusHandle = PrometheusBuilder::new().install_recorder()?;
    let url = std::env::var("DATABASE_URL")
        .unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into());
    let pool = sqlx::PgPool::connect(&url).await?;
    outbox_runtime::migrate(&pool).await?;

    let relay = Relay::builder(pool.clone())
        .handler(on_placed)
        .backoff(outbox_runtime::Backoff {
            base: Duration::from_millis(100),
            ..outbox_runtime::Backoff::default()
        })
        .retention(Duration::from_secs(3600))
        .build()?;
    let relay_metrics = relay.metrics();

    let app = Router::new()
        .route("/metrics", get(move || std::future::ready(prometheus.render())))
        .route("/health", get(move || health(relay_metrics.clone())));
    let addr = std::env::var("METRICS_ADDR").unwrap_or_else(|_| "127.0.0.1:9464".into());
    let listener = tokio::net::TcpListener::bind(&addr).await?;
    println!("serving http://{addr}/metrics and http://{addr}/health");

    let shutdown = async {
        match std::env::var("RUN_FOR_SECS").ok().and_then(|s| s.parse().ok()) {
            Some(secs) => tokio::time::sleep(Duration::from_secs(secs)).await,
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    };
    let producer = tokio::spawn(async move {
        for n in 0.. {
            let mut tx = pool.begin().await?;
            outbox_runtime::emit(&mut tx, &OrderPlaced { order_id: Uuid::now_v7(), n }).await?;
            tx.commit().await?;
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Ok::<_, outbox_runtime::Error>(())
    });
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let counts = relay.run_until(shutdown).await?;
    producer.abort();
    server.abort();
    println!("relay stopped: {counts:?}");
    Ok(())
}
