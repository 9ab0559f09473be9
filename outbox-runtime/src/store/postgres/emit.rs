//! Writing events: the one insert statement behind every `emit`.

use sqlx::PgConnection;
use uuid::Uuid;

use super::{Query, Scalar};
use crate::store::{InsertShared, NewEvents};

/// The single-row insert of one unordered event, followed by `$tail`.
macro_rules! insert_one {
    ($tail:literal) => {
        concat!(
            "INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, \
                                        event_version, payload, headers, available_at, \
                                        idempotency_key) \
             VALUES ($1, $2, $3, $4, $10, $5::jsonb, $6::jsonb, \
                     COALESCE($7::timestamptz, now() + $8::bigint * interval '1 microsecond'), $9)",
            $tail
        )
    };
}

/// Inserts the rows; returns the ids actually inserted (an idempotency key already stored
/// inserts nothing).
///
/// One unordered event, the common case, takes the plain single-row statement: on the
/// producer's hot path, every bit of statement work counts against its transaction.
///
/// For ordered events it first takes a transaction-scoped advisory lock per aggregate, in key
/// order (so two batches cannot deadlock each other), and only then lets rows draw their `seq`:
/// the uncorrelated subquery in WHERE is a one-time filter, evaluated before any row is made.
pub(crate) async fn insert_events(
    conn: &mut PgConnection,
    shared: InsertShared<'_>,
    rows: &NewEvents,
) -> Result<Vec<Uuid>, sqlx::Error> {
    if let ([event_id], [false]) = (rows.event_ids.as_slice(), rows.ordered.as_slice()) {
        let inserted = insert_one_query(&shared, rows).execute(conn).await?;
        return Ok(if inserted.rows_affected() == 1 { vec![*event_id] } else { Vec::new() });
    }
    insert_many_query(&shared, rows).fetch_all(conn).await
}

/// The first row of `rows` alone, unordered.
pub(super) fn insert_one_query<'q>(shared: &InsertShared<'q>, rows: &'q NewEvents) -> Query<'q> {
    // Without a key there is nothing to conflict with: a plain insert, which spares the
    // speculative insertion ON CONFLICT costs.
    let sql = match shared.idempotency_key {
        None => insert_one!(""),
        Some(_) => insert_one!(
            " ON CONFLICT (aggregate_type, idempotency_key) \
              WHERE idempotency_key IS NOT NULL DO NOTHING"
        ),
    };
    let (at, delay) = shared.available.at_or_delay();
    sqlx::query(sql)
        .bind(rows.event_ids[0])
        .bind(shared.aggregate_type)
        .bind(&rows.aggregate_ids[0])
        .bind(rows.event_types[0])
        .bind(&rows.payloads[0])
        .bind(shared.headers)
        .bind(at)
        .bind(delay)
        .bind(shared.idempotency_key)
        .bind(rows.versions[0])
}

pub(super) fn insert_many_query<'q>(
    shared: &InsertShared<'q>,
    rows: &'q NewEvents,
) -> Scalar<'q, Uuid> {
    let (at, delay) = shared.available.at_or_delay();
    sqlx::query_scalar(
        "WITH locked AS ( \
             SELECT count(pg_advisory_xact_lock(k)) AS n FROM ( \
                 SELECT DISTINCT hashtextextended($1 || '/' || a, 0) AS k \
                 FROM UNNEST($6::text[], $9::bool[]) AS x(a, ordered) WHERE ordered ORDER BY 1 \
             ) AS keys \
         ) \
         INSERT INTO outbox.events (event_id, aggregate_type, aggregate_id, event_type, \
                                    event_version, payload, headers, available_at, ordered, \
                                    idempotency_key) \
         SELECT e.event_id, $1, e.aggregate_id, e.event_type, e.version, e.payload::jsonb, \
                $2::jsonb, COALESCE($3::timestamptz, now() + $4::bigint * interval '1 microsecond'), \
                e.ordered, $10 \
         FROM UNNEST($5::uuid[], $6::text[], $7::text[], $8::int4[], $9::bool[], $11::text[]) \
              WITH ORDINALITY AS e(event_id, aggregate_id, payload, version, ordered, event_type, ord) \
         WHERE (SELECT n FROM locked) >= 0 \
         ORDER BY e.ord \
         ON CONFLICT (aggregate_type, idempotency_key) WHERE idempotency_key IS NOT NULL \
         DO NOTHING \
         RETURNING event_id",
    )
    .bind(shared.aggregate_type)
    .bind(shared.headers)
    .bind(at)
    .bind(delay)
    .bind(&rows.event_ids)
    .bind(&rows.aggregate_ids)
    .bind(&rows.payloads)
    .bind(&rows.versions)
    .bind(&rows.ordered)
    .bind(shared.idempotency_key)
    .bind(&rows.event_types)
}

/// The event stored earlier under an idempotency key.
pub(crate) async fn event_for_key(
    conn: &mut PgConnection,
    aggregate_type: &str,
    idempotency_key: &str,
) -> Result<Option<Uuid>, sqlx::Error> {
    event_for_key_query(aggregate_type, idempotency_key).fetch_optional(conn).await
}

pub(super) fn event_for_key_query<'q>(
    aggregate_type: &'q str,
    idempotency_key: &'q str,
) -> Scalar<'q, Uuid> {
    sqlx::query_scalar(
        "SELECT event_id FROM outbox.events WHERE aggregate_type = $1 AND idempotency_key = $2",
    )
    .bind(aggregate_type)
    .bind(idempotency_key)
}
