//! RabbitMQ (feature `rabbitmq`, on `lapin`).
//!
//! Each message is published to one exchange with its destination as the routing key, as a
//! persistent message (delivery mode 2) with `message_id` = the event id, content type
//! `application/json` and the message's headers as AMQP string headers. The channel is in
//! publisher-confirm mode, so a row is published only once the broker acknowledged its message,
//! and every message is `mandatory`: one that no queue takes comes back (`basic.return`) and is
//! a failed delivery naming the routing key and "unroutable", not a silent drop.
//!
//! RabbitMQ does not deduplicate: after a relay crash between the broker's confirmation and
//! the row's acknowledgement a message can arrive twice, and consumers deduplicate by
//! `message_id`.
//!
//! One channel is kept across batches and shared by batches in flight; a channel the broker
//! closed (after an error) is replaced by a new one at the next batch, so one failure does not
//! poison the deliveries after it.
//!
//! What happens when the connection itself closes (the broker restarted, the network dropped)
//! depends on how the sink was made:
//!
//! - [`RabbitSink::from_uri`] keeps the URI and the connection properties, and opens a new
//!   connection at the next batch (or start check) once the current one is no longer connected:
//!   delivery resumes by itself when the broker is back. An attempt is bounded by
//!   [`CONNECT_TIMEOUT`], so during an outage a batch fails fast (its rows go back to pending
//!   while the relay checks the broker) instead of hanging; batches that waited for an attempt that failed
//!   fail with its error rather than each trying again. A failed attempt is a [`SinkError`]
//!   naming the routing key (the exchange, at start) and the cause, never the URI, which may
//!   hold a password.
//! - [`RabbitSink::new`] takes a connection it cannot reopen: once that connection closed,
//!   the sink stays unavailable and rows stay pending until the relay is restarted on a new one.
//!
//! A message no queue takes, one the broker refuses (`basic.nack`), or one it closes the channel
//! over (`PRECONDITION_FAILED`, `CONTENT_TOO_LARGE`: a message over `max_message_size`; the
//! others in flight on that channel are sent again alone, so only the one at fault fails) is a
//! failed attempt of its event. A broker that cannot be reached, a connection lost, an exchange
//! gone (`NOT_FOUND`) or access refused are
//! [unavailable](crate::forward::SinkErrorKind::Unavailable): the relay pauses, checks the
//! exchange until it is back, and sends the message again.
//!
//! Do not combine `from_uri` with lapin's own `enable_auto_recover`: the sink already
//! reconnects, and two mechanisms recovering one connection race each other.

/// The `lapin` this sink is built on, so your connection is the one it takes.
pub use lapin;

use std::time::Duration;

use futures_util::future::{join_all, BoxFuture};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
use lapin::types::{AMQPValue, FieldTable};
use lapin::uri::AMQPUri;
use lapin::{
    BasicProperties, Channel, Confirmation, Connection, ConnectionProperties, ErrorKind,
    ExchangeKind,
};
use tokio::sync::Mutex;
use tokio::time::Instant;

use crate::error::ErrorChain;
use crate::forward::{OutboundMessage, Sink, SinkError};

/// AMQP delivery mode 2: the broker writes the message to disk (in a durable queue).
const PERSISTENT: u8 = 2;

/// Longest a sink spends opening a connection ([`RabbitSink::from_uri`]) or a channel: long
/// enough for a broker across a slow network, short enough that a batch sent during an outage
/// fails (and is retried) instead of holding its rows.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Publishes to one RabbitMQ exchange, routing each message by its destination.
pub struct RabbitSink {
    exchange: String,
    /// How to open a new connection: `None` for a sink on a given connection ([`RabbitSink::new`]).
    connector: Option<Connector>,
    current: Mutex<Current>,
}

/// What a sink made from a URI keeps to connect again. No `Debug`: the URI may hold a password.
struct Connector {
    /// The parsed URI, or why it does not parse (in words that do not quote it).
    uri: Result<AMQPUri, String>,
    properties: ConnectionProperties,
}

/// The connection and the publishing channel, replaced together under one lock, so that one
/// batch at a time opens them and the others wait for its result.
#[derive(Default)]
struct Current {
    /// `None` until a sink made from a URI first connects.
    connection: Option<Connection>,
    /// The publishing channel, in confirm mode; opened with the first batch, replaced once closed.
    channel: Option<Channel>,
    /// When the last attempt to connect failed, and why: batches that were already waiting for
    /// the lock share that failure instead of each waiting out a timeout of its own.
    failed: Option<(Instant, String)>,
}

impl RabbitSink {
    /// A sink on `connection` that publishes to the exchange named `exchange`, which must exist
    /// when the relay starts (declare it, and bind the queues your destinations route to).
    ///
    /// It reopens channels, not the connection: once `connection` closed, every delivery fails
    /// until the relay is restarted on a new one. Use [`RabbitSink::from_uri`] for a sink that
    /// reconnects by itself.
    pub fn new(connection: Connection, exchange: impl Into<String>) -> Self {
        let current = Current { connection: Some(connection), ..Current::default() };
        RabbitSink { exchange: exchange.into(), connector: None, current: Mutex::new(current) }
    }

    /// A sink that connects to the broker at `uri` (`amqp://user:password@host:port/vhost`) with
    /// `properties`, publishes to the exchange named `exchange`, which must exist when the relay
    /// starts, and connects again by itself whenever its connection closed (see the
    /// [module docs](self)).
    ///
    /// No I/O here: the relay's start check opens the first connection, so a broker that is
    /// down, refuses the credentials or lacks the exchange stops the relay with
    /// [`Error::Sink`](crate::Error::Sink). A URI that does not parse is reported there too.
    pub fn from_uri(
        uri: &str,
        properties: ConnectionProperties,
        exchange: impl Into<String>,
    ) -> Self {
        let uri = uri.parse::<AMQPUri>().map_err(|error| {
            // The parser's message can quote the whole URI, password included.
            if error.contains(uri) {
                "the URI is not a valid AMQP URI".to_owned()
            } else {
                format!("the URI is not a valid AMQP URI: {error}")
            }
        });
        RabbitSink {
            exchange: exchange.into(),
            connector: Some(Connector { uri, properties }),
            current: Mutex::new(Current::default()),
        }
    }

    /// The open publishing channel, or a new one in confirm mode (on a new connection if the
    /// sink can make one and the current one is closed).
    async fn channel(&self) -> Result<Channel, String> {
        let asked = Instant::now();
        let mut current = self.current.lock().await;
        if let Some(open) = current.channel.as_ref().filter(|c| c.status().connected()) {
            return Ok(open.clone());
        }
        let opened = self.connected(&mut current, asked).await?;
        let open = async {
            let channel = opened.create_channel().await?;
            channel.confirm_select(ConfirmSelectOptions::default()).await?;
            Ok::<_, lapin::Error>(channel)
        };
        let channel = within(open).await.map_err(|e| format!("cannot open a channel: {e}"))?;
        current.channel = Some(channel.clone());
        Ok(channel)
    }

    /// The current connection, or a new one if it is closed and the sink can make one.
    /// `asked`: when the caller started waiting for the lock.
    async fn connected<'c>(
        &self,
        current: &'c mut Current,
        asked: Instant,
    ) -> Result<&'c Connection, String> {
        let stale = current.connection.as_ref().is_none_or(|c| !c.status().connected());
        if let (true, Some(connector)) = (stale, &self.connector) {
            if let Some((_, error)) = current.failed.as_ref().filter(|(at, _)| *at >= asked) {
                return Err(error.clone());
            }
            current.channel = None;
            current.connection = None;
            match connector.connect().await {
                Ok(connection) => {
                    current.failed = None;
                    current.connection = Some(connection);
                }
                Err(error) => {
                    current.failed = Some((Instant::now(), error.clone()));
                    return Err(error);
                }
            }
        }
        current.connection.as_ref().ok_or_else(|| "no connection to the broker".to_owned())
    }
}

impl Connector {
    /// A new connection, within [`CONNECT_TIMEOUT`]; the error names the cause, not the URI.
    async fn connect(&self) -> Result<Connection, String> {
        let connected = match &self.uri {
            Ok(uri) => within(Connection::connect_uri(uri.clone(), self.properties.clone())).await,
            Err(invalid) => Err(invalid.clone()),
        };
        connected.map_err(|error| format!("cannot connect to the broker: {error}"))
    }
}

/// Awaits `step` for at most [`CONNECT_TIMEOUT`].
async fn within<T>(
    step: impl std::future::Future<Output = Result<T, lapin::Error>>,
) -> Result<T, String> {
    match tokio::time::timeout(CONNECT_TIMEOUT, step).await {
        Ok(done) => done.map_err(|error| error.to_string()),
        Err(_) => Err(format!("no answer from the broker within {CONNECT_TIMEOUT:?}")),
    }
}

impl Sink for RabbitSink {
    fn check(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move {
            let what = format!("exchange `{}`", self.exchange);
            // A channel of its own: a failed passive declare closes the channel it ran on.
            let channel = {
                let asked = Instant::now();
                let mut current = self.current.lock().await;
                let connection = self
                    .connected(&mut current, asked)
                    .await
                    .map_err(|e| SinkError::unavailable(&what, e))?;
                within(connection.create_channel()).await.map_err(|e| {
                    SinkError::unavailable(&what, format_args!("cannot open a channel: {e}"))
                })?
            };
            let passive = ExchangeDeclareOptions { passive: true, ..Default::default() };
            channel
                .exchange_declare(
                    self.exchange.as_str().into(),
                    ExchangeKind::Direct,
                    passive,
                    FieldTable::default(),
                )
                .await
                .map_err(|e| SinkError::unavailable(&what, e))?;
            let _ = channel.close(200, "checked".into()).await;
            Ok(())
        })
    }

    fn send<'a>(
        &'a self,
        batch: &'a [OutboundMessage],
    ) -> BoxFuture<'a, Vec<Result<(), SinkError>>> {
        Box::pin(async move {
            let mut outcomes = self.send_on_one_channel(batch).await;
            // A message the broker refuses by closing the channel (too large, say) fails every
            // message in flight on that channel with the same error: each is sent again alone,
            // so that only the one at fault is refused.
            let suspects: Vec<usize> = (0..batch.len())
                .filter(|&i| matches!(&outcomes[i], Err(Refusal::ChannelClosed(_))))
                .collect();
            if suspects.len() > 1 {
                for i in suspects {
                    let alone = self.send_on_one_channel(std::slice::from_ref(&batch[i])).await;
                    outcomes[i] = alone.into_iter().next().unwrap_or(Ok(()));
                }
            }
            outcomes
                .into_iter()
                .zip(batch)
                .map(|(outcome, message)| outcome.map_err(|e| e.into_sink_error(message)))
                .collect()
        })
    }
}

/// Why the broker did not confirm a message.
enum Refusal {
    /// The channel closed with a refusal that can be this message's (a precondition, its size).
    ChannelClosed(String),
    /// Anything else, classified.
    Other(SinkError),
}

impl Refusal {
    fn into_sink_error(self, message: &OutboundMessage) -> SinkError {
        match self {
            Refusal::ChannelClosed(reason) => SinkError::refused(&message.destination, reason),
            Refusal::Other(error) => error,
        }
    }
}

impl RabbitSink {
    /// Publishes `batch` on the current channel, sending every message before awaiting the
    /// confirmations together.
    async fn send_on_one_channel(&self, batch: &[OutboundMessage]) -> Vec<Result<(), Refusal>> {
        let channel = match self.channel().await {
            Ok(channel) => channel,
            Err(e) => {
                let reason = format!("exchange `{}`: {e}", self.exchange);
                let unavailable = |m: &OutboundMessage| {
                    Err(Refusal::Other(SinkError::unavailable(&m.destination, &reason)))
                };
                return batch.iter().map(unavailable).collect();
            }
        };
        let mut sent = Vec::with_capacity(batch.len());
        for message in batch {
            let published = channel
                .basic_publish(
                    self.exchange.as_str().into(),
                    message.destination.as_str().into(),
                    BasicPublishOptions { mandatory: true, ..Default::default() },
                    &message.payload,
                    properties(message),
                )
                .await;
            sent.push(published);
        }
        let confirms = sent.into_iter().zip(batch).map(|(sent, message)| async move {
            let refused = |e: &dyn std::fmt::Display| {
                Refusal::Other(SinkError::refused(&message.destination, e))
            };
            let not_confirmed = |e: lapin::Error| match e.kind() {
                ErrorKind::ProtocolError(amqp)
                    if matches!(
                        amqp.kind(),
                        AMQPErrorKind::Soft(
                            AMQPSoftError::PRECONDITIONFAILED | AMQPSoftError::CONTENTTOOLARGE
                        )
                    ) =>
                {
                    Refusal::ChannelClosed(ErrorChain(&e).to_string())
                }
                // Not sent, or sent and never confirmed (the connection lost, the exchange gone,
                // access refused): the broker may have it, and it is sent again once the broker
                // answers and the sink's check passes.
                _ => Refusal::Other(SinkError::unavailable(&message.destination, ErrorChain(&e))),
            };
            let confirmation = sent.map_err(not_confirmed)?.await.map_err(not_confirmed)?;
            match confirmation {
                Confirmation::Ack(None) => Ok(()),
                Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
                    Err(refused(&format_args!(
                        "unroutable: no queue bound to exchange `{}` takes this routing key \
                         ({} {})",
                        self.exchange, returned.reply_code, returned.reply_text,
                    )))
                }
                Confirmation::Nack(None) => Err(refused(&"refused by the broker (nack)")),
                Confirmation::NotRequested => Err(Refusal::Other(SinkError::unavailable(
                    &message.destination,
                    "the channel is not in publisher-confirm mode",
                ))),
            }
        });
        join_all(confirms).await
    }
}

fn properties(message: &OutboundMessage) -> BasicProperties {
    let mut headers = FieldTable::default();
    for (name, value) in &message.headers {
        headers.insert(name.as_str().into(), AMQPValue::LongString(value.as_str().into()));
    }
    BasicProperties::default()
        .with_message_id(message.id.to_string().into())
        .with_content_type(message.content_type.into())
        .with_delivery_mode(PERSISTENT)
        .with_headers(headers)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_uri_that_does_not_parse_fails_the_start_check_without_quoting_it() {
        // The first has no authority, and the parser's message quotes it whole.
        for uri in ["amqp:guest:s3cret-pw@host/%2f", "amqp://guest:s3cret-pw@host:port/%2f"] {
            let sink = RabbitSink::from_uri(uri, ConnectionProperties::default(), "events");
            let error = sink.check().await.expect_err("the URI does not parse").to_string();
            let expected = "exchange `events`: cannot connect to the broker: the URI is not a \
                            valid AMQP URI";
            assert!(error.starts_with(expected), "{error}");
            assert!(!error.contains("s3cret-pw") && !error.contains("amqp:"), "{error}");
        }
    }
}
