//! Forwarding to real brokers (NATS JetStream on 127.0.0.1:4222, RabbitMQ on 127.0.0.1:5672,
//! Redis on 127.0.0.1:6379, the Kafka-protocol broker on 127.0.0.1:9092): a relay draining a
//! backlog into the broker against the bare client publishing the same payloads with
//! confirmations and against the same relay draining the same backlog into a no-op handler,
//! and commit-to-consumer latency at a steady rate.
//!
//! Each broker gets a destination of the run's own (a JetStream stream; a RabbitMQ topic
//! exchange with a durable queue bound to it; a Redis stream; a Kafka topic), deleted
//! afterwards where the broker can. The relay forwards with its
//! defaults and one destination template, `{prefix}.{aggregate_type}.{event_type}`.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures_util::future::BoxFuture;
use futures_util::StreamExt;
use outbox_runtime::forward::kafka::{rdkafka, KafkaSink};
use outbox_runtime::forward::nats::{async_nats, NatsSink};
use outbox_runtime::forward::rabbitmq::{lapin, RabbitSink};
use outbox_runtime::forward::redis::{redis, RedisSink};
use outbox_runtime::forward::{Forward, OutboundMessage, Sink, SinkError};
use outbox_runtime::Relay;
use sqlx::{PgPool, Row};
use tokio::task::JoinHandle;
use uuid::Uuid;

use crate::cpu::{Cpu, Spent};
use crate::db::{self, Database};
use crate::events::credited;
use crate::relay::{self, Calls, Running, Setup};

const NATS: &str = "127.0.0.1:4222";
const AMQP: &str = "amqp://guest:guest@127.0.0.1:5672/%2f";
const KAFKA: &str = "127.0.0.1:9092";
const REDIS: &str = "redis://127.0.0.1:6379";

/// One backlog row as the bare client publishes it: the same subject or routing key and
/// payload as the relay's message, under a fresh id (JetStream would drop the relay's ids as
/// duplicates).
pub struct Payload {
    id: Uuid,
    destination: String,
    payload: Vec<u8>,
}

/// Each message's first arrival at the consumer, by event id, and the arrivals beyond one.
#[derive(Clone, Default)]
pub struct Arrivals(Arc<Mutex<(HashMap<Uuid, Instant>, u64)>>);

impl Arrivals {
    fn arrived(&self, id: Option<Uuid>) {
        let now = Instant::now();
        let mut arrivals = self.0.lock().unwrap();
        let Some(id) = id else { panic!("a message without an event id") };
        if arrivals.0.insert(id, now).is_some() {
            arrivals.1 += 1;
        }
    }

    fn distinct(&self) -> usize {
        self.0.lock().unwrap().0.len()
    }
}

/// A broker with a destination of the run's own.
pub trait Broker: Sized {
    /// Creates the destination (stream; exchange and queue).
    async fn create() -> Self;
    /// Every destination the relay and the baseline publish to starts with this and a dot.
    fn prefix(&self) -> &str;
    /// The relay's sink, on a connection of its own.
    async fn sink(&self) -> impl Sink;
    /// Publishes `messages` with the bare client, keeping `window` confirmations outstanding,
    /// and returns once every one is confirmed.
    async fn publish_bare(&self, messages: &[Payload], window: usize);
    /// Removes every message the broker holds for the run; returns how many there were.
    async fn purge(&self) -> u64;
    /// A consumer of the destination recording each message's arrival, until aborted.
    async fn consume(&self, arrivals: Arrivals) -> JoinHandle<()>;
    /// Deletes the destination.
    async fn delete(self);
}

/// JetStream: a file-backed stream of the run's own taking `{prefix}.>`.
pub struct Nats {
    jetstream: async_nats::jetstream::Context,
    stream: String,
    prefix: String,
}

impl Broker for Nats {
    async fn create() -> Self {
        let client = async_nats::connect(NATS).await.expect("NATS runs on 127.0.0.1:4222");
        let jetstream = async_nats::jetstream::new(client);
        let id = Uuid::new_v4().simple().to_string();
        let (stream, prefix) = (format!("OUTBOX_BENCH_{id}"), format!("bench{id}"));
        let config = async_nats::jetstream::stream::Config {
            name: stream.clone(),
            subjects: vec![format!("{prefix}.>")],
            ..Default::default()
        };
        jetstream.create_stream(config).await.expect("the stream is created");
        Nats { jetstream, stream, prefix }
    }

    fn prefix(&self) -> &str {
        &self.prefix
    }

    async fn sink(&self) -> impl Sink {
        NatsSink::new(async_nats::connect(NATS).await.unwrap(), &self.stream)
    }

    async fn publish_bare(&self, messages: &[Payload], window: usize) {
        use async_nats::jetstream::message::PublishMessage;
        let client = async_nats::connect(NATS).await.unwrap();
        let jetstream = async_nats::jetstream::new(client);
        let mut outstanding = VecDeque::with_capacity(window);
        for message in messages {
            if outstanding.len() == window {
                let ack: async_nats::jetstream::context::PublishAckFuture =
                    outstanding.pop_front().unwrap();
                ack.await.unwrap();
            }
            let publish = PublishMessage::build()
                .payload(message.payload.clone().into())
                .message_id(message.id.to_string());
            let destination = message.destination.clone();
            outstanding.push_back(jetstream.send_publish(destination, publish).await.unwrap());
        }
        for ack in outstanding {
            ack.await.unwrap();
        }
    }

    async fn purge(&self) -> u64 {
        let stream = self.jetstream.get_stream(&self.stream).await.unwrap();
        stream.purge().await.unwrap().purged
    }

    async fn consume(&self, arrivals: Arrivals) -> JoinHandle<()> {
        use async_nats::jetstream::consumer::{pull, AckPolicy};
        let stream = self.jetstream.get_stream(&self.stream).await.unwrap();
        let config = pull::Config { ack_policy: AckPolicy::None, ..Default::default() };
        let consumer = stream.create_consumer(config).await.unwrap();
        let mut messages = consumer.messages().await.unwrap();
        tokio::spawn(async move {
            while let Some(message) = messages.next().await {
                let message = message.unwrap();
                let header = async_nats::header::NATS_MESSAGE_ID;
                let id = message.headers.as_ref().and_then(|h| h.get(header));
                arrivals.arrived(id.and_then(|id| id.as_str().parse().ok()));
            }
        })
    }

    async fn delete(self) {
        self.jetstream.delete_stream(&self.stream).await.unwrap();
    }
}

/// RabbitMQ: a topic exchange of the run's own and a durable queue bound to it for
/// `{prefix}.#`.
pub struct Rabbit {
    connection: lapin::Connection,
    channel: lapin::Channel,
    exchange: String,
    queue: String,
    prefix: String,
}

async fn amqp() -> lapin::Connection {
    lapin::Connection::connect(AMQP, lapin::ConnectionProperties::default())
        .await
        .expect("RabbitMQ runs on 127.0.0.1:5672")
}

impl Broker for Rabbit {
    async fn create() -> Self {
        use lapin::options::{ExchangeDeclareOptions, QueueBindOptions, QueueDeclareOptions};
        use lapin::types::FieldTable;
        let connection = amqp().await;
        let channel = connection.create_channel().await.unwrap();
        let id = Uuid::new_v4().simple().to_string();
        let (exchange, queue, prefix) =
            (format!("outbox-bench-{id}"), format!("outbox-bench-{id}"), format!("bench{id}"));
        let durable = QueueDeclareOptions { durable: true, ..Default::default() };
        channel.queue_declare(queue.as_str().into(), durable, FieldTable::default()).await.unwrap();
        let kind = lapin::ExchangeKind::Topic;
        let options = ExchangeDeclareOptions::default();
        channel
            .exchange_declare(exchange.as_str().into(), kind, options, FieldTable::default())
            .await
            .unwrap();
        let (keys, bind) = (format!("{prefix}.#"), QueueBindOptions::default());
        channel
            .queue_bind(
                queue.as_str().into(),
                exchange.as_str().into(),
                keys.into(),
                bind,
                FieldTable::default(),
            )
            .await
            .unwrap();
        Rabbit { connection, channel, exchange, queue, prefix }
    }

    fn prefix(&self) -> &str {
        &self.prefix
    }

    async fn sink(&self) -> impl Sink {
        RabbitSink::new(amqp().await, &self.exchange)
    }

    async fn publish_bare(&self, messages: &[Payload], window: usize) {
        use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
        let connection = amqp().await;
        let channel = connection.create_channel().await.unwrap();
        channel.confirm_select(ConfirmSelectOptions::default()).await.unwrap();
        let confirmed = |confirmation: lapin::Confirmation| {
            assert!(matches!(confirmation, lapin::Confirmation::Ack(None)), "{confirmation:?}");
        };
        let mandatory = BasicPublishOptions { mandatory: true, ..Default::default() };
        let mut outstanding = VecDeque::with_capacity(window);
        for message in messages {
            if outstanding.len() == window {
                let confirm: lapin::PublisherConfirm = outstanding.pop_front().unwrap();
                confirmed(confirm.await.unwrap());
            }
            let properties = lapin::BasicProperties::default()
                .with_message_id(message.id.to_string().into())
                .with_content_type("application/json".into())
                .with_delivery_mode(2);
            let confirm = channel
                .basic_publish(
                    self.exchange.as_str().into(),
                    message.destination.as_str().into(),
                    mandatory,
                    &message.payload,
                    properties,
                )
                .await
                .unwrap();
            outstanding.push_back(confirm);
        }
        for confirm in outstanding {
            confirmed(confirm.await.unwrap());
        }
        let _ = connection.close(200, "done".into()).await;
    }

    async fn purge(&self) -> u64 {
        let options = lapin::options::QueuePurgeOptions::default();
        u64::from(self.channel.queue_purge(self.queue.as_str().into(), options).await.unwrap())
    }

    async fn consume(&self, arrivals: Arrivals) -> JoinHandle<()> {
        use lapin::options::BasicConsumeOptions;
        let channel = self.connection.create_channel().await.unwrap();
        let no_ack = BasicConsumeOptions { no_ack: true, ..Default::default() };
        let mut consumer = channel
            .basic_consume(
                self.queue.as_str().into(),
                "bench".into(),
                no_ack,
                lapin::types::FieldTable::default(),
            )
            .await
            .unwrap();
        tokio::spawn(async move {
            let _channel = channel;
            while let Some(delivery) = consumer.next().await {
                let delivery = delivery.unwrap();
                let id = delivery.properties.message_id().as_ref();
                arrivals.arrived(id.and_then(|id| id.as_str().parse().ok()));
            }
        })
    }

    async fn delete(self) {
        use lapin::options::{ExchangeDeleteOptions, QueueDeleteOptions};
        let queue = self.queue.as_str().into();
        self.channel.queue_delete(queue, QueueDeleteOptions::default()).await.unwrap();
        let exchange = self.exchange.as_str().into();
        self.channel.exchange_delete(exchange, ExchangeDeleteOptions::default()).await.unwrap();
        let _ = self.connection.close(200, "done".into()).await;
    }
}

/// Redis: one stream of the run's own, `{prefix}.account.account.credited` (the backlog's one
/// destination).
pub struct Redis {
    connection: redis::aio::ConnectionManager,
    stream: String,
    prefix: String,
}

async fn redis_connection() -> redis::aio::ConnectionManager {
    let client = redis::Client::open(REDIS).unwrap();
    client.get_connection_manager().await.expect("Redis runs on 127.0.0.1:6379")
}

impl Broker for Redis {
    async fn create() -> Self {
        let prefix = format!("bench{}", Uuid::new_v4().simple());
        let stream = format!("{prefix}.account.account.credited");
        Redis { connection: redis_connection().await, stream, prefix }
    }

    fn prefix(&self) -> &str {
        &self.prefix
    }

    async fn sink(&self) -> impl Sink {
        RedisSink::new(redis_connection().await)
    }

    async fn publish_bare(&self, messages: &[Payload], window: usize) {
        // The sink's command (its fields but the headers), `window` of them outstanding on one
        // multiplexed connection, each awaited for its entry id.
        let connection = redis_connection().await;
        futures_util::stream::iter(messages)
            .map(|message| {
                let mut connection = connection.clone();
                async move {
                    let entry: String = redis::cmd("XADD")
                        .arg(&message.destination)
                        .arg("*")
                        .arg("id")
                        .arg(message.id.to_string())
                        .arg("content-type")
                        .arg("application/json")
                        .arg("payload")
                        .arg(&message.payload)
                        .query_async(&mut connection)
                        .await
                        .unwrap();
                    entry
                }
            })
            .buffer_unordered(window)
            .for_each(|_| async {})
            .await;
    }

    async fn purge(&self) -> u64 {
        let mut connection = self.connection.clone();
        let (held, _): (u64, u64) = redis::pipe()
            .cmd("XLEN")
            .arg(&self.stream)
            .cmd("DEL")
            .arg(&self.stream)
            .query_async(&mut connection)
            .await
            .unwrap();
        held
    }

    async fn consume(&self, arrivals: Arrivals) -> JoinHandle<()> {
        use redis::streams::{StreamReadOptions, StreamReadReply};
        // A connection of its own: XREAD BLOCK holds it.
        let client = redis::Client::open(REDIS).unwrap();
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        let stream = self.stream.clone();
        tokio::spawn(async move {
            let mut last = "$".to_owned();
            loop {
                let options = StreamReadOptions::default().block(1_000).count(1_000);
                let reply: StreamReadReply = redis::AsyncCommands::xread_options(
                    &mut connection,
                    &[&stream],
                    &[&last],
                    &options,
                )
                .await
                .unwrap();
                for entry in reply.keys.into_iter().flat_map(|key| key.ids) {
                    let id: Option<String> = entry.get("id");
                    arrivals.arrived(id.and_then(|id| id.parse().ok()));
                    last = entry.id;
                }
            }
        })
    }

    async fn delete(self) {
        let mut connection = self.connection.clone();
        let _: u64 =
            redis::cmd("DEL").arg(&self.stream).query_async(&mut connection).await.unwrap();
    }
}

/// Kafka: the topic of the run's own that the backlog's one event type goes to, 3 partitions.
/// The broker keeps what it was sent, so `purge` counts the records since the last purge.
pub struct Kafka {
    config: rdkafka::ClientConfig,
    topic: String,
    prefix: String,
    /// The topic's records at the last purge.
    purged: Mutex<i64>,
}

impl Kafka {
    /// The topic's records, read from the start until none came for two seconds (the broker's
    /// high watermarks, tansu 0.6's at least, are not a count of its records).
    fn records(&self) -> i64 {
        use rdkafka::consumer::{BaseConsumer, Consumer};
        let consumer: BaseConsumer = self
            .config
            .clone()
            .set("group.id", format!("bench-count-{}", Uuid::new_v4().simple()))
            .set("enable.auto.commit", "false")
            .create()
            .unwrap();
        let mut assignment = rdkafka::TopicPartitionList::new();
        for partition in 0..3 {
            let beginning = rdkafka::Offset::Beginning;
            assignment.add_partition_offset(&self.topic, partition, beginning).unwrap();
        }
        consumer.assign(&assignment).unwrap();
        let (mut records, mut quiet_since) = (0, Instant::now());
        while quiet_since.elapsed() < Duration::from_secs(2) {
            if let Some(message) = consumer.poll(Duration::from_millis(100)) {
                message.unwrap();
                records += 1;
                quiet_since = Instant::now();
            }
        }
        records
    }
}

impl Broker for Kafka {
    async fn create() -> Self {
        use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
        let mut config = rdkafka::ClientConfig::new();
        config.set("bootstrap.servers", KAFKA);
        let prefix = format!("bench{}", Uuid::new_v4().simple());
        let topic = format!("{prefix}.account.account.credited");
        let admin: AdminClient<_> = config.create().unwrap();
        let new = NewTopic::new(&topic, 3, TopicReplication::Fixed(1));
        let created = admin.create_topics([&new], &AdminOptions::new()).await;
        assert!(created.expect("Kafka runs on 127.0.0.1:9092").iter().all(Result::is_ok));
        Kafka { config, topic, prefix, purged: Mutex::new(0) }
    }

    fn prefix(&self) -> &str {
        &self.prefix
    }

    async fn sink(&self) -> impl Sink {
        KafkaSink::new(&self.config).unwrap().topics([self.topic.clone()])
    }

    async fn publish_bare(&self, messages: &[Payload], window: usize) {
        use rdkafka::producer::{FutureProducer, FutureRecord};
        // The sink's producer settings: idempotent, acks=all.
        let producer: FutureProducer = self
            .config
            .clone()
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .create()
            .unwrap();
        let mut outstanding = VecDeque::with_capacity(window);
        for message in messages {
            if outstanding.len() == window {
                let report: rdkafka::producer::DeliveryFuture = outstanding.pop_front().unwrap();
                report.await.unwrap().unwrap();
            }
            let id = message.id.to_string();
            let record = FutureRecord::to(&message.destination).key(&id).payload(&message.payload);
            outstanding.push_back(producer.send_result(record).map_err(|(e, _)| e).unwrap());
        }
        for report in outstanding {
            report.await.unwrap().unwrap();
        }
    }

    async fn purge(&self) -> u64 {
        let records = tokio::task::block_in_place(|| self.records());
        let mut purged = self.purged.lock().unwrap();
        let since = records - std::mem::replace(&mut *purged, records);
        since as u64
    }

    async fn consume(&self, arrivals: Arrivals) -> JoinHandle<()> {
        use rdkafka::consumer::{Consumer, StreamConsumer};
        use rdkafka::message::{Headers, Message};
        let consumer: StreamConsumer = self
            .config
            .clone()
            .set("group.id", format!("bench-{}", Uuid::new_v4().simple()))
            .set("enable.auto.commit", "false")
            .set("fetch.wait.max.ms", "10")
            .create()
            .unwrap();
        let mut assignment = rdkafka::TopicPartitionList::new();
        for partition in 0..3 {
            // The topic is the workload's own: from its beginning, no offset lookup can race the
            // first records (a lookup of the end resolved late once, and missed some).
            assignment
                .add_partition_offset(&self.topic, partition, rdkafka::Offset::Beginning)
                .unwrap();
        }
        consumer.assign(&assignment).unwrap();
        tokio::spawn(async move {
            loop {
                let message = consumer.recv().await.unwrap();
                let headers = message.headers();
                let id = headers.and_then(|headers| {
                    let header = headers.iter().find(|h| h.key == "outbox-event-id")?;
                    std::str::from_utf8(header.value?).ok()?.parse().ok()
                });
                arrivals.arrived(id);
            }
        })
    }

    async fn delete(self) {
        // The broker keeps topics in memory; a run's topic is left, named for the run.
    }
}

/// The relay's forwarding to `broker`, every batch it publishes recorded in `batches`.
async fn forward(broker: &impl Broker, batches: &Batches) -> Forward {
    let timed = Timed { inner: broker.sink().await, batches: batches.clone() };
    Forward::to(timed)
        .destination(&format!("{}.{{aggregate_type}}.{{event_type}}", broker.prefix()))
}

/// What the relay's batches looked like: how many, how large, how long each took from publish
/// to the broker's last confirmation, and the span from the first batch's start to the last's end.
#[derive(Clone, Default)]
pub struct Batches(Arc<Mutex<BatchTimes>>);

#[derive(Default)]
struct BatchTimes {
    batches: u64,
    messages: u64,
    confirming: Duration,
    first: Option<Instant>,
    last: Option<Instant>,
}

/// The relay's batches, on average.
pub struct Profile {
    pub batch_size: f64,
    /// From a batch's publish to its last confirmation, in ms.
    pub confirm_ms: f64,
    /// The span of all batches over their number (one batch after another), in ms.
    pub interval_ms: f64,
}

impl Batches {
    fn profile(&self) -> Profile {
        let t = self.0.lock().unwrap();
        let span = t.last.zip(t.first).map_or(Duration::ZERO, |(last, first)| last - first);
        let batches = t.batches.max(1) as f64;
        Profile {
            batch_size: t.messages as f64 / batches,
            confirm_ms: t.confirming.as_secs_f64() * 1e3 / batches,
            interval_ms: span.as_secs_f64() * 1e3 / batches,
        }
    }
}

/// A sink that times the batches of the one it wraps (an `Instant` and a lock per batch).
struct Timed<S> {
    inner: S,
    batches: Batches,
}

impl<S: Sink> Sink for Timed<S> {
    fn check(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        self.inner.check()
    }

    fn send<'a>(
        &'a self,
        batch: &'a [OutboundMessage],
    ) -> BoxFuture<'a, Vec<Result<(), SinkError>>> {
        Box::pin(async move {
            let started = Instant::now();
            self.batches.0.lock().unwrap().first.get_or_insert(started);
            let outcomes = self.inner.send(batch).await;
            let ended = Instant::now();
            let mut t = self.batches.0.lock().unwrap();
            t.batches += 1;
            t.messages += batch.len() as u64;
            t.confirming += ended - started;
            t.last = Some(ended);
            outcomes
        })
    }
}

/// The backlog's rows as the bare client publishes them, in the order they were emitted.
async fn payloads(pool: &PgPool, prefix: &str) -> Vec<Payload> {
    sqlx::query(
        "SELECT aggregate_type || '.' || event_type, payload::text FROM outbox.events ORDER BY seq",
    )
    .fetch_all(pool)
    .await
    .unwrap()
    .iter()
    .map(|row| Payload {
        id: Uuid::new_v4(),
        destination: format!("{prefix}.{}", row.get::<&str, _>(0)),
        payload: row.get::<&str, _>(1).as_bytes().to_vec(),
    })
    .collect()
}

/// One forwarding drain beside its baselines.
pub struct Throughput {
    /// The relay's events/s, start to last confirmation acknowledged.
    pub relay: f64,
    /// The bare client's events/s, first publish to last confirmation.
    pub bare: f64,
    /// The same relay's events/s draining the same backlog into a no-op handler (defaults).
    pub handled: f64,
    /// The whole machine's CPU per event: the relay's drain, the bare client's, the no-op
    /// handler's.
    pub cpu: Costs,
    /// Messages the broker held beyond one per event after the relay's drain.
    pub duplicates: u64,
    /// The relay's batches.
    pub profile: Profile,
}

/// What each way of moving the backlog cost the whole machine (every process on it).
pub struct Costs {
    pub relay: Spent,
    pub bare: Spent,
    pub handled: Spent,
}

/// A backlog of `events` drained by one relay with `concurrency` forwarding to `B`, beside
/// the same payloads published by the bare client with a window of `concurrency` confirmations
/// and the same backlog drained by one relay with its defaults into a no-op handler. Panics
/// unless the broker holds exactly one message per event after each.
pub async fn throughput<B: Broker>(url: &str, events: usize, concurrency: usize) -> Throughput {
    let (handled, handled_cpu) = {
        let db = Database::fresh(url, "forward_handled").await;
        db::backlog(&db.pool, events, credited).await;
        let relay = Setup::defaults(1).relay(&db.pool, &Calls::default());
        let cpu = Cpu::now();
        let rate = relay::until_delivered(vec![relay], events).await.events_per_second;
        let cpu = cpu.since();
        db.drop().await;
        (rate, cpu)
    };

    let broker = B::create().await;
    let db = Database::fresh(url, "forward").await;
    db::backlog(&db.pool, events, credited).await;
    let messages = payloads(&db.pool, broker.prefix()).await;

    let (started, cpu) = (Instant::now(), Cpu::now());
    broker.publish_bare(&messages, concurrency).await;
    let bare = events as f64 / started.elapsed().as_secs_f64();
    let bare_cpu = cpu.since();
    assert_eq!(broker.purge().await, events as u64, "the bare client published every event");

    let batches = Batches::default();
    let forward = forward(&broker, &batches).await;
    let relay = Relay::builder(db.pool.clone()).forward(forward).concurrency(concurrency);
    let cpu = Cpu::now();
    let rate = relay::until_delivered(vec![relay.build().unwrap()], events).await.events_per_second;
    let relay_cpu = cpu.since();
    db.drop().await;
    let held = broker.purge().await;
    assert!(held >= events as u64, "the relay forwarded {held} of {events} events");
    broker.delete().await;
    let duplicates = held - events as u64;
    let cpu = Costs { relay: relay_cpu, bare: bare_cpu, handled: handled_cpu };
    Throughput { relay: rate, bare, handled, cpu, duplicates, profile: batches.profile() }
}

/// What [`latency`] measured.
pub struct Latency {
    /// Events/s the producers achieved.
    pub rate: f64,
    /// Consumer arrival minus the producer's COMMIT returning, sorted.
    pub latencies: Vec<Duration>,
    /// Arrivals beyond one per event.
    pub duplicates: u64,
}

/// Commit-to-consumer latency: producers commit one event per transaction at `rate` events/s
/// together for `duration` while one relay (defaults) forwards to `B` and a consumer of the
/// destination records each arrival.
pub async fn latency<B: Broker>(url: &str, rate: f64, duration: Duration) -> Latency {
    let broker = B::create().await;
    let db = Database::fresh(url, "forward_latency").await;
    let arrivals = Arrivals::default();
    let consumer = broker.consume(arrivals.clone()).await;
    let forward = forward(&broker, &Batches::default()).await;
    let running = Running::start(Relay::builder(db.pool.clone()).forward(forward).build().unwrap());
    tokio::time::sleep(Duration::from_millis(300)).await;

    let committed = relay::produce(&db.pool, 4, duration, Some(rate)).await;
    let deadline = Instant::now() + Duration::from_secs(60);
    while arrivals.distinct() < committed.len() {
        assert!(Instant::now() < deadline, "the consumer did not receive every event in time");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    // A moment for late duplicates to arrive.
    tokio::time::sleep(Duration::from_millis(200)).await;
    running.stop().await;
    consumer.abort();
    db.drop().await;
    broker.purge().await;
    broker.delete().await;
    let (arrived, duplicates) = std::mem::take(&mut *arrivals.0.lock().unwrap());
    Latency {
        rate: committed.len() as f64 / duration.as_secs_f64(),
        latencies: relay::latencies(&committed, &arrived),
        duplicates,
    }
}
