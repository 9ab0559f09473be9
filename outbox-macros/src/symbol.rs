//! Attribute key names, in one place.

/// The attribute every key lives under: `#[outbox(...)]`.
pub const OUTBOX: &str = "outbox";

/// Struct and enum key: the aggregate type.
pub const AGGREGATE: &str = "aggregate";
/// Struct and variant key: the event type.
pub const EVENT_TYPE: &str = "event_type";
/// Struct and struct-variant key: the version of the payload's shape.
pub const VERSION: &str = "version";
/// Struct key: the struct that reads the previous version.
pub const UPCAST_FROM: &str = "upcast_from";
/// Struct and enum key, a flag: events of one aggregate are delivered in emit order.
pub const ORDERED: &str = "ordered";
/// Struct and enum key: the path of the runtime crate.
pub const CRATE: &str = "crate";
/// Field key: marks the aggregate id field.
pub const ID: &str = "id";

/// Keys accepted in `#[outbox(...)]` on a struct.
pub const CONTAINER_KEYS: &[&str] = &[AGGREGATE, EVENT_TYPE, VERSION, UPCAST_FROM, ORDERED, CRATE];
/// Keys accepted in `#[outbox(...)]` on an enum (an event family): what all variants share.
pub const ENUM_KEYS: &[&str] = &[AGGREGATE, ORDERED, CRATE];
/// Keys accepted in `#[outbox(...)]` on a variant of an event family. `upcast_from` is not
/// one of them, but it is read there to explain what to do instead.
pub const VARIANT_KEYS: &[&str] = &[EVENT_TYPE, VERSION];
/// Keys accepted in `#[outbox(...)]` on a field.
pub const FIELD_KEYS: &[&str] = &[ID];

/// The serde attribute, whose enum and variant keys an event family depends on.
pub const SERDE: &str = "serde";
