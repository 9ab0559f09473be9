//! Items the derive's generated code names. Not public API: exempt from semver, and only
//! guaranteed to match an `outbox-macros` of exactly the same version (the workspace pins it).

pub use serde;

/// Turns the `#[outbox(id)]` field into the stored aggregate id. A named function rather than
/// `ToString::to_string` so a non-`Display` id type fails with the bound spelled out here.
#[inline]
pub fn aggregate_id<T: ?Sized + core::fmt::Display>(id: &T) -> String {
    id.to_string()
}

/// The relay's default lease statement, for the test that checks its plan ignores published
/// history. Parameters: `$1` limit, `$2` token, `$3` lease micros, `$4` max attempts, `$5` skip
/// dead ordered, `$6`/`$7` handled aggregate and event types.
pub const LEASE_SQL: &str = crate::store::LEASE_HANDLED;
