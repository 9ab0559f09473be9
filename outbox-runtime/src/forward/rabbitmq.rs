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
//! poison the deliveries after it. The connection is the one given to [`RabbitSink::new`] and
//! is not reopened: once it closed (the broker restarted), deliveries fail and their rows stay
//! pending until the relay is restarted on a new connection.

/// The `lapin` this sink is built on, so your connection is the one it takes.
pub use lapin;

use futures_util::future::{join_all, BoxFuture};
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions, ExchangeDeclareOptions};
use lapin::types::{AMQPValue, FieldTable};
use lapin::{BasicProperties, Channel, Confirmation, Connection, ExchangeKind};
use tokio::sync::Mutex;

use crate::forward::{OutboundMessage, Sink, SinkError};

/// AMQP delivery mode 2: the broker writes the message to disk (in a durable queue).
const PERSISTENT: u8 = 2;

/// Publishes to one RabbitMQ exchange, routing each message by its destination.
pub struct RabbitSink {
    connection: Connection,
    exchange: String,
    /// The publishing channel, in confirm mode; opened with the first batch, replaced once closed.
    channel: Mutex<Option<Channel>>,
}

impl RabbitSink {
    /// A sink on `connection` that publishes to the exchange named `exchange`, which must exist
    /// when the relay starts (declare it, and bind the queues your destinations route to).
    pub fn new(connection: Connection, exchange: impl Into<String>) -> Self {
        RabbitSink { connection, exchange: exchange.into(), channel: Mutex::new(None) }
    }

    /// The open publishing channel, or a new one in confirm mode if there is none or it closed.
    async fn channel(&self) -> Result<Channel, lapin::Error> {
        let mut channel = self.channel.lock().await;
        if let Some(open) = channel.as_ref().filter(|c| c.status().connected()) {
            return Ok(open.clone());
        }
        let opened = self.connection.create_channel().await?;
        opened.confirm_select(ConfirmSelectOptions::default()).await?;
        *channel = Some(opened.clone());
        Ok(opened)
    }
}

impl Sink for RabbitSink {
    fn check(&self) -> BoxFuture<'_, Result<(), SinkError>> {
        Box::pin(async move {
            let what = format!("exchange `{}`", self.exchange);
            // A channel of its own: a failed passive declare closes the channel it ran on.
            let channel =
                self.connection.create_channel().await.map_err(|e| SinkError::new(&what, e))?;
            let passive = ExchangeDeclareOptions { passive: true, ..Default::default() };
            channel
                .exchange_declare(
                    self.exchange.as_str().into(),
                    ExchangeKind::Direct,
                    passive,
                    FieldTable::default(),
                )
                .await
                .map_err(|e| SinkError::new(&what, e))?;
            let _ = channel.close(200, "checked".into()).await;
            Ok(())
        })
    }

    fn publish<'a>(
        &'a self,
        batch: &'a [OutboundMessage],
    ) -> BoxFuture<'a, Vec<Result<(), SinkError>>> {
        Box::pin(async move {
            let channel = match self.channel().await {
                Ok(channel) => channel,
                Err(e) => {
                    let reason = format!("no channel to publish on: {e}");
                    return batch
                        .iter()
                        .map(|m| Err(SinkError::new(&m.destination, &reason)))
                        .collect();
                }
            };
            // Send every message first, then await the confirmations together.
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
                let refused = |e: &dyn std::fmt::Display| SinkError::new(&message.destination, e);
                let confirmation = sent.map_err(|e| refused(&e))?.await.map_err(|e| refused(&e))?;
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
                    Confirmation::NotRequested => {
                        Err(refused(&"the channel is not in publisher-confirm mode"))
                    }
                }
            });
            join_all(confirms).await
        })
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
