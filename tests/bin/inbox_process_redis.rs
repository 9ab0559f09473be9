//! `inbox-process-redis`: an inbox consuming a Redis stream through a consumer group in a process
//! of its own, for `tests/inbox_redis.rs`, which SIGKILLs it mid-stream and starts it again.
//!
//! Its handler takes `job.run` events and records each call as a row `(event_id, pid)` of the
//! table `effects` (which the test creates), in the inbox's transaction: the effect commits with
//! the inbox's record, so an effect recorded twice would be a duplicate the inbox let through.
//! The inbox is named after the group, as the module docs of `inbox::redis` advise.
//!
//! Arguments: the database URL, the stream key, the group and the consumer's name in it.
//! `HANDLER_SLEEP_MS` (default 5): how long each call takes before it records.
//! `CLAIM_IDLE_MS` (default 30000): the claim idle time, after which it takes over the entries
//! other consumers left pending. Runs until killed.

use std::time::Duration;

use outbox_runtime::forward::redis::redis;
use outbox_runtime::inbox::redis::{consume, GroupReader};
use outbox_runtime::inbox::{Inbox, InboxContext};
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

fn millis(name: &str, default: u64) -> Duration {
    let ms = std::env::var(name).ok().and_then(|ms| ms.parse().ok()).unwrap_or(default);
    Duration::from_millis(ms)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter("warn").init();
    let mut args = std::env::args().skip(1);
    let (url, stream, group, consumer) = (args.next(), args.next(), args.next(), args.next());
    let (Some(url), Some(stream), Some(group), Some(consumer)) = (url, stream, group, consumer)
    else {
        panic!("usage: inbox-process-redis DATABASE_URL STREAM GROUP CONSUMER");
    };
    let pool = sqlx::PgPool::connect(&url).await.expect("the database answers");
    let inbox = Inbox::builder(pool, group.as_str())
        .state(millis("HANDLER_SLEEP_MS", 5))
        .handler(record)
        .build()
        .expect("the inbox builds");
    // A connection of its own, whose replies may take long while both cores are busy: longer
    // than the reads block.
    let client = redis::Client::open("redis://127.0.0.1:6379/").expect("the URL parses");
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_response_timeout(Some(Duration::from_secs(30)));
    let connection = redis::aio::ConnectionManager::new_with_config(client, config)
        .await
        .expect("Redis answers");
    let reader = GroupReader::new(stream, group, consumer)
        .claim_idle(millis("CLAIM_IDLE_MS", 30_000))
        .block(Duration::from_secs(1));
    consume(&inbox, connection, &reader, std::future::pending()).await.expect("consuming");
}
