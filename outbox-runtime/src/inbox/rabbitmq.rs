//! Consuming a RabbitMQ queue into an [`Inbox`] (feature `rabbitmq`, on `lapin`).
//!
//! [`consume`] takes the queue's messages with manual acknowledgements, handling one at a time
//! in the order the broker delivers them: each goes through [`Inbox::receive`] and is then
//! acknowledged after the commit, given back to the queue after the retry's delay, or rejected
//! if it is not an outbox message. A database that fails gives the message back (no attempt
//! counted) and pauses consuming with a backoff until it answers again.
//!
//! | the message | told to the broker |
//! |---|---|
//! | handled, a duplicate, dead, or of a type no handler takes | `basic.ack` |
//! | failed with attempts left, or snoozed | kept unacknowledged for the delay, then `basic.nack` with `requeue` |
//! | not an outbox message (a header missing or malformed) | `basic.reject` without `requeue`, and an error log |
//! | the database failed | `basic.nack` with `requeue` after a pause, during which nothing else is handled |
//!
//! RabbitMQ has no negative acknowledgement with a delay: a message waiting for its retry stays
//! unacknowledged on a timer of its own while the messages behind it are handled, so it neither
//! spins (redelivered at once, failing again) nor stalls the queue. At the end of the delay it is
//! requeued and the broker delivers it again (to this consumer or another one of the queue).
//! A delay is held at most [`MOST_HELD`], under the broker's `consumer_timeout`.
//!
//! Configure the queue and the consumer for it:
//! - A durable queue, and messages published persistent (the relay's are): a broker restart
//!   then loses nothing.
//! - The prefetch ([`consume`]'s `prefetch`, `basic.qos` on its channel) bounds the messages
//!   delivered and not yet acknowledged: those under way, those the broker sent ahead, and
//!   those waiting for a retry, each of which holds a slot until its delay ends. Above the
//!   number of messages you expect to fail at once, so that failing ones do not take every slot.
//! - A dead-letter exchange on the queue (`x-dead-letter-exchange`): a message that is not an
//!   outbox message is rejected and goes there, to be looked at; without one the broker drops
//!   it. Messages whose handler gave up are not rejected: they are dead in `outbox.inbox`, kept
//!   with their payload and last error, and acknowledged.
//! - Bind the queue only to the routing keys of the types the inbox handles: a message of a
//!   type no handler takes is acknowledged and gone.
//! - `consumer_timeout` (30 minutes by default) above the longest handler call: past it the
//!   broker closes the channel and [`consume`] returns with the error.
//!
//! Duplicates: RabbitMQ delivers a message again after a consumer crashed or its channel
//! closed before the acknowledgement, and a relay may publish one twice (see
//! [`forward::rabbitmq`](crate::forward::rabbitmq)). The inbox recognizes each by its event id
//! (the `outbox-event-id` header): a message handled before is acknowledged without calling its
//! handler, and two deliveries of one message at once (by two consumers) wait for each other.
//!
//! Order: messages are handled one at a time in delivery order, but a message waiting for its
//! retry is passed by the ones behind it. For per-queue order across failures, consume with a
//! prefetch of 1 and a single consumer on the queue: the broker then sends nothing else until
//! the waiting message is acknowledged or requeued (a requeued message goes back to its place
//! in the queue where RabbitMQ can keep it there; see its documentation for your queue type).
//!
//! The [`Channel`] is the caller's, and so is its connection: [`consume`] returns an error when
//! the channel closes or the broker cancels the consumer, and the caller starts it again (on a
//! new channel, and a new connection if that one closed). Messages it had not acknowledged are
//! delivered again by the broker, and the inbox finds those it handled.

use std::borrow::Cow;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures_util::{FutureExt, StreamExt};
use lapin::message::Delivery;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicNackOptions, BasicQosOptions,
    BasicRejectOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{Acker, BasicProperties, Channel, ChannelState, Consumer, ErrorKind};
use tokio::sync::watch;
use tokio::task::JoinSet;

use super::{InboundMessage, Inbox, InboxError, Received};
use crate::error::ErrorChain;

/// The first pause after the database failed; it doubles up to a limit.
const FIRST_RETRY: Duration = Duration::from_millis(200);
const MOST_RETRY: Duration = Duration::from_secs(30);

/// The longest a message is kept unacknowledged for its retry's delay: half of RabbitMQ's
/// default `consumer_timeout` (30 minutes), past which the broker would close the channel. A
/// longer delay (a long [`Snooze`](crate::Snooze)) is cut to this: the message is delivered
/// again then, and its handler called again.
pub const MOST_HELD: Duration = Duration::from_secs(15 * 60);

/// Why [`consume`] stopped before its shutdown. Start it again once the cause is gone: the
/// messages it had not acknowledged are delivered again, and the inbox finds those it handled.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ConsumeError {
    /// The channel or its connection failed or was closed, or the broker refused to consume
    /// the queue (it does not exist, access is refused, another connection has it exclusive):
    /// start again on a new channel (and connection, if that one closed).
    #[error("cannot consume RabbitMQ queue `{queue}`")]
    Channel {
        /// The queue.
        queue: String,
        /// What the broker or the client said.
        #[source]
        source: lapin::Error,
    },
    /// The broker cancelled the consumer (`basic.cancel`): the queue was deleted, or, for a
    /// replicated queue, its leader moved. The channel is still open.
    #[error(
        "the broker cancelled the consumer of RabbitMQ queue `{queue}`; consume it again once \
         it exists"
    )]
    Cancelled {
        /// The queue.
        queue: String,
    },
    /// The name is longer than AMQP's 255 bytes, so no queue has it.
    #[error("`{queue}` cannot name a RabbitMQ queue: AMQP allows at most 255 bytes")]
    QueueName {
        /// The name.
        queue: String,
    },
}

/// Receives the messages of `queue` through `inbox` until `shutdown` completes, on `channel`
/// (give it a channel of its own: `basic.qos` sets the channel's prefetch for the consumers
/// created after it). `prefetch` bounds the messages delivered and not yet acknowledged (see the
/// [module docs](self)); 0 means no bound, as in AMQP, and is not advised: the broker then sends
/// the whole queue to this consumer.
///
/// When `shutdown` completes, the consumer is cancelled so that the broker sends nothing more,
/// the messages it already delivered are handled and acknowledged, messages waiting for their
/// retry are requeued at once (delivered again, maybe before their delay ends), and `consume`
/// returns `Ok`. The channel stays open; close it. (Dropping the future instead stops at once:
/// the messages delivered and not acknowledged, those waiting for a retry among them, stay so
/// until the channel closes, and the broker then delivers them again.)
///
/// Returns early only if the channel closes or the broker cancels the consumer, with why: start
/// it again (see [`ConsumeError`]).
pub async fn consume<S: Clone + Send + Sync + 'static>(
    inbox: &Inbox<S>,
    channel: &Channel,
    queue: &str,
    prefetch: u16,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ConsumeError> {
    let Ok(name) = ShortString::try_new(queue) else {
        return Err(ConsumeError::QueueName { queue: queue.to_owned() });
    };
    let failed = |source| ConsumeError::Channel { queue: queue.to_owned(), source };
    channel.basic_qos(prefetch, BasicQosOptions { global: false }).await.map_err(failed)?;
    let manual_acks = BasicConsumeOptions { no_ack: false, ..BasicConsumeOptions::default() };
    // An empty tag: the broker names the consumer, uniquely on the channel.
    let consumer = channel
        .basic_consume(name, "".into(), manual_acks, FieldTable::default())
        .await
        .map_err(failed)?;
    let mut held = Held::new(queue);
    let consumed =
        Consuming { inbox, channel, queue, held: &mut held }.run(consumer, shutdown).await;
    held.release().await;
    consumed
}

/// One consumer of a queue, while it runs.
struct Consuming<'a, S> {
    inbox: &'a Inbox<S>,
    channel: &'a Channel,
    queue: &'a str,
    held: &'a mut Held,
}

impl<S: Clone + Send + Sync + 'static> Consuming<'_, S> {
    async fn run(
        mut self,
        mut consumer: Consumer,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), ConsumeError> {
        // Fused: once it completed, it is pending for good and never polled again.
        let mut shutdown = std::pin::pin!(shutdown.fuse());
        let mut stopping = false;
        let mut retry = FIRST_RETRY;
        loop {
            let next = tokio::select! {
                biased;
                () = &mut shutdown => {
                    self.stop(&consumer).await?;
                    stopping = true;
                    continue;
                }
                next = consumer.next() => next,
            };
            let delivery = match next {
                Some(Ok(delivery)) => delivery,
                Some(Err(source)) => {
                    return Err(ConsumeError::Channel { queue: self.queue.to_owned(), source });
                }
                // The end of the deliveries the broker sent before it took our cancellation.
                None if stopping => return Ok(()),
                None => return Err(self.ended()),
            };
            match self.handle(&delivery).await {
                Ok(()) => retry = FIRST_RETRY,
                Err(error) => {
                    tracing::warn!(
                        error = %ErrorChain(&error),
                        consumer = self.inbox.consumer(),
                        queue = self.queue,
                        retry_in = ?retry,
                        "inbox database failed; the message goes back to the queue after the \
                         pause, and consuming pauses until the database answers"
                    );
                    if !stopping {
                        tokio::select! {
                            biased;
                            () = &mut shutdown => {
                                self.stop(&consumer).await?;
                                stopping = true;
                            }
                            () = tokio::time::sleep(retry) => {}
                        }
                    }
                    tell(&delivery, Answer::GiveBack, self.queue).await;
                    retry = (retry * 2).min(MOST_RETRY);
                }
            }
        }
    }

    /// Cancels the consumer: the broker sends nothing more, and the stream ends after the
    /// deliveries it sent before.
    async fn stop(&self, consumer: &Consumer) -> Result<(), ConsumeError> {
        self.channel
            .basic_cancel(consumer.tag(), BasicCancelOptions::default())
            .await
            .map_err(|source| ConsumeError::Channel { queue: self.queue.to_owned(), source })
    }

    /// Why the deliveries ended though nobody here cancelled the consumer: the broker cancelled
    /// it, or the channel was closed (the stream ends without an error when this application
    /// closes it).
    fn ended(&self) -> ConsumeError {
        let queue = self.queue.to_owned();
        if self.channel.status().connected() {
            return ConsumeError::Cancelled { queue };
        }
        let closed = ErrorKind::InvalidChannelState(
            ChannelState::Closed,
            "the channel was closed while it consumed",
        );
        ConsumeError::Channel { queue, source: closed.into() }
    }

    /// Handles one message and tells the broker (or holds it for its retry); `Err` only when
    /// the database failed, and then the message is not answered yet.
    async fn handle(&mut self, delivery: &Delivery) -> Result<(), InboxError> {
        let headers = headers(&delivery.properties);
        let named = headers.iter().map(|(name, value)| (*name, value.as_ref()));
        let inbound = match InboundMessage::from_headers(named, &delivery.data) {
            Ok(inbound) => inbound,
            Err(invalid) => {
                tracing::error!(
                    error = %ErrorChain(&invalid),
                    consumer = self.inbox.consumer(),
                    queue = self.queue,
                    exchange = %delivery.exchange,
                    routing_key = %delivery.routing_key,
                    message_id = ?delivery.properties.message_id().as_ref().map(ShortString::as_str),
                    "RabbitMQ message rejected: it is not an outbox message and can never be \
                     handled; the queue's dead-letter exchange gets it if the queue has one \
                     (look at it there and fix its publisher), else the broker drops it"
                );
                tell(delivery, Answer::Reject, self.queue).await;
                return Ok(());
            }
        };
        match self.inbox.receive(&inbound).await? {
            Received::Failed { retry_in: delay, .. } | Received::Snoozed { delay } => {
                self.held.give_back_after(delivery, delay);
            }
            _ => tell(delivery, Answer::Ack, self.queue).await,
        }
        Ok(())
    }
}

/// Messages waiting for their retry's delay, each on a timer task of its own: unacknowledged
/// until then, so that the broker neither redelivers them nor sends them to another consumer.
struct Held {
    queue: Arc<str>,
    timers: JoinSet<()>,
    /// Set to `true` to end every delay now.
    release: watch::Sender<bool>,
}

impl Held {
    fn new(queue: &str) -> Self {
        Held { queue: queue.into(), timers: JoinSet::new(), release: watch::Sender::new(false) }
    }

    /// Requeues `delivery` after `delay` (at most [`MOST_HELD`]), or at [`Held::release`].
    fn give_back_after(&mut self, delivery: &Delivery, delay: Duration) {
        while self.timers.try_join_next().is_some() {}
        let (acker, tag, queue) =
            (delivery.acker.clone(), delivery.delivery_tag, self.queue.clone());
        let mut released = self.release.subscribe();
        self.timers.spawn(async move {
            tokio::select! {
                () = tokio::time::sleep(delay.min(MOST_HELD)) => {}
                _ = released.wait_for(|now| *now) => {}
            }
            answer(&acker, tag, Answer::GiveBack, &queue).await;
        });
    }

    /// Requeues every message still waiting, now.
    async fn release(&mut self) {
        self.release.send_replace(true);
        while self.timers.join_next().await.is_some() {}
    }
}

/// What to tell the broker about a message.
#[derive(Clone, Copy)]
enum Answer {
    /// `basic.ack`: done with, remove it.
    Ack,
    /// `basic.nack` with `requeue`: deliver it again.
    GiveBack,
    /// `basic.reject` without `requeue`: to the queue's dead-letter exchange, or dropped.
    Reject,
}

async fn tell(delivery: &Delivery, what: Answer, queue: &str) {
    answer(&delivery.acker, delivery.delivery_tag, what, queue).await;
}

/// Answers for one message. A lost answer only means the broker delivers the message again
/// once the channel closes, and the inbox finds it handled; `Ok(false)` (the channel already
/// closed) means the same, and [`consume`] returns the channel's error.
async fn answer(acker: &Acker, delivery_tag: u64, what: Answer, queue: &str) {
    let answered = match what {
        Answer::Ack => acker.ack(BasicAckOptions { multiple: false }).await,
        Answer::GiveBack => acker.nack(BasicNackOptions { multiple: false, requeue: true }).await,
        Answer::Reject => acker.reject(BasicRejectOptions { requeue: false }).await,
    };
    let Err(error) = answered else { return };
    let error = ErrorChain(&error);
    match what {
        Answer::Ack => tracing::warn!(
            %error,
            queue,
            delivery_tag,
            "cannot acknowledge a RabbitMQ message; the broker delivers it again once the \
             channel closes, and the inbox finds it handled"
        ),
        Answer::GiveBack => tracing::warn!(
            %error,
            queue,
            delivery_tag,
            "cannot give a RabbitMQ message back to its queue; the broker delivers it again \
             once the channel closes"
        ),
        Answer::Reject => tracing::warn!(
            %error,
            queue,
            delivery_tag,
            "cannot reject a RabbitMQ message; the broker delivers it again once the channel \
             closes, and it is rejected again"
        ),
    }
}

/// A message's headers as text: strings as they are (long strings read as UTF-8, lossily),
/// integers in decimal. Others (tables and arrays, such as the `x-death` that dead-lettering
/// adds, booleans, floats, timestamps, bytes) are left out: the outbox's headers are strings.
fn headers(properties: &BasicProperties) -> Vec<(&str, Cow<'_, str>)> {
    let Some(table) = properties.headers() else {
        return Vec::new();
    };
    table.inner().iter().filter_map(|(name, value)| Some((name.as_str(), text(value)?))).collect()
}

/// A header's value as text, if it is a string or an integer.
fn text(value: &AMQPValue) -> Option<Cow<'_, str>> {
    Some(match value {
        AMQPValue::LongString(text) => String::from_utf8_lossy(text.as_bytes()),
        AMQPValue::ShortString(text) => Cow::Borrowed(text.as_str()),
        AMQPValue::ShortShortInt(n) => n.to_string().into(),
        AMQPValue::ShortShortUInt(n) => n.to_string().into(),
        AMQPValue::ShortInt(n) => n.to_string().into(),
        AMQPValue::ShortUInt(n) => n.to_string().into(),
        AMQPValue::LongInt(n) => n.to_string().into(),
        AMQPValue::LongUInt(n) => n.to_string().into(),
        AMQPValue::LongLongInt(n) => n.to_string().into(),
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use lapin::types::{FieldArray, LongString};

    fn properties(headers: &[(&str, AMQPValue)]) -> BasicProperties {
        let mut table = FieldTable::default();
        for (name, value) in headers {
            table.insert((*name).into(), value.clone());
        }
        BasicProperties::default().with_headers(table)
    }

    #[test]
    fn strings_and_integers_are_read_as_text_and_the_rest_left_out() {
        let properties = properties(&[
            ("outbox-event-id", AMQPValue::LongString("0193a5a8".into())),
            ("outbox-event-type", AMQPValue::ShortString("order.placed".into())),
            ("outbox-event-version", AMQPValue::LongInt(2)),
            ("x-delivery-count", AMQPValue::LongLongInt(3)),
            ("bytes", AMQPValue::LongString(LongString::from(vec![b'a', 0xff]))),
            ("x-death", AMQPValue::FieldArray(FieldArray::from(vec![AMQPValue::Boolean(true)]))),
            ("flag", AMQPValue::Boolean(true)),
        ]);
        let mut read: Vec<(&str, String)> =
            headers(&properties).into_iter().map(|(n, v)| (n, v.into_owned())).collect();
        read.sort();
        assert_eq!(
            read,
            [
                ("bytes", "a\u{fffd}".to_owned()),
                ("outbox-event-id", "0193a5a8".to_owned()),
                ("outbox-event-type", "order.placed".to_owned()),
                ("outbox-event-version", "2".to_owned()),
                ("x-delivery-count", "3".to_owned()),
            ]
        );
    }

    #[test]
    fn a_message_without_headers_has_none() {
        assert!(headers(&BasicProperties::default()).is_empty());
    }
}
