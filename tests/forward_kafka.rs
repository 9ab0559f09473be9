//! Forwarding to Kafka, on the Kafka-protocol broker at 127.0.0.1:9092 (tansu; see
//! `support::kafka`): each test produces to topics under a prefix of its own.

mod support;

use outbox_runtime::forward::kafka::KafkaSink;
use outbox_runtime::forward::Forward;
use outbox_runtime::Relay;
use sqlx::PgPool;
use support::forwarding::{
    a_message_too_large, assert_in_emit_order, emit_two_and_roll_back_one,
    forward_ordered_through_failures, forward_until_published, sink_error_at_start,
    ORDERED_ACCOUNTS, TRACEPARENT,
};
use support::kafka::{Record, Topics};
use support::*;

fn placed_topic(topics: &Topics) -> String {
    format!("{}.order.order.placed", topics.prefix)
}

fn forwarding(pool: &PgPool, sink: KafkaSink, topics: &Topics) -> outbox_runtime::RelayBuilder {
    let destination = format!("{}.{{aggregate_type}}.{{event_type}}", topics.prefix);
    fast(Relay::builder(pool.clone())).forward(Forward::to(sink).destination(&destination))
}

#[sqlx::test(migrations = false)]
async fn committed_events_arrive_once_with_their_key_and_headers(pool: PgPool) {
    migrated(&pool).await;
    let topics = Topics::new();
    let topic = placed_topic(&topics);
    let kept = emit_two_and_roll_back_one(&pool).await;

    let sink = topics.sink(std::slice::from_ref(&topic)); // created at start, 3 partitions
    forward_until_published(&pool, forwarding(&pool, sink, &topics), 2).await;

    let mut records = topics.records(&topic, 2).await;
    assert_eq!(records.len(), 2, "each committed event once, the rolled-back one never");
    records.sort_by_key(|record| record.payload["total_cents"].as_i64());
    for (record, id) in records.iter().zip(&kept) {
        assert_eq!(record.key, record.payload["order_id"].as_str().unwrap(), "keyed by aggregate");
        assert_eq!(record.header("outbox-event-id"), Some(id.to_string().as_str()));
        assert_eq!(record.header("outbox-event-type"), Some("order.placed"));
        assert_eq!(record.header("outbox-aggregate-type"), Some("order"));
        assert_eq!(record.header("outbox-aggregate-id"), Some(record.key.as_str()));
        assert_eq!(record.header("outbox-event-version"), Some("1"));
        assert_eq!(record.header("traceparent"), Some(TRACEPARENT));
        assert_eq!(record.header("tenant"), Some("acme"));
        assert_eq!(record.header("content-type"), Some("application/json"));
        assert!(record.header("outbox-created-at").is_some());
    }
    let totals: Vec<i64> =
        records.iter().map(|r| r.payload["total_cents"].as_i64().unwrap()).collect();
    assert_eq!(totals, [1, 2], "the payloads as stored");
}

/// One aggregate's events share its key, so they land on one partition in emit order (the
/// consumer's order), while the sink refuses 30% of the messages and they are retried.
#[sqlx::test(migrations = false)]
async fn ordered_events_arrive_in_emit_order_while_the_sink_fails_at_random(pool: PgPool) {
    migrated(&pool).await;
    let topics = Topics::new();
    let account_topics: Vec<String> = (0..ORDERED_ACCOUNTS)
        .map(|account| format!("{}.account.{account}", topics.prefix))
        .collect();
    forward_ordered_through_failures(&pool, topics.sink(&account_topics), &topics.prefix).await;
    let mut received = Vec::new();
    for topic in &account_topics {
        let records: Vec<Record> = topics.records(topic, 25).await;
        let partitions: std::collections::HashSet<i32> =
            records.iter().map(|r| r.partition).collect();
        assert_eq!(partitions.len(), 1, "one aggregate, one partition: {partitions:?}");
        received.extend(records.into_iter().map(|r| (r.topic, r.payload["n"].as_u64().unwrap())));
    }
    assert_in_emit_order(received);
}

/// A record larger than the broker takes is refused alone, naming topic and cause; the others
/// go through.
#[sqlx::test(migrations = false)]
async fn a_record_too_large_fails_alone_naming_topic_and_cause(pool: PgPool) {
    migrated(&pool).await;
    let topics = Topics::new();
    let renamed = format!("{}.customer.customer.renamed", topics.prefix);
    let placed = placed_topic(&topics);
    let sink = topics.sink(&[renamed.clone(), placed.clone()]);
    let error = a_message_too_large(&pool, forwarding(&pool, sink, &topics)).await;
    assert!(error.starts_with(&format!("{renamed}: ")), "{error}");
    assert!(error.to_lowercase().contains("too large"), "the cause is named: {error}");
    assert_eq!(topics.records(&placed, 2).await.len(), 2, "the others went through");
}

/// A topic the sink checks at start that does not exist stops the relay, naming it, unless the
/// sink may create it.
#[sqlx::test(migrations = false)]
async fn a_missing_topic_stops_the_relay_at_start(pool: PgPool) {
    migrated(&pool).await;
    let topics = Topics::new();
    let topic = placed_topic(&topics);
    let sink = KafkaSink::new(&topics.config()).unwrap().topics([topic.clone()]);
    let error = sink_error_at_start(&pool, sink).await;
    assert_eq!(error.destination, topic, "{error}");
    assert!(error.reason.contains("no such topic"), "{error}");
}

/// A record whose topic does not exist (the template names topics no check knew) is refused:
/// a failed attempt naming the topic, not an outage.
#[sqlx::test(migrations = false)]
async fn a_record_to_a_missing_topic_is_a_failure_naming_it(pool: PgPool) {
    migrated(&pool).await;
    let topics = Topics::new();
    let sink = KafkaSink::new(&topics.config()).unwrap();
    let destination = format!("{}.{{aggregate_type}}.{{event_type}}", topics.prefix);
    let error =
        support::forwarding::first_failure(&pool, Forward::to(sink).destination(&destination))
            .await;
    assert!(error.starts_with(&format!("{}: ", placed_topic(&topics))), "{error}");
}

#[sqlx::test(migrations = false)]
async fn an_unreachable_broker_stops_the_relay_at_start(pool: PgPool) {
    migrated(&pool).await;
    let topics = Topics::at("127.0.0.1:1"); // nothing listens on port 1
    let error = sink_error_at_start(&pool, KafkaSink::new(&topics.config()).unwrap()).await;
    assert_eq!(error.destination, "kafka brokers 127.0.0.1:1", "{error}");
}
