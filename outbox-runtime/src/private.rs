//! Items the derive's generated code names. Not public API: exempt from semver, and only
//! guaranteed to match an `outbox-macros` of exactly the same version (the workspace pins it).

pub use serde;

pub use crate::decode::DecodeError;
pub use crate::error::InvalidEvent;
pub use crate::event::EventType;

use crate::error::BoxError;
use crate::event::OutboxEvent;

/// Turns the `#[outbox(id)]` field into the stored aggregate id. A named function rather than
/// `ToString::to_string` so a non-`Display` id type fails with the bound spelled out here.
#[inline]
pub fn aggregate_id<T: ?Sized + core::fmt::Display>(id: &T) -> String {
    id.to_string()
}

/// Decodes a payload written at the type's own version.
#[inline]
pub fn decode<T: serde::de::DeserializeOwned>(payload: &str) -> Result<T, DecodeError> {
    crate::decode::decode(payload)
}

/// Decodes the payload of an enum family's struct variant number `index` (serde's numbering).
#[inline]
pub fn decode_variant<T: serde::de::DeserializeOwned>(
    index: u32,
    payload: &str,
) -> Result<T, DecodeError> {
    crate::decode::decode_variant(index, payload)
}

/// `OutboxEvent::__read` of a type without predecessors.
#[inline]
pub fn read_plain<E: OutboxEvent>(
    event_type: &str,
    version: u32,
    payload: &str,
) -> Result<E, DecodeError> {
    crate::decode::read_plain(event_type, version, payload)
}

/// Converts a predecessor's value into its successor's; a failure names both versions.
#[inline]
pub fn upcast<P, E>(previous: P) -> Result<E, DecodeError>
where
    P: OutboxEvent,
    E: OutboxEvent + TryFrom<P>,
    E::Error: Into<BoxError>,
{
    crate::decode::upcast(previous)
}

/// Compiles only if `E` converts from its predecessor `P`. The derive calls it at the
/// `upcast_from` path, so a missing conversion is reported there.
#[inline]
pub fn assert_upcast<P, E>()
where
    E: TryFrom<P>,
    E::Error: Into<BoxError>,
{
}

/// The error for a stored version `E` does not read.
#[inline]
pub fn unknown_version<E: OutboxEvent>(event_type: &str, version: u32) -> DecodeError {
    crate::decode::unknown_version::<E>(event_type, version)
}

/// The error for an event type `E` does not have.
#[inline]
pub fn unknown_event_type<E>(event_type: &str) -> DecodeError {
    crate::decode::unknown_event_type::<E>(event_type)
}

/// The payload of an enum family's struct variant: the variant's content, without serde's tag.
#[inline]
pub fn variant_payload<T: serde::Serialize>(value: &T) -> Result<String, InvalidEvent> {
    crate::json::untagged(value)
}

/// `a == b`, in a constant (the derive's checks between versions and variants).
pub const fn str_eq(a: &str, b: &str) -> bool {
    let (a, b) = (a.as_bytes(), b.as_bytes());
    if a.len() != b.len() {
        return false;
    }
    let mut i = 0;
    while i < a.len() {
        if a[i] != b[i] {
            return false;
        }
        i += 1;
    }
    true
}

/// The relay's statements and their steps, for this repository's tests (feature `test-hooks`).
#[cfg(feature = "test-hooks")]
#[path = "test_hooks.rs"]
pub mod test_hooks;
