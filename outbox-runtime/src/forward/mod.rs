//! Forwarding: a relay that publishes events to a message broker instead of (or beside) calling
//! in-process handlers, with everything the relay guarantees: leases and fencing, retries with
//! backoff, dead letters, per-aggregate ordering, graceful shutdown, metrics.
//!
//! A row is marked published only after the broker confirmed its message (a [`Sink`] reports
//! one outcome per message). Every sink maps a row to a message the same way:
//!
//! | message | from the row |
//! |---|---|
//! | destination (NATS subject, routing key, stream key, Kafka topic) | [`Forward::destination`] template, default `{event_type}` |
//! | message id (NATS `Nats-Msg-Id`, for the broker's deduplication; AMQP `message_id`; Redis field `id`) | `event_id` |
//! | partition / ordering key (the Kafka record key) | `aggregate_id` |
//! | headers `outbox-event-id`, `outbox-event-type`, `outbox-aggregate-type`, `outbox-aggregate-id`, `outbox-created-at` (RFC 3339), `outbox-event-version` | the row's columns |
//! | the emit headers, `traceparent` among them | `headers`, strings as they are, other JSON values as JSON text |
//! | content type | `application/json` |
//! | payload | the stored JSON, as `jsonb` prints it |
//!
//! With [`Forward::cloudevents`], the row's own headers take CloudEvents binary-mode names
//! instead (`ce-id`, `ce-type`, `ce-source` = `/{aggregate_type}`, `ce-subject`, `ce-time`,
//! `ce-specversion` = `1.0`, and the extension `ce-eventversion`), so consumers with a
//! CloudEvents SDK read them as they are.
//!
//! The payload is forwarded as stored, at the version it was written: a forwarding relay does
//! not upcast, and consumers read the version from its header.

mod health;
#[cfg(feature = "kafka")]
pub mod kafka;
#[cfg(feature = "nats")]
pub mod nats;
#[cfg(feature = "rabbitmq")]
pub mod rabbitmq;
#[cfg(feature = "redis")]
pub mod redis;
mod route;

use std::fmt;
use std::sync::Arc;

use futures_util::future::BoxFuture;
use uuid::Uuid;

pub use health::SinkStatus;
pub(crate) use health::{probe, SinkHealth};
pub(crate) use route::{ForwardRoute, Forwarded};

/// Longest the relay waits for a sink to confirm a batch: past it, the batch's outcome is
/// unknown, the sink is taken as unavailable and the messages are sent again once it answers.
pub const CONFIRM_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// One message for a broker, mapped from an outbox row (see the [module docs](self)).
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct OutboundMessage {
    /// Where it goes: a NATS subject, a routing key, a stream key.
    pub destination: String,
    /// The event id: the broker's deduplication key where it has one.
    pub id: Uuid,
    /// The aggregate id: the partition or ordering key.
    pub key: String,
    /// Headers, in order.
    pub headers: Vec<(String, String)>,
    /// Always `application/json`.
    pub content_type: &'static str,
    /// The payload as stored.
    pub payload: Vec<u8>,
}

impl OutboundMessage {
    /// A message without headers, as a test of a custom [`Sink`] makes one (the relay maps rows
    /// itself); add headers with [`header`](Self::header).
    ///
    /// ```
    /// use outbox_runtime::forward::OutboundMessage;
    /// use uuid::Uuid;
    ///
    /// let id = Uuid::now_v7();
    /// let message = OutboundMessage::new("order.placed", id, "order-7", br#"{"order_id":7}"#.to_vec())
    ///     .header("outbox-event-id", id.to_string());
    /// assert_eq!(message.headers, [("outbox-event-id".to_owned(), id.to_string())]);
    /// assert_eq!(message.content_type, "application/json");
    /// ```
    pub fn new(
        destination: impl Into<String>,
        id: Uuid,
        key: impl Into<String>,
        payload: impl Into<Vec<u8>>,
    ) -> Self {
        OutboundMessage {
            destination: destination.into(),
            id,
            key: key.into(),
            headers: Vec::new(),
            content_type: "application/json",
            payload: payload.into(),
        }
    }

    /// Adds a header after those it has.
    pub fn header(mut self, name: impl Into<String>, value: impl Into<String>) -> Self {
        self.headers.push((name.into(), value.into()));
        self
    }
}

/// Why a broker did not take a message (or a sink cannot start), and whose fault it is.
///
/// The [`kind`](SinkError::kind) decides what the relay does: a message the broker
/// [refused](SinkErrorKind::Refused) is a failed delivery attempt, retried with backoff until
/// the event's attempts run out; a broker that was [unavailable](SinkErrorKind::Unavailable)
/// costs the event nothing: the row goes back to pending with no attempt counted, and the relay
/// stops leasing for the sink until its [check](Sink::check) passes again.
#[derive(Debug, thiserror::Error)]
#[error("{destination}: {reason}")]
pub struct SinkError {
    /// The message's destination, or what the sink checked at start.
    pub destination: String,
    /// What went wrong, in the broker's words.
    pub reason: String,
    kind: SinkErrorKind,
}

/// Whose fault a [`SinkError`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum SinkErrorKind {
    /// The broker refused this message (unroutable, too large, no stream covers its subject, a
    /// key of another type, rejected): a failed attempt of the event.
    Refused,
    /// The broker could not be reached, the connection was lost, or no confirmation came in
    /// time, so the message may or may not have arrived: not the event's fault. It is sent again
    /// under the same message id once the broker answers.
    Unavailable,
}

impl SinkError {
    /// The broker refused the message for `destination`: a failed attempt of its event.
    pub fn refused(destination: impl Into<String>, reason: impl fmt::Display) -> Self {
        SinkError::with_kind(SinkErrorKind::Refused, destination, reason)
    }

    /// The broker was unavailable for `destination` (unreachable, connection lost, no
    /// confirmation in time): the event waits, no attempt counted.
    pub fn unavailable(destination: impl Into<String>, reason: impl fmt::Display) -> Self {
        SinkError::with_kind(SinkErrorKind::Unavailable, destination, reason)
    }

    fn with_kind(
        kind: SinkErrorKind,
        destination: impl Into<String>,
        reason: impl fmt::Display,
    ) -> Self {
        SinkError { destination: destination.into(), reason: reason.to_string(), kind }
    }

    /// Whose fault it is.
    pub fn kind(&self) -> SinkErrorKind {
        self.kind
    }
}

/// A message broker a relay forwards to. Implementations send a batch at once (sending every
/// message before awaiting any confirmation) and report one outcome per message, in order.
pub trait Sink: Send + Sync + 'static {
    /// Checks that the broker is reachable and set up to take the relay's messages (a stream
    /// or exchange exists). At start, a failed check stops the relay with an error, so a
    /// misconfigured sink does not fail every delivery; while the sink is unavailable, the relay
    /// calls it with backoff and resumes delivering once it passes.
    fn check(&self) -> BoxFuture<'_, Result<(), SinkError>>;

    /// Sends `batch`; resolves once the broker confirmed (or refused) each message. (The row is
    /// then marked published: in this crate "publish" is that acknowledgement, `published_at`.) An
    /// outcome the sink cannot know (sent, never confirmed) is [`SinkErrorKind::Unavailable`].
    /// The relay gives a batch [`CONFIRM_TIMEOUT`] and takes a batch still unconfirmed then as
    /// unavailable.
    fn send<'a>(
        &'a self,
        batch: &'a [OutboundMessage],
    ) -> BoxFuture<'a, Vec<Result<(), SinkError>>>;
}

/// How a relay forwards: to which sink, which event types, under which destinations.
/// Register it with [`RelayBuilder::forward`](crate::RelayBuilder::forward).
#[derive(Clone)]
pub struct Forward {
    pub(crate) sink: Arc<dyn Sink>,
    /// Or what is wrong with it (a placeholder no row field fills), for the relay's `build`.
    pub(crate) destination: Result<Template, String>,
    pub(crate) cloudevents: bool,
    /// `None`: every event type no handler takes.
    pub(crate) event_types: Option<Vec<(String, String)>>,
}

impl Forward {
    /// Forwards every event type that no handler of the relay takes.
    pub fn to(sink: impl Sink) -> Self {
        Forward {
            sink: Arc::new(sink),
            destination: Template::destination(DEFAULT_DESTINATION),
            cloudevents: false,
            event_types: None,
        }
    }

    /// The destination template: `{aggregate_type}`, `{event_type}` and `{aggregate_id}` are
    /// replaced by the row's values; any other `{...}` makes the relay's `build` fail
    /// ([`BuildError::InvalidDestination`](crate::BuildError::InvalidDestination)). Default
    /// `{event_type}` (event types are namespaced by their aggregate already, as in
    /// `order.placed`).
    pub fn destination(mut self, template: &str) -> Self {
        self.destination = Template::destination(template);
        self
    }

    /// Forwards only these `(aggregate_type, event_type)` pairs; the others stay pending for
    /// another relay.
    pub fn only<A: Into<String>, E: Into<String>>(
        mut self,
        types: impl IntoIterator<Item = (A, E)>,
    ) -> Self {
        self.event_types = Some(types.into_iter().map(|(a, e)| (a.into(), e.into())).collect());
        self
    }

    /// Names the row's own headers as CloudEvents binary mode does (`ce-id`, `ce-type`, ...).
    pub fn cloudevents(mut self, on: bool) -> Self {
        self.cloudevents = on;
        self
    }
}

/// Where a message goes unless [`Forward::destination`] says otherwise.
pub const DEFAULT_DESTINATION: &str = "{event_type}";

/// A destination template, parsed once.
#[derive(Debug, Clone)]
pub(crate) struct Template(Vec<Part>);

#[derive(Debug, Clone)]
enum Part {
    Text(String),
    AggregateType,
    EventType,
    AggregateId,
}

impl Template {
    /// [`parse`](Self::parse), with what a [`BuildError`](crate::BuildError) says of a bad one.
    fn destination(template: &str) -> Result<Self, String> {
        Template::parse(template).map_err(|placeholder| format!("`{placeholder}` in `{template}`"))
    }

    /// The template's parts, or the first `{...}` that names no row field (an opening brace
    /// without a closing one is text).
    fn parse(template: &str) -> Result<Self, String> {
        let mut parts = Vec::new();
        let mut rest = template;
        while let Some(start) = rest.find('{') {
            let (text, tail) = rest.split_at(start);
            let Some(end) = tail.find('}') else { break };
            let part = match &tail[1..end] {
                "aggregate_type" => Part::AggregateType,
                "event_type" => Part::EventType,
                "aggregate_id" => Part::AggregateId,
                _ => return Err(tail[..=end].to_owned()),
            };
            parts.push(Part::Text(text.to_owned()));
            parts.push(part);
            rest = &tail[end + 1..];
        }
        parts.push(Part::Text(rest.to_owned()));
        Ok(Template(parts))
    }

    pub(crate) fn render(
        &self,
        aggregate_type: &str,
        event_type: &str,
        aggregate_id: &str,
    ) -> String {
        self.0
            .iter()
            .map(|part| match part {
                Part::Text(text) => text.as_str(),
                Part::AggregateType => aggregate_type,
                Part::EventType => event_type,
                Part::AggregateId => aggregate_id,
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_replace_the_row_fields_and_keep_other_text() {
        let template = Template::parse("outbox.{aggregate_type}.{event_type}.{aggregate_id}");
        let rendered = template.unwrap().render("order", "order.placed", "7");
        assert_eq!(rendered, "outbox.order.order.placed.7");
        let open = Template::parse("{event_type}.{").unwrap();
        assert_eq!(open.render("order", "order.placed", "7"), "order.placed.{");
        let default = Template::parse(DEFAULT_DESTINATION).unwrap();
        assert_eq!(default.render("order", "order.placed", "7"), "order.placed");
    }

    #[test]
    fn a_placeholder_no_field_fills_is_refused() {
        assert_eq!(Template::parse("{aggregate}.{event_type}").unwrap_err(), "{aggregate}");
        assert_eq!(Template::parse("events.{}").unwrap_err(), "{}");
    }
}
