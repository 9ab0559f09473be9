//! `inbox-process-kafka`: an inbox consuming a Kafka topic in a process of its own, for
//! `tests/inbox_kafka.rs`, which SIGKILLs it mid-stream and starts it again.
//!
//! Its handler takes `job.run` events and records each call as a row `(event_id, pid)` of the
//! table `effects` (which the test creates), in the inbox's transaction: the effect commits with
//! the inbox's record, so an effect recorded twice would be a duplicate the inbox let through.
//!
//! Arguments: the database URL, the brokers (`host:port`), the topic and the consumer group (the
//! test creates the topic). `HANDLER_SLEEP_MS` (default 5): how long each call takes before it
//! records. Runs until killed, or until SIGTERM: then it finishes the record under way, commits
//! the group's offsets, leaves the group and exits with success.

use std::time::Duration;

use outbox_runtime::forward::kafka::rdkafka::consumer::{Consumer, StreamConsumer};
use outbox_runtime::forward::kafka::rdkafka::ClientConfig;
use outbox_runtime::inbox::{kafka, Inbox, InboxContext};
use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

/// `tests/support/relay_process.rs` declares the same type to emit it.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "job", event_type = "job.run")]
struct JobRun {
    #[outbox(id)]
    job: u64,
    n: u64,
}

async fn record(mut ctx: InboxContext<Duration>, _: JobRun) -> Result<(), sqlx::Error> {
    tokio::time::sleep(*ctx.state()).await;
    sqlx::query("INSERT INTO effects (event_id, pid) VALUES ($1, pg_backend_pid())")
        .bind(ctx.event_id())
        .execute(&mut **ctx.tx())
        .await?;
    Ok(())
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter("warn").init();
    let mut args = std::env::args().skip(1);
    let (url, brokers, topic, group) = (args.next(), args.next(), args.next(), args.next());
    let (Some(url), Some(brokers), Some(topic), Some(group)) = (url, brokers, topic, group) else {
        panic!("usage: inbox-process-kafka DATABASE_URL BROKERS TOPIC GROUP");
    };
    let sleep: u64 =
        std::env::var("HANDLER_SLEEP_MS").ok().and_then(|ms| ms.parse().ok()).unwrap_or(5);
    let pool = sqlx::PgPool::connect(&url).await.expect("the database answers");
    let inbox = Inbox::builder(pool, "inbox-process")
        .state(Duration::from_millis(sleep))
        .handler(record)
        .build()
        .expect("the inbox builds");
    let mut config = ClientConfig::new();
    config
        .set("bootstrap.servers", &brokers)
        .set("group.id", &group)
        // A killed member is given up on after this, and its partitions assigned to the others
        // (or to its restarted self).
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "1000");
    let consumer: StreamConsumer =
        kafka::consumer_config(&config).create().expect("the consumer is created");
    consumer.subscribe(&[&topic]).expect("the consumer subscribes");
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .expect("SIGTERM can be caught");
    let shutdown = async move {
        terminate.recv().await;
    };
    kafka::consume(&inbox, &consumer, shutdown).await.expect("consuming");
    drop(consumer); // leaves the group
}
