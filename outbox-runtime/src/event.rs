//! The [`OutboxEvent`] trait: what makes a Rust type an outbox event.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::decode::DecodeError;
use crate::error::InvalidEvent;

/// A typed outbox event: a serde type that knows its aggregate and event type.
///
/// Derive it rather than implementing it by hand; the derive checks the names at compile time:
///
/// ```
/// use outbox_runtime::OutboxEvent;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, OutboxEvent)]
/// #[outbox(aggregate = "order", event_type = "order.placed")]
/// struct OrderPlaced {
///     #[outbox(id)]
///     order_id: u64,
///     total_cents: i64,
/// }
///
/// let event = OrderPlaced { order_id: 7, total_cents: 1250 };
/// assert_eq!(OrderPlaced::AGGREGATE_TYPE, "order");
/// assert_eq!(OrderPlaced::EVENT_TYPE, "order.placed");
/// assert_eq!(event.aggregate_id(), "7");
/// ```
///
/// # Attributes
///
/// On the struct, `#[outbox(...)]` takes:
/// - `aggregate = "..."` (required): the kind of entity the event belongs to, stored as
///   `aggregate_type`.
/// - `event_type = "..."` (required): what happened, stored as `event_type`; together with the
///   aggregate it routes a stored event back to its handler.
/// - `version = N` (optional, default 1): the version of the payload's shape this struct
///   writes, stored in `event_version` (see [Evolving events](#evolving-events)).
/// - `upcast_from = Type` (optional): the struct that reads the previous version, exactly one
///   lower, which this type converts from with `From` or `TryFrom`.
/// - `ordered` (optional flag): events of one aggregate are delivered one at a time, in the
///   order they were emitted (see [`EventType::ordered`]).
/// - `crate = "..."` (optional): the path of this crate when it is renamed in `Cargo.toml`.
///
/// Both names follow one grammar: a lowercase ASCII letter, then lowercase letters, digits,
/// `_`, `.` and `-` (for example `order`, `order.placed`, `billing-v2.invoice_paid`).
///
/// Exactly one named field carries `#[outbox(id)]`: the aggregate id, stored as text through its
/// `Display` implementation (`Uuid`, integers, `String` and newtypes that display all work).
/// Structs with named fields derive `OutboxEvent`; generic structs do, with the derive
/// requiring `Serialize + DeserializeOwned` of the concrete type. On a struct the derive also
/// adds the inherent constants `EVENT_TYPE` and `VERSION`.
///
/// # Evolving events
///
/// A stored event outlives the code that wrote it. When a payload's shape changes, give the new
/// struct the next `version` and keep the old one, renamed, as its predecessor; write the
/// conversion with `From` (or `TryFrom`, when it can fail, which records a failed delivery
/// naming both versions):
///
/// ```
/// use outbox_runtime::OutboxEvent;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, OutboxEvent)]
/// #[outbox(aggregate = "order", event_type = "order.placed")]
/// struct OrderPlacedV1 { #[outbox(id)] order_id: u64, total: i64 }
///
/// #[derive(Serialize, Deserialize, OutboxEvent)]
/// #[outbox(aggregate = "order", event_type = "order.placed", version = 2, upcast_from = OrderPlacedV1)]
/// struct OrderPlaced { #[outbox(id)] order_id: u64, total_cents: i64 }
///
/// impl From<OrderPlacedV1> for OrderPlaced {
///     fn from(v1: OrderPlacedV1) -> Self {
///         OrderPlaced { order_id: v1.order_id, total_cents: v1.total }
///     }
/// }
///
/// assert_eq!(OrderPlaced::VERSION, 2);
/// assert_eq!(OrderPlaced::EVENT_TYPES[0].oldest_version(), 1);
/// ```
///
/// A handler of `OrderPlaced` then receives rows of both versions; versions whose structs are
/// gone are read with JSON upcasters ([`RelayBuilder::upcast_json`](crate::RelayBuilder::upcast_json)).
///
/// # Enum families
///
/// On an enum, the derive makes one type of several event types of one aggregate: each variant
/// names its event type and is either a newtype around an event struct or a struct variant with
/// an `#[outbox(id)]` field. A value is stored as its variant's event type, with the variant's
/// content as the payload, so a handler of the enum and a handler of one variant's struct read
/// the same rows.
///
/// ```
/// use outbox_runtime::OutboxEvent;
/// use serde::{Deserialize, Serialize};
///
/// #[derive(Serialize, Deserialize, OutboxEvent)]
/// #[outbox(aggregate = "order", event_type = "order.placed")]
/// struct OrderPlaced { #[outbox(id)] order_id: u64, total_cents: i64 }
///
/// #[derive(Serialize, Deserialize, OutboxEvent)]
/// #[outbox(aggregate = "order")]
/// enum OrderEvent {
///     #[outbox(event_type = "order.placed")]
///     Placed(OrderPlaced),
///     #[outbox(event_type = "order.cancelled", version = 2)]
///     Cancelled { #[outbox(id)] order_id: u64, reason: String },
/// }
///
/// let event = OrderEvent::Cancelled { order_id: 7, reason: "out of stock".into() };
/// assert_eq!(event.event_type().name(), "order.cancelled");
/// assert_eq!(event.aggregate_id(), "7");
/// assert_eq!(OrderEvent::EVENT_TYPES.len(), 2);
/// ```
///
/// The enum takes `aggregate`, `ordered` (for every variant; a newtype variant's struct must
/// agree) and `crate`; each variant takes `event_type` and, on a struct variant, `version`. The
/// enum keeps serde's default (externally tagged) representation.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an outbox event",
    label = "not an outbox event",
    note = "derive it: `#[derive(Serialize, Deserialize, OutboxEvent)]` with \
            `#[outbox(aggregate = \"...\", event_type = \"...\")]` and an `#[outbox(id)]` field"
)]
pub trait OutboxEvent: Serialize + DeserializeOwned {
    /// The aggregate type, stored in the `aggregate_type` column.
    const AGGREGATE_TYPE: &'static str;

    /// Every event type this Rust type writes and reads: a struct's one, or one per variant of
    /// an enum family, in declaration order.
    const EVENT_TYPES: &'static [EventType];

    /// The id of the aggregate this event belongs to, stored in the `aggregate_id` column.
    fn aggregate_id(&self) -> String;

    /// The event type this value is stored as: a struct's only one, an enum's variant's.
    fn event_type(&self) -> &'static EventType {
        &Self::EVENT_TYPES[0]
    }

    /// Whether the type is an enum family (its serde form wraps each variant's content).
    #[doc(hidden)]
    const __FAMILY: bool = false;

    /// The payload as stored: the value's JSON (an enum family's: its variant's content).
    #[doc(hidden)]
    fn __payload(&self) -> Result<String, InvalidEvent> {
        crate::json::to_json(self, "the payload")
    }

    /// Reads a stored payload of `event_type` written at `version`, upcasting older versions.
    #[doc(hidden)]
    fn __read(event_type: &str, version: u32, payload: &str) -> Result<Self, DecodeError> {
        crate::__private::read_plain(event_type, version, payload)
    }
}

/// One event type as a Rust type writes and reads it: name, version, ordering.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EventType {
    name: &'static str,
    version: u32,
    oldest_version: u32,
    ordered: bool,
}

impl EventType {
    /// An event type written at `version` and read from `oldest_version` up (through the
    /// `upcast_from` chain). Written by the derive; by hand only for a hand-written
    /// [`OutboxEvent`], where `oldest_version` is `version`.
    pub const fn new(name: &'static str, version: u32, oldest_version: u32, ordered: bool) -> Self {
        EventType { name, version, oldest_version, ordered }
    }

    /// The event type, stored in the `event_type` column.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// The version written, stored in the `event_version` column (1 unless declared).
    pub const fn version(&self) -> u32 {
        self.version
    }

    /// The oldest version the Rust type reads by itself, through its `upcast_from` chain.
    pub const fn oldest_version(&self) -> u32 {
        self.oldest_version
    }

    /// Whether events of this type are delivered in order per aggregate: an event is handed to
    /// its handler only once every ordered event emitted before it for the same aggregate (same
    /// aggregate type and id) is published, across all relays, retries and lease expiries.
    ///
    /// To make that order gap-free, emitting an ordered event takes a transaction-scoped lock on
    /// its aggregate: a transaction emitting for an aggregate waits until any other transaction
    /// that emitted for it ends, as it would if both updated the aggregate's row. Emit order is
    /// therefore commit order, and no earlier event of the aggregate can appear after a later
    /// one is visible. Unordered types take no lock and are delivered in parallel.
    pub const fn ordered(&self) -> bool {
        self.ordered
    }
}
