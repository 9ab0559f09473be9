//! The [`OutboxEvent`] trait: what makes a Rust type an outbox event.

use serde::de::DeserializeOwned;
use serde::Serialize;

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
/// - `ordered` (optional flag): events of one aggregate are delivered one at a time, in the
///   order they were emitted (see [`ORDERED`](OutboxEvent::ORDERED)).
/// - `crate = "..."` (optional): the path of this crate when it is renamed in `Cargo.toml`.
///
/// Both names follow one grammar: a lowercase ASCII letter, then lowercase letters, digits,
/// `_`, `.` and `-` (for example `order`, `order.placed`, `billing-v2.invoice_paid`).
///
/// Exactly one named field carries `#[outbox(id)]`: the aggregate id, stored as text through its
/// `Display` implementation (`Uuid`, integers, `String` and newtypes that display all work).
/// Only structs with named fields derive `OutboxEvent`; generic structs do, with the derive
/// requiring `Serialize + DeserializeOwned` of the concrete type.
#[diagnostic::on_unimplemented(
    message = "`{Self}` is not an outbox event",
    label = "not an outbox event",
    note = "derive it: `#[derive(Serialize, Deserialize, OutboxEvent)]` with \
            `#[outbox(aggregate = \"...\", event_type = \"...\")]` and an `#[outbox(id)]` field"
)]
pub trait OutboxEvent: Serialize + DeserializeOwned {
    /// The aggregate type, stored in the `aggregate_type` column.
    const AGGREGATE_TYPE: &'static str;
    /// The event type, stored in the `event_type` column.
    const EVENT_TYPE: &'static str;

    /// Whether events of this type are delivered in order per aggregate: an event is handed to
    /// its handler only once every ordered event emitted before it for the same aggregate (same
    /// aggregate type and id) is published, across all relays, retries and lease expiries.
    ///
    /// To make that order gap-free, emitting an ordered event takes a transaction-scoped lock on
    /// its aggregate: a transaction emitting for an aggregate waits until any other transaction
    /// that emitted for it ends, as it would if both updated the aggregate's row. Emit order is
    /// therefore commit order, and no earlier event of the aggregate can appear after a later
    /// one is visible. Unordered types take no lock and are delivered in parallel.
    const ORDERED: bool = false;

    /// The id of the aggregate this event belongs to, stored in the `aggregate_id` column.
    fn aggregate_id(&self) -> String;
}
