//! NATS JetStream (feature `nats`, on `async-nats`).
//!
//! Each message is published to JetStream with `Nats-Msg-Id` set to the event id, so the
//! stream's duplicate window drops a repeat after a relay crash, and a row is published once
//! the stream's acknowledgement (`PubAck`) came back. A subject no stream covers is refused by
//! the server (`no responders`): a failed delivery naming the subject. A message larger than the
//! server's `max_payload` is refused before it is sent: the server would answer it by closing
//! the connection, failing every other message in flight with it.
//!
//! A lost connection, a client that cannot send, an acknowledgement that does not come within
//! the JetStream context's timeout, or `no responders` while the sink's own stream does not
//! answer either, is [unavailable](crate::forward::SinkErrorKind::Unavailable): the relay pauses
//! and sends the message again, under the same `Nats-Msg-Id`, once the server answers. The
//! client buffers what it is given while disconnected and sends it on reconnecting, so a message
//! the relay took as unconfirmed can reach the stream; the stream's duplicate window (two
//! minutes by default) drops the repeat, so keep it longer than the outages to ride out without
//! a duplicate.

/// The `async-nats` this sink is built on, so your client is the one it takes.
pub use async_nats;

use async_nats::connection::State;
use async_nats::jetstream::context::PublishErrorKind;
use async_nats::jetstream::{self, message::PublishMessage};
use async_nats::HeaderMap;
use futures_util::future::{join_all, BoxFuture};
use tokio::sync::OnceCell;

use crate::error::ErrorChain;
use crate::forward::{OutboundMessage, Sink, SinkError};

/// Publishes to NATS JetStream, into the streams whose subjects cover each destination.
pub struct NatsSink {
    client: async_nats::Client,
    jetstream: jetstream::Context,
    stream: String,
}

impl NatsSink {
    /// A sink on `client` whose messages go into the stream named `stream`, which must exist
    /// when the relay starts (create it with the subjects your destinations use).
    pub fn new(client: async_nats::Client, stream: impl Into<String>) -> Self {
        NatsSink { jetstream: jetstream::new(client.clone()), client, stream: stream.into() }
    }
}

impl Sink for NatsSink {
    fn check(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move {
            let what = format!("stream `{}`", self.stream);
            if self.client.connection_state() != State::Connected {
                return Err(SinkError::unavailable(what, "not connected to the NATS server"));
            }
            let found = self.jetstream.get_stream(&self.stream).await;
            found.map_err(|e| SinkError::unavailable(what, ErrorChain(&e)))?;
            Ok(())
        })
    }

    fn send<'a>(
        &'a self,
        batch: &'a [OutboundMessage],
    ) -> BoxFuture<'a, Vec<Result<(), SinkError>>> {
        Box::pin(async move {
            // Send every message first, then await the acknowledgements together.
            let max_payload = self.client.server_info().max_payload;
            let mut sent = Vec::with_capacity(batch.len());
            for message in batch {
                let size = encoded_size(message);
                if max_payload > 0 && size > max_payload {
                    let too_large = format!(
                        "message of {size} bytes (payload and headers) exceeds the server's \
                         max_payload of {max_payload} bytes"
                    );
                    sent.push(Err(SinkError::refused(&message.destination, too_large)));
                    continue;
                }
                let publish = PublishMessage::build()
                    .payload(message.payload.clone().into())
                    .headers(headers(message))
                    .message_id(message.id.to_string());
                let destination = message.destination.clone();
                let sent_one = self.jetstream.send_publish(destination, publish).await;
                // Not sent: the client is closed or its buffer full, whatever the message.
                let unsent = |e| SinkError::unavailable(&message.destination, ErrorChain(&e));
                sent.push(sent_one.map_err(unsent));
            }
            // Asked at most once a batch, if the server answers that no stream takes a subject.
            let stream_answers = OnceCell::new();
            let acks = sent.into_iter().zip(batch).map(|(sent, message)| {
                let stream_answers = &stream_answers;
                async move {
                    let Err(error) = sent?.await else { return Ok(()) };
                    let destination = &message.destination;
                    Err(match error.kind() {
                        PublishErrorKind::StreamNotFound => {
                            // `no responders`: no stream takes the subject, or JetStream itself
                            // is not answering (starting up, its leader away).
                            let ask = || async { self.jetstream.get_stream(&self.stream).await };
                            if *stream_answers.get_or_init(|| async { ask().await.is_ok() }).await {
                                SinkError::refused(destination, ErrorChain(&error))
                            } else {
                                let reason = format!(
                                    "{}, and stream `{}` does not answer either: JetStream is \
                                     unavailable",
                                    ErrorChain(&error),
                                    self.stream
                                );
                                SinkError::unavailable(destination, reason)
                            }
                        }
                        // Sent, never acknowledged: it may be in the stream. Sent again under the
                        // same `Nats-Msg-Id`, it is dropped as a repeat.
                        PublishErrorKind::TimedOut
                        | PublishErrorKind::BrokenPipe
                        | PublishErrorKind::MaxAckPending => {
                            SinkError::unavailable(destination, ErrorChain(&error))
                        }
                        // The stream's own answer: limits, a rejected message.
                        _ => SinkError::refused(destination, ErrorChain(&error)),
                    })
                }
            });
            join_all(acks).await
        })
    }
}

/// What the server counts against `max_payload`: the payload and the encoded headers
/// (`NATS/1.0\r\n`, `name: value\r\n` each, `\r\n`), `Nats-Msg-Id` and content type included.
fn encoded_size(message: &OutboundMessage) -> usize {
    let header = |name: &str, value: &str| name.len() + value.len() + 4;
    let own: usize = message.headers.iter().map(|(name, value)| header(name, value)).sum();
    let id = header("Nats-Msg-Id", &message.id.to_string());
    let content_type = header("content-type", message.content_type);
    message.payload.len() + own + id + content_type + "NATS/1.0\r\n\r\n".len()
}

fn headers(message: &OutboundMessage) -> HeaderMap {
    let mut headers = HeaderMap::new();
    for (name, value) in &message.headers {
        headers.append(name.as_str(), value.as_str());
    }
    headers.insert("content-type", message.content_type);
    headers
}
