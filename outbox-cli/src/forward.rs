//! `outbox forward`: a forwarding relay as a daemon, configured by flags or the environment.

use std::time::Duration;

use outbox_runtime::forward::{nats::NatsSink, Forward};
use outbox_runtime::{Relay, RelayCounts, RelayMetrics};
use sqlx::PgPool;
use tokio::signal::unix::{signal, SignalKind};

use crate::cli::ForwardArgs;
use crate::error::Failure;

/// Runs until SIGINT or SIGTERM, then stops gracefully and returns what it did.
pub async fn run(pool: &PgPool, args: &ForwardArgs) -> Result<RelayCounts, Failure> {
    // One line per failure, without payloads (the relay logs those at debug only).
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
    let mut forward =
        Forward::to(sink(args).await?).destination(&args.subject).cloudevents(args.cloudevents);
    if !args.event_type.is_empty() {
        forward = forward.only(args.event_type.clone());
    }
    let relay = Relay::builder(pool.clone())
        .forward(forward)
        .batch_size(args.batch_size)
        .concurrency(args.concurrency)
        .max_attempts(args.max_attempts)
        .build()
        .map_err(|error| Failure::Forward(error.to_string()))?;
    let progress = tokio::spawn(report_progress(relay.metrics(), args.progress));
    let server = match args.metrics_addr {
        Some(address) => Some(tokio::spawn(serve_metrics(address, relay.metrics()).await?)),
        None => None,
    };
    let counts = relay.run_until(stop_signal()).await;
    progress.abort();
    if let Some(server) = server {
        server.abort();
    }
    Ok(counts?)
}

/// Binds `address` and returns the server that answers `/metrics` (the relay's counters and
/// histograms, Prometheus text) and `/health` (200 while the relay runs and reached the
/// database within 30 s, else 503).
async fn serve_metrics(
    address: std::net::SocketAddr,
    relay: RelayMetrics,
) -> Result<impl std::future::Future<Output = ()>, Failure> {
    use axum::http::StatusCode;
    use axum::routing::get;

    let cannot = |what: &str, error: &dyn std::fmt::Display| {
        Failure::Forward(format!("cannot serve metrics on {address}: {what}: {error}"))
    };
    let prometheus = metrics_exporter_prometheus::PrometheusBuilder::new()
        .install_recorder()
        .map_err(|error| cannot("recorder", &error))?;
    let health = move || {
        let healthy = relay.is_healthy(Duration::from_secs(30));
        std::future::ready(if healthy {
            (StatusCode::OK, "ok\n")
        } else {
            (StatusCode::SERVICE_UNAVAILABLE, "relay not running or database unreachable\n")
        })
    };
    let app = axum::Router::new()
        .route("/metrics", get(move || std::future::ready(prometheus.render())))
        .route("/health", get(health));
    let listener =
        tokio::net::TcpListener::bind(address).await.map_err(|error| cannot("bind", &error))?;
    Ok(async move {
        if let Err(error) = axum::serve(listener, app).await {
            eprintln!("outbox forward: the metrics server stopped: {error}");
        }
    })
}

/// The sink `--to` names.
async fn sink(args: &ForwardArgs) -> Result<NatsSink, Failure> {
    let Some(address) = args.to.strip_prefix("nats://") else {
        let scheme = args.to.split("://").next().unwrap_or_default();
        return Err(Failure::Forward(format!(
            "cannot forward to `{scheme}://`: this build forwards to nats://host:port"
        )));
    };
    let Some(stream) = &args.stream else {
        return Err(Failure::Forward("forwarding to NATS needs --stream".to_owned()));
    };
    let client = tokio::time::timeout(Duration::from_secs(5), async_nats::connect(address))
        .await
        .map_err(|_| Failure::Forward(format!("cannot reach NATS at {address}: timed out")))?
        .map_err(|error| Failure::Forward(format!("cannot reach NATS at {address}: {error}")))?;
    Ok(NatsSink::new(client, stream.clone()))
}

/// Prints a progress line every `every`.
async fn report_progress(metrics: RelayMetrics, every: Duration) {
    let mut ticks = tokio::time::interval(every);
    ticks.tick().await;
    loop {
        ticks.tick().await;
        let counts = metrics.counts();
        eprintln!(
            "outbox forward: {} forwarded, {} failed, {} dead so far",
            counts.delivered, counts.failed, counts.dead
        );
    }
}

/// SIGINT or SIGTERM.
async fn stop_signal() {
    match signal(SignalKind::terminate()) {
        Ok(mut terminate) => {
            tokio::select! {
                _ = terminate.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}
