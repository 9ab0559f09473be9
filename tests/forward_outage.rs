//! The broker away and back: a forwarding relay whose sink reaches the real broker through a
//! TCP proxy (`support::proxy`) that the test cuts for longer than the relay's whole retry budget
//! (and than JetStream's acknowledgement timeout) while events keep being emitted, then restores.
//!
//! What each test checks, for NATS JetStream, RabbitMQ, Redis Streams and Kafka alike:
//! - an unavailable broker is not the events' failure: no attempt counted, no row dead, though
//!   a few attempts with a fast backoff would have spent the budget many times over;
//! - the relay saw the outage (it handed rows back, its sink status said unavailable) and
//!   resumed by itself: the same relay, never restarted, its client reconnected through the
//!   proxy, and every event ends published;
//! - every event is at the consumer: exactly once on JetStream (what the client sent on
//!   reconnecting and the relay sent again carry the same `Nats-Msg-Id`, dropped by the stream's
//!   duplicate window); at least once on RabbitMQ, Redis and Kafka, whose repeats come only from
//!   messages in flight when the cut fell (the broker took them, its confirmation was lost), so
//!   there are at most as many as deliveries run at once.
//!
//! And that a RabbitMQ sink that cannot connect at start stops the relay with a clear
//! `Error::Sink` that never quotes the password.

mod support;

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use async_nats::ConnectOptions;
use lapin::ConnectionProperties;
use outbox_runtime::forward::nats::NatsSink;
use outbox_runtime::forward::rabbitmq::RabbitSink;
use outbox_runtime::forward::redis::RedisSink;
use outbox_runtime::forward::{Forward, Sink, SinkStatus};
use outbox_runtime::{Relay, RelayCounts};
use sqlx::PgPool;
use support::forwarding::sink_error_at_start;
use support::kafka::{Broker, Topics};
use support::nats::{Stream, NATS};
use support::proxy::Proxy;
use support::rabbitmq::Exchange;
use support::redis::Streams;
use support::*;
use uuid::Uuid;

/// Deliveries running at once, so also the most messages in flight when the cut falls.
const CONCURRENCY: usize = 8;
/// How long the broker is away: longer than JetStream's acknowledgement timeout (5 s), so its
/// client's publishes time out too, and than the retry budget many times over.
const OUTAGE: Duration = Duration::from_secs(6);
/// The retry budget: with `fast` backoff (10 ms, up to 50 ms), spent in a tenth of a second.
const MAX_ATTEMPTS: u32 = 3;
/// Events emitted before the cut, during the outage (in several transactions) and after it.
const BEFORE: i64 = 100;
const DURING: i64 = 100;
const AFTER: i64 = 50;
const TOTAL: usize = (BEFORE + DURING + AFTER) as usize;

/// Runs a relay forwarding to `sink` (which reaches its broker through `proxy`) across an
/// outage; returns the emitted ids and the relay's counts once every event is published.
async fn across_an_outage(
    pool: &PgPool,
    proxy: &Proxy,
    sink: impl Sink,
    prefix: &str,
) -> (Vec<Uuid>, RelayCounts) {
    let destination = format!("{prefix}.{{aggregate_type}}.{{event_type}}");
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .forward(Forward::to(sink).destination(&destination))
            .concurrency(CONCURRENCY)
            .max_attempts(MAX_ATTEMPTS),
    );
    let emit = |from: i64, count: i64| async move {
        emit_committed(pool, &(from..from + count).map(placed).collect::<Vec<_>>()).await
    };
    let mut ids = emit(0, BEFORE).await;
    eventually("some events are published", || async { count_published(pool).await > 0 }).await;

    proxy.cut();
    let cut_at = tokio::time::Instant::now();
    let mut during = Vec::new();
    for chunk in 0..4 {
        during.extend(emit(BEFORE + chunk * DURING / 4, DURING / 4).await);
    }
    eventually("the relay sees the broker unavailable", || async {
        matches!(relay.metrics.sink_status(), Some(SinkStatus::Unavailable { .. }))
    })
    .await;
    // The outage itself: the only fixed wait.
    tokio::time::sleep_until(cut_at + OUTAGE).await;
    let published_during: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox.events WHERE event_id = ANY($1) AND published_at IS NOT NULL",
    )
    .bind(&during)
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(published_during, 0, "nothing emitted during the outage reached the broker");
    proxy.restore();
    ids.extend(during);
    ids.extend(emit(BEFORE + DURING, AFTER).await);

    eventually("every event is published", || async {
        count_published(pool).await == TOTAL as i64
    })
    .await;
    assert_eq!(relay.metrics.sink_status(), Some(SinkStatus::Available), "the sink is back");
    let counts = relay.stop().await;
    println!("{counts:?}");
    let (dead, attempts): (i64, i64) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE dead_at IS NOT NULL), coalesce(sum(attempts), 0) \
         FROM outbox.events",
    )
    .fetch_one(pool)
    .await
    .unwrap();
    assert_eq!(dead, 0, "no row dead");
    assert_eq!(attempts, 0, "no attempt counted: the broker's outage is not the events' failure");
    assert_eq!(counts.failed, 0, "no failed delivery: {counts:?}");
    assert!(counts.handed_back > 0, "deliveries during the outage were handed back: {counts:?}");
    assert!(
        proxy.carried() >= 2,
        "the sink's client connected again through the proxy by itself: {} connections",
        proxy.carried()
    );
    (ids, counts)
}

/// Checks the consumer's copies (`received`, one event id per message) against the emitted
/// `ids`: each at least once, and at most `CONCURRENCY` repeats in all.
fn at_least_once(ids: &[Uuid], received: &[Uuid]) {
    let mut copies: HashMap<Uuid, usize> = HashMap::new();
    for id in received {
        *copies.entry(*id).or_default() += 1;
    }
    let emitted: HashSet<Uuid> = ids.iter().copied().collect();
    let arrived: HashSet<Uuid> = copies.keys().copied().collect();
    assert_eq!(arrived, emitted, "every event, and only those, at the consumer");
    let repeats = received.len() - emitted.len();
    println!("{} messages for {} events: {repeats} repeats", received.len(), emitted.len());
    assert!(
        repeats <= CONCURRENCY,
        "{repeats} repeats, more than the {CONCURRENCY} deliveries that can be in flight at the cut"
    );
    assert!(copies.values().all(|&n| n <= 2), "one cut repeats a message at most once");
}

#[sqlx::test(migrations = false)]
async fn nats_jetstream_away_and_back_loses_nothing_and_repeats_nothing(pool: PgPool) {
    migrated(&pool).await;
    let stream = Stream::create(Duration::from_secs(120)).await;
    let proxy = Proxy::start(NATS).await;
    // Only the proxy's address: a server advertising others must not let the client around it.
    let client = ConnectOptions::new()
        .ignore_discovered_servers()
        .connect(proxy.addr())
        .await
        .expect("NATS through the proxy");
    let sink = NatsSink::new(client, &stream.name);
    let (ids, _) = across_an_outage(&pool, &proxy, sink, &stream.prefix).await;

    let received: Vec<Uuid> = stream.message_ids().await;
    let distinct: HashSet<Uuid> = received.iter().copied().collect();
    assert_eq!(distinct, ids.iter().copied().collect::<HashSet<_>>(), "every event arrived");
    assert_eq!(received.len(), TOTAL, "exactly once: repeats dropped by Nats-Msg-Id");
}

#[sqlx::test(migrations = false)]
async fn rabbitmq_away_and_back_reconnects_and_loses_nothing(pool: PgPool) {
    migrated(&pool).await;
    let exchange = Exchange::create().await;
    let proxy = Proxy::start("127.0.0.1:5672").await;
    let uri = format!("amqp://guest:guest@{}/%2f", proxy.addr());
    let sink = RabbitSink::from_uri(&uri, ConnectionProperties::default(), &exchange.name);
    let (ids, _) = across_an_outage(&pool, &proxy, sink, &exchange.prefix).await;

    let received: Vec<Uuid> = exchange
        .messages()
        .await
        .iter()
        .map(|m| m.message_id.as_deref().unwrap().parse().unwrap())
        .collect();
    at_least_once(&ids, &received);
}

#[sqlx::test(migrations = false)]
async fn redis_away_and_back_reconnects_and_loses_nothing(pool: PgPool) {
    migrated(&pool).await;
    let streams = Streams::create().await;
    let proxy = Proxy::start("127.0.0.1:6379").await;
    let client = ::redis::Client::open(format!("redis://{}/", proxy.addr())).unwrap();
    let connection = ::redis::aio::ConnectionManager::new(client).await.unwrap();
    let (ids, _) =
        across_an_outage(&pool, &proxy, RedisSink::new(connection), &streams.prefix).await;

    let key = format!("{}.order.order.placed", streams.prefix);
    let received: Vec<Uuid> = streams
        .entries(&key)
        .await
        .iter()
        .map(|(_, fields)| {
            let id = fields.iter().find(|(name, _)| name == "id").expect("an id field");
            id.1.parse().unwrap()
        })
        .collect();
    at_least_once(&ids, &received);
}

/// Kafka clients connect to the addresses the broker advertises, not the one they were given:
/// the test runs a broker of its own that advertises the proxy's.
#[sqlx::test(migrations = false)]
async fn kafka_away_and_back_reconnects_and_loses_nothing(pool: PgPool) {
    migrated(&pool).await;
    let addr = Broker::free_addr();
    let proxy = Proxy::start(addr.clone()).await;
    let _broker = Broker::start(&addr, &proxy.addr()).await;
    let topics = Topics::at(&proxy.addr());
    let topic = format!("{}.order.order.placed", topics.prefix);
    let sink = topics.sink(std::slice::from_ref(&topic));
    let (ids, _) = across_an_outage(&pool, &proxy, sink, &topics.prefix).await;

    let received: Vec<Uuid> = topics
        .records(&topic, TOTAL)
        .await
        .iter()
        .map(|record| record.header("outbox-event-id").unwrap().parse().unwrap())
        .collect();
    at_least_once(&ids, &received);
}

#[sqlx::test(migrations = false)]
async fn wrong_rabbitmq_credentials_stop_the_relay_at_start_without_the_password(pool: PgPool) {
    migrated(&pool).await;
    let exchange = Exchange::create().await;
    let password = "not-the-password-7c1e";
    let uri = format!("amqp://guest:{password}@127.0.0.1:5672/%2f");
    let sink = RabbitSink::from_uri(&uri, ConnectionProperties::default(), &exchange.name);
    let sink_error = sink_error_at_start(&pool, sink).await;
    let text = format!("{sink_error} | {sink_error:?}");
    println!("{text}");
    assert!(!text.contains(password), "the password is never shown: {text}");
    assert_eq!(sink_error.destination, format!("exchange `{}`", exchange.name));
    let reason = &sink_error.reason;
    assert!(reason.starts_with("cannot connect to the broker: "), "{reason}");
    assert!(reason.contains("ACCESS_REFUSED"), "the broker's reason: {reason}");
}

#[sqlx::test(migrations = false)]
async fn a_rabbitmq_broker_away_at_start_stops_the_relay_with_the_cause(pool: PgPool) {
    migrated(&pool).await;
    let exchange = Exchange::create().await;
    let proxy = Proxy::start("127.0.0.1:5672").await;
    proxy.cut();
    let password = "guest-secret-5d02";
    let uri = format!("amqp://guest:{password}@{}/%2f", proxy.addr());
    let sink = RabbitSink::from_uri(&uri, ConnectionProperties::default(), &exchange.name);
    let sink_error = sink_error_at_start(&pool, sink).await;
    let text = format!("{sink_error} | {sink_error:?}");
    println!("{text}");
    assert!(!text.contains(password), "the password is never shown: {text}");
    assert!(!text.contains(&uri) && !text.contains("amqp://"), "nor the URI: {text}");
    assert_eq!(sink_error.destination, format!("exchange `{}`", exchange.name));
    assert!(sink_error.reason.starts_with("cannot connect to the broker: "), "{text}");
}
