//! Consuming a Redis stream through a consumer group into an [`Inbox`] (feature `redis`).
//!
//! [`consume`] reads a stream's entries as one consumer of a group (`XREADGROUP`) and handles
//! them one at a time through [`Inbox::receive`]: each is acknowledged (`XACK`) after the
//! commit, or left pending and handled again once its retry's delay has passed, or acknowledged
//! with an error log if it is not an outbox entry. A database that fails leaves the entry
//! pending (handled again after a backoff, no attempt counted) and pauses reading until the
//! database answers. Entries are read as [`forward::redis`](crate::forward::redis) appends them:
//! the outbox headers from the `h:` fields, the payload from `payload`.
//!
//! # The group and the consumer
//! - The group is the subscription: one per service reading the stream (name the [`Inbox`]
//!   after it too). If missing, it is created at the stream's start
//!   (`XGROUP CREATE <stream> <group> 0 MKSTREAM`), so the entries appended before the service
//!   first started are read too; create it yourself at `$` to skip them.
//! - The consumer is one process of the service, named the same across its restarts (the host
//!   name, a StatefulSet pod's name): started again, it first reads its own pending entries
//!   (`XREADGROUP ... 0`), those it had read and not acknowledged when it stopped or crashed.
//!   Two processes reading at once need two names.
//! - Entries left pending by a consumer that does not come back are taken over by the others
//!   (`XAUTOCLAIM`) once idle for the [claim idle time](GroupReader::claim_idle). A consumer
//!   name never used again stays listed in the group: remove it with `XGROUP DELCONSUMER` once
//!   it has nothing pending.
//!
//! # The claim idle time and the handlers' time
//! An entry is idle from its delivery to a consumer. The entries a consumer holds without
//! handling them (read and not begun, or waiting for their retry) are renewed every third of the
//! claim idle time, between handler calls (`XCLAIM ... JUSTID`); the entry under way is not
//! renewed while its handler runs. So make the claim idle time well above the longest a handler
//! takes (the default, 30 s, fits handlers of a few seconds). An entry taken over while its
//! handler still runs is handled by both consumers, and the inbox makes that safe: the second
//! waits for the first's outcome and finds it handled, a wait but no second effect.
//!
//! # Duplicates
//! Redis delivers an entry again after a crash, a lost acknowledgement or a take-over, and the
//! relay may append an event twice (see [`forward::redis`](crate::forward::redis)). The inbox
//! finds each repeat handled ([`Received::Duplicate`]): its handler does not run again, and the
//! entry is acknowledged.
//!
//! # Order
//! A consumer reads its entries in stream order and handles them one at a time, so with one
//! consumer in the group they are handled in stream order, except that:
//! - an entry waiting for its retry (its handler failed or snoozed) lets later ones pass, up to
//!   [`max_retrying`](GroupReader::max_retrying) entries waiting at once (then reading stops
//!   until one is settled). With `max_retrying(0)` an entry waiting holds back every later one,
//!   which keeps stream order across failures;
//! - entries taken over from a consumer that stopped are handled when taken, after later ones.
//!
//! Consumers of one group share its entries and handle them side by side, in no common order.
//!
//! # The connection
//! Give the consumer a [`ConnectionManager`] of its own: a blocking read
//! (`XREADGROUP ... BLOCK`) holds its connection for up to [`block`](GroupReader::block)
//! (200 ms by default), which must be shorter than the connection's response timeout
//! (redis-rs's default is 500 ms; see `ConnectionManagerConfig::set_response_timeout`).
//!
//! A command that fails (the connection lost, a timeout, the server loading) is logged and sent
//! again after a backoff, and the consumer then reads its own pending entries again, in case a
//! reply with entries was lost. [`consume`] returns an error only when the stream cannot be
//! read as configured: the key holds another type (`WRONGTYPE`), the group is gone (`NOGROUP`:
//! the group or the stream was deleted), the user may not run the commands (`NOPERM`), a reply
//! it cannot read, or an invalid [`GroupReader`] setting.

use std::collections::{BTreeMap, HashSet, VecDeque};
use std::future::Future;
use std::time::Duration;

use ::redis::aio::ConnectionManager;
use ::redis::{ErrorKind, RedisError, Value};
use tokio::time::Instant;

use super::{InboundMessage, Inbox, InboxError, InvalidMessage, Received};
use crate::error::ErrorChain;
use crate::forward::redis::{HEADER_PREFIX, PAYLOAD};

/// The first pause after the database or the server failed; it doubles up to a limit.
const FIRST_RETRY: Duration = Duration::from_millis(200);
const MOST_RETRY: Duration = Duration::from_secs(30);
/// Entries asked for by each read and each take-over.
const READ_COUNT: usize = 10;
/// The shortest claim idle time: a shorter one would have consumers renew and take entries
/// from one another without end.
const LEAST_CLAIM_IDLE: Duration = Duration::from_millis(100);
/// A delay too long to add to an instant waits this long instead (see [`after`]).
const FOREVER: Duration = Duration::from_secs(365 * 24 * 3600);

/// Which stream to read, as which consumer of which group, and how (see the
/// [module docs](self)).
///
/// ```
/// use std::time::Duration;
/// use outbox_runtime::inbox::redis::GroupReader;
///
/// let reader = GroupReader::new("orders", "billing", "billing-7f9c")
///     .claim_idle(Duration::from_secs(60))
///     .max_retrying(0);
/// ```
#[derive(Debug, Clone)]
pub struct GroupReader {
    stream: String,
    group: String,
    consumer: String,
    claim_idle: Duration,
    block: Duration,
    max_retrying: usize,
}

impl GroupReader {
    /// Reads the stream key `stream` as `consumer` of `group`: the group names the service (one
    /// per subscription), the consumer one process of it, the same across its restarts.
    pub fn new(
        stream: impl Into<String>,
        group: impl Into<String>,
        consumer: impl Into<String>,
    ) -> Self {
        GroupReader {
            stream: stream.into(),
            group: group.into(),
            consumer: consumer.into(),
            claim_idle: Duration::from_secs(30),
            block: Duration::from_millis(200),
            max_retrying: 100,
        }
    }

    /// How long an entry stays pending to another consumer without news before this one takes
    /// it over (`XAUTOCLAIM`); default 30 s, at least 100 ms. Make it well above the longest a
    /// handler takes: the entry under way is not renewed while its handler runs.
    pub fn claim_idle(mut self, idle: Duration) -> Self {
        self.claim_idle = idle;
        self
    }

    /// How long a read waits for new entries (`XREADGROUP ... BLOCK`); default 200 ms, at
    /// least 1 ms. Keep it shorter than the connection's response timeout.
    pub fn block(mut self, block: Duration) -> Self {
        self.block = block;
        self
    }

    /// How many entries may wait for their retry while later ones are handled; default 100.
    /// Past it, reading stops until one is settled; with 0, an entry waiting for its retry
    /// holds back every later one (stream order kept across failures).
    pub fn max_retrying(mut self, entries: usize) -> Self {
        self.max_retrying = entries;
        self
    }

    /// The setting that cannot work, if one.
    fn invalid(&self) -> Option<&'static str> {
        if self.claim_idle < LEAST_CLAIM_IDLE {
            Some("GroupReader::claim_idle must be at least 100 ms")
        } else if self.block < Duration::from_millis(1) {
            Some("GroupReader::block must be at least 1 ms (BLOCK 0 would wait forever)")
        } else {
            None
        }
    }
}

/// Receives the stream's entries through `inbox` as `reader` says until `shutdown` completes;
/// the entry under way when it does is finished (handled and acknowledged) first, and the
/// entries read but not begun stay pending to this consumer, read first when it starts again.
/// Returns early only if the stream cannot be read as configured (see the
/// [module docs](self)), with why.
pub async fn consume<S: Clone + Send + Sync + 'static>(
    inbox: &Inbox<S>,
    connection: ConnectionManager,
    reader: &GroupReader,
    shutdown: impl Future<Output = ()>,
) -> Result<(), RedisError> {
    if let Some(invalid) = reader.invalid() {
        return Err(RedisError::from((ErrorKind::InvalidClientConfig, invalid)));
    }
    let mut shutdown = std::pin::pin!(shutdown);
    // Awaits a command, or returns at shutdown: a command cut short loses nothing, its entries
    // stay pending to this consumer.
    macro_rules! or_shutdown {
        ($command:expr) => {
            tokio::select! {
                biased;
                () = &mut shutdown => return Ok(()),
                done = $command => done,
            }
        };
    }
    let mut run = Run::new(inbox, connection, reader);
    let mut retry = FIRST_RETRY;
    // Each turn takes the first step that applies: create the group; renew the entries held;
    // wait out a pause the database asked for; fetch the retries that are due; wait while too
    // many entries wait for their retry; handle the next entry held; read this consumer's own
    // pending entries; take over others' idle ones; read new ones.
    loop {
        let now = Instant::now();
        let done = if !run.created {
            or_shutdown!(run.create_group())
        } else if now >= run.next_renewal {
            or_shutdown!(run.renew(now))
        } else if let Some(until) = run.paused_until.filter(|&until| until > now) {
            or_shutdown!(tokio::time::sleep_until(until.min(run.next_renewal)));
            continue;
        } else if run.next_due().is_some_and(|due| due <= now) {
            or_shutdown!(run.fetch_due(now))
        } else if run.waiting.len() > reader.max_retrying {
            let due = run.next_due().unwrap_or(run.next_renewal);
            or_shutdown!(tokio::time::sleep_until(due.min(run.next_renewal)));
            continue;
        } else if let Some(entry) = run.backlog.pop_front() {
            // No entry is begun after the shutdown, and the one begun is finished.
            or_shutdown!(std::future::ready(()));
            run.handle(entry).await;
            continue;
        } else if let Some(from) = run.own_from {
            or_shutdown!(run.read_own(from))
        } else if now >= run.next_claim {
            or_shutdown!(run.claim(now))
        } else {
            let block = run.block_for(now);
            if block.is_zero() {
                continue;
            }
            or_shutdown!(run.read_new(block))
        };
        let Err(failed) = done else {
            retry = FIRST_RETRY;
            continue;
        };
        if failed.is_final() {
            tracing::error!(
                error = %ErrorChain(&failed.error),
                consumer = inbox.consumer(),
                stream = %reader.stream,
                group = %reader.group,
                command = failed.command,
                "cannot read the Redis stream as configured; consuming stops with this error"
            );
            return Err(failed.error);
        }
        tracing::warn!(
            error = %ErrorChain(&failed.error),
            consumer = inbox.consumer(),
            stream = %reader.stream,
            group = %reader.group,
            command = failed.command,
            retry_in = ?retry,
            "Redis command failed; sending it again after the backoff, then reading this \
             consumer's pending entries again in case a reply was lost"
        );
        run.own_from = Some(EntryId::ZERO);
        or_shutdown!(tokio::time::sleep(retry));
        retry = (retry * 2).min(MOST_RETRY);
    }
}

/// A command that failed, and which.
struct Failed {
    command: &'static str,
    error: RedisError,
}

impl Failed {
    /// Whether sending the command again cannot help: the stream cannot be read as configured.
    fn is_final(&self) -> bool {
        matches!(self.error.code(), Some("WRONGTYPE" | "NOGROUP" | "NOPERM"))
            || matches!(self.error.kind(), ErrorKind::Parse | ErrorKind::UnexpectedReturnType)
    }
}

/// What the consumer holds between its steps.
struct Run<'a, S> {
    inbox: &'a Inbox<S>,
    connection: ConnectionManager,
    reader: &'a GroupReader,
    /// Whether the group is known to exist.
    created: bool,
    /// Entries read or taken over, not begun, in the order to handle them.
    backlog: VecDeque<Entry>,
    /// Entries pending to this consumer that wait for their retry, and when it is due.
    waiting: BTreeMap<EntryId, Instant>,
    /// Where to read this consumer's own pending entries from, until none is left: from the
    /// start when it starts, and after a command failed (its reply, with entries, may be lost).
    own_from: Option<EntryId>,
    /// Where the take-over scan goes on from, and when it runs next.
    claim_from: EntryId,
    next_claim: Instant,
    /// When the entries held (backlog and waiting) are renewed next.
    next_renewal: Instant,
    /// Reading pauses until then after the database failed.
    paused_until: Option<Instant>,
    database_retry: Duration,
}

impl<'a, S: Clone + Send + Sync + 'static> Run<'a, S> {
    fn new(inbox: &'a Inbox<S>, connection: ConnectionManager, reader: &'a GroupReader) -> Self {
        let now = Instant::now();
        Run {
            inbox,
            connection,
            reader,
            created: false,
            backlog: VecDeque::new(),
            waiting: BTreeMap::new(),
            own_from: Some(EntryId::ZERO),
            claim_from: EntryId::ZERO,
            next_claim: now,
            next_renewal: after(now, reader.claim_idle / 3),
            paused_until: None,
            database_retry: FIRST_RETRY,
        }
    }

    /// `XGROUP CREATE ... MKSTREAM`, an existing group taken as it is.
    async fn create_group(&mut self) -> Result<(), Failed> {
        let reader = self.reader;
        let created: Result<(), RedisError> = ::redis::cmd("XGROUP")
            .arg("CREATE")
            .arg(&reader.stream)
            .arg(&reader.group)
            .arg("0")
            .arg("MKSTREAM")
            .query_async(&mut self.connection)
            .await;
        match created {
            Err(error) if error.code() != Some("BUSYGROUP") => {
                Err(Failed { command: "XGROUP CREATE", error })
            }
            _ => {
                self.created = true;
                Ok(())
            }
        }
    }

    /// Resets the idle time of the entries held (`XCLAIM <ids> JUSTID`), so that no other
    /// consumer takes them over; forgets those that are no longer pending to this consumer.
    async fn renew(&mut self, now: Instant) -> Result<(), Failed> {
        let held: Vec<EntryId> =
            self.waiting.keys().copied().chain(self.backlog.iter().map(|entry| entry.id)).collect();
        if !held.is_empty() {
            let mut command = self.claim_command(&held);
            let value = command.arg("JUSTID").query_async::<Value>(&mut self.connection).await;
            let renewed =
                value.and_then(ids).map_err(|error| Failed { command: "XCLAIM", error })?;
            let renewed: HashSet<EntryId> = renewed.into_iter().collect();
            for id in held.into_iter().filter(|id| !renewed.contains(id)) {
                self.lost(id);
                self.waiting.remove(&id);
                self.backlog.retain(|entry| entry.id != id);
            }
        }
        self.next_renewal = after(now, self.reader.claim_idle / 3);
        Ok(())
    }

    /// Fetches the entries whose retry is due (`XCLAIM`), to handle first.
    async fn fetch_due(&mut self, now: Instant) -> Result<(), Failed> {
        let due: Vec<EntryId> =
            self.waiting.iter().filter(|&(_, &at)| at <= now).map(|(&id, _)| id).collect();
        let value = self.claim_command(&due).query_async::<Value>(&mut self.connection).await;
        let fetched =
            value.and_then(entries).map_err(|error| Failed { command: "XCLAIM", error })?;
        for id in &due {
            self.waiting.remove(id);
            if !fetched.iter().any(|entry| entry.id == *id) {
                self.lost(*id);
            }
        }
        for entry in fetched.into_iter().rev() {
            self.backlog.push_front(entry);
        }
        Ok(())
    }

    /// `XCLAIM <stream> <group> <consumer> 0 <ids>`: the entries to this consumer, their idle
    /// time reset.
    fn claim_command(&self, ids: &[EntryId]) -> ::redis::Cmd {
        let reader = self.reader;
        let mut command = ::redis::cmd("XCLAIM");
        command.arg(&reader.stream).arg(&reader.group).arg(&reader.consumer).arg(0);
        for id in ids {
            command.arg(id.to_string());
        }
        command
    }

    /// Reads this consumer's own pending entries after `from` (`XREADGROUP ... <from>`).
    async fn read_own(&mut self, from: EntryId) -> Result<(), Failed> {
        let read = self.read_group(&from.to_string(), None).await?;
        self.own_from = read.last().map(|entry| entry.id);
        let waiting = &self.waiting;
        self.backlog.extend(read.into_iter().filter(|entry| !waiting.contains_key(&entry.id)));
        Ok(())
    }

    /// Reads new entries (`XREADGROUP ... BLOCK <block> ... >`).
    async fn read_new(&mut self, block: Duration) -> Result<(), Failed> {
        let read = self.read_group(">", Some(block)).await?;
        self.backlog.extend(read);
        Ok(())
    }

    async fn read_group(
        &mut self,
        from: &str,
        block: Option<Duration>,
    ) -> Result<Vec<Entry>, Failed> {
        let reader = self.reader;
        let mut command = ::redis::cmd("XREADGROUP");
        command.arg("GROUP").arg(&reader.group).arg(&reader.consumer).arg("COUNT").arg(READ_COUNT);
        if let Some(block) = block {
            command.arg("BLOCK").arg(block.as_millis().max(1).to_string());
        }
        command.arg("STREAMS").arg(&reader.stream).arg(from);
        let value = command.query_async::<Value>(&mut self.connection).await;
        value.and_then(read_reply).map_err(|error| Failed { command: "XREADGROUP", error })
    }

    /// Takes over the entries pending longer than the claim idle time (`XAUTOCLAIM`), a few at
    /// a time, scanning the group's pending entries every half of the claim idle time.
    async fn claim(&mut self, now: Instant) -> Result<(), Failed> {
        let reader = self.reader;
        let value = ::redis::cmd("XAUTOCLAIM")
            .arg(&reader.stream)
            .arg(&reader.group)
            .arg(&reader.consumer)
            .arg(reader.claim_idle.as_millis().to_string())
            .arg(self.claim_from.to_string())
            .arg("COUNT")
            .arg(READ_COUNT)
            .query_async::<Value>(&mut self.connection)
            .await;
        let (next, claimed, deleted) = value
            .and_then(autoclaim_reply)
            .map_err(|error| Failed { command: "XAUTOCLAIM", error })?;
        for id in deleted {
            self.deleted(id);
        }
        // Its own entries waiting for their retry stay waiting (only renewed late).
        let waiting = &self.waiting;
        let taken: Vec<Entry> =
            claimed.into_iter().filter(|entry| !waiting.contains_key(&entry.id)).collect();
        if let Some(first) = taken.first() {
            tracing::warn!(
                consumer = self.inbox.consumer(),
                stream = %reader.stream,
                group = %reader.group,
                redis_consumer = %reader.consumer,
                entries = taken.len(),
                first = %first.id,
                claim_idle = ?reader.claim_idle,
                "took over Redis stream entries pending longer than the claim idle time (a \
                 consumer stopped, or a handler ran longer than that); handling them now"
            );
        }
        self.backlog.extend(taken);
        self.claim_from = next;
        if next == EntryId::ZERO {
            self.next_claim = after(now, reader.claim_idle / 2);
        }
        Ok(())
    }

    /// When the earliest retry is due.
    fn next_due(&self) -> Option<Instant> {
        self.waiting.values().min().copied()
    }

    /// How long the next read may wait for new entries: until the next retry, renewal or
    /// take-over scan at most.
    fn block_for(&self, now: Instant) -> Duration {
        let mut until = after(now, self.reader.block);
        until = until.min(self.next_claim);
        if let Some(due) = self.next_due() {
            until = until.min(due).min(self.next_renewal);
        }
        until.saturating_duration_since(now)
    }

    /// Handles one entry and tells the server (or leaves it pending to handle again later).
    async fn handle(&mut self, entry: Entry) {
        let Some(fields) = &entry.fields else {
            self.deleted(entry.id);
            self.acknowledge(entry.id).await;
            return;
        };
        let inbound = match message(fields) {
            Ok(inbound) => inbound,
            Err(invalid) => {
                tracing::error!(
                    error = %ErrorChain(&invalid),
                    consumer = self.inbox.consumer(),
                    stream = %self.reader.stream,
                    entry = %entry.id,
                    "Redis stream entry acknowledged without being handled: it is not an outbox \
                     entry and can never be handled; it stays in the stream for inspection \
                     (XRANGE <stream> <entry> <entry>), to delete with XDEL"
                );
                self.acknowledge(entry.id).await;
                return;
            }
        };
        match self.inbox.receive(&inbound).await {
            Ok(Received::Failed { retry_in: delay, .. } | Received::Snoozed { delay }) => {
                self.database_retry = FIRST_RETRY;
                self.wait(entry.id, delay);
            }
            Ok(_) => {
                self.database_retry = FIRST_RETRY;
                self.acknowledge(entry.id).await;
            }
            Err(error @ InboxError::Database(_)) => {
                let retry = self.database_retry;
                tracing::warn!(
                    error = %ErrorChain(&error),
                    consumer = self.inbox.consumer(),
                    stream = %self.reader.stream,
                    entry = %entry.id,
                    retry_in = ?retry,
                    "inbox database failed; the Redis stream entry stays pending and is handled \
                     again after the backoff, and reading pauses until the database answers"
                );
                self.wait(entry.id, retry);
                self.paused_until = Some(after(Instant::now(), retry));
                self.database_retry = (retry * 2).min(MOST_RETRY);
            }
        }
    }

    /// Leaves the entry pending, to handle again after `delay`.
    fn wait(&mut self, id: EntryId, delay: Duration) {
        self.waiting.insert(id, after(Instant::now(), delay));
    }

    /// Acknowledges an entry; a lost acknowledgement only means it is read again (from this
    /// consumer's pending entries) and found handled.
    async fn acknowledge(&mut self, id: EntryId) {
        let reader = self.reader;
        let acked: Result<i64, RedisError> = ::redis::cmd("XACK")
            .arg(&reader.stream)
            .arg(&reader.group)
            .arg(id.to_string())
            .query_async(&mut self.connection)
            .await;
        if let Err(error) = acked {
            tracing::warn!(
                error = %ErrorChain(&error),
                consumer = self.inbox.consumer(),
                stream = %reader.stream,
                entry = %id,
                "cannot acknowledge a Redis stream entry; it stays pending, is read again and \
                 found handled"
            );
            self.own_from = Some(EntryId::ZERO);
        }
    }

    fn deleted(&self, id: EntryId) {
        tracing::error!(
            consumer = self.inbox.consumer(),
            stream = %self.reader.stream,
            group = %self.reader.group,
            entry = %id,
            "Redis stream entry deleted (trimmed, or XDEL) while pending, before it was handled: \
             this consumer cannot handle its event, and it leaves the group's pending entries; \
             trim the stream by an age longer than consumers may lag"
        );
    }

    fn lost(&self, id: EntryId) {
        tracing::warn!(
            consumer = self.inbox.consumer(),
            stream = %self.reader.stream,
            group = %self.reader.group,
            entry = %id,
            "a Redis stream entry this consumer held is no longer pending to it (another \
             consumer took it over, or it was deleted); it is not handled here"
        );
    }
}

/// `delay` after `now`, or a year for a delay too long to add.
fn after(now: Instant, delay: Duration) -> Instant {
    now.checked_add(delay).unwrap_or(now + FOREVER)
}

/// An entry's id, `<milliseconds>-<sequence>`, ordered as in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct EntryId {
    ms: u64,
    seq: u64,
}

impl EntryId {
    /// Before every entry: `XREADGROUP ... 0` reads all of a consumer's pending entries, and an
    /// `XAUTOCLAIM` scan starts and ends at it.
    const ZERO: EntryId = EntryId { ms: 0, seq: 0 };

    fn parse(text: &str) -> Option<EntryId> {
        let (ms, seq) = text.split_once('-')?;
        Some(EntryId { ms: ms.parse().ok()?, seq: seq.parse().ok()? })
    }
}

impl std::fmt::Display for EntryId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// A stream entry as read: its id and its fields in order, `None` if it was deleted from the
/// stream while pending.
#[derive(Debug, Clone, PartialEq)]
struct Entry {
    id: EntryId,
    fields: Option<Vec<(String, Vec<u8>)>>,
}

/// The inbox's message in an entry's fields: the `h:` ones are its headers.
fn message(fields: &[(String, Vec<u8>)]) -> Result<InboundMessage, InvalidMessage> {
    let headers: Vec<(&str, std::borrow::Cow<'_, str>)> = fields
        .iter()
        .filter_map(|(name, value)| {
            Some((name.strip_prefix(HEADER_PREFIX)?, String::from_utf8_lossy(value)))
        })
        .collect();
    let payload = fields.iter().find(|(name, _)| name == PAYLOAD).map_or(&[][..], |(_, v)| v);
    InboundMessage::from_headers(headers.iter().map(|(name, value)| (*name, &**value)), payload)
}

/// An `XREADGROUP` reply for one stream (RESP2: `[[key, entries]]`; RESP3: `{key: entries}`;
/// nil when the read timed out).
fn read_reply(value: Value) -> Result<Vec<Entry>, RedisError> {
    let streams = match value {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(streams) => streams
            .into_iter()
            .map(|stream| match stream {
                Value::Array(mut pair) if pair.len() == 2 => Ok(pair.remove(1)),
                other => Err(unexpected("a stream and its entries", &other)),
            })
            .collect::<Result<Vec<Value>, RedisError>>()?,
        Value::Map(streams) => streams.into_iter().map(|(_, entries)| entries).collect(),
        other => return Err(unexpected("the streams read", &other)),
    };
    let mut read = Vec::new();
    for list in streams {
        read.extend(entries(list)?);
    }
    Ok(read)
}

/// An `XAUTOCLAIM` reply: where the scan goes on, the entries taken over, and the ids deleted
/// from the stream that it removed from the pending entries (Redis 7).
fn autoclaim_reply(value: Value) -> Result<(EntryId, Vec<Entry>, Vec<EntryId>), RedisError> {
    let Value::Array(parts) = value else {
        return Err(unexpected("an XAUTOCLAIM reply", &value));
    };
    let mut parts = parts.into_iter();
    let next = entry_id(parts.next().unwrap_or(Value::Nil))?;
    let claimed = entries(parts.next().unwrap_or(Value::Nil))?;
    let deleted = match parts.next() {
        Some(deleted) => ids(deleted)?,
        None => Vec::new(),
    };
    Ok((next, claimed, deleted))
}

/// A list of entries `[[id, [field, value, ...]], ...]`; an entry deleted from the stream has
/// nil fields (or is nil itself, in Redis 6's `XAUTOCLAIM`: skipped).
fn entries(value: Value) -> Result<Vec<Entry>, RedisError> {
    let list = match value {
        Value::Nil => return Ok(Vec::new()),
        Value::Array(list) => list,
        other => return Err(unexpected("a list of entries", &other)),
    };
    let mut read = Vec::with_capacity(list.len());
    for item in list {
        let Value::Array(parts) = item else {
            if matches!(item, Value::Nil) {
                continue;
            }
            return Err(unexpected("an entry", &item));
        };
        let mut parts = parts.into_iter();
        let id = entry_id(parts.next().unwrap_or(Value::Nil))?;
        let fields = match parts.next().unwrap_or(Value::Nil) {
            Value::Nil => None,
            Value::Array(flat) if flat.len() % 2 == 0 => {
                let mut flat = flat.into_iter();
                let mut fields = Vec::with_capacity(flat.len() / 2);
                while let (Some(name), Some(value)) = (flat.next(), flat.next()) {
                    fields
                        .push((String::from_utf8_lossy(&bytes(name)?).into_owned(), bytes(value)?));
                }
                Some(fields)
            }
            Value::Map(pairs) => Some(
                pairs
                    .into_iter()
                    .map(|(name, value)| {
                        Ok((String::from_utf8_lossy(&bytes(name)?).into_owned(), bytes(value)?))
                    })
                    .collect::<Result<_, RedisError>>()?,
            ),
            other => return Err(unexpected("an entry's fields", &other)),
        };
        read.push(Entry { id, fields });
    }
    Ok(read)
}

/// A list of entry ids (`XCLAIM ... JUSTID`, the deleted ids of `XAUTOCLAIM`).
fn ids(value: Value) -> Result<Vec<EntryId>, RedisError> {
    match value {
        Value::Nil => Ok(Vec::new()),
        Value::Array(list) => list.into_iter().map(entry_id).collect(),
        other => Err(unexpected("a list of entry ids", &other)),
    }
}

fn entry_id(value: Value) -> Result<EntryId, RedisError> {
    let text = bytes(value)?;
    std::str::from_utf8(&text)
        .ok()
        .and_then(EntryId::parse)
        .ok_or_else(|| unexpected("an entry id", &Value::BulkString(text)))
}

fn bytes(value: Value) -> Result<Vec<u8>, RedisError> {
    match value {
        Value::BulkString(bytes) => Ok(bytes),
        Value::SimpleString(text) | Value::VerbatimString { text, .. } => Ok(text.into_bytes()),
        other => Err(unexpected("a string", &other)),
    }
}

fn unexpected(what: &'static str, value: &Value) -> RedisError {
    RedisError::from((
        ErrorKind::UnexpectedReturnType,
        "unexpected reply from Redis",
        format!("expected {what}, got {value:?}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    fn entry_value(id: &str, fields: &[(&str, &str)]) -> Value {
        let flat = fields.iter().flat_map(|(name, value)| [bulk(name), bulk(value)]).collect();
        Value::Array(vec![bulk(id), Value::Array(flat)])
    }

    const HEADERS: [(&str, &str); 8] = [
        ("id", "0193a5a8-7f7b-7d4e-9b8e-2f1c3a9d5e01"),
        ("key", "7"),
        ("content-type", "application/json"),
        ("h:outbox-event-id", "0193a5a8-7f7b-7d4e-9b8e-2f1c3a9d5e01"),
        ("h:outbox-event-type", "order.placed"),
        ("h:outbox-aggregate-type", "order"),
        ("h:outbox-aggregate-id", "7"),
        ("h:outbox-event-version", "1"),
    ];

    #[test]
    fn entry_ids_order_as_in_the_stream() {
        let ids: Vec<EntryId> =
            ["10-2", "9-5", "10-10"].iter().map(|id| EntryId::parse(id).unwrap()).collect();
        let mut sorted = ids.clone();
        sorted.sort();
        let shown: Vec<String> = sorted.iter().map(ToString::to_string).collect();
        assert_eq!(shown, ["9-5", "10-2", "10-10"]);
        assert_eq!(EntryId::parse("0-0"), Some(EntryId::ZERO));
        assert_eq!(EntryId::parse("12"), None);
        assert_eq!(EntryId::parse("a-1"), None);
    }

    #[test]
    fn a_read_in_resp2_and_resp3_gives_entries_in_order_and_deleted_ones_as_such() {
        let list = Value::Array(vec![
            entry_value("1-0", &[("a", "1"), ("b", "2")]),
            Value::Array(vec![bulk("2-0"), Value::Nil]),
        ]);
        let expected = vec![
            Entry {
                id: EntryId { ms: 1, seq: 0 },
                fields: Some(vec![("a".into(), b"1".to_vec()), ("b".into(), b"2".to_vec())]),
            },
            Entry { id: EntryId { ms: 2, seq: 0 }, fields: None },
        ];
        let resp2 = Value::Array(vec![Value::Array(vec![bulk("s"), list.clone()])]);
        assert_eq!(read_reply(resp2).unwrap(), expected);
        let resp3 = Value::Map(vec![(bulk("s"), list)]);
        assert_eq!(read_reply(resp3).unwrap(), expected);
        assert_eq!(read_reply(Value::Nil).unwrap(), []);
    }

    #[test]
    fn an_autoclaim_reply_gives_the_cursor_the_entries_and_the_deleted_ids() {
        let reply = Value::Array(vec![
            bulk("5-1"),
            Value::Array(vec![entry_value("3-0", &[("a", "1")]), Value::Nil]),
            Value::Array(vec![bulk("4-0")]),
        ]);
        let (next, claimed, deleted) = autoclaim_reply(reply).unwrap();
        assert_eq!(next, EntryId { ms: 5, seq: 1 });
        assert_eq!(claimed.len(), 1, "a nil entry (Redis 6) is skipped");
        assert_eq!(claimed[0].id, EntryId { ms: 3, seq: 0 });
        assert_eq!(deleted, [EntryId { ms: 4, seq: 0 }]);
    }

    #[test]
    fn a_reply_of_another_shape_is_an_error_saying_what_was_expected() {
        let error = entries(Value::Int(3)).unwrap_err();
        assert_eq!(error.kind(), ErrorKind::UnexpectedReturnType);
        assert!(ErrorChain(&error).to_string().contains("expected a list of entries"), "{error}");
        assert!(Failed { command: "XREADGROUP", error }.is_final());
    }

    #[test]
    fn the_message_is_read_from_the_prefixed_fields_and_the_payload() {
        let mut fields: Vec<(String, Vec<u8>)> =
            HEADERS.iter().map(|(n, v)| (n.to_string(), v.as_bytes().to_vec())).collect();
        fields.push(("h:traceparent".into(), b"00-abc-def-01".to_vec()));
        fields.push(("payload".into(), br#"{"order_id":"7"}"#.to_vec()));
        let message = message(&fields).unwrap();
        assert_eq!(message.event_type(), "order.placed");
        assert_eq!(message.aggregate_id(), "7");
        assert_eq!(message.payload(), r#"{"order_id":"7"}"#);
        assert_eq!(
            message.headers(),
            &serde_json::json!({ "traceparent": "00-abc-def-01" }),
            "only the `h:` fields are headers, without their prefix"
        );
    }

    #[test]
    fn an_entry_without_the_outbox_headers_is_invalid() {
        let fields = vec![("outbox-event-id".to_owned(), b"not prefixed".to_vec())];
        let invalid = message(&fields).unwrap_err();
        assert!(invalid.to_string().contains("no `outbox-event-id` header"), "{invalid}");
    }

    #[test]
    fn settings_that_cannot_work_are_refused() {
        let reader = GroupReader::new("s", "g", "c");
        assert_eq!(reader.clone().invalid(), None);
        assert!(reader.clone().claim_idle(Duration::from_millis(99)).invalid().is_some());
        assert!(reader.block(Duration::ZERO).invalid().is_some());
    }
}
