//! A message as it arrived from a broker, read from the headers a forwarding relay writes.

use chrono::{DateTime, Utc};
use uuid::Uuid;

/// The headers every forwarded message carries (see [`forward`](crate::forward)).
const EVENT_ID: &str = "outbox-event-id";
const EVENT_TYPE: &str = "outbox-event-type";
const AGGREGATE_TYPE: &str = "outbox-aggregate-type";
const AGGREGATE_ID: &str = "outbox-aggregate-id";
const EVENT_VERSION: &str = "outbox-event-version";
const CREATED_AT: &str = "outbox-created-at";

/// One message for the [`Inbox`](super::Inbox): the event's id, type and version from the
/// message's headers (as a forwarding relay writes them), the other headers, and the payload.
///
/// ```
/// use outbox_runtime::inbox::InboundMessage;
///
/// let headers = [
///     ("outbox-event-id", "0193a5a8-7f7b-7d4e-9b8e-2f1c3a9d5e01"),
///     ("outbox-event-type", "order.placed"),
///     ("outbox-aggregate-type", "order"),
///     ("outbox-aggregate-id", "7"),
///     ("outbox-event-version", "1"),
///     ("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"),
/// ];
/// let message = InboundMessage::from_headers(headers, br#"{"order_id":7}"#)?;
/// assert_eq!(message.event_type(), "order.placed");
/// assert_eq!(message.headers()["traceparent"], "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01");
/// # Ok::<(), outbox_runtime::inbox::InvalidMessage>(())
/// ```
#[derive(Debug, Clone, PartialEq)]
pub struct InboundMessage {
    pub(crate) event_id: Uuid,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) event_type: String,
    pub(crate) version: u32,
    pub(crate) created_at: Option<DateTime<Utc>>,
    /// Every other header, as a JSON object of strings.
    pub(crate) headers: serde_json::Value,
    pub(crate) payload: String,
}

/// A message that can never be handled: a header the inbox needs is missing or malformed.
/// Redelivering it cannot help; acknowledge (or terminate) it and log this error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "not an outbox message ({reason}): it needs the headers `outbox-event-id`, \
     `outbox-event-type`, `outbox-aggregate-type`, `outbox-aggregate-id` and \
     `outbox-event-version`, as a forwarding relay writes them; redelivering it cannot help"
)]
pub struct InvalidMessage {
    reason: String,
}

impl InboundMessage {
    /// Reads a message from its headers (name and value; names compared ignoring ASCII case, the
    /// first of a repeated name kept) and its payload, which must be UTF-8 JSON text to be
    /// handled (a payload that is not is kept as it decodes lossily, and fails its handler).
    pub fn from_headers<'h>(
        headers: impl IntoIterator<Item = (&'h str, &'h str)>,
        payload: &[u8],
    ) -> Result<Self, InvalidMessage> {
        let mut others = serde_json::Map::new();
        let mut known: [Option<&str>; 6] = [None; 6];
        let names = [EVENT_ID, EVENT_TYPE, AGGREGATE_TYPE, AGGREGATE_ID, EVENT_VERSION, CREATED_AT];
        for (name, value) in headers {
            match names.iter().position(|known| known.eq_ignore_ascii_case(name)) {
                Some(slot) => {
                    known[slot].get_or_insert(value);
                }
                None => {
                    others.entry(name).or_insert_with(|| value.into());
                }
            }
        }
        let [event_id, event_type, aggregate_type, aggregate_id, version, created_at] = known;
        fn required<'v>(value: Option<&'v str>, name: &str) -> Result<&'v str, InvalidMessage> {
            value.ok_or_else(|| InvalidMessage { reason: format!("no `{name}` header") })
        }
        let malformed = |name: &str, value: &str, why: String| InvalidMessage {
            reason: format!("`{name}` is `{value}`: {why}"),
        };
        let event_id = required(event_id, EVENT_ID)?;
        let event_id =
            Uuid::parse_str(event_id).map_err(|e| malformed(EVENT_ID, event_id, e.to_string()))?;
        let version = required(version, EVENT_VERSION)?;
        let version =
            version.parse::<u32>().ok().filter(|&v| v > 0 && i32::try_from(v).is_ok()).ok_or_else(
                || malformed(EVENT_VERSION, version, "not a positive integer".into()),
            )?;
        let created_at = created_at
            .map(|at| {
                DateTime::parse_from_rfc3339(at)
                    .map(|at| at.with_timezone(&Utc))
                    .map_err(|e| malformed(CREATED_AT, at, e.to_string()))
            })
            .transpose()?;
        Ok(InboundMessage {
            event_id,
            aggregate_type: required(aggregate_type, AGGREGATE_TYPE)?.to_owned(),
            aggregate_id: required(aggregate_id, AGGREGATE_ID)?.to_owned(),
            event_type: required(event_type, EVENT_TYPE)?.to_owned(),
            version,
            created_at,
            headers: serde_json::Value::Object(others),
            payload: String::from_utf8_lossy(payload).into_owned(),
        })
    }

    /// The event's id (`outbox-event-id`): what makes a redelivery a duplicate.
    pub fn event_id(&self) -> Uuid {
        self.event_id
    }

    /// The event type (`outbox-event-type`).
    pub fn event_type(&self) -> &str {
        &self.event_type
    }

    /// The aggregate type (`outbox-aggregate-type`).
    pub fn aggregate_type(&self) -> &str {
        &self.aggregate_type
    }

    /// The aggregate id (`outbox-aggregate-id`).
    pub fn aggregate_id(&self) -> &str {
        &self.aggregate_id
    }

    /// The version the payload was written at (`outbox-event-version`).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// When the event was emitted (`outbox-created-at`), if the message says.
    pub fn created_at(&self) -> Option<DateTime<Utc>> {
        self.created_at
    }

    /// The message's other headers (`traceparent` among them), a JSON object of strings.
    pub fn headers(&self) -> &serde_json::Value {
        &self.headers
    }

    /// The payload, as it arrived.
    pub fn payload(&self) -> &str {
        &self.payload
    }
}
