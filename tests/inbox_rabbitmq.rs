//! The inbox consuming RabbitMQ, end to end on the real broker: a relay forwards events to an
//! exchange, the broker is made to deliver some twice, and an inbox consumer in a process of its
//! own is SIGKILLed mid-stream and started again. Repeats at the broker, none at the effect.
//! Then what the broker is told for each outcome: failures requeued after their delay without
//! holding the queue, poison acknowledged dead, messages that are not outbox messages rejected
//! to the queue's dead-letter exchange, and how `consume` ends.

mod support;

use std::collections::HashMap;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use lapin::options::{
    BasicGetOptions, BasicPublishOptions, ConfirmSelectOptions, QueueBindOptions,
    QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection};
use outbox_runtime::forward::Forward;
use outbox_runtime::inbox::rabbitmq::{self, ConsumeError};
use outbox_runtime::inbox::{Inbox, InboxContext};
use outbox_runtime::{BoxError, Relay, Snooze};
use sqlx::PgPool;
use support::inbox::{create_effects, effects};
use support::rabbitmq::{connect, Exchange};
use support::relay_process::JobRun;
use support::*;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use uuid::Uuid;

/// A durable queue of the test's own, not exclusive (unlike `Exchange`'s), so that another
/// connection, a consumer process among them, may consume it. Deleted when dropped; its
/// `x-expires` has the broker delete it anyway a minute after its last use if the test dies.
struct Queue {
    connection: Arc<Connection>,
    /// In publisher-confirm mode.
    channel: Channel,
    name: String,
}

impl Queue {
    /// A queue bound to `exchange` for every routing key under its prefix, as `Exchange`'s own.
    async fn bound_to(exchange: &Exchange) -> Self {
        Self::declare(Some(exchange), FieldTable::default()).await
    }

    async fn declare(bound_to: Option<&Exchange>, mut arguments: FieldTable) -> Self {
        let connection = connect().await;
        let channel = connection.create_channel().await.unwrap();
        channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
        let name = format!("inbox-{}", Uuid::new_v4().simple());
        arguments.insert("x-expires".into(), AMQPValue::LongInt(60_000));
        let durable = QueueDeclareOptions { durable: true, ..Default::default() };
        channel.queue_declare(name.as_str().into(), durable, arguments).await.unwrap();
        if let Some(exchange) = bound_to {
            let keys = format!("{}.#", exchange.prefix);
            let (queue, exchange) = (name.as_str().into(), exchange.name.as_str().into());
            let bind = QueueBindOptions::default();
            channel
                .queue_bind(queue, exchange, keys.into(), bind, FieldTable::default())
                .await
                .unwrap();
        }
        Queue { connection: Arc::new(connection), channel, name }
    }

    /// `(ready, consumers)`: the messages waiting for a consumer (not those delivered and not
    /// yet acknowledged) and the queue's consumers.
    async fn counts(&self) -> (u32, u32) {
        let passive = QueueDeclareOptions { passive: true, ..Default::default() };
        let queue = self
            .channel
            .queue_declare(self.name.as_str().into(), passive, FieldTable::default())
            .await
            .unwrap();
        (queue.message_count(), queue.consumer_count())
    }

    /// The messages ready once the queue has no consumer left. The broker requeues a consumer's
    /// unacknowledged messages as it drops the consumer, so the count is then final.
    async fn ready_once_unconsumed(&self) -> u32 {
        eventually("the queue has no consumer", || async { self.counts().await.1 == 0 }).await;
        self.counts().await.0
    }

    /// Publishes a message straight to the queue (the default exchange), confirmed.
    async fn publish(&self, payload: &[u8], properties: BasicProperties) {
        let mandatory = BasicPublishOptions { mandatory: true, ..Default::default() };
        let confirmation = self
            .channel
            .basic_publish("".into(), self.name.as_str().into(), mandatory, payload, properties)
            .await
            .unwrap()
            .await
            .unwrap();
        assert_eq!(confirmation, Confirmation::Ack(None), "the broker took the message");
    }

    /// Every message in the queue, in queue order, taken off it.
    async fn take_all(&self) -> Vec<BasicProperties> {
        let mut taken = Vec::new();
        let no_ack = BasicGetOptions { no_ack: true };
        while let Some(got) =
            self.channel.basic_get(self.name.as_str().into(), no_ack).await.unwrap()
        {
            taken.push(got.delivery.properties.clone());
        }
        taken
    }
}

impl Drop for Queue {
    fn drop(&mut self) {
        let (connection, channel, name) =
            (self.connection.clone(), self.channel.clone(), self.name.clone());
        tokio::spawn(async move {
            let _ = channel.queue_delete(name.as_str().into(), QueueDeleteOptions::default()).await;
            drop(connection);
        });
    }
}

/// An `inbox-process-rabbitmq` child, killed when dropped so a failing test leaves none behind.
struct ConsumerProcess(Child);

impl ConsumerProcess {
    fn spawn(pool: &PgPool, queue: &Queue) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_inbox-process-rabbitmq"))
            .args([&database_url(pool), &queue.name])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("inbox-process-rabbitmq starts");
        ConsumerProcess(child)
    }

    fn kill(mut self) {
        self.0.kill().expect("SIGKILL is delivered");
        self.0.wait().expect("the killed consumer is reaped");
    }

    /// Sends SIGTERM (a graceful stop) and waits for the process to exit.
    async fn terminate(mut self) -> ExitStatus {
        let pid = self.0.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().expect("kill runs");
        assert!(sent.success(), "SIGTERM is delivered");
        let child = &mut self.0;
        within(
            async {
                loop {
                    if let Some(status) = child.try_wait().expect("the consumer is waited for") {
                        return status;
                    }
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
            },
            "the consumer exits",
        )
        .await
    }
}

impl Drop for ConsumerProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// [`rabbitmq::consume`] on a connection of its own, in a task, until [`Consuming::stop`].
struct Consuming {
    connection: Connection,
    channel: Channel,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), ConsumeError>>,
}

impl Consuming {
    async fn start<S: Clone + Send + Sync + 'static>(
        inbox: &Inbox<S>,
        queue: &Queue,
        prefetch: u16,
    ) -> Self {
        let connection = connect().await;
        let channel = connection.create_channel().await.unwrap();
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn({
            let (inbox, channel, queue) = (inbox.clone(), channel.clone(), queue.name.clone());
            async move {
                rabbitmq::consume(&inbox, &channel, &queue, prefetch, async {
                    let _ = stopped.await;
                })
                .await
            }
        });
        Consuming { connection, channel, stop, task }
    }

    /// Asks `consume` to stop, waits for it, then closes its channel and connection.
    async fn stop(self) {
        let _ = self.stop.send(());
        let consumed = within(self.task, "consume returns after its shutdown").await;
        consumed.unwrap().expect("consume stops cleanly");
        self.channel.close(200, "stopped".into()).await.unwrap();
        self.connection.close(200, "stopped".into()).await.unwrap();
    }

    /// What `consume` returned by itself (without its shutdown).
    async fn ended(self) -> Result<(), ConsumeError> {
        within(self.task, "consume returns").await.unwrap()
    }
}

/// Emits `count` jobs and forwards them with a relay to `exchange`, whose bindings route them to
/// `queue`; returns their event ids.
async fn forwarded(pool: &PgPool, exchange: &Exchange, count: u64) -> Vec<Uuid> {
    let mut ids = Vec::new();
    let mut tx = pool.begin().await.unwrap();
    for job in 0..count {
        ids.push(outbox_runtime::emit(&mut tx, &JobRun { job, n: job }).await.unwrap());
    }
    tx.commit().await.unwrap();
    let destination = format!("{}.{{event_type}}", exchange.prefix);
    let forward = Forward::to(exchange.sink().await).destination(&destination);
    let relay = Running::start(fast(Relay::builder(pool.clone())).forward(forward));
    // The relay marks a row published once the broker confirmed its message, which it does once
    // the message is in every queue bound for it.
    eventually("every job is forwarded", || async { count_published(pool).await == count as i64 })
        .await;
    relay.stop().await;
    ids
}

/// Publishes copies of the first `count` messages the relay forwarded (as `exchange`'s own
/// queue received them) to `queue`, headers, message id and all: the broker delivers those
/// events twice.
async fn duplicated_at_the_broker(exchange: &Exchange, queue: &Queue, count: usize) {
    for message in exchange.messages().await.into_iter().take(count) {
        let mut headers = FieldTable::default();
        for (name, value) in &message.headers {
            headers.insert(name.as_str().into(), AMQPValue::LongString(value.as_str().into()));
        }
        let mut properties = BasicProperties::default().with_headers(headers);
        if let Some(id) = &message.message_id {
            properties = properties.with_message_id(id.as_str().into());
        }
        if let Some(content_type) = &message.content_type {
            properties = properties.with_content_type(content_type.as_str().into());
        }
        if let Some(mode) = message.delivery_mode {
            properties = properties.with_delivery_mode(mode);
        }
        queue.publish(&serde_json::to_vec(&message.payload).unwrap(), properties).await;
    }
}

/// `(handled, dead)` messages recorded in `consumer`'s inbox.
async fn recorded(pool: &PgPool, consumer: &str) -> (i64, i64) {
    sqlx::query_as(
        "SELECT count(*) FILTER (WHERE handled_at IS NOT NULL), \
                count(*) FILTER (WHERE dead_at IS NOT NULL) \
         FROM outbox.inbox WHERE consumer = $1",
    )
    .bind(consumer)
    .fetch_one(pool)
    .await
    .unwrap()
}

/// Handler calls by job number, shared with a test's handler.
type Calls = Arc<Mutex<HashMap<u64, u32>>>;

/// Counts a call of `job`'s handler; returns which call it is, from 1.
fn called(calls: &Calls, job: u64) -> u32 {
    let mut calls = calls.lock().unwrap();
    let call = calls.entry(job).or_insert(0);
    *call += 1;
    *call
}

#[sqlx::test(migrations = false)]
async fn a_consumer_killed_mid_stream_and_restarted_has_each_effect_once(pool: PgPool) {
    migrated(&pool).await;
    create_effects(&pool).await;
    let exchange = Exchange::create().await;
    let queue = Queue::bound_to(&exchange).await;
    let ids = forwarded(&pool, &exchange, 300).await;
    duplicated_at_the_broker(&exchange, &queue, 40).await;
    assert_eq!(queue.counts().await, (340, 0), "each event once and 40 of them twice, ready");
    let _busy = CpuBurner::start(Duration::from_secs(60));

    // Killed three times mid-stream, each time after it made some progress: it holds up to 20
    // messages delivered and not acknowledged, which the broker delivers again.
    for round in 1..=3 {
        let consumer = ConsumerProcess::spawn(&pool, &queue);
        eventually("the consumer makes progress", || async {
            effects(&pool).await.1 >= 60 * round
        })
        .await;
        consumer.kill();
    }
    let last = ConsumerProcess::spawn(&pool, &queue);
    eventually("every event has its effect and every message was delivered", || async {
        effects(&pool).await.1 == 300 && queue.counts().await == (0, 1)
    })
    .await;
    // A graceful stop handles and acknowledges what the broker delivered: nothing goes back.
    assert!(last.terminate().await.success(), "the consumer stops cleanly at SIGTERM");
    assert_eq!(queue.ready_once_unconsumed().await, 0, "every message acknowledged");

    let (effects, distinct, repeated) = effects(&pool).await;
    assert_eq!((effects, distinct, repeated), (300, 300, 0), "each effect once");
    let handled: Vec<Uuid> = sqlx::query_scalar(
        "SELECT event_id FROM outbox.inbox WHERE consumer = 'inbox-process' \
         AND handled_at IS NOT NULL ORDER BY event_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut expected = ids;
    expected.sort();
    assert_eq!(handled, expected, "every event recorded handled, and nothing else");
}

#[sqlx::test(migrations = false)]
async fn failures_are_retried_through_the_broker_and_poison_is_acknowledged_dead(pool: PgPool) {
    migrated(&pool).await;
    let exchange = Exchange::create().await;
    let queue = Queue::bound_to(&exchange).await;
    let ids = forwarded(&pool, &exchange, 20).await;
    // Jobs with an odd number fail once; job 7 fails every time.
    let calls = Calls::default();
    let inbox = Inbox::builder(pool.clone(), "flaky")
        .state(calls.clone())
        .max_attempts(3)
        .backoff(outbox_runtime::Backoff {
            base: Duration::from_millis(50),
            cap: Duration::from_millis(200),
            jitter: false,
        })
        .handler(|ctx: InboxContext<Calls>, job: JobRun| async move {
            let call = called(ctx.state(), job.job);
            if job.job == 7 || (job.job % 2 == 1 && call == 1) {
                return Err(HandlerError(format!("job {} failed call {call}", job.job)));
            }
            Ok(())
        })
        .build()
        .unwrap();
    let consuming = Consuming::start(&inbox, &queue, 10).await;
    eventually("every message is handled or dead", || async {
        recorded(&pool, "flaky").await == (19, 1)
    })
    .await;
    consuming.stop().await;
    assert_eq!(queue.ready_once_unconsumed().await, 0, "every message acknowledged, poison too");

    let calls = calls.lock().unwrap().clone();
    for job in 0..20_u64 {
        let expected = match job {
            7 => 3,
            odd if odd % 2 == 1 => 2,
            _ => 1,
        };
        assert_eq!(calls[&job], expected, "calls of job {job}");
    }
    let dead: Vec<(Uuid, i32, String)> = sqlx::query_as(
        "SELECT event_id, attempts, last_error FROM outbox.inbox \
         WHERE consumer = 'flaky' AND dead_at IS NOT NULL",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(dead, [(ids[7], 3, "job 7 failed call 3".to_owned())]);
}

#[sqlx::test(migrations = false)]
async fn a_message_waiting_for_its_retry_holds_neither_the_queue_nor_the_shutdown(pool: PgPool) {
    migrated(&pool).await;
    let exchange = Exchange::create().await;
    let queue = Queue::bound_to(&exchange).await;
    forwarded(&pool, &exchange, 10).await;
    // Job 0 snoozes for an hour until `ready` is set.
    let ready = Arc::new(AtomicBool::new(false));
    let calls = Calls::default();
    let inbox = Inbox::builder(pool.clone(), "snoozing")
        .state((ready.clone(), calls.clone()))
        .handler(|ctx: InboxContext<(Arc<AtomicBool>, Calls)>, job: JobRun| async move {
            let (ready, calls) = ctx.state();
            called(calls, job.job);
            if job.job == 0 && !ready.load(Ordering::SeqCst) {
                return Err(BoxError::from(Snooze::after(Duration::from_secs(3600))));
            }
            Ok(())
        })
        .build()
        .unwrap();

    let consuming = Consuming::start(&inbox, &queue, 5).await;
    eventually("the messages behind the snoozed one are handled", || async {
        recorded(&pool, "snoozing").await == (9, 0)
    })
    .await;
    assert_eq!(calls.lock().unwrap()[&0], 1, "the snoozed message is held, not redelivered");
    // The shutdown does not wait out the hour: the held message goes back to the queue.
    consuming.stop().await;
    assert_eq!(queue.ready_once_unconsumed().await, 1, "the snoozed message is back, ready");

    ready.store(true, Ordering::SeqCst);
    let consuming = Consuming::start(&inbox, &queue, 5).await;
    eventually("the snoozed message is handled", || async {
        recorded(&pool, "snoozing").await == (10, 0)
    })
    .await;
    consuming.stop().await;
    assert_eq!(queue.ready_once_unconsumed().await, 0);
    let calls = calls.lock().unwrap().clone();
    assert_eq!(calls[&0], 2, "the snoozed message is called again once delivered again");
    assert!((1..10).all(|job| calls[&job] == 1), "the others once each: {calls:?}");
}

#[sqlx::test(migrations = false)]
async fn a_message_that_is_not_an_outbox_message_is_rejected_to_the_dead_letter_exchange(
    pool: PgPool,
) {
    migrated(&pool).await;
    let exchange = Exchange::create().await;
    let dead_letters = Queue::declare(None, FieldTable::default()).await;
    let mut arguments = FieldTable::default();
    arguments.insert("x-dead-letter-exchange".into(), AMQPValue::LongString("".into()));
    arguments.insert(
        "x-dead-letter-routing-key".into(),
        AMQPValue::LongString(dead_letters.name.as_str().into()),
    );
    let queue = Queue::declare(Some(&exchange), arguments).await;
    // Ahead of a forwarded event: one without headers, one whose event id is not a UUID.
    queue.publish(b"{}", BasicProperties::default().with_message_id("no-headers".into())).await;
    let mut headers = FieldTable::default();
    for (name, value) in [
        ("outbox-event-id", "not-a-uuid"),
        ("outbox-event-type", "job.run"),
        ("outbox-aggregate-type", "job"),
        ("outbox-aggregate-id", "1"),
        ("outbox-event-version", "1"),
    ] {
        headers.insert(name.into(), AMQPValue::LongString(value.into()));
    }
    let bad_id = BasicProperties::default().with_message_id("bad-id".into()).with_headers(headers);
    queue.publish(br#"{"job":1,"n":1}"#, bad_id).await;
    let ids = forwarded(&pool, &exchange, 1).await;

    let inbox = Inbox::builder(pool.clone(), "strict")
        .handler(|_: InboxContext, _: JobRun| async { Ok::<_, HandlerError>(()) })
        .build()
        .unwrap();
    let consuming = Consuming::start(&inbox, &queue, 10).await;
    eventually("the outbox message is handled and the others dead-lettered", || async {
        recorded(&pool, "strict").await == (1, 0) && dead_letters.counts().await.0 == 2
    })
    .await;
    consuming.stop().await;
    assert_eq!(queue.ready_once_unconsumed().await, 0);

    let handled: Vec<Uuid> =
        sqlx::query_scalar("SELECT event_id FROM outbox.inbox WHERE consumer = 'strict'")
            .fetch_all(&pool)
            .await
            .unwrap();
    assert_eq!(handled, ids, "only the outbox message is recorded");
    let rejected: Vec<(Option<String>, Option<String>)> = dead_letters
        .take_all()
        .await
        .iter()
        .map(|properties| {
            let id = properties.message_id().as_ref().map(ToString::to_string);
            (id, death_reason(properties))
        })
        .collect();
    let rejected_as = |id: &str| (Some(id.to_owned()), Some("rejected".to_owned()));
    assert_eq!(rejected, [rejected_as("no-headers"), rejected_as("bad-id")]);
}

/// The `reason` of the first entry of the `x-death` header the broker adds when it
/// dead-letters a message.
fn death_reason(properties: &BasicProperties) -> Option<String> {
    let headers = properties.headers().as_ref()?;
    let Some(AMQPValue::FieldArray(deaths)) = headers.inner().get("x-death") else {
        return None;
    };
    let Some(AMQPValue::FieldTable(death)) = deaths.as_slice().first() else {
        return None;
    };
    match death.inner().get("reason")? {
        AMQPValue::LongString(reason) => Some(reason.to_string()),
        AMQPValue::ShortString(reason) => Some(reason.to_string()),
        _ => None,
    }
}

#[sqlx::test(migrations = false)]
async fn consume_returns_when_the_broker_cancels_it_or_its_channel_closes(pool: PgPool) {
    migrated(&pool).await;
    let inbox = Inbox::builder(pool.clone(), "ended")
        .handler(|_: InboxContext, _: JobRun| async { Ok::<_, HandlerError>(()) })
        .build()
        .unwrap();

    // The queue deleted under the consumer: the broker cancels it, the channel stays open.
    let queue = Queue::declare(None, FieldTable::default()).await;
    let consuming = Consuming::start(&inbox, &queue, 10).await;
    eventually("the consumer is up", || async { queue.counts().await.1 == 1 }).await;
    let deleted = QueueDeleteOptions::default();
    queue.channel.queue_delete(queue.name.as_str().into(), deleted).await.unwrap();
    match consuming.ended().await {
        Err(ConsumeError::Cancelled { queue: name }) => assert_eq!(name, queue.name),
        other => panic!("expected the broker's cancellation, got {other:?}"),
    }

    // The channel closed under the consumer: an error naming the queue.
    let queue = Queue::declare(None, FieldTable::default()).await;
    let consuming = Consuming::start(&inbox, &queue, 10).await;
    eventually("the consumer is up", || async { queue.counts().await.1 == 1 }).await;
    consuming.channel.close(200, "closed under the consumer".into()).await.unwrap();
    let channel = consuming.channel.clone();
    match consuming.ended().await {
        Err(error @ ConsumeError::Channel { .. }) => {
            let text = error.to_string();
            assert_eq!(text, format!("cannot consume RabbitMQ queue `{}`", queue.name));
        }
        other => panic!("expected the channel's error, got {other:?}"),
    }
    assert!(!channel.status().connected());

    // A name no queue can have.
    let long = "q".repeat(256);
    let consumed = rabbitmq::consume(&inbox, &channel, &long, 10, std::future::pending()).await;
    assert!(matches!(consumed, Err(ConsumeError::QueueName { .. })), "{consumed:?}");
}
