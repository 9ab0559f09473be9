//! Items the derive's generated code names. Not public API: exempt from semver, and only
//! guaranteed to match an `outbox-macros` of exactly the same version (the workspace pins it).

pub use serde;

/// Turns the `#[outbox(id)]` field into the stored aggregate id. A named function rather than
/// `ToString::to_string` so a non-`Display` id type fails with the bound spelled out here.
#[inline]
pub fn aggregate_id<T: ?Sized + core::fmt::Display>(id: &T) -> String {
    id.to_string()
}

/// The relay's statements and their steps, for this repository's tests (feature `test-hooks`).
#[cfg(feature = "test-hooks")]
#[path = "test_hooks.rs"]
pub mod test_hooks;
