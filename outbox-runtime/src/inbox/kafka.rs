//! Consuming Kafka topics into an [`Inbox`] (feature `kafka`).
//!
//! [`consume`] takes the records of a subscribed [`StreamConsumer`] one at a time, each
//! partition's in offset order: each is handled through [`Inbox::receive`], and its offset is
//! stored for the next commit only once the inbox settled it (handled, a duplicate, dead, or no
//! handler for its type). A record that is not an outbox message is logged and skipped. The
//! stored offsets are committed every second and when consuming stops.
//!
//! Kafka has no negative acknowledgement of one record: a record to deliver again (its handler
//! failed with attempts left, or snoozed) is kept in memory and handled again after the delay,
//! and its **partition is paused until then**: the records behind it wait, so one aggregate's
//! events (one key, one partition) are handled in order across retries, and the partition's
//! committed offset never passes a record that is not settled. Other partitions go on. A long
//! retry (a large [`Backoff`](crate::Backoff), a long snooze) holds its partition that long:
//! the inbox's `max_attempts` bounds how long a failing record can hold it before it is dead and
//! the partition moves on. While the inbox's database fails, the record is handled again after a
//! backoff, with no attempt counted, and no other record is handled until the database answers
//! (each partition pauses at its next record); the consumer keeps polling all along, so it stays
//! in its group.
//!
//! Create the consumer with [`consumer_config`], or with these settings of your own:
//! - `group.id`: the consumer group; the group's members share the partitions, and its committed
//!   offsets are where a partition's next owner starts.
//! - `enable.auto.offset.store=false` (required; [`consume`] refuses a consumer without it):
//!   otherwise librdkafka stores each record's offset as it hands the record over, and a commit
//!   would pass records not handled yet.
//! - `enable.auto.commit`: either. Left on (the default), librdkafka also commits the stored
//!   offsets before a rebalance takes partitions away and when the consumer closes; off, offsets
//!   stored since [`consume`]'s last commit are not committed before a rebalance, and those
//!   records are delivered again to the partition's next owner.
//! - `auto.offset.reset=earliest` for a new group to read what was forwarded before it started
//!   ([`consumer_config`] sets it unless yours does).
//! - `max.poll.interval.ms` longer than a handler takes: the consumer does not poll while one
//!   runs, and librdkafka leaves the group past it.
//!
//! Redeliveries are expected and harmless: after a crash, a rebalance, or a commit that did not
//! land, a partition's next owner reads it from its committed offset, and the inbox finds the
//! records handled since then ([`Received::Duplicate`]): their handlers do not run again.
//!
//! ```no_run
//! # use outbox_runtime::inbox::{kafka, Inbox};
//! use outbox_runtime::forward::kafka::rdkafka::consumer::{Consumer, StreamConsumer};
//! use outbox_runtime::forward::kafka::rdkafka::ClientConfig;
//!
//! # async fn run(inbox: Inbox) -> Result<(), Box<dyn std::error::Error>> {
//! let mut config = ClientConfig::new();
//! config.set("bootstrap.servers", "127.0.0.1:9092").set("group.id", "billing");
//! let consumer: StreamConsumer = kafka::consumer_config(&config).create()?;
//! consumer.subscribe(&["orders.order.order.placed"])?;
//! kafka::consume(&inbox, &consumer, async {
//!     let _ = tokio::signal::ctrl_c().await;
//! })
//! .await?;
//! # Ok(()) }
//! ```

use std::collections::HashMap;
use std::future::Future;
use std::time::Duration;

use rdkafka::consumer::{CommitMode, Consumer, ConsumerContext, StreamConsumer};
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{BorrowedMessage, Headers, Message};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use tokio::time::Instant;

use super::{InboundMessage, Inbox, InboxError, InvalidMessage, Received};
use crate::error::ErrorChain;

/// The first pause after the database or the consumer failed; it doubles up to a limit.
const FIRST_RETRY: Duration = Duration::from_millis(200);
const MOST_RETRY: Duration = Duration::from_secs(30);

/// How often offsets stored since the last commit are committed.
const COMMIT_INTERVAL: Duration = Duration::from_secs(1);

/// Why [`consume`] stopped before its shutdown.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumeError {
    /// The consumer stores offsets by itself: it would commit records before the inbox handled
    /// them.
    #[error(
        "the Kafka consumer stores each record's offset as it hands the record over \
         (`enable.auto.offset.store` is true), so a commit would pass records not handled yet; \
         create it with `enable.auto.offset.store=false` (as `inbox::kafka::consumer_config` \
         does)"
    )]
    AutoOffsetStore,
    /// The consumer hit a fatal error (its group membership fenced, say) and cannot go on;
    /// create a new one.
    #[error("the Kafka consumer failed for good; create a new one")]
    Fatal(#[source] KafkaError),
}

/// `config` with what [`consume`] relies on set over it: `enable.auto.offset.store=false`,
/// and `auto.offset.reset=earliest` unless `config` sets it. Set `group.id` in `config`.
pub fn consumer_config(config: &ClientConfig) -> ClientConfig {
    let mut config = config.clone();
    config.set("enable.auto.offset.store", "false");
    if config.get("auto.offset.reset").is_none() {
        config.set("auto.offset.reset", "earliest");
    }
    config
}

/// Receives the records of `consumer`'s partitions through `inbox` until `shutdown` completes
/// (see the [module docs](self)); subscribe it first. When `shutdown` completes, the record
/// under way is finished, the stored offsets are committed (synchronously: the thread waits for
/// the brokers' answer), and records waiting for a retry are sought back to, so that a later
/// `consume`, or their partition's next owner, delivers them again. Returns early only if the
/// consumer stores offsets by itself, or fails for good.
pub async fn consume<S, C>(
    inbox: &Inbox<S>,
    consumer: &StreamConsumer<C>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ConsumeError>
where
    S: Clone + Send + Sync + 'static,
    C: ConsumerContext + 'static,
{
    // Storing no offset at all fails only if librdkafka stores them by itself.
    if let Err(KafkaError::StoreOffset(RDKafkaErrorCode::InvalidArgument)) =
        consumer.store_offsets(&TopicPartitionList::new())
    {
        return Err(ConsumeError::AutoOffsetStore);
    }
    let mut consuming = Consuming {
        inbox,
        consumer,
        waiting: HashMap::new(),
        outage: Outage::default(),
        stored: false,
    };
    let mut shutdown = std::pin::pin!(shutdown);
    let mut next_commit = Instant::now() + COMMIT_INTERVAL;
    let mut read_retry = FIRST_RETRY;
    loop {
        let due = consuming.next_due();
        let event = tokio::select! {
            biased;
            () = &mut shutdown => break,
            () = tokio::time::sleep_until(due.unwrap_or(next_commit)), if due.is_some() => {
                Event::Due
            }
            () = tokio::time::sleep_until(next_commit) => Event::Commit,
            received = consumer.recv() => Event::Received(received.map(|m| Record::read(&m))),
        };
        match event {
            Event::Due => consuming.retry_due().await,
            Event::Commit => {
                consuming.commit(CommitMode::Async);
                next_commit = Instant::now() + COMMIT_INTERVAL;
            }
            Event::Received(Ok(record)) => {
                read_retry = FIRST_RETRY;
                consuming.arrived(record).await;
            }
            Event::Received(Err(KafkaError::PartitionEOF(_))) => {}
            Event::Received(Err(error @ KafkaError::MessageConsumptionFatal(_))) => {
                consuming.commit(CommitMode::Sync);
                return Err(ConsumeError::Fatal(error));
            }
            Event::Received(Err(error)) => {
                tracing::warn!(
                    error = %ErrorChain(&error),
                    consumer = inbox.consumer(),
                    retry_in = ?read_retry,
                    "cannot read the Kafka consumer's records; asking again after the pause"
                );
                tokio::select! {
                    biased;
                    () = &mut shutdown => break,
                    () = tokio::time::sleep(read_retry) => {}
                }
                read_retry = (read_retry * 2).min(MOST_RETRY);
            }
        }
    }
    consuming.commit(CommitMode::Sync);
    consuming.rewind_waiting();
    Ok(())
}

enum Event {
    Due,
    Commit,
    Received(Result<Record, KafkaError>),
}

/// A record as read from the consumer, no longer borrowing it.
struct Record {
    partition: Partition,
    offset: i64,
    message: Result<InboundMessage, InvalidMessage>,
}

impl Record {
    fn read(message: &BorrowedMessage<'_>) -> Self {
        let headers: Vec<(&str, std::borrow::Cow<'_, str>)> = message
            .headers()
            .map(|headers| {
                headers
                    .iter()
                    .map(|h| (h.key, String::from_utf8_lossy(h.value.unwrap_or_default())))
                    .collect()
            })
            .unwrap_or_default();
        let headers = headers.iter().map(|(name, value)| (*name, value.as_ref()));
        let payload = message.payload().unwrap_or_default();
        Record {
            partition: Partition { topic: message.topic().to_owned(), number: message.partition() },
            offset: message.offset(),
            message: InboundMessage::from_headers(headers, payload),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Partition {
    topic: String,
    number: i32,
}

impl Partition {
    fn list(&self, offset: Option<i64>) -> TopicPartitionList {
        let mut list = TopicPartitionList::with_capacity(1);
        match offset {
            // Only an offset librdkafka cannot represent fails, and record offsets are not.
            Some(offset) => {
                let _ = list.add_partition_offset(&self.topic, self.number, Offset::Offset(offset));
            }
            None => {
                list.add_partition(&self.topic, self.number);
            }
        }
        list
    }
}

/// A record to handle again at `due`; its partition is paused meanwhile.
struct Waiting {
    offset: i64,
    message: InboundMessage,
    due: Instant,
}

/// The inbox's database failing: when to try again, and the pause after that.
struct Outage {
    retry: Duration,
    until: Option<Instant>,
}

impl Default for Outage {
    fn default() -> Self {
        Outage { retry: FIRST_RETRY, until: None }
    }
}

impl Outage {
    /// The database failed: the pause before trying again.
    fn failed(&mut self) -> Duration {
        let pause = self.retry;
        self.until = Some(Instant::now() + pause);
        self.retry = (pause * 2).min(MOST_RETRY);
        pause
    }

    fn answered(&mut self) {
        *self = Outage::default();
    }

    /// Until when nothing is to be handled, if the database failed a moment ago.
    fn pending(&self) -> Option<Instant> {
        self.until.filter(|until| *until > Instant::now())
    }
}

/// What [`Inbox::receive`] made of a record, for the partition.
enum Outcome {
    /// Handled, a duplicate, dead, or no handler: its offset can be committed.
    Settled,
    /// Deliver it again after the delay.
    Again(Duration),
}

struct Consuming<'a, S, C: ConsumerContext + 'static> {
    inbox: &'a Inbox<S>,
    consumer: &'a StreamConsumer<C>,
    /// At most one record per partition: the partition is paused behind it.
    waiting: HashMap<Partition, Waiting>,
    outage: Outage,
    /// Offsets stored since the last commit.
    stored: bool,
}

impl<S, C> Consuming<'_, S, C>
where
    S: Clone + Send + Sync + 'static,
    C: ConsumerContext + 'static,
{
    fn next_due(&self) -> Option<Instant> {
        self.waiting.values().map(|waiting| waiting.due).min()
    }

    /// A record the consumer handed over.
    async fn arrived(&mut self, record: Record) {
        let Record { partition, offset, message } = record;
        if let Some(waiting) = self.waiting.get(&partition) {
            if offset > waiting.offset {
                // Fetched before the partition paused (librdkafka drops those); it is read again
                // once the waiting record is settled and the partition resumes after it.
                tracing::debug!(
                    topic = %partition.topic,
                    partition = partition.number,
                    offset,
                    "Kafka record behind a paused partition's retry ignored; it is read again \
                     when the partition resumes"
                );
                return;
            }
            // The partition was assigned anew and reads from its committed offset: the waiting
            // record comes again in its turn, and nothing holds the partition any more.
            self.waiting.remove(&partition);
            self.resume(&partition);
        }
        let message = match message {
            Ok(message) => message,
            Err(invalid) => {
                tracing::error!(
                    error = %ErrorChain(&invalid),
                    consumer = self.inbox.consumer(),
                    topic = %partition.topic,
                    partition = partition.number,
                    offset,
                    "Kafka record skipped: it is not an outbox message and can never be handled; \
                     its offset is committed past it (produce it with the outbox headers, as a \
                     forwarding relay does, to have it handled)"
                );
                self.store(&partition, offset);
                return;
            }
        };
        if let Some(until) = self.outage.pending() {
            self.pause(&partition);
            self.waiting.insert(partition, Waiting { offset, message, due: until });
            return;
        }
        self.handle(partition, offset, message, false).await;
    }

    /// Handles the earliest record whose retry is due.
    async fn retry_due(&mut self) {
        let now = Instant::now();
        let Some(partition) =
            self.waiting.iter().find(|(_, w)| w.due <= now).map(|(partition, _)| partition.clone())
        else {
            return;
        };
        let Some(mut waiting) = self.waiting.remove(&partition) else { return };
        if let Some(until) = self.outage.pending() {
            waiting.due = until;
            self.waiting.insert(partition, waiting);
            return;
        }
        if !self.assigned(&partition) {
            // Resumed so that a later assignment of the partition fetches it.
            self.resume(&partition);
            tracing::info!(
                consumer = self.inbox.consumer(),
                topic = %partition.topic,
                partition = partition.number,
                offset = waiting.offset,
                "Kafka partition no longer assigned to this consumer while its record waited for \
                 a retry; its new owner delivers the record again from the committed offset"
            );
            return;
        }
        self.handle(partition, waiting.offset, waiting.message, true).await;
    }

    /// Handles a record, then stores its offset, or keeps it for its retry (its partition
    /// paused). `paused`: its partition is paused behind it already.
    async fn handle(
        &mut self,
        partition: Partition,
        offset: i64,
        message: InboundMessage,
        paused: bool,
    ) {
        let again = match self.inbox.receive(&message).await {
            Ok(received) => {
                self.outage.answered();
                match outcome(&received) {
                    Outcome::Settled => {
                        self.store(&partition, offset);
                        if paused {
                            self.resume_after(&partition, offset);
                        }
                        return;
                    }
                    Outcome::Again(delay) => {
                        tracing::debug!(
                            consumer = self.inbox.consumer(),
                            topic = %partition.topic,
                            partition = partition.number,
                            offset,
                            retry_in = ?delay,
                            "Kafka partition paused until its record is handled again"
                        );
                        delay
                    }
                }
            }
            Err(InboxError::Database(error)) => {
                let pause = self.outage.failed();
                tracing::warn!(
                    error = %ErrorChain(&error),
                    consumer = self.inbox.consumer(),
                    topic = %partition.topic,
                    partition = partition.number,
                    offset,
                    retry_in = ?pause,
                    "inbox database failed; the record is handled again after the pause (no \
                     attempt counted), and consuming pauses until the database answers"
                );
                pause
            }
        };
        if !paused {
            self.pause(&partition);
        }
        self.waiting.insert(partition, Waiting { offset, message, due: Instant::now() + again });
    }

    fn assigned(&self, partition: &Partition) -> bool {
        match self.consumer.assignment() {
            Ok(assignment) => {
                assignment.find_partition(&partition.topic, partition.number).is_some()
            }
            // Handled anyway: a record handled twice is a duplicate, one skipped would be lost.
            Err(_) => true,
        }
    }

    /// Stores `offset + 1`, where the partition's next owner starts, for the next commit.
    fn store(&mut self, partition: &Partition, offset: i64) {
        match self.consumer.store_offsets(&partition.list(Some(offset + 1))) {
            Ok(()) => self.stored = true,
            Err(KafkaError::StoreOffset(RDKafkaErrorCode::State)) => tracing::debug!(
                topic = %partition.topic,
                partition = partition.number,
                offset,
                "Kafka partition no longer assigned to this consumer; its new owner delivers the \
                 record again and the inbox finds it settled"
            ),
            Err(error) => tracing::warn!(
                error = %ErrorChain(&error),
                topic = %partition.topic,
                partition = partition.number,
                offset,
                "cannot store a Kafka record's offset; the record is delivered again after a \
                 restart or rebalance, and the inbox finds it settled"
            ),
        }
    }

    fn commit(&mut self, mode: CommitMode) {
        if !std::mem::take(&mut self.stored) {
            return;
        }
        match self.consumer.commit_consumer_state(mode) {
            // Committed already, by librdkafka's auto-commit.
            Ok(()) | Err(KafkaError::ConsumerCommit(RDKafkaErrorCode::NoOffset)) => {}
            Err(error) => tracing::warn!(
                error = %ErrorChain(&error),
                consumer = self.inbox.consumer(),
                "cannot commit the Kafka consumer's offsets; records past the last commit are \
                 delivered again after a restart or rebalance, and the inbox finds them settled"
            ),
        }
    }

    fn pause(&self, partition: &Partition) {
        if let Err(error) = self.consumer.pause(&partition.list(None)) {
            tracing::warn!(
                error = %ErrorChain(&error),
                topic = %partition.topic,
                partition = partition.number,
                "cannot pause a Kafka partition behind its record's retry; the records fetched \
                 behind it are ignored and read again once the record is settled"
            );
        }
    }

    fn resume(&self, partition: &Partition) {
        if let Err(error) = self.consumer.resume(&partition.list(None)) {
            tracing::warn!(
                error = %ErrorChain(&error),
                topic = %partition.topic,
                partition = partition.number,
                "cannot resume a paused Kafka partition; it stays paused in this consumer until \
                 it is assigned anew (restart the consumer if it does not move)"
            );
        }
    }

    /// Resumes a paused partition from the record after `offset`, whatever was fetched before.
    fn resume_after(&self, partition: &Partition, offset: i64) {
        self.seek(partition, offset + 1);
        self.resume(partition);
    }

    fn seek(&self, partition: &Partition, offset: i64) {
        // Not waited for: started here, done by librdkafka's threads in order with the
        // partition's pause and resume.
        let sought = self.consumer.seek(
            &partition.topic,
            partition.number,
            Offset::Offset(offset),
            Duration::ZERO,
        );
        if let Err(error) = sought {
            tracing::debug!(
                error = %ErrorChain(&error),
                topic = %partition.topic,
                partition = partition.number,
                offset,
                "cannot seek a Kafka partition (no longer assigned?); its next owner starts from \
                 its committed offset"
            );
        }
    }

    /// At shutdown: records waiting for a retry are sought back to and their partitions
    /// resumed, so the consumer delivers them again if it is used on.
    fn rewind_waiting(&mut self) {
        for (partition, waiting) in std::mem::take(&mut self.waiting) {
            self.seek(&partition, waiting.offset);
            self.resume(&partition);
        }
    }
}

fn outcome(received: &Received) -> Outcome {
    match *received {
        Received::Handled | Received::Duplicate | Received::Dead | Received::NoHandler => {
            Outcome::Settled
        }
        Received::Failed { retry_in: delay, .. } | Received::Snoozed { delay } => {
            Outcome::Again(delay)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_stores_no_offset_by_itself_and_reads_from_the_start_unless_told() {
        let mut mine = ClientConfig::new();
        mine.set("group.id", "billing").set("enable.auto.offset.store", "true");
        let config = consumer_config(&mine);
        assert_eq!(config.get("enable.auto.offset.store"), Some("false"));
        assert_eq!(config.get("auto.offset.reset"), Some("earliest"));
        assert_eq!(config.get("group.id"), Some("billing"));
        mine.set("auto.offset.reset", "latest");
        assert_eq!(consumer_config(&mine).get("auto.offset.reset"), Some("latest"), "yours kept");
    }

    #[test]
    fn the_outage_pause_doubles_up_to_its_limit_and_resets_once_the_database_answers() {
        let mut outage = Outage::default();
        assert_eq!(outage.pending(), None);
        let pauses: Vec<Duration> = (0..12).map(|_| outage.failed()).collect();
        let ms = Duration::from_millis;
        assert_eq!(pauses[..4], [ms(200), ms(400), ms(800), ms(1600)]);
        assert_eq!(pauses[11], MOST_RETRY);
        assert!(outage.pending().is_some(), "nothing handled meanwhile");
        outage.answered();
        assert_eq!(outage.pending(), None);
        assert_eq!(outage.failed(), FIRST_RETRY);
    }

    #[test]
    fn only_a_failure_with_attempts_left_or_a_snooze_holds_the_partition() {
        let delay = Duration::from_millis(300);
        for settled in [Received::Handled, Received::Duplicate, Received::Dead, Received::NoHandler]
        {
            assert!(matches!(outcome(&settled), Outcome::Settled), "{settled:?}");
        }
        let failed = Received::Failed { attempts: 2, retry_in: delay };
        assert!(matches!(outcome(&failed), Outcome::Again(d) if d == delay));
        let snoozed = Received::Snoozed { delay };
        assert!(matches!(outcome(&snoozed), Outcome::Again(d) if d == delay));
    }
}
