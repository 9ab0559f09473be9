//! Transactional outbox for sqlx + PostgreSQL.
#![warn(missing_docs)]

pub mod dead_letters;
mod emit;
mod error;
mod event;
mod json;
mod migrate;
mod relay;
mod retention;
mod stats;
mod store;

pub use emit::{emit, emit_all, emit_all_with, emit_with, EmitOptions};
pub use error::{BoxError, Error, InvalidEvent};
pub use event::OutboxEvent;
pub use migrate::{migrate, with_outbox_migrations};
pub use relay::{
    Backoff, BuildError, DeadOrderedEvents, EventContext, Handler, HandlerContext, Relay,
    RelayBuilder, RelayCounts, RelayMetrics, TransactionContext, UnknownEvents,
};
pub use retention::purge_published;
pub use stats::{stats, stats_by_type, OutboxStats, TypeStats};

/// Derives [`OutboxEvent`] for a serde struct; see the trait for the attributes.
pub use outbox_macros::OutboxEvent;

/// The sqlx this crate is built on (0.8), for callers who want to be sure their transaction
/// type is the one `emit` takes.
pub use sqlx;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;
