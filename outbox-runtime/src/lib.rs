//! Transactional outbox for sqlx + PostgreSQL.
//!
//! Write an event with [`emit`] in the same transaction as the state change it describes; a
//! [`Relay`] delivers committed events to typed handlers, at least once, retrying with backoff
//! and keeping the ones that exhaust their attempts as [`dead_letters`].
//!
//! # The reference design
//!
//! The table `outbox.events` keeps every column of the common outbox design this crate started
//! from, called *the reference design* in these docs: `event_id uuid`, `aggregate_type`,
//! `aggregate_id`, `event_type text`, `payload`, `headers jsonb`, `created_at`,
//! `available_at`, `published_at timestamptz`, `attempts int`, `last_error text`, with those
//! names and types, so operational SQL written for it keeps working. Its known weakness, that a
//! leased row becomes visible to other relays again once the lease statement commits (so two
//! relays deliver it), is what the relay's leases and fencing tokens fix.
#![warn(missing_docs)]

pub mod dead_letters;
mod emit;
mod error;
mod event;
pub mod forward;
mod json;
mod migrate;
mod otel;
mod relay;
mod retention;
#[cfg(feature = "schemars")]
mod schema;
mod stats;
mod store;
#[cfg(feature = "testing")]
pub mod testing;

pub use emit::{emit, emit_all, emit_all_with, emit_with, EmitOptions};
pub use error::{BoxError, Error, InvalidEvent};
pub use event::{EventType, OutboxEvent};
pub use migrate::{migrate, with_outbox_migrations};
pub use relay::{
    Backoff, BuildError, DeadOrderedEvents, EventContext, Handler, HandlerContext, NewerVersions,
    Relay, RelayBuilder, RelayCounts, RelayMetrics, TransactionContext, UnknownEvents,
};
pub use retention::purge_published;
#[cfg(feature = "schemars")]
pub use schema::{event_schemas, EventSchema};
pub use stats::{stats, stats_by_type, OutboxStats, TypeStats};

/// Derives [`OutboxEvent`] for a serde struct; see the trait for the attributes.
pub use outbox_macros::OutboxEvent;

/// The sqlx this crate is built on (0.8), for callers who want to be sure their transaction
/// type is the one `emit` takes.
pub use sqlx;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;
