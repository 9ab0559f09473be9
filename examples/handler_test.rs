//! Testing a producer and a handler with the testing kit (`outbox_runtime::testing`, the
//! `testing` feature, for `[dev-dependencies]`): `emitted` reads what an open transaction
//! emitted, `drain` runs a relay until nothing is left to deliver and reports each event's
//! outcome, and `Faults` makes a handler fail or panic on chosen calls.
//!
//! The code under test is a loyalty programme: placing an order emits `OrderPlaced`; its
//! handler, transactional, credits the customer one point per whole euro and emits
//! `PointsAwarded` in the transaction the order's event is acknowledged in.
//!
//! This example is a test suite: run it with
//! `cargo test -p outbox-examples --example handler_test` (`cargo test --workspace` runs it too,
//! as the example is declared with `test = true`). Each test gets a fresh database of its own
//! from `#[sqlx::test]` on the PostgreSQL in `DATABASE_URL`, as the kit expects: a drain
//! reports every event of its relay's types in the database, so tests must not share one.
//! `cargo run --example handler_test` only says how to run it.

// The application's code is called by the tests alone: `cargo run` builds it unused.
#![cfg_attr(not(test), allow(dead_code))]

use outbox_runtime::{emit, BoxError, EventContext, OutboxEvent, TransactionContext};
use serde::{Deserialize, Serialize};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

// ---------------------------------------------------------------------------------------------
// The application's code under test
// ---------------------------------------------------------------------------------------------

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "handler_test.order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: Uuid,
    customer_id: Uuid,
    total_cents: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "handler_test.customer", event_type = "customer.points_awarded")]
struct PointsAwarded {
    #[outbox(id)]
    customer_id: Uuid,
    order_id: Uuid,
    points: i64,
}

/// The application's table, made by its migrations.
const SCHEMA: &str =
    "CREATE TABLE handler_test_points (customer_id uuid PRIMARY KEY, points bigint NOT NULL)";

/// The producer: places an order (here, only its event) in the caller's transaction.
async fn place_order(
    tx: &mut Transaction<'_, Postgres>,
    customer_id: Uuid,
    total_cents: i64,
) -> Result<OrderPlaced, outbox_runtime::Error> {
    let order = OrderPlaced { order_id: Uuid::now_v7(), customer_id, total_cents };
    emit(tx, &order).await?;
    Ok(order)
}

/// The handler: its writes and its follow-up event commit with the acknowledgement.
async fn award_points(mut ctx: TransactionContext, order: OrderPlaced) -> Result<(), BoxError> {
    award(ctx.tx(), &order).await
}

/// The handler's work on any transaction, so a test can also call it on one of its own.
async fn award(tx: &mut Transaction<'_, Postgres>, order: &OrderPlaced) -> Result<(), BoxError> {
    if order.total_cents < 0 {
        return Err(format!("order {} has a negative total", order.order_id).into());
    }
    let points = order.total_cents / 100;
    sqlx::query(
        "INSERT INTO handler_test_points (customer_id, points) VALUES ($1, $2) \
         ON CONFLICT (customer_id) DO UPDATE \
         SET points = handler_test_points.points + EXCLUDED.points",
    )
    .bind(order.customer_id)
    .bind(points)
    .execute(&mut **tx)
    .await?;
    let awarded =
        PointsAwarded { customer_id: order.customer_id, order_id: order.order_id, points };
    emit(tx, &awarded).await?;
    Ok(())
}

/// Another service's handler of `PointsAwarded` (a mail to the customer, say).
async fn notify_customer(_: EventContext, _: PointsAwarded) -> Result<(), std::io::Error> {
    Ok(())
}

fn main() {
    println!("This example is a test suite. Run it with");
    println!();
    println!("    cargo test -p outbox-examples --example handler_test");
    println!();
    println!("(`cargo test --workspace` runs it too.)");
}

#[cfg(test)]
mod tests {
    use outbox_runtime::testing::{self, Faults, Outcome};
    use outbox_runtime::Relay;
    use sqlx::{PgExecutor, PgPool};

    use super::*;

    /// The outbox's schema and the application's, in a test's fresh database.
    async fn migrated(pool: &PgPool) -> Result<(), BoxError> {
        outbox_runtime::migrate(pool).await?;
        sqlx::query(SCHEMA).execute(pool).await?;
        Ok(())
    }

    /// A customer's points, through the pool or an open transaction.
    async fn points(
        db: impl PgExecutor<'_>,
        customer_id: Uuid,
    ) -> Result<Option<i64>, sqlx::Error> {
        sqlx::query_scalar("SELECT points FROM handler_test_points WHERE customer_id = $1")
            .bind(customer_id)
            .fetch_optional(db)
            .await
    }

    /// The handler's effects, without a relay: the write and the follow-up event, read through
    /// the open transaction before anything is committed.
    #[sqlx::test(migrations = false)]
    async fn award_credits_points_and_emits_points_awarded(pool: PgPool) -> Result<(), BoxError> {
        migrated(&pool).await?;
        let customer_id = Uuid::now_v7();
        let order = OrderPlaced { order_id: Uuid::now_v7(), customer_id, total_cents: 4_250 };

        let mut tx = pool.begin().await?;
        award(&mut tx, &order).await?;
        assert_eq!(points(&mut *tx, customer_id).await?, Some(42), "one point per whole euro");
        let emitted = testing::emitted::<PointsAwarded>(&mut tx).await?;
        assert_eq!(emitted, [PointsAwarded { customer_id, order_id: order.order_id, points: 42 }]);
        Ok(())
    }

    /// Through a relay: the order's event is delivered despite a panic and a failure, its
    /// points credited once, and the follow-up event delivered in turn.
    #[sqlx::test(migrations = false)]
    async fn an_order_is_awarded_once_through_a_panic_and_a_failure(
        pool: PgPool,
    ) -> Result<(), BoxError> {
        migrated(&pool).await?;
        let customer_id = Uuid::now_v7();
        let mut tx = pool.begin().await?;
        let order = place_order(&mut tx, customer_id, 1_999).await?;
        // Read through the open transaction: nothing is committed yet.
        assert_eq!(testing::emitted::<OrderPlaced>(&mut tx).await?, [order]);
        tx.commit().await?;

        // Each event's first call panics and its second fails, before reaching the handler.
        let faults = Faults::new().panic_first(1).fail_first(1);
        let relay = Relay::builder(pool.clone())
            .handler(faults.wrap(award_points))
            .handler(notify_customer);
        let report = testing::drain(relay).await?;

        let [placed, awarded] = report.events() else {
            panic!("an order and its points expected: {report:?}");
        };
        assert_eq!(
            (placed.event_type.as_str(), placed.outcome),
            (OrderPlaced::EVENT_TYPE, Outcome::Delivered)
        );
        assert_eq!(placed.attempts, 2, "{placed}");
        assert_eq!(placed.last_error.as_deref(), Some("injected failure (call 2)"));
        assert_eq!(faults.calls_for(placed.event_id), 3);
        assert_eq!(faults.handler_calls(), 1, "the handler ran once");
        assert_eq!(points(&pool, customer_id).await?, Some(19));
        assert_eq!(
            (awarded.event_type.as_str(), awarded.outcome, awarded.attempts),
            (PointsAwarded::EVENT_TYPE, Outcome::Delivered, 0)
        );
        assert_eq!(awarded.aggregate_id, customer_id.to_string());
        Ok(())
    }

    /// An order the handler refuses fails every attempt, ends dead, and credits nothing.
    #[sqlx::test(migrations = false)]
    async fn a_negative_total_ends_dead_and_awards_nothing(pool: PgPool) -> Result<(), BoxError> {
        migrated(&pool).await?;
        let customer_id = Uuid::now_v7();
        let mut tx = pool.begin().await?;
        let order = place_order(&mut tx, customer_id, -100).await?;
        tx.commit().await?;

        let relay = Relay::builder(pool.clone())
            .handler(award_points)
            .handler(notify_customer)
            .max_attempts(3);
        let report = testing::drain(relay).await?;

        let [placed] = report.events() else { panic!("only the order expected: {report:?}") };
        assert_eq!((placed.outcome, placed.attempts), (Outcome::Dead, 3), "{placed}");
        let reason = format!("order {} has a negative total", order.order_id);
        assert_eq!(placed.last_error.as_deref(), Some(reason.as_str()));
        assert_eq!(points(&pool, customer_id).await?, None);
        assert_eq!(report.counts().dead, 1);
        Ok(())
    }
}
