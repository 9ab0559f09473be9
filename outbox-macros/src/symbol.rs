//! Attribute key names, in one place.

/// The attribute every key lives under: `#[outbox(...)]`.
pub const OUTBOX: &str = "outbox";

/// Container key: the aggregate type.
pub const AGGREGATE: &str = "aggregate";
/// Container key: the event type.
pub const EVENT_TYPE: &str = "event_type";
/// Container key: the path of the runtime crate.
pub const CRATE: &str = "crate";
/// Container key, a flag: events of one aggregate are delivered in emit order.
pub const ORDERED: &str = "ordered";
/// Field key: marks the aggregate id field.
pub const ID: &str = "id";

/// Keys accepted in `#[outbox(...)]` on the struct.
pub const CONTAINER_KEYS: &[&str] = &[AGGREGATE, EVENT_TYPE, CRATE, ORDERED];
/// Keys accepted in `#[outbox(...)]` on a field.
pub const FIELD_KEYS: &[&str] = &[ID];
