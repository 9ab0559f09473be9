//! Redis Streams (feature `redis`, on `redis` with its tokio `ConnectionManager`).
//!
//! Each message is appended with `XADD <destination> * ...`, the destination being the stream
//! key, with these fields in this order:
//!
//! | field | value |
//! |---|---|
//! | `id` | the event id |
//! | `key` | the aggregate id |
//! | `content-type` | `application/json` |
//! | `h:<name>` | one per header, `h:outbox-event-id`, `h:traceparent`, ... |
//! | `payload` | the stored JSON |
//!
//! Headers are prefixed with `h:` so that no header name can take the place of one of the
//! other fields. The entry id in the `XADD` reply is the confirmation: a row is published once
//! Redis answered it. A batch is sent as one pipeline, not a transaction: one outcome per
//! command, so a key holding another type (`WRONGTYPE`) fails its own messages only.
//!
//! A key of another type (`WRONGTYPE`) or another refusal of the command is a failed attempt of
//! its event; a connection lost or refused, a timeout, or a server that cannot take writes now
//! (`LOADING`, `OOM`, `READONLY`, `MASTERDOWN`, ...) is
//! [unavailable](crate::forward::SinkErrorKind::Unavailable): the relay pauses and appends the
//! entry again once the server answers.
//!
//! Streams grow until trimmed: [`RedisSink::trim`] has each `XADD` trim its stream to about a
//! length (`MAXLEN ~`) or an age (`MINID ~`, entry ids being milliseconds), the `~` letting Redis
//! trim whole nodes only, which costs next to nothing.
//!
//! Redis has no broker-side deduplication: after a relay crash between Redis's reply and the
//! row's acknowledgement an entry can be appended twice, and consumers deduplicate by the `id`
//! field.

/// The `redis` crate this sink is built on, so your connection is the one it takes.
pub use ::redis;

use ::redis::aio::ConnectionManager;
use ::redis::{RedisError, RedisResult};
use futures_util::future::BoxFuture;

use crate::error::ErrorChain;
use crate::forward::{OutboundMessage, Sink, SinkError};

/// The fields of an entry: each header under this prefix, and the payload (the inbox's
/// consumer reads them back).
pub(crate) const HEADER_PREFIX: &str = "h:";
pub(crate) const PAYLOAD: &str = "payload";

/// Appends to Redis streams, one stream key per destination.
pub struct RedisSink {
    connection: ConnectionManager,
    trim: Option<Trim>,
}

/// How far each append trims its stream (see [`RedisSink::trim`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Trim {
    /// Keep about this many entries (`MAXLEN ~ n`): at least that many, a node's worth more at most.
    MaxLen(u64),
    /// Keep about the entries appended within this long (`MINID ~ <now - age>`).
    MaxAge(std::time::Duration),
}

impl RedisSink {
    /// A sink on `connection`, which reconnects by itself after a dropped connection.
    pub fn new(connection: ConnectionManager) -> Self {
        RedisSink { connection, trim: None }
    }

    /// Trims every stream it appends to, in the same `XADD`. Default: no trimming.
    pub fn trim(mut self, trim: Trim) -> Self {
        self.trim = Some(trim);
        self
    }
}

impl Sink for RedisSink {
    fn check(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move {
            let mut connection = self.connection.clone();
            let pong: RedisResult<String> = ::redis::cmd("PING").query_async(&mut connection).await;
            pong.map(drop)
                .map_err(|e| SinkError::unavailable("redis server (PING)", ErrorChain(&e)))
        })
    }

    fn send<'a>(
        &'a self,
        batch: &'a [OutboundMessage],
    ) -> BoxFuture<'a, Vec<Result<(), SinkError>>> {
        Box::pin(async move {
            let mut pipe = ::redis::pipe();
            pipe.ignore_errors();
            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH);
            let now_ms = now.map_or(0, |since| since.as_millis());
            for message in batch {
                let command = pipe.cmd("XADD").arg(&message.destination);
                match self.trim {
                    Some(Trim::MaxLen(entries)) => command.arg("MAXLEN").arg("~").arg(entries),
                    Some(Trim::MaxAge(age)) => {
                        let min_id = now_ms.saturating_sub(age.as_millis());
                        command.arg("MINID").arg("~").arg(min_id.to_string())
                    }
                    None => command,
                };
                let command = command.arg("*");
                command.arg("id").arg(message.id.to_string()).arg("key").arg(&message.key);
                command.arg("content-type").arg(message.content_type);
                for (name, value) in &message.headers {
                    command.arg(format!("{HEADER_PREFIX}{name}")).arg(value);
                }
                command.arg(PAYLOAD).arg(&message.payload);
            }
            let mut connection = self.connection.clone();
            let replies: RedisResult<Vec<RedisResult<String>>> =
                pipe.query_async(&mut connection).await;
            match replies {
                Ok(replies) => batch
                    .iter()
                    .zip(replies.into_iter().map(Some).chain(std::iter::repeat_with(|| None)))
                    .map(|(message, reply)| match reply {
                        Some(Ok(_entry_id)) => Ok(()),
                        Some(Err(e)) if is_unavailable(&e) => {
                            Err(SinkError::unavailable(&message.destination, ErrorChain(&e)))
                        }
                        Some(Err(e)) => {
                            Err(SinkError::refused(&message.destination, ErrorChain(&e)))
                        }
                        None => {
                            Err(SinkError::unavailable(&message.destination, "no reply from redis"))
                        }
                    })
                    .collect(),
                // The pipeline as a whole failed: the connection, not a message.
                Err(e) => batch
                    .iter()
                    .map(|m| Err(SinkError::unavailable(&m.destination, ErrorChain(&e))))
                    .collect(),
            }
        })
    }
}

/// Whether a command's error is the server's state (unreachable, loading, out of memory, a
/// replica or cluster unavailable) rather than a refusal of the message (`WRONGTYPE`, a
/// malformed command).
fn is_unavailable(error: &RedisError) -> bool {
    use ::redis::{ErrorKind, ServerErrorKind};
    let transport = error.is_io_error() || error.is_connection_dropped() || error.is_timeout();
    let server_state = matches!(
        error.kind(),
        ErrorKind::Server(
            ServerErrorKind::BusyLoading
                | ServerErrorKind::TryAgain
                | ServerErrorKind::ClusterDown
                | ServerErrorKind::MasterDown
                | ServerErrorKind::ReadOnly
                | ServerErrorKind::Moved
                | ServerErrorKind::Ask
        )
    );
    let busy = matches!(error.code(), Some("OOM" | "BUSY" | "MISCONF" | "NOREPLICAS"));
    transport || server_state || busy
}
