//! Transactional outbox for sqlx + PostgreSQL.
#![warn(missing_docs)]

mod event;

pub use event::OutboxEvent;
/// Derives [`OutboxEvent`] for a serde struct; see the trait for the attributes.
pub use outbox_macros::OutboxEvent;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;
