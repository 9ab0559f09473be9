//! The inbox consuming NATS JetStream, end to end: a relay forwards events to a stream, the
//! broker is made to deliver some twice, and an inbox consumer in a process of its own is
//! SIGKILLed mid-stream and started again. Repeats at the broker, none at the effect.

mod support;

use std::process::{Child, Command, Stdio};
use std::time::Duration;

use async_nats::jetstream::consumer::{pull, AckPolicy, PullConsumer};
use async_nats::HeaderMap;
use outbox_runtime::forward::Forward;
use outbox_runtime::inbox::{nats, Inbox, InboxContext};
use outbox_runtime::Relay;
use sqlx::PgPool;
use support::inbox::{create_effects, effects};
use support::nats::Stream;
use support::relay_process::JobRun;
use support::*;
use uuid::Uuid;

/// An `inbox-process` child, killed when dropped so a failing test leaves none behind.
struct Consumer(Child);

impl Consumer {
    fn spawn(pool: &PgPool, stream: &Stream, consumer: &str) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_inbox-process"))
            .args([&database_url(pool), &stream.name, consumer])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("inbox-process starts");
        Consumer(child)
    }

    fn kill(mut self) {
        self.0.kill().expect("SIGKILL is delivered");
        self.0.wait().expect("the killed consumer is reaped");
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Emits `count` jobs and forwards them to `stream` with a relay; returns their event ids.
async fn forwarded(pool: &PgPool, stream: &Stream, count: u64) -> Vec<Uuid> {
    let mut ids = Vec::new();
    let mut tx = pool.begin().await.unwrap();
    for job in 0..count {
        ids.push(outbox_runtime::emit(&mut tx, &JobRun { job, n: job }).await.unwrap());
    }
    tx.commit().await.unwrap();
    let destination = format!("{}.{{event_type}}", stream.prefix);
    let relay = Running::start(
        fast(Relay::builder(pool.clone()))
            .forward(Forward::to(stream.sink()).destination(&destination)),
    );
    eventually("every job is in the stream", || async {
        stream.message_ids().await.len() as u64 == count
    })
    .await;
    relay.stop().await;
    ids
}

/// Publishes the first `count` messages of `stream` again under new message ids, so the
/// stream's deduplication lets them through: the broker delivers those events twice.
async fn duplicated_at_the_broker(stream: &Stream, count: usize) {
    for (subject, headers, payload) in stream.messages().await.into_iter().take(count) {
        let mut copy = HeaderMap::new();
        for (name, value) in &headers {
            if name != "Nats-Msg-Id" {
                copy.insert(name.as_str(), value.as_str());
            }
        }
        copy.insert("Nats-Msg-Id", Uuid::new_v4().to_string().as_str());
        let body = serde_json::to_vec(&payload).unwrap();
        let ack = stream.jetstream.publish_with_headers(subject, copy, body.into()).await.unwrap();
        ack.await.unwrap();
    }
}

async fn consumer(stream: &Stream, name: &str, ack_wait: Duration) -> PullConsumer {
    let found = stream.jetstream.get_stream(&stream.name).await.unwrap();
    found
        .create_consumer(pull::Config {
            durable_name: Some(name.to_owned()),
            ack_policy: AckPolicy::Explicit,
            ack_wait,
            ..Default::default()
        })
        .await
        .unwrap()
}

/// Whether the consumer has delivered every message and has none waiting for its
/// acknowledgement.
async fn settled(consumer: &PullConsumer) -> bool {
    let mut consumer = consumer.clone();
    let info = consumer.info().await.unwrap();
    info.num_pending == 0 && info.num_ack_pending == 0
}

#[sqlx::test(migrations = false)]
async fn a_consumer_killed_mid_stream_and_restarted_has_each_effect_once(pool: PgPool) {
    migrated(&pool).await;
    create_effects(&pool).await;
    let stream = Stream::create(Duration::from_secs(120)).await;
    let ids = forwarded(&pool, &stream, 300).await;
    duplicated_at_the_broker(&stream, 40).await;
    // A short ack wait: messages the killed consumer held come back soon.
    let name = "billing";
    let jetstream_consumer = consumer(&stream, name, Duration::from_secs(2)).await;
    let _busy = CpuBurner::start(Duration::from_secs(60));

    // Killed three times mid-stream, each time after it made some progress.
    for round in 1..=3 {
        let first = Consumer::spawn(&pool, &stream, name);
        eventually("the consumer makes progress", || async {
            effects(&pool).await.1 >= 60 * round
        })
        .await;
        first.kill();
    }
    let last = Consumer::spawn(&pool, &stream, name);
    eventually("every event has its effect", || async { effects(&pool).await.1 == 300 }).await;
    eventually("every message is acknowledged", || settled(&jetstream_consumer)).await;
    drop(last);

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
    let info = jetstream_consumer.clone().info().await.unwrap().clone();
    assert!(info.delivered.stream_sequence >= 340, "the broker delivered the 40 copies too");
}

#[sqlx::test(migrations = false)]
async fn failures_are_retried_by_the_broker_and_poison_is_acknowledged_dead(pool: PgPool) {
    migrated(&pool).await;
    let stream = Stream::create(Duration::from_secs(120)).await;
    let ids = forwarded(&pool, &stream, 20).await;
    // Jobs with an odd number fail once; job 7 fails every time.
    let calls = std::sync::Arc::new(std::sync::Mutex::new(std::collections::HashMap::new()));
    let inbox = Inbox::builder(pool.clone(), "flaky")
        .state(calls.clone())
        .max_attempts(3)
        .backoff(outbox_runtime::Backoff {
            base: Duration::from_millis(50),
            cap: Duration::from_millis(200),
            jitter: false,
        })
        .handler(
            |ctx: InboxContext<
                std::sync::Arc<std::sync::Mutex<std::collections::HashMap<u64, u32>>>,
            >,
             job: JobRun| async move {
                let call = {
                    let mut calls = ctx.state().lock().unwrap();
                    let call = calls.entry(job.job).or_insert(0);
                    *call += 1;
                    *call
                };
                if job.job == 7 || (job.job % 2 == 1 && call == 1) {
                    return Err(HandlerError(format!("job {} failed call {call}", job.job)));
                }
                Ok(())
            },
        )
        .build()
        .unwrap();
    let jetstream_consumer = consumer(&stream, "flaky", Duration::from_secs(30)).await;
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let consuming = tokio::spawn({
        let (inbox, jetstream_consumer) = (inbox.clone(), jetstream_consumer.clone());
        async move {
            nats::consume(&inbox, &jetstream_consumer, async {
                let _ = stopped.await;
            })
            .await
        }
    });
    eventually("every message is settled", || settled(&jetstream_consumer)).await;
    let _ = stop.send(());
    consuming.await.unwrap().unwrap();

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
    let handled: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM outbox.inbox WHERE consumer = 'flaky' AND handled_at IS NOT NULL",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(handled, 19);
}
