//! Transactional outbox for sqlx + PostgreSQL.
//!
//! Write an event with [`emit`] in the same transaction as the state change it describes; a
//! [`Relay`] delivers committed events to typed handlers, at least once, retrying with backoff
//! and keeping the ones that exhaust their attempts as [`dead_letters`].
//!
//! # Quickstart
//!
//! ```no_run
//! use outbox_runtime::{EventContext, OutboxEvent, Relay};
//! use serde::{Deserialize, Serialize};
//!
//! /// An event: a serde type with its aggregate, event type and the field that is the aggregate id.
//! #[derive(Serialize, Deserialize, OutboxEvent)]
//! #[outbox(aggregate = "order", event_type = "order.placed")]
//! struct OrderPlaced {
//!     #[outbox(id)]
//!     order_id: i64,
//!     total_cents: i64,
//! }
//!
//! /// A handler: called at least once per event, retried with backoff while it fails.
//! async fn send_receipt(ctx: EventContext<()>, event: OrderPlaced) -> Result<(), std::io::Error> {
//!     println!("order {} placed (event {})", event.order_id, ctx.event_id());
//!     Ok(())
//! }
//!
//! # async fn run(pool: outbox_runtime::sqlx::PgPool) -> Result<(), Box<dyn std::error::Error>> {
//! outbox_runtime::migrate(&pool).await?;
//!
//! // The state change and its event commit together, or neither does.
//! let mut tx = pool.begin().await?;
//! outbox_runtime::sqlx::query("INSERT INTO orders (id, total_cents) VALUES (7, 4200)")
//!     .execute(&mut *tx)
//!     .await?;
//! outbox_runtime::emit(&mut tx, &OrderPlaced { order_id: 7, total_cents: 4200 }).await?;
//! tx.commit().await?;
//!
//! // The relay delivers committed events until the shutdown future completes.
//! let relay = Relay::builder(pool).handler(send_receipt).build()?;
//! relay.run_until(async { tokio::signal::ctrl_c().await.unwrap() }).await?;
//! # Ok(()) }
//! ```
//!
//! The README covers the rest: forwarding to brokers (the [`forward`] module), consuming what
//! another service forwarded exactly once (the [`inbox`]), ordering, transactional handlers,
//! event versions, operations and the CLI.
//!
//! # Subscribers
//!
//! One event, several independent side effects: register each as a named subscriber
//! ([`RelayBuilder::subscriber`]) instead of one handler. Each gets every event of its type once,
//! with its own attempts, backoff, dead letters and per-aggregate order: a subscriber that fails
//! is retried alone, and neither holds back nor repeats the others.
//!
//! ```no_run
//! # use outbox_runtime::{EventContext, OutboxEvent, Relay};
//! # use serde::{Deserialize, Serialize};
//! # #[derive(Serialize, Deserialize, OutboxEvent)]
//! # #[outbox(aggregate = "order", event_type = "order.placed")]
//! # struct OrderPlaced { #[outbox(id)] order_id: i64 }
//! # async fn send_receipt(_: EventContext, _: OrderPlaced) -> Result<(), std::io::Error> { Ok(()) }
//! # async fn index_order(_: EventContext, _: OrderPlaced) -> Result<(), std::io::Error> { Ok(()) }
//! # fn build(pool: outbox_runtime::sqlx::PgPool) -> Result<(), outbox_runtime::BuildError> {
//! let relay = Relay::builder(pool)
//!     .subscriber("receipts", send_receipt)
//!     .subscriber("search-index", index_order)
//!     .build()?;
//! # Ok(()) }
//! ```
//!
//! How: emitting is unchanged (nothing is written per subscriber). The relay that leases an
//! event calls its subscribers at once; the statement that acknowledges the event writes a
//! **copy** of it (a row with `subscriber` set) for each subscriber that still needs it: one that
//! failed or snoozed, one behind on the event's aggregate, one whose handler writes in the
//! acknowledgement's transaction, and one that other relays run. Relays lease, retry and kill
//! copies as any other row, so a dead copy is a dead letter for its subscriber alone
//! ([`dead_letters::DeadEvent::subscriber`]). A subscriber added later starts with the events
//! acknowledged after its relay first started; [`replay::replay_to`] gives it older ones, as long
//! as they are kept ([`RelayBuilder::retention`]). [`subscribers`] lists them and removes one.
//!
//! # Words
//!
//! The API, the CLI, the metrics and these docs use each word in one sense:
//!
//! - **Pending**: committed, neither published nor dead: due, leased, or waiting for a retry.
//! - **Lease**: a relay's hold on pending rows, under a fencing token, renewed while it lasts; it
//!   **expires** when its relay dies or stalls for a whole lease timeout.
//! - **Delivery**: one try at an event: calling its handler, or forwarding it to a broker
//!   ([`forward`]). **Delivered**: the handler returned `Ok`, or the broker confirmed the message.
//! - **Published**: what a delivered event's row becomes, whether handled or forwarded
//!   (`published_at` is set, or with `delete_on_publish` the row is deleted): the reference
//!   design's word.
//! - **Attempt**: a failed delivery. `attempts` counts them and `max_attempts` limits them;
//!   expired leases ([`EventContext::expired_leases`]) and [snoozes](Snooze) are not attempts.
//! - **Handed back**: a leased row returned to pending with no attempt counted (at shutdown,
//!   while a broker or the database is unavailable, or [snoozed](Snooze)).
//! - **Dead**: out of attempts or expired leases, or [rejected](Reject) by its handler; kept as a
//!   [dead letter](dead_letters) until requeued or discarded.
//! - **Subscriber**: one of several named handlers of an event type; its **copy** of an event is
//!   the row that carries the event to it alone (see [Subscribers](#subscribers)).
//!
//! # Cargo features
#![doc = document_features::document_features!()]
//!
//! The crate enables no TLS: it connects through the pool you give it, so your application's
//! sqlx features decide (`tls-rustls` or `tls-native-tls` for `sslmode=require` and up). The
//! forwarding sinks' broker clients (async-nats, lapin, redis) likewise speak TLS with the
//! features your application enables on them.
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
#![cfg_attr(docsrs, feature(doc_cfg))]

// The driver seam: the whole crate names `sqlx`, which is whichever version the features chose.
// Both versions accept every statement and type this crate uses, so there is one copy of the
// SQL and of the relay.
/// The sqlx this crate is built on (0.8, or 0.9 with the feature `sqlx-0-9`), for callers who
/// want to be sure their transaction type is the one `emit` takes.
#[cfg(all(feature = "sqlx-0-8", not(feature = "sqlx-0-9")))]
pub extern crate sqlx_0_8 as sqlx;
/// The sqlx this crate is built on (0.8, or 0.9 with the feature `sqlx-0-9`), for callers who
/// want to be sure their transaction type is the one `emit` takes.
#[cfg(feature = "sqlx-0-9")]
pub extern crate sqlx_0_9 as sqlx;
#[cfg(not(any(feature = "sqlx-0-8", feature = "sqlx-0-9")))]
compile_error!(
    "outbox-runtime needs a sqlx: enable the feature `sqlx-0-8` (default) or `sqlx-0-9`"
);

mod backend;
#[cfg(feature = "console")]
pub mod console;
pub mod dead_letters;
mod decode;
mod emit;
mod error;
mod event;
pub mod events;
pub mod forward;
pub mod inbox;
mod json;
#[cfg(feature = "schemars")]
mod json_schema;
mod migrate;
mod otel;
pub mod pauses;
mod relay;
pub mod relays;
pub mod replay;
mod retention;
mod serialize;
mod stats;
mod store;
pub mod subscribers;
#[cfg(feature = "testing")]
pub mod testing;

pub use backend::Backend;
pub use emit::{emit, emit_all, emit_all_with, emit_idempotent, emit_with, EmitOptions, Emitted};
pub use error::{BoxError, Error, InvalidEvent};
pub use event::{EventType, OutboxEvent};
#[cfg(feature = "schemars")]
pub use json_schema::{event_schemas, EventSchema};
pub use migrate::{check_schema, migrate, with_outbox_migrations, SchemaVersion};
pub use relay::{
    Backoff, BuildError, DeadOrderedEvents, EventContext, Handler, HandlerContext, HandlerOptions,
    LeaseMode, NewerVersions, Reject, Relay, RelayBuilder, RelayCounts, RelayMetrics, Snooze,
    TransactionContext, UnknownEvents,
};
pub use retention::purge_published;
pub use stats::{stats, stats_by_type, OutboxStats, TypeStats};

/// Derives [`OutboxEvent`] for a serde struct; see the trait for the attributes.
pub use outbox_macros::OutboxEvent;

#[doc(hidden)]
#[path = "private.rs"]
pub mod __private;
