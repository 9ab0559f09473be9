//! The subscribers' registry, and what the fan-out of an ordered event reads.

use sqlx::PgPool;

use super::Scalar;

/// Registers subscribers, `$1` to `$3` (aggregate types, event types, names) column-wise; those
/// registered already keep their registration.
pub(crate) const REGISTER: &str =
    "INSERT INTO outbox.subscribers (aggregate_type, event_type, subscriber) \
     SELECT * FROM UNNEST($1::text[], $2::text[], $3::text[]) \
     ON CONFLICT (aggregate_type, event_type, subscriber) DO NOTHING";

/// The subscribers with an undelivered copy of an ordered event of the aggregate `$1`, `$2`
/// (dead ones too, unless `$3` skips dead events): a later event of the aggregate waits for them,
/// so it is not delivered to them at once but copied behind. Every such copy is of an earlier
/// event: an event is copied when it is acknowledged, which the later events wait for.
pub(crate) const BEHIND: &str = "SELECT DISTINCT p.subscriber FROM outbox.events p \
     WHERE p.ordered AND p.published_at IS NULL \
       AND p.aggregate_type = $1 AND p.aggregate_id = $2 \
       AND p.subscriber <> '' AND (p.dead_at IS NULL OR NOT $3)";

/// Registers `(aggregate_type, event_type, subscriber)` keys, column-wise.
pub(crate) async fn register(
    pool: &PgPool,
    aggregate_types: &[&str],
    event_types: &[&str],
    subscribers: &[&str],
) -> Result<(), sqlx::Error> {
    register_query(aggregate_types, event_types, subscribers).execute(pool).await?;
    Ok(())
}

pub(super) fn register_query<'q>(
    aggregate_types: &'q [&'q str],
    event_types: &'q [&'q str],
    subscribers: &'q [&'q str],
) -> super::Query<'q> {
    sqlx::query(REGISTER).bind(aggregate_types).bind(event_types).bind(subscribers)
}

/// The subscribers an ordered event of the aggregate waits for (see [`BEHIND`]).
pub(crate) async fn behind(
    pool: &PgPool,
    aggregate_type: &str,
    aggregate_id: &str,
    skip_dead: bool,
) -> Result<Vec<String>, sqlx::Error> {
    Ok(on_indexes!(pool, fetch_all, behind_query(aggregate_type, aggregate_id, skip_dead)))
}

pub(super) fn behind_query<'q>(
    aggregate_type: &'q str,
    aggregate_id: &'q str,
    skip_dead: bool,
) -> Scalar<'q, String> {
    sqlx::query_scalar(BEHIND).bind(aggregate_type).bind(aggregate_id).bind(skip_dead)
}
