//! A kit for testing your own code against the outbox (feature `testing`, for
//! `[dev-dependencies]`): what a transaction emitted, a relay run until it has delivered
//! everything due, and faults injected into your handlers.
//!
//! - [`emitted`] reads, through an open transaction, the events of one Rust type that this
//!   transaction emitted: typed, in order, before anything is committed. [`emitted_records`]
//!   adds their ids, headers and versions.
//! - [`drain`] runs a relay until nothing it leases is due within a short horizon (retries
//!   included), shuts it down, and reports each event's [`Outcome`]: delivered, failed, dead or
//!   still pending. It returns as soon as that holds, never after a fixed sleep, and fails
//!   naming what is still due after its timeout. [`Drain`] sets the horizon and the timeout.
//! - [`Faults`] wraps one of your handlers to fail, panic or wait on chosen calls of each
//!   event, and counts the calls; the wrapped handler registers like the original.
//!
//! # Example
//!
//! With [`#[sqlx::test]`](https://docs.rs/sqlx/0.8/sqlx/attr.test.html), every test gets a
//! database of its own, so a drain sees only that test's events:
//!
//! ```no_run
//! # use outbox_runtime::sqlx;
//! use outbox_runtime::testing::{self, Faults, Outcome};
//! use outbox_runtime::{EventContext, OutboxEvent, Relay};
//! use serde::{Deserialize, Serialize};
//! use sqlx::{PgPool, Postgres, Transaction};
//!
//! #[derive(Debug, PartialEq, Serialize, Deserialize, OutboxEvent)]
//! #[outbox(aggregate = "order", event_type = "order.placed")]
//! struct OrderPlaced {
//!     #[outbox(id)]
//!     order_id: i64,
//!     total_cents: i64,
//! }
//!
//! // The code under test: a producer and a handler.
//! async fn place_order(tx: &mut Transaction<'_, Postgres>, order_id: i64) -> Result<(), outbox_runtime::Error> {
//!     outbox_runtime::emit(tx, &OrderPlaced { order_id, total_cents: 4_200 }).await?;
//!     Ok(())
//! }
//!
//! async fn send_receipt(_: EventContext, _: OrderPlaced) -> Result<(), std::io::Error> {
//!     Ok(())
//! }
//!
//! # macro_rules! checked { (#[$test:meta] $($item:tt)*) => { $($item)* } }
//! # checked! {
//! #[sqlx::test(migrations = false)]
//! async fn placing_an_order_sends_a_receipt(pool: PgPool) -> Result<(), Box<dyn std::error::Error>> {
//!     outbox_runtime::migrate(&pool).await?;
//!
//!     let mut tx = pool.begin().await?;
//!     place_order(&mut tx, 7).await?;
//!     let placed = testing::emitted::<OrderPlaced>(&mut tx).await?;
//!     assert_eq!(placed, [OrderPlaced { order_id: 7, total_cents: 4_200 }]);
//!     tx.commit().await?;
//!
//!     // The mail server refuses the first two attempts.
//!     let faults = Faults::new().fail_first(2);
//!     let relay = Relay::builder(pool.clone()).handler(faults.wrap(send_receipt));
//!     let report = testing::drain(relay).await?;
//!
//!     let [receipt] = report.events() else { panic!("one event expected: {report:?}") };
//!     assert_eq!(receipt.outcome, Outcome::Delivered);
//!     assert_eq!(receipt.attempts, 2);
//!     assert_eq!(faults.handler_calls(), 1);
//!     Ok(())
//! }
//! # }
//! ```
//!
//! # What a drain waits for
//!
//! A row of the relay's types is *due* while it is pending and either leased (being delivered)
//! or deliverable within the horizon (1 s by default): available by then and not held back
//! behind an earlier ordered event of its aggregate that is not due itself (a dead one, unless
//! the relay skips those). The drain ends at the first reading with nothing due. The relay runs
//! with a 10 ms poll interval and a backoff of 10 ms to 100 ms unless the builder set others,
//! so a failing row is retried within the horizon until it is delivered or dead; delays and
//! backoffs longer than the horizon leave rows [`Pending`](Outcome::Pending) or
//! [`Failed`](Outcome::Failed) in the report.
//!
//! The report lists every event of the relay's types that was published or died during the
//! drain, or is still pending, whoever delivered it: run one relay per test database.

mod drain;
mod emitted;
mod faults;
mod report;

pub use drain::{drain, Drain, DrainError};
pub use emitted::{emitted, emitted_records, Emitted, EmittedError};
pub use faults::{DeliveryContext, Faults, InjectedFailure};
pub use report::{DrainReport, DrainedEvent, Outcome};
