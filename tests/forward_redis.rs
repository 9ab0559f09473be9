//! Forwarding to Redis Streams on 127.0.0.1:6379 (the real server): each test appends to
//! stream keys under a prefix of its own, and deletes them.

mod support;

use std::collections::HashMap;
use std::time::Duration;

use outbox_runtime::forward::{redis::RedisSink, Forward};
use outbox_runtime::Relay;
use sqlx::PgPool;
use support::forwarding::{
    assert_in_emit_order, emit_two_and_roll_back_one, first_failure,
    forward_ordered_through_failures, forward_until_published, sink_error_at_start,
    ORDERED_ACCOUNTS, TRACEPARENT,
};
use support::redis::{Entry, Streams};
use support::*;

async fn forwarding(pool: &PgPool, streams: &Streams) -> outbox_runtime::RelayBuilder {
    let destination = format!("{}.{{aggregate_type}}.{{event_type}}", streams.prefix);
    let forward = Forward::to(streams.sink().await).destination(&destination);
    fast(Relay::builder(pool.clone())).forward(forward)
}

fn fields(entry: &Entry) -> HashMap<&str, &str> {
    entry.1.iter().map(|(name, value)| (name.as_str(), value.as_str())).collect()
}

#[sqlx::test(migrations = false)]
async fn committed_events_arrive_once_with_their_id_key_and_headers(pool: PgPool) {
    migrated(&pool).await;
    let streams = Streams::create().await;
    let kept = emit_two_and_roll_back_one(&pool).await;

    forward_until_published(&pool, forwarding(&pool, &streams).await, 2).await;

    let key = format!("{}.order.order.placed", streams.prefix);
    assert_eq!(streams.keys().await, [key.as_str()], "one stream key per destination");
    let mut entries = streams.entries(&key).await;
    assert_eq!(entries.len(), 2, "each committed event once, the rolled-back one never");
    let payload = |entry: &Entry| -> serde_json::Value {
        serde_json::from_str(fields(entry)["payload"]).unwrap()
    };
    // Two rows published in one batch may be appended in either order; match them by payload.
    entries.sort_by_key(|entry| payload(entry)["total_cents"].as_i64());
    for (entry, id) in entries.iter().zip(&kept) {
        let names: Vec<&str> = entry.1.iter().map(|(name, _)| name.as_str()).collect();
        assert_eq!(names[..3], ["id", "key", "content-type"]);
        assert_eq!(names.last(), Some(&"payload"));
        let fields = fields(entry);
        let payload = payload(entry);
        assert_eq!(fields["id"], id.to_string());
        assert_eq!(fields["key"], payload["order_id"].as_str().unwrap());
        assert_eq!(fields["content-type"], "application/json");
        assert_eq!(fields["h:outbox-event-id"], id.to_string());
        assert_eq!(fields["h:outbox-event-type"], "order.placed");
        assert_eq!(fields["h:outbox-aggregate-type"], "order");
        assert_eq!(fields["h:outbox-aggregate-id"], fields["key"]);
        assert_eq!(fields["h:traceparent"], TRACEPARENT);
        assert_eq!(fields["h:tenant"], "acme");
        assert!(fields.contains_key("h:outbox-created-at"));
    }
    let totals: Vec<i64> =
        entries.iter().map(|entry| payload(entry)["total_cents"].as_i64().unwrap()).collect();
    assert_eq!(totals, [1, 2], "the payloads as stored");
}

#[sqlx::test(migrations = false)]
async fn a_key_holding_another_type_is_a_failure_naming_it_and_loses_nothing(pool: PgPool) {
    migrated(&pool).await;
    let streams = Streams::create().await;
    let key = format!("{}.order.order.placed", streams.prefix);
    let mut connection = streams.connection.clone();
    let () = ::redis::cmd("SET")
        .arg(&key)
        .arg("not a stream")
        .query_async(&mut connection)
        .await
        .unwrap();
    let destination = format!("{}.{{aggregate_type}}.{{event_type}}", streams.prefix);
    let error =
        first_failure(&pool, Forward::to(streams.sink().await).destination(&destination)).await;
    assert!(error.starts_with(&format!("{key}: ")), "{error}");
    assert!(error.contains("WRONGTYPE"), "{error}");
    let value: String = ::redis::cmd("GET").arg(&key).query_async(&mut connection).await.unwrap();
    assert_eq!(value, "not a stream", "nothing was written");
}

#[sqlx::test(migrations = false)]
async fn an_unreachable_server_stops_the_relay_at_start(pool: PgPool) {
    migrated(&pool).await;
    // Nothing listens on port 1.
    let client = ::redis::Client::open("redis://127.0.0.1:1/").unwrap();
    let config = ::redis::aio::ConnectionManagerConfig::new()
        .set_number_of_retries(0)
        .set_connection_timeout(Some(Duration::from_secs(1)));
    let connection = ::redis::aio::ConnectionManager::new_lazy_with_config(client, config).unwrap();
    let error = sink_error_at_start(&pool, RedisSink::new(connection)).await;
    assert_eq!(error.destination, "redis server (PING)", "{error}");
}

#[sqlx::test(migrations = false)]
async fn ordered_events_arrive_in_emit_order_while_the_sink_fails_at_random(pool: PgPool) {
    migrated(&pool).await;
    let streams = Streams::create().await;
    forward_ordered_through_failures(&pool, streams.sink().await, &streams.prefix).await;
    let mut received = Vec::new();
    for account in 0..ORDERED_ACCOUNTS {
        let key = format!("{}.account.{account}", streams.prefix);
        for entry in streams.entries(&key).await {
            let payload: serde_json::Value =
                serde_json::from_str(fields(&entry)["payload"]).unwrap();
            received.push((key.clone(), payload["n"].as_u64().unwrap()));
        }
    }
    assert_in_emit_order(received);
}

/// A sink whose broker takes `delay` to answer each batch, and that counts the batches it
/// began to send.
struct Slow {
    inner: RedisSink,
    delay: Duration,
    began: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl outbox_runtime::forward::Sink for Slow {
    fn check(
        &self,
    ) -> futures_util::future::BoxFuture<'_, Result<(), outbox_runtime::forward::SinkError>> {
        self.inner.check()
    }

    fn send<'a>(
        &'a self,
        batch: &'a [outbox_runtime::forward::OutboundMessage],
    ) -> futures_util::future::BoxFuture<'a, Vec<Result<(), outbox_runtime::forward::SinkError>>>
    {
        Box::pin(async move {
            self.began.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::time::sleep(self.delay).await;
            self.inner.send(batch).await
        })
    }
}

/// A relay stopped while its sink is sending stops within its shutdown timeout (and the
/// second it gives the last acknowledgements), not twice that, and sends nothing once
/// `run_until` returned: the publish it gave up on never reaches the broker, and its row stays
/// pending for the next relay.
#[sqlx::test(migrations = false)]
async fn a_relay_stopped_mid_send_sends_nothing_after_it_returns(pool: PgPool) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::Arc;

    migrated(&pool).await;
    let streams = Streams::create().await;
    let id = emit_committed(&pool, &[placed(1)]).await[0];
    let began = Arc::new(AtomicUsize::new(0));
    let sink =
        Slow { inner: streams.sink().await, delay: Duration::from_secs(6), began: began.clone() };
    let shutdown_timeout = Duration::from_secs(3);
    let destination = format!("{}.{{aggregate_type}}.{{event_type}}", streams.prefix);
    let relay = fast(Relay::builder(pool.clone()))
        .forward(Forward::to(sink).destination(&destination))
        .shutdown_timeout(shutdown_timeout)
        .build()
        .unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let running = tokio::spawn(relay.run_until(async {
        let _ = stopped.await;
    }));
    eventually("the sink began sending", || async { began.load(Ordering::SeqCst) > 0 }).await;
    let stopping = tokio::time::Instant::now();
    stop.send(()).unwrap();
    running.await.unwrap().unwrap();
    let took = stopping.elapsed();
    // Before: the batcher ran detached and shutdown could take twice the timeout (6 s here).
    assert!(took < shutdown_timeout * 3 / 2 + Duration::from_secs(1), "stopped in {took:?}");

    // Past the moment the given-up send would have reached Redis (it began before the stop).
    tokio::time::sleep(Duration::from_secs(6)).await;
    assert!(streams.keys().await.is_empty(), "nothing sent after run_until returned");
    let row = row_state(&pool, id).await;
    assert!(!row.published && row.attempts == 0, "pending, no attempt counted: {row:?}");
}

/// `RedisSink::trim(Trim::MaxLen(n))` keeps each stream near `n` entries (`MAXLEN ~`: whole
/// nodes of 100 entries are dropped, so at least `n` and under a node more) instead of growing
/// with every event.
#[sqlx::test(migrations = false)]
async fn a_trimmed_stream_keeps_about_its_length(pool: PgPool) {
    use outbox_runtime::forward::redis::Trim;

    migrated(&pool).await;
    let streams = Streams::create().await;
    let events: Vec<_> = (0..500).map(placed).collect();
    emit_committed(&pool, &events).await;
    let destination = format!("{}.{{aggregate_type}}.{{event_type}}", streams.prefix);
    let sink = streams.sink().await.trim(Trim::MaxLen(100));
    let builder =
        fast(Relay::builder(pool.clone())).forward(Forward::to(sink).destination(&destination));
    forward_until_published(&pool, builder, 500).await;
    let key = format!("{}.order.order.placed", streams.prefix);
    let kept = streams.entries(&key).await;
    assert!((100..200).contains(&kept.len()), "{} entries kept of 500", kept.len());
    let last: serde_json::Value =
        serde_json::from_str(fields(kept.last().unwrap())["payload"]).unwrap();
    assert!(last["total_cents"].as_i64().unwrap() >= 400, "the newest are kept: {last}");
}
