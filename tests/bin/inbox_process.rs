//! `inbox-process`: an inbox consuming a NATS JetStream pull consumer in a process of its own,
//! for `tests/inbox_nats.rs`, which SIGKILLs it mid-stream and starts it again.
//!
//! Its handler takes `job.run` events and records each call as a row `(event_id, pid)` of the
//! table `effects` (which the test creates), in the inbox's transaction: the effect commits with
//! the inbox's record, so an effect recorded twice would be a duplicate the inbox let through.
//!
//! Arguments: the database URL, the stream and the durable consumer's name (the test creates
//! both). `HANDLER_SLEEP_MS` (default 5): how long each call takes before it records. Runs until
//! killed.

use std::time::Duration;

use outbox_runtime::forward::nats::async_nats;
use outbox_runtime::inbox::{nats, Inbox, InboxContext};
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
    let (url, stream, consumer) = (args.next(), args.next(), args.next());
    let (Some(url), Some(stream), Some(consumer)) = (url, stream, consumer) else {
        panic!("usage: inbox-process DATABASE_URL STREAM CONSUMER");
    };
    let sleep: u64 =
        std::env::var("HANDLER_SLEEP_MS").ok().and_then(|ms| ms.parse().ok()).unwrap_or(5);
    let pool = sqlx::PgPool::connect(&url).await.expect("the database answers");
    let inbox = Inbox::builder(pool, "inbox-process")
        .state(Duration::from_millis(sleep))
        .handler(record)
        .build()
        .expect("the inbox builds");
    let client = async_nats::connect("127.0.0.1:4222").await.expect("NATS answers");
    let jetstream = async_nats::jetstream::new(client);
    let stream = jetstream.get_stream(&stream).await.expect("the stream exists");
    let consumer = stream.get_consumer(&consumer).await.expect("the consumer exists");
    nats::consume(&inbox, &consumer, std::future::pending()).await.expect("consuming");
}
