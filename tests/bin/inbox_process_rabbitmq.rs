//! `inbox-process-rabbitmq`: an inbox consuming a RabbitMQ queue in a process of its own, for
//! `tests/inbox_rabbitmq.rs`, which SIGKILLs it mid-stream and starts it again.
//!
//! Its handler takes `job.run` events and records each call as a row `(event_id, pid)` of the
//! table `effects` (which the test creates), in the inbox's transaction: the effect commits with
//! the inbox's record, so an effect recorded twice would be a duplicate the inbox let through.
//!
//! Arguments: the database URL and the queue (the test declares it, on the broker at
//! 127.0.0.1:5672). `HANDLER_SLEEP_MS` (default 5): how long each call takes before it records.
//! `PREFETCH` (default 20): the consumer's prefetch, so that a kill finds messages delivered
//! and not yet acknowledged. Runs until killed, or until SIGTERM, at which it stops gracefully
//! (the messages delivered are handled and acknowledged), closes its connection and exits 0.

use std::time::Duration;

use outbox_runtime::forward::rabbitmq::lapin::{Connection, ConnectionProperties};
use outbox_runtime::inbox::{rabbitmq, Inbox, InboxContext};
use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};
use tokio::signal::unix::{signal, SignalKind};

/// `tests/support/relay_process.rs` declares the same type to emit it.
#[derive(Debug, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "job", event_type = "job.run")]
struct JobRun {
    #[outbox(id)]
    job: u64,
    n: u64,
}

/// `tests/support/rabbitmq.rs`'s broker.
const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";

async fn record(mut ctx: InboxContext<Duration>, _: JobRun) -> Result<(), sqlx::Error> {
    tokio::time::sleep(*ctx.state()).await;
    sqlx::query("INSERT INTO effects (event_id, pid) VALUES ($1, pg_backend_pid())")
        .bind(ctx.event_id())
        .execute(&mut **ctx.tx())
        .await?;
    Ok(())
}

fn setting(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|value| value.parse().ok()).unwrap_or(default)
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    tracing_subscriber::fmt().with_writer(std::io::stderr).with_env_filter("warn").init();
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(queue)) = (args.next(), args.next()) else {
        panic!("usage: inbox-process-rabbitmq DATABASE_URL QUEUE");
    };
    let sleep = Duration::from_millis(setting("HANDLER_SLEEP_MS", 5));
    let prefetch = u16::try_from(setting("PREFETCH", 20)).expect("PREFETCH fits in u16");
    // Listening before anything else, so that a SIGTERM sent once the consumer is up is never
    // the default action's (an exit without the graceful stop).
    let mut terminate = signal(SignalKind::terminate()).expect("SIGTERM can be listened to");
    let pool = sqlx::PgPool::connect(&url).await.expect("the database answers");
    let inbox = Inbox::builder(pool, "inbox-process")
        .state(sleep)
        .handler(record)
        .build()
        .expect("the inbox builds");
    let connection =
        Connection::connect(AMQP, ConnectionProperties::default()).await.expect("RabbitMQ answers");
    let channel = connection.create_channel().await.expect("a channel opens");
    let stopped = async {
        terminate.recv().await;
    };
    rabbitmq::consume(&inbox, &channel, &queue, prefetch, stopped).await.expect("consuming");
    channel.close(200, "stopped".into()).await.expect("the channel closes");
    connection.close(200, "stopped".into()).await.expect("the connection closes");
}
