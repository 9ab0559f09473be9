//! `outbox forward`: a forwarding relay as a daemon, configured by flags or the environment.

use std::time::Duration;

use outbox_runtime::forward::kafka::{rdkafka, KafkaSink};
use outbox_runtime::forward::nats::{async_nats, NatsSink};
use outbox_runtime::forward::rabbitmq::{lapin, RabbitSink};
use outbox_runtime::forward::redis::{redis, RedisSink, Trim};
use outbox_runtime::forward::{Forward, SinkStatus};
use outbox_runtime::{Relay, RelayCounts, RelayMetrics};
use sqlx::PgPool;
use tokio::signal::unix::{signal, SignalKind};

use crate::cli::ForwardArgs;
use crate::error::Failure;
use crate::percent;

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
        sink(args).await?.destination(&args.destination).cloudevents(args.cloudevents);
    if !args.event_type.is_empty() {
        forward = forward.only(args.event_type.clone());
    }
    let mut builder = Relay::builder(pool.clone()).forward(forward).max_attempts(args.max_attempts);
    if let Some(rows) = args.batch_size {
        builder = builder.batch_size(rows);
    }
    if let Some(concurrency) = args.concurrency {
        builder = builder.concurrency(concurrency);
    }
    let relay = builder.build().map_err(|error| Failure::Forward(error.to_string()))?;
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
/// histograms, Prometheus text) and `/health` (200 while the relay runs, reached the database
/// within 30 s and its broker answers; else 503, with the reason).
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
        let answer = if !relay.is_healthy(Duration::from_secs(30)) {
            let down = "relay not running or database unreachable\n";
            (StatusCode::SERVICE_UNAVAILABLE, down.to_owned())
        } else if let Some(SinkStatus::Unavailable { reason, since }) = relay.sink_status() {
            let since = since.format("%Y-%m-%dT%H:%M:%SZ");
            let paused = format!(
                "broker unavailable since {since}: {reason}\nforwarding paused; events wait \
                 with no attempt counted, and the relay checks the broker until it answers\n"
            );
            (StatusCode::SERVICE_UNAVAILABLE, paused)
        } else {
            (StatusCode::OK, "ok\n".to_owned())
        };
        std::future::ready(answer)
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

/// The sink `--to` names. Errors name the broker by host and port, never by its URL, which
/// may hold a password.
async fn sink(args: &ForwardArgs) -> Result<Forward, Failure> {
    let url = args.to.as_str();
    let (scheme, _) = url.split_once("://").unwrap_or((url, ""));
    let at = endpoint(url);
    // A TLS handshake with a server that does not speak it fails in the TLS library's words
    // ("received corrupt message"), or not at all (Redis waits for the rest of a command).
    let over =
        if matches!(scheme, "tls" | "amqps" | "rediss" | "kafka+ssl") { " over TLS" } else { "" };
    let unreachable = |error: &dyn std::fmt::Display| {
        Failure::Forward(format!("cannot reach the broker at {at}{over}: {error}"))
    };
    let needs = |flag: &str| Failure::Forward(format!("forwarding to {scheme}:// needs {flag}"));
    match scheme {
        "nats" | "tls" => {
            let stream = args.stream.clone().ok_or_else(|| needs("--stream"))?;
            let options = nats_options(url, args).await?.require_tls(scheme == "tls");
            let client = within_5s(options.connect(at.as_str()))
                .await
                .map_err(|e| unreachable(&e))?
                .map_err(|e| unreachable(&e))?;
            Ok(Forward::to(NatsSink::new(client, stream)))
        }
        "amqp" | "amqps" => {
            // Connects when the relay starts, and again whenever the connection drops; amqps://
            // is TLS or nothing, the certificate checked against the system's roots.
            let exchange = args.exchange.clone().ok_or_else(|| needs("--exchange"))?;
            let properties = lapin::ConnectionProperties::default();
            Ok(Forward::to(RabbitSink::from_uri(url, properties, exchange)))
        }
        "redis" | "rediss" => {
            // rediss:// is TLS or nothing, the server's certificate checked against the
            // system's roots (SSL_CERT_FILE or SSL_CERT_DIR to use others).
            let client = redis::Client::open(url).map_err(|e| unreachable(&e))?;
            // One connection first: the manager retries a failed one until the timeout and
            // then reports only the timeout, while this reports why (a certificate that does
            // not verify, a refused password).
            within_5s(client.get_multiplexed_async_connection())
                .await
                .map_err(|e| unreachable(&e))?
                .map_err(|e| unreachable(&e))?;
            let connection = within_5s(redis::aio::ConnectionManager::new(client))
                .await
                .map_err(|e| unreachable(&e))?
                .map_err(|e| unreachable(&e))?;
            let mut sink = RedisSink::new(connection);
            if let Some(entries) = args.redis_maxlen {
                sink = sink.trim(Trim::MaxLen(entries));
            }
            if let Some(age) = args.redis_max_age {
                sink = sink.trim(Trim::MaxAge(age));
            }
            Ok(Forward::to(sink))
        }
        "kafka" | "kafka+ssl" => {
            // Checked when the relay starts: the brokers answer, and the topics it can name
            // before seeing a row exist (or are created).
            let config = kafka_config(url, scheme == "kafka+ssl", args);
            let mut sink = KafkaSink::new(&config)
                .map_err(|e| Failure::Forward(e.to_string()))?
                .topics(known_topics(&args.destination, &args.event_type));
            if let Some((partitions, replicas)) = args.kafka_create_topics {
                sink = sink.create_missing_topics(partitions, replicas);
            }
            Ok(Forward::to(sink))
        }
        _ => Err(Failure::Forward(format!(
            "cannot forward to `{scheme}://`: expected nats:// or tls:// (NATS), amqp:// or \
             amqps:// (RabbitMQ), redis:// or rediss:// (Redis), kafka:// or kafka+ssl:// (Kafka)"
        ))),
    }
}

/// How to authenticate to NATS: the URL's `user:password@` or `token@`, or `--nats-creds`, or
/// `--nats-nkey` (async-nats itself ignores credentials in a URL).
async fn nats_options(
    url: &str,
    args: &ForwardArgs,
) -> Result<async_nats::ConnectOptions, Failure> {
    let userinfo = userinfo(url);
    let given = [userinfo.is_some(), args.nats_creds.is_some(), args.nats_nkey.is_some()];
    if given.iter().filter(|&&given| given).count() > 1 {
        return Err(Failure::Forward(
            "NATS takes one way to authenticate: credentials in the URL, --nats-creds or \
             --nats-nkey"
                .to_owned(),
        ));
    }
    if let Some(path) = &args.nats_creds {
        return async_nats::ConnectOptions::with_credentials_file(path).await.map_err(|error| {
            Failure::Forward(format!("cannot read --nats-creds {}: {error}", path.display()))
        });
    }
    if let Some(seed) = &args.nats_nkey {
        return Ok(async_nats::ConnectOptions::with_nkey(seed.clone()));
    }
    Ok(match userinfo.map(|userinfo| userinfo.split_once(':')) {
        None => async_nats::ConnectOptions::new(),
        Some(Some((user, password))) => async_nats::ConnectOptions::with_user_and_password(
            percent::decoded(user, false),
            percent::decoded(password, false),
        ),
        Some(None) => {
            async_nats::ConnectOptions::with_token(percent::decoded(userinfo.unwrap_or(""), false))
        }
    })
}

/// The Kafka producer's settings: the URL's brokers, TLS (`kafka+ssl://`), SASL when the URL has
/// a user and password, then `--kafka-option`s.
fn kafka_config(url: &str, tls: bool, args: &ForwardArgs) -> rdkafka::ClientConfig {
    let mut config = rdkafka::ClientConfig::new();
    config.set("bootstrap.servers", endpoint(url));
    let userinfo = userinfo(url);
    let protocol = match (tls, userinfo.is_some()) {
        (false, false) => "plaintext",
        (true, false) => "ssl",
        (false, true) => "sasl_plaintext",
        (true, true) => "sasl_ssl",
    };
    config.set("security.protocol", protocol);
    if let Some(userinfo) = userinfo {
        let (user, password) = userinfo.split_once(':').unwrap_or((userinfo, ""));
        config
            .set("sasl.mechanisms", &args.kafka_sasl_mechanism)
            .set("sasl.username", percent::decoded(user, false))
            .set("sasl.password", percent::decoded(password, false));
    }
    let files = [
        ("ssl.ca.location", &args.kafka_ca),
        ("ssl.certificate.location", &args.kafka_cert),
        ("ssl.key.location", &args.kafka_key),
    ];
    for (property, file) in files {
        if let Some(file) = file {
            config.set(property, file.display().to_string());
        }
    }
    for (key, value) in &args.kafka_option {
        config.set(key, value);
    }
    config
}

/// The topics a destination template names before any row is read: itself when it has no
/// placeholder, or one per `--event-type` when it names no aggregate id; else none.
fn known_topics(template: &str, event_types: &[(String, String)]) -> Vec<String> {
    if !template.contains('{') {
        return vec![template.to_owned()];
    }
    if template.contains("{aggregate_id}") {
        return Vec::new();
    }
    let mut topics: Vec<String> = event_types
        .iter()
        .map(|(aggregate_type, event_type)| {
            template.replace("{aggregate_type}", aggregate_type).replace("{event_type}", event_type)
        })
        .collect();
    topics.dedup();
    topics
}

/// The `user:password` or `token` before the `@` of a broker URL, still percent-encoded.
fn userinfo(url: &str) -> Option<&str> {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = rest.split(['/', '?', '#']).next().unwrap_or_default();
    authority.rsplit_once('@').map(|(userinfo, _)| userinfo)
}

/// `host:port` of a broker URL, without scheme, credentials or path.
fn endpoint(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    let rest = rest.rsplit_once('@').map_or(rest, |(_, host)| host);
    rest.split(['/', '?']).next().unwrap_or_default().to_owned()
}

/// A connection attempt, given up after 5 s.
async fn within_5s<T>(connecting: impl std::future::Future<Output = T>) -> Result<T, &'static str> {
    tokio::time::timeout(Duration::from_secs(5), connecting).await.map_err(|_| "timed out")
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
pub(crate) async fn stop_signal() {
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
