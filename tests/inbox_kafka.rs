//! The inbox consuming Kafka, end to end, on the Kafka-protocol broker at 127.0.0.1:9092 (tansu;
//! see `support::kafka`): a relay forwards events to a topic of the test's own, the broker is made
//! to hold some twice, and an inbox consumer in a process of its own is SIGKILLed mid-stream and
//! started again. Repeats at the broker, none at the effect. Failures are retried with their
//! partition waiting behind them, so each aggregate's events are handled in order; a database
//! outage holds the records without spending their attempts.

mod support;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use outbox_runtime::forward::kafka::{rdkafka, KafkaSink};
use outbox_runtime::forward::Forward;
use outbox_runtime::inbox::{kafka, Inbox, InboxContext};
use outbox_runtime::{Backoff, Relay, Snooze};
use rdkafka::consumer::{BaseConsumer, Consumer, StreamConsumer};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use sqlx::PgPool;
use support::inbox::{create_effects, effects};
use support::kafka::{Record, Topics, KAFKA};
use support::proxy::Proxy;
use support::relay_process::JobRun;
use support::*;
use uuid::Uuid;

/// Partitions of every topic here (`forwarded` creates the topic so).
const PARTITIONS: i32 = 3;

/// An `inbox-process-kafka` child, killed when dropped so a failing test leaves none behind.
struct InboxProcess(Child);

impl InboxProcess {
    fn spawn(pool: &PgPool, topic: &str, group: &str) -> Self {
        let child = Command::new(env!("CARGO_BIN_EXE_inbox-process-kafka"))
            .args([&database_url(pool), KAFKA, topic, group])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("inbox-process-kafka starts");
        InboxProcess(child)
    }

    fn kill(mut self) {
        self.0.kill().expect("SIGKILL is delivered");
        self.0.wait().expect("the killed consumer is reaped");
    }

    /// SIGTERM, then waits for the process to finish its record, commit and exit.
    async fn terminate(mut self) {
        let pid = self.0.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(sent.success(), "kill -TERM {pid}");
        let mut status = None;
        eventually("the consumer exits after SIGTERM", || {
            status = self.0.try_wait().unwrap();
            std::future::ready(status.is_some())
        })
        .await;
        assert!(status.unwrap().success(), "a graceful exit: {status:?}");
    }
}

impl Drop for InboxProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Emits `n` = 0, 1, ... `per_job - 1` for each of `jobs` jobs (one aggregate each), emit order
/// by `n`, and forwards them to `topic` with a relay; returns their event ids by `(job, n)`.
async fn forwarded(
    pool: &PgPool,
    topics: &Topics,
    topic: &str,
    jobs: u64,
    per_job: u64,
) -> HashMap<(u64, u64), Uuid> {
    let mut ids = HashMap::new();
    let mut tx = pool.begin().await.unwrap();
    for n in 0..per_job {
        for job in 0..jobs {
            ids.insert((job, n), outbox_runtime::emit(&mut tx, &JobRun { job, n }).await.unwrap());
        }
    }
    tx.commit().await.unwrap();
    let sink = KafkaSink::new(&one_record_batches(topics.config()))
        .unwrap()
        .topics([topic])
        .create_missing_topics(PARTITIONS, 1);
    let relay = Running::start(
        fast(Relay::builder(pool.clone())).forward(Forward::to(sink).destination(topic)),
    );
    let total = ids.len() as i64;
    eventually("every event is published", || async { count_published(pool).await == total }).await;
    relay.stop().await;
    ids
}

/// Producer settings that write each record as a batch of its own. tansu 0.6.0 serves a fetch
/// only from the batches whose first offset is at or past the fetch offset (its storage's
/// `fetch` takes `offsets.split_off(&offset)` of the batches' base offsets): a consumer that
/// resumes inside a batch (from a committed offset, or after a pause) would never get the rest
/// of that batch. Apache Kafka returns the batch holding the offset, and librdkafka skips the
/// records before it; with one record per batch, tansu does the same.
fn one_record_batches(mut config: ClientConfig) -> ClientConfig {
    config.set("batch.num.messages", "1");
    config
}

/// Produces `records` again, each to its partition with its key, headers and payload: the
/// broker then holds those events twice, at other offsets.
async fn duplicated_at_the_broker(topics: &Topics, records: &[&Record]) {
    let producer: FutureProducer = one_record_batches(topics.config()).create().unwrap();
    for record in records {
        let headers = record.headers.iter().fold(OwnedHeaders::new(), |headers, (key, value)| {
            headers.insert(Header { key, value: Some(value) })
        });
        let payload = serde_json::to_vec(&record.payload).unwrap();
        let copy = FutureRecord::to(&record.topic)
            .partition(record.partition)
            .key(&record.key)
            .headers(headers)
            .payload(&payload);
        producer.send(copy, Duration::from_secs(10)).await.unwrap();
    }
}

/// A record that is not an outbox message (no outbox headers), produced to `topic`.
async fn not_an_outbox_message(topics: &Topics, topic: &str) {
    let producer: FutureProducer = topics.config().create().unwrap();
    let record = FutureRecord::to(topic).key("stranger").payload(r#"{"hello":"world"}"#);
    producer.send(record, Duration::from_secs(10)).await.unwrap();
}

/// Reads a consumer group's committed offsets without joining it.
struct GroupOffsets {
    reader: Arc<BaseConsumer>,
    topic: String,
}

impl GroupOffsets {
    fn new(topics: &Topics, topic: &str, group: &str) -> Self {
        let reader = topics.config().set("group.id", group).create().unwrap();
        GroupOffsets { reader: Arc::new(reader), topic: topic.to_owned() }
    }

    /// Whether the group committed the end of every partition: every record in it settled.
    async fn at_the_end(&self) -> bool {
        self.partitions()
            .await
            .iter()
            .all(|&(committed, end)| end == 0 || committed == Offset::Offset(end))
    }

    /// Whether the group committed an offset of any partition.
    async fn committed_any(&self) -> bool {
        self.partitions().await.iter().any(|(committed, _)| matches!(committed, Offset::Offset(_)))
    }

    /// `(committed offset, end offset)` of each partition.
    async fn partitions(&self) -> Vec<(Offset, i64)> {
        let (reader, topic) = (self.reader.clone(), self.topic.clone());
        tokio::task::spawn_blocking(move || {
            let timeout = Duration::from_secs(5);
            let mut partitions = TopicPartitionList::new();
            for partition in 0..PARTITIONS {
                partitions.add_partition(&topic, partition);
            }
            let committed = reader.committed_offsets(partitions, timeout).unwrap();
            (0..PARTITIONS)
                .map(|partition| {
                    let (_, end) = reader.fetch_watermarks(&topic, partition, timeout).unwrap();
                    (committed.find_partition(&topic, partition).unwrap().offset(), end)
                })
                .collect()
        })
        .await
        .unwrap()
    }
}

/// `kafka::consume` running in a task of the test, on a consumer the test can look at too.
struct Consuming {
    consumer: Arc<StreamConsumer>,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), kafka::ConsumeError>>,
}

impl Consuming {
    /// A consumer in `group` subscribed to `topic`, consumed into `inbox`.
    fn start(inbox: Inbox<Calls>, topics: &Topics, topic: &str, group: &str) -> Self {
        let consumer: StreamConsumer =
            kafka::consumer_config(&consumer_settings(topics, group)).create().unwrap();
        consumer.subscribe(&[topic]).unwrap();
        let consumer = Arc::new(consumer);
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn({
            let consumer = consumer.clone();
            async move {
                kafka::consume(&inbox, &consumer, async {
                    let _ = stopped.await;
                })
                .await
            }
        });
        Consuming { consumer, stop, task }
    }

    /// Whether the consumer handed a record over to `consume`.
    fn read_some(&self) -> bool {
        let positions = self.consumer.position().unwrap();
        positions.elements().iter().any(|p| matches!(p.offset(), Offset::Offset(_)))
    }

    /// Stops consuming, asserts it ended well, and closes the consumer (leaving its group).
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().expect("consuming stops at its shutdown");
        let consumer = self.consumer;
        tokio::task::spawn_blocking(move || drop(consumer)).await.unwrap();
    }
}

/// The settings of an in-process consumer in `group`; the child process sets the same.
fn consumer_settings(topics: &Topics, group: &str) -> ClientConfig {
    let mut config = topics.config();
    config
        .set("group.id", group)
        .set("session.timeout.ms", "6000")
        .set("heartbeat.interval.ms", "1000");
    config
}

#[sqlx::test(migrations = false)]
async fn a_consumer_killed_mid_stream_and_restarted_has_each_effect_once(pool: PgPool) {
    migrated(&pool).await;
    create_effects(&pool).await;
    let topics = Topics::new();
    let topic = format!("{}.jobs", topics.prefix);
    let ids = forwarded(&pool, &topics, &topic, 300, 1).await;
    let records = topics.records(&topic, 300).await;
    assert_eq!(records.len(), 300, "each event forwarded once");
    // Copies spread over the partitions.
    let copies: Vec<&Record> = records.iter().step_by(7).take(40).collect();
    duplicated_at_the_broker(&topics, &copies).await;
    assert_eq!(topics.records(&topic, 340).await.len(), 340, "the broker holds the 40 copies");
    let group = format!("{}.billing", topics.prefix);
    let offsets = GroupOffsets::new(&topics, &topic, &group);
    let _busy = CpuBurner::start(Duration::from_secs(120));

    // Killed three times mid-stream, each time after it made some progress.
    for round in 1..=3 {
        let consumer = InboxProcess::spawn(&pool, &topic, &group);
        eventually("the consumer makes progress", || async {
            effects(&pool).await.1 >= 60 * round
        })
        .await;
        consumer.kill();
    }
    let last = InboxProcess::spawn(&pool, &topic, &group);
    eventually("every event has its effect", || async { effects(&pool).await.1 == 300 }).await;
    eventually("the group committed every partition to its end", || offsets.at_the_end()).await;
    last.terminate().await;
    assert!(offsets.at_the_end().await, "still at the end after a graceful exit");

    let (effects, distinct, repeated) = effects(&pool).await;
    assert_eq!((effects, distinct, repeated), (300, 300, 0), "each effect once");
    let handled: Vec<Uuid> = sqlx::query_scalar(
        "SELECT event_id FROM outbox.inbox WHERE consumer = 'inbox-process' \
         AND handled_at IS NOT NULL ORDER BY event_id",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    let mut expected: Vec<Uuid> = ids.into_values().collect();
    expected.sort();
    assert_eq!(handled, expected, "every event recorded handled, and nothing else");
}

/// What the handler of the retry test was called with, in call order: `(job, n)`.
type Calls = Arc<Mutex<Vec<(u64, u64)>>>;

/// Records the call; returns which call of `(job, n)` it is, from 1.
fn called(ctx: &InboxContext<Calls>, job: &JobRun) -> usize {
    let mut calls = ctx.state().lock().unwrap();
    calls.push((job.job, job.n));
    calls.iter().filter(|&&call| call == (job.job, job.n)).count()
}

/// Calls per job, in call order: the `n` of each.
fn per_job(calls: &Calls) -> HashMap<u64, Vec<u64>> {
    let mut per_job: HashMap<u64, Vec<u64>> = HashMap::new();
    for &(job, n) in calls.lock().unwrap().iter() {
        per_job.entry(job).or_default().push(n);
    }
    per_job
}

/// Jobs 0 to 3, `n` 0 to 5 each. Odd `n` fails its first call; job 2's `n` 3 fails every call;
/// job 1's `n` 4 snoozes once.
async fn flaky(ctx: InboxContext<Calls>, job: JobRun) -> Result<(), outbox_runtime::BoxError> {
    let call = called(&ctx, &job);
    match (job.job, job.n) {
        (2, 3) => Err(HandlerError(format!("job 2 n 3 failed call {call}")).into()),
        (1, 4) if call == 1 => Err(Snooze::after(Duration::from_millis(100)).into()),
        (job, n) if n % 2 == 1 && call == 1 => {
            Err(HandlerError(format!("job {job} n {n} failed call {call}")).into())
        }
        _ => Ok(()),
    }
}

#[sqlx::test(migrations = false)]
async fn failures_hold_their_partition_and_poison_is_dead_in_order(pool: PgPool) {
    migrated(&pool).await;
    let topics = Topics::new();
    let topic = format!("{}.jobs", topics.prefix);
    let ids = forwarded(&pool, &topics, &topic, 4, 6).await;
    not_an_outbox_message(&topics, &topic).await;
    // Each job's events in emit order at the broker: one key, one partition.
    let records = topics.records(&topic, 25).await;
    assert_eq!(records.len(), 25);
    let mut at_the_broker: HashMap<u64, Vec<u64>> = HashMap::new();
    for record in records.iter().filter(|record| record.key != "stranger") {
        let job = record.payload["job"].as_u64().unwrap();
        at_the_broker.entry(job).or_default().push(record.payload["n"].as_u64().unwrap());
    }
    for job in 0..4 {
        assert_eq!(at_the_broker[&job], [0, 1, 2, 3, 4, 5], "job {job} at the broker");
    }

    let calls = Calls::default();
    let inbox = Inbox::builder(pool.clone(), "flaky")
        .state(calls.clone())
        .max_attempts(3)
        .backoff(Backoff {
            base: Duration::from_millis(50),
            cap: Duration::from_millis(200),
            jitter: false,
        })
        .handler(flaky)
        .build()
        .unwrap();
    let group = format!("{}.flaky", topics.prefix);
    let consuming = Consuming::start(inbox, &topics, &topic, &group);
    let offsets = GroupOffsets::new(&topics, &topic, &group);
    eventually("every record is settled and committed", || offsets.at_the_end()).await;
    consuming.stop().await;

    // Per job, each record's calls before the next record's: its partition waited.
    let per_job = per_job(&calls);
    assert_eq!(per_job[&0], [0, 1, 1, 2, 3, 3, 4, 5, 5], "job 0");
    assert_eq!(per_job[&1], [0, 1, 1, 2, 3, 3, 4, 4, 5, 5], "job 1: n 4 snoozed once");
    assert_eq!(per_job[&2], [0, 1, 1, 2, 3, 3, 3, 4, 5, 5], "job 2: n 3 dead after 3 calls");
    assert_eq!(per_job[&3], [0, 1, 1, 2, 3, 3, 4, 5, 5], "job 3");

    let dead: Vec<(Uuid, i32, String)> = sqlx::query_as(
        "SELECT event_id, attempts, last_error FROM outbox.inbox \
         WHERE consumer = 'flaky' AND dead_at IS NOT NULL",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    assert_eq!(dead, [(ids[&(2, 3)], 3, "job 2 n 3 failed call 3".to_owned())]);
    let mut handled: Vec<Uuid> = sqlx::query_scalar(
        "SELECT event_id FROM outbox.inbox WHERE consumer = 'flaky' AND handled_at IS NOT NULL",
    )
    .fetch_all(&pool)
    .await
    .unwrap();
    handled.sort();
    let mut expected: Vec<Uuid> =
        ids.iter().filter(|(key, _)| **key != (2, 3)).map(|(_, id)| *id).collect();
    expected.sort();
    assert_eq!(handled, expected, "the others handled, the stranger record skipped");
}

async fn counted(ctx: InboxContext<Calls>, job: JobRun) -> Result<(), outbox_runtime::BoxError> {
    called(&ctx, &job);
    Ok(())
}

#[sqlx::test(migrations = false)]
async fn a_database_outage_holds_the_records_and_spends_no_attempt(pool: PgPool) {
    migrated(&pool).await;
    let topics = Topics::new();
    let topic = format!("{}.jobs", topics.prefix);
    forwarded(&pool, &topics, &topic, 3, 10).await;
    let proxy = Proxy::to_database(&pool).await;
    proxy.cut();
    let calls = Calls::default();
    // One attempt each: a database failure counted as one would make the record dead.
    let inbox = Inbox::builder(proxy.pool(&pool), "outage")
        .state(calls.clone())
        .max_attempts(1)
        .handler(counted)
        .build()
        .unwrap();
    let group = format!("{}.outage", topics.prefix);
    let consuming = Consuming::start(inbox, &topics, &topic, &group);
    let offsets = GroupOffsets::new(&topics, &topic, &group);
    eventually("records are read while the database is away", || {
        std::future::ready(consuming.read_some())
    })
    .await;
    assert!(!offsets.committed_any().await, "nothing committed while the database is away");
    proxy.restore();
    eventually("every record is settled and committed", || offsets.at_the_end()).await;
    consuming.stop().await;

    let rows: (i64, i64, i32) = sqlx::query_as(
        "SELECT count(*) FILTER (WHERE handled_at IS NOT NULL), \
                count(*) FILTER (WHERE dead_at IS NOT NULL), coalesce(max(attempts), 0) \
         FROM outbox.inbox WHERE consumer = 'outage'",
    )
    .fetch_one(&pool)
    .await
    .unwrap();
    assert_eq!(rows, (30, 0, 0), "all handled, no attempt spent");
    let per_job = per_job(&calls);
    for job in 0..3 {
        assert_eq!(per_job[&job], (0..10).collect::<Vec<u64>>(), "job {job}: once each, in order");
    }
}

#[tokio::test]
async fn a_consumer_that_stores_offsets_itself_is_refused() {
    let topics = Topics::new();
    let group = format!("{}.careless", topics.prefix);
    // Without `consumer_config`: librdkafka stores offsets as it hands records over.
    let consumer: StreamConsumer = consumer_settings(&topics, &group).create().unwrap();
    let pool = sqlx::postgres::PgPoolOptions::new().connect_lazy("postgres://nowhere/").unwrap();
    let inbox = Inbox::builder(pool, "careless").build().unwrap();
    let error = kafka::consume(&inbox, &consumer, std::future::pending()).await.unwrap_err();
    assert!(matches!(error, kafka::ConsumeError::AutoOffsetStore), "{error:?}");
    assert!(error.to_string().contains("enable.auto.offset.store=false"), "{error}");
}
