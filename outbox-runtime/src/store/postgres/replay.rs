//! Replaying published events: their rows made pending again.

use chrono::{DateTime, Utc};
use sqlx::PgPool;

use super::ops::run_and_wake;
use super::{Query, Scalar};

/// The ids of the events of one type (as emitted: not subscribers' copies) published in
/// `[$3, $4)`, as a CTE `replayed`. The range is
/// read on the `published_at` index first, then filtered by type: the time range bounds what
/// is read, and no plan can prefer an index on the type (such as the optional
/// `events_by_aggregate`) and walk the type's whole history instead.
macro_rules! published_rows {
    () => {
        "WITH in_range AS MATERIALIZED ( \
             SELECT event_id, aggregate_type, event_type, subscriber FROM outbox.events \
             WHERE published_at >= $3 AND published_at < $4), \
         replayed AS (SELECT event_id FROM in_range \
                      WHERE aggregate_type = $1 AND event_type = $2 AND subscriber = '') "
    };
}

/// The rows [`replay`] would make pending.
pub(crate) async fn count_published(
    pool: &PgPool,
    aggregate_type: &str,
    event_type: &str,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<i64, sqlx::Error> {
    Ok(on_indexes!(pool, fetch_one, count_query(aggregate_type, event_type, from, until)))
}

/// How many published rows [`replay`] would make pending.
pub(crate) const COUNT_PUBLISHED: &str =
    concat!(published_rows!(), "SELECT count(*) FROM replayed");

pub(super) fn count_query<'q>(
    aggregate_type: &'q str,
    event_type: &'q str,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Scalar<'q, i64> {
    sqlx::query_scalar(COUNT_PUBLISHED).bind(aggregate_type).bind(event_type).bind(from).bind(until)
}

/// Makes those rows pending again (attempts reset, available now, `last_error` kept) and wakes
/// the relays; returns how many.
pub(crate) async fn replay(
    pool: &PgPool,
    aggregate_type: &str,
    event_type: &str,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    run_and_wake(pool, replay_query(aggregate_type, event_type, from, until)).await
}

/// Makes the rows of [`published_rows!`] pending again, found by their ids as an array on the
/// primary key: a join planned while the outbox was empty could walk every row for each one
/// replayed, and a plain `published_at IS NOT NULL` would let a plan walk the `published_at`
/// index instead (`IS TRUE`: a test no index predicate is proved from).
pub(crate) const REPLAY: &str = concat!(
    published_rows!(),
    "UPDATE outbox.events \
     SET published_at = NULL, attempts = 0, expired_leases = 0, lease_token = NULL, \
         available_at = now() \
     WHERE event_id = ANY (ARRAY(SELECT event_id FROM replayed)) \
       AND (published_at IS NOT NULL) IS TRUE"
);

pub(super) fn replay_query<'q>(
    aggregate_type: &'q str,
    event_type: &'q str,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Query<'q> {
    sqlx::query(REPLAY).bind(aggregate_type).bind(event_type).bind(from).bind(until)
}

/// Delivers the events of [`published_rows!`] once more to the subscriber `$5` alone: a copy for
/// each (due now), or its copy re-armed if that was published; a pending or dead copy is left as
/// it is.
pub(crate) const REPLAY_TO: &str = concat!(
    published_rows!(),
    "INSERT INTO outbox.events (source_event_id, subscriber, aggregate_type, aggregate_id, \
                                event_type, event_version, payload, headers, created_at, ordered) \
     SELECT e.event_id, $5, e.aggregate_type, e.aggregate_id, e.event_type, e.event_version, \
            e.payload, e.headers, e.created_at, e.ordered \
     FROM outbox.events e WHERE e.event_id = ANY (ARRAY(SELECT event_id FROM replayed)) \
     ON CONFLICT (source_event_id, subscriber) WHERE source_event_id IS NOT NULL \
     DO UPDATE SET published_at = NULL, attempts = 0, expired_leases = 0, lease_token = NULL, \
                   available_at = now() \
     WHERE outbox.events.published_at IS NOT NULL"
);

/// Delivers the published events of a type once more to one subscriber (see [`REPLAY_TO`]) and
/// wakes the relays; returns how many.
pub(crate) async fn replay_to(
    pool: &PgPool,
    subscriber: &str,
    aggregate_type: &str,
    event_type: &str,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Result<u64, sqlx::Error> {
    run_and_wake(pool, replay_to_query(subscriber, aggregate_type, event_type, from, until)).await
}

pub(super) fn replay_to_query<'q>(
    subscriber: &'q str,
    aggregate_type: &'q str,
    event_type: &'q str,
    from: DateTime<Utc>,
    until: DateTime<Utc>,
) -> Query<'q> {
    sqlx::query(REPLAY_TO)
        .bind(aggregate_type)
        .bind(event_type)
        .bind(from)
        .bind(until)
        .bind(subscriber)
}
