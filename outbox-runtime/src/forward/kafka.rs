//! Kafka (feature `kafka`, on `rdkafka` with librdkafka built in).
//!
//! Each message is one record on the topic named by its destination:
//!
//! | record | value |
//! |---|---|
//! | key | the aggregate id: one aggregate stays on one partition, so its order holds end to end |
//! | headers | the message's headers (`outbox-event-id`, `outbox-event-type`, ..., the emit's), then `content-type` |
//! | value | the stored JSON |
//!
//! The producer is idempotent (`enable.idempotence`, so `acks=all`): librdkafka's own retries
//! never store a record twice or out of order. A row is published once its record's delivery
//! report came back.
//!
//! A record the broker refuses (larger than the topic's `max.message.bytes`, a topic that does
//! not exist, not authorized, an invalid record) is a failed attempt of its event, naming topic
//! and cause. Brokers that cannot be reached, a lost connection, a leader or replicas not
//! available, or a delivery report that does not come within `message.timeout.ms` is
//! [unavailable](crate::forward::SinkErrorKind::Unavailable): the relay pauses and sends the
//! record again once the brokers answer. The sink caps `message.timeout.ms` below
//! [`CONFIRM_TIMEOUT`](crate::forward::CONFIRM_TIMEOUT), so librdkafka has given a record up
//! before the relay sends it again.
//!
//! Kafka keeps no message id to drop a repeat by: a record sent again after an unconfirmed
//! outcome (it was written, its report was lost), or after a relay crash between the report and
//! the row's acknowledgement, can be stored twice. Consumers deduplicate by `outbox-event-id`.

/// The `rdkafka` crate this sink is built on, for its `ClientConfig`.
pub use rdkafka;

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures_util::future::{join_all, BoxFuture};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::{ClientContext, DefaultClientContext};
use rdkafka::config::RDKafkaLogLevel;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{FutureProducer, FutureRecord, Producer};
use rdkafka::ClientConfig;

use crate::error::ErrorChain;
use crate::forward::{OutboundMessage, Sink, SinkError, SinkErrorKind};

/// How long librdkafka tries to deliver a record: below
/// [`CONFIRM_TIMEOUT`](super::CONFIRM_TIMEOUT), so a record the relay sends again is no longer
/// queued in the client.
const MESSAGE_TIMEOUT: Duration = Duration::from_secs(8);

/// How long a check waits for the brokers' metadata or a topic's creation.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Produces records to Kafka, one topic per destination.
pub struct KafkaSink {
    config: ClientConfig,
    /// `kafka brokers <bootstrap.servers>`, what a check names.
    brokers: String,
    /// Replaced by the check after an unavailability (see [`KafkaSink::renew_producer`]).
    producer: Mutex<FutureProducer<Brokers>>,
    /// Set when librdkafka reports every broker down, cleared by a check that reached them.
    all_down: Arc<AtomicBool>,
    /// Set when a record came back unavailable: the next check replaces the producer.
    stale: AtomicBool,
    topics: Vec<String>,
    create: Option<(i32, i32)>,
}

impl KafkaSink {
    /// A sink on a producer made from `config`: `bootstrap.servers` and whatever security your
    /// cluster needs (`security.protocol`, `ssl.ca.location`, `sasl.mechanisms`, ...). The sink
    /// sets what forwarding relies on, over yours: `enable.idempotence=true`, `acks=all`,
    /// `message.timeout.ms` (8 s at most), `allow.auto.create.topics=false` (a record to a topic
    /// that does not exist is refused, not a new topic), and
    /// `topic.metadata.propagation.max.ms=2000`.
    pub fn new(config: &ClientConfig) -> Result<Self, SinkError> {
        let config = producer_config(config);
        let servers = config.get("bootstrap.servers").unwrap_or("(no bootstrap.servers)");
        let brokers = format!("kafka brokers {servers}");
        let all_down = Arc::new(AtomicBool::new(false));
        let producer = Mutex::new(create_producer(&config, &brokers, &all_down)?);
        let stale = AtomicBool::new(false);
        let (topics, create) = (Vec::new(), None);
        Ok(KafkaSink { config, brokers, producer, all_down, stale, topics, create })
    }

    /// Topics the check requires to exist: at start, a missing one stops the relay (or is
    /// created, with [`create_missing_topics`](Self::create_missing_topics)).
    pub fn topics<T: Into<String>>(mut self, topics: impl IntoIterator<Item = T>) -> Self {
        self.topics.extend(topics.into_iter().map(Into::into));
        self
    }

    /// Creates the [checked topics](Self::topics) that do not exist, with `partitions`
    /// partitions of `replication` replicas each.
    pub fn create_missing_topics(mut self, partitions: i32, replication: i32) -> Self {
        self.create = Some((partitions, replication));
        self
    }

    fn producer(&self) -> FutureProducer<Brokers> {
        self.producer.lock().unwrap_or_else(|poisoned| poisoned.into_inner()).clone()
    }

    /// Replaces the producer after a record came back unavailable, or a fatal error: after an
    /// outage an idempotent producer can be left waiting on records it may have written (its
    /// sequence numbers then stall what follows) or on a broker connection in reconnect backoff;
    /// a new one starts with fresh connections and a fresh producer id. Returns the old one,
    /// whose drop purges what it still queued (failing those records as unavailable) and blocks.
    fn renew_producer(&self) -> Result<Option<FutureProducer<Brokers>>, SinkError> {
        let mut producer = self.producer.lock().unwrap_or_else(|poisoned| poisoned.into_inner());
        if let Some((code, reason)) = producer.client().fatal_error() {
            tracing::warn!(?code, reason, "the Kafka producer hit a fatal error; replacing it");
        } else if !self.stale.swap(false, Ordering::SeqCst) {
            return Ok(None);
        }
        let fresh = create_producer(&self.config, &self.brokers, &self.all_down)?;
        Ok(Some(std::mem::replace(&mut *producer, fresh)))
    }

    /// Creates `missing` with the settings of
    /// [`create_missing_topics`](Self::create_missing_topics).
    async fn create_topics(
        &self,
        missing: &[&str],
        (partitions, replication): (i32, i32),
    ) -> Result<(), SinkError> {
        let cannot = |topic: &str, e: &dyn std::fmt::Display| {
            SinkError::unavailable(topic, format!("cannot create the topic: {e}"))
        };
        let admin: AdminClient<DefaultClientContext> =
            self.config.create().map_err(|e| cannot(missing[0], &ErrorChain(&e)))?;
        let topics: Vec<NewTopic<'_>> = missing
            .iter()
            .map(|topic| NewTopic::new(topic, partitions, TopicReplication::Fixed(replication)))
            .collect();
        let options = AdminOptions::new().operation_timeout(Some(CHECK_TIMEOUT));
        let created = admin
            .create_topics(&topics, &options)
            .await
            .map_err(|e| cannot(missing[0], &ErrorChain(&e)))?;
        for result in created {
            match result {
                Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
                Err((topic, code)) => return Err(cannot(&topic, &code)),
            }
        }
        Ok(())
    }
}

fn producer_config(config: &ClientConfig) -> ClientConfig {
    let mut config = config.clone();
    let timeout = config
        .get("message.timeout.ms")
        .and_then(|ms| ms.parse().ok())
        .map_or(MESSAGE_TIMEOUT, |ms: u64| Duration::from_millis(ms).min(MESSAGE_TIMEOUT));
    config
        .set("enable.idempotence", "true")
        .set("acks", "all")
        .set("message.timeout.ms", timeout.as_millis().to_string())
        .set("allow.auto.create.topics", "false")
        .set("topic.metadata.propagation.max.ms", "2000");
    config
}

fn create_producer(
    config: &ClientConfig,
    brokers: &str,
    all_down: &Arc<AtomicBool>,
) -> Result<FutureProducer<Brokers>, SinkError> {
    config.create_with_context(Brokers { all_down: all_down.clone() }).map_err(|e| {
        SinkError::refused(brokers, format!("cannot create the producer: {}", ErrorChain(&e)))
    })
}

impl Sink for KafkaSink {
    fn check(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move {
            let replaced = self.renew_producer()?;
            let producer = self.producer();
            let topics = self.topics.clone();
            let brokers = self.brokers.clone();
            // librdkafka's metadata request blocks its thread.
            let missing = tokio::task::spawn_blocking(move || -> Result<Vec<String>, SinkError> {
                drop(replaced); // blocks while it purges
                let unreachable = |e: KafkaError| SinkError::unavailable(&brokers, ErrorChain(&e));
                if topics.is_empty() {
                    producer.client().fetch_metadata(None, CHECK_TIMEOUT).map_err(unreachable)?;
                    return Ok(Vec::new());
                }
                let mut missing = Vec::new();
                for topic in topics {
                    let metadata = producer
                        .client()
                        .fetch_metadata(Some(&topic), CHECK_TIMEOUT)
                        .map_err(unreachable)?;
                    let error = metadata.topics().first().and_then(|t| t.error());
                    match error.map(RDKafkaErrorCode::from) {
                        None => {}
                        Some(RDKafkaErrorCode::UnknownTopicOrPartition) => missing.push(topic),
                        Some(code) => return Err(SinkError::refused(topic, code)),
                    }
                }
                Ok(missing)
            })
            .await
            .map_err(|e| SinkError::unavailable(&self.brokers, ErrorChain(&e)))??;
            self.all_down.store(false, Ordering::SeqCst); // they answered
            if missing.is_empty() {
                return Ok(());
            }
            let missing: Vec<&str> = missing.iter().map(String::as_str).collect();
            match self.create {
                Some(settings) => self.create_topics(&missing, settings).await,
                None => Err(SinkError::refused(
                    missing.join(", "),
                    "no such topic: create it, or let the sink create missing topics",
                )),
            }
        })
    }

    fn send<'a>(
        &'a self,
        batch: &'a [OutboundMessage],
    ) -> BoxFuture<'a, Vec<Result<(), SinkError>>> {
        Box::pin(async move {
            if self.all_down.load(Ordering::SeqCst) {
                // librdkafka would queue the records until the brokers are back or its timeout.
                let down = |m: &OutboundMessage| {
                    Err(SinkError::unavailable(&m.destination, "all Kafka brokers are down"))
                };
                self.stale.store(true, Ordering::SeqCst);
                return batch.iter().map(down).collect();
            }
            // Queue every record first, then await the delivery reports together.
            let producer = self.producer();
            let reports = batch.iter().map(|message| {
                let queued = producer.send_result(record(message));
                async move {
                    let destination = &message.destination;
                    match queued {
                        Err((error, _)) => Err(classify(destination, &error)),
                        Ok(report) => match report.await {
                            Ok(Ok(_delivery)) => Ok(()),
                            Ok(Err((error, _))) => Err(classify(destination, &error)),
                            Err(_) => Err(SinkError::unavailable(
                                destination,
                                "the Kafka producer was closed before its delivery report",
                            )),
                        },
                    }
                }
            });
            let outcomes = join_all(reports).await;
            if outcomes
                .iter()
                .any(|o| matches!(o, Err(e) if e.kind() == SinkErrorKind::Unavailable))
            {
                self.stale.store(true, Ordering::SeqCst);
            }
            outcomes
        })
    }
}

/// The producer's context: librdkafka reports its brokers all down as a client-wide error, not
/// per record (those stay queued until its timeout), and logs through it.
struct Brokers {
    all_down: Arc<AtomicBool>,
}

impl ClientContext for Brokers {
    fn log(&self, level: RDKafkaLogLevel, facility: &str, message: &str) {
        use RDKafkaLogLevel as Level;
        // One level down: librdkafka logs every failed reconnection as an error, while the
        // relay logs the sink's unavailability once per change.
        match level {
            Level::Emerg | Level::Alert | Level::Critical | Level::Error => {
                tracing::warn!(target: "librdkafka", facility, "{message}")
            }
            Level::Warning | Level::Notice => {
                tracing::info!(target: "librdkafka", facility, "{message}")
            }
            Level::Info | Level::Debug => {
                tracing::debug!(target: "librdkafka", facility, "{message}")
            }
        }
    }

    fn error(&self, error: KafkaError, reason: &str) {
        match error.rdkafka_error_code() {
            Some(RDKafkaErrorCode::AllBrokersDown) => {
                self.all_down.store(true, Ordering::SeqCst);
                tracing::debug!(reason, "all Kafka brokers are down");
            }
            Some(RDKafkaErrorCode::BrokerTransportFailure) => {
                tracing::debug!(reason, "a Kafka broker connection failed");
            }
            _ => tracing::warn!(error = %ErrorChain(&error), reason, "Kafka client error"),
        }
    }
}

fn record(message: &OutboundMessage) -> FutureRecord<'_, str, [u8]> {
    let own = message.headers.iter().map(|(name, value)| (name.as_str(), value.as_str()));
    let headers = own.chain([("content-type", message.content_type)]).fold(
        OwnedHeaders::new_with_capacity(message.headers.len() + 1),
        |headers, (key, value)| headers.insert(Header { key, value: Some(value) }),
    );
    FutureRecord::to(&message.destination)
        .key(message.key.as_str())
        .payload(message.payload.as_slice())
        .headers(headers)
}

/// Whose fault a failed record is: refused by the broker, or its brokers unavailable.
fn classify(topic: &str, error: &KafkaError) -> SinkError {
    use RDKafkaErrorCode as Code;
    let Some(code) = error.rdkafka_error_code() else {
        return SinkError::unavailable(topic, ErrorChain(error));
    };
    let refused = match code {
        // The record itself, or its topic, refused by the broker (or by the client, checking
        // the broker's limits before sending).
        Code::MessageSizeTooLarge
        | Code::InvalidMessageSize
        | Code::InvalidMessage
        | Code::InvalidRecord
        | Code::MessageBatchTooLarge
        | Code::InvalidTopic
        | Code::TopicAuthorizationFailed
        | Code::PolicyViolation
        | Code::UnknownTopic
        | Code::UnknownTopicOrPartition
        | Code::UnknownPartition
        | Code::InvalidTimestamp
        | Code::UnsupportedForMessageFormat => true,
        // The client's own state or the brokers': unreachable, timed out, not leader, not
        // enough replicas, a full queue, a fatal idempotence error (the next check replaces
        // the producer).
        Code::MessageTimedOut
        | Code::TimedOutQueue
        | Code::BrokerTransportFailure
        | Code::AllBrokersDown
        | Code::Resolve
        | Code::OperationTimedOut
        | Code::QueueFull
        | Code::RequestTimedOut
        | Code::NetworkException
        | Code::LeaderNotAvailable
        | Code::NotLeaderForPartition
        | Code::NotEnoughReplicas
        | Code::NotEnoughReplicasAfterAppend
        | Code::BrokerNotAvailable
        | Code::ReplicaNotAvailable
        | Code::NotCoordinator
        | Code::CoordinatorNotAvailable
        | Code::ClusterAuthorizationFailed
        | Code::SaslAuthenticationFailed
        | Code::Authentication
        | Code::SSL
        | Code::PurgeQueue
        | Code::PurgeInflight
        | Code::Fatal
        | Code::KafkaStorageError
        | Code::OutOfOrderSequenceNumber
        | Code::UnknownProducerId
        | Code::InvalidProducerEpoch
        | Code::ProducerFenced => false,
        // Any other answer from a broker refuses the record; any other error of the client's
        // own is its state.
        other => other as i32 > 0,
    };
    let reason = format!("{}", ErrorChain(error));
    if refused {
        SinkError::refused(topic, reason)
    } else {
        SinkError::unavailable(topic, reason)
    }
}
