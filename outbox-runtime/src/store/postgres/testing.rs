//! The statements of the test kit (`crate::testing`, feature `testing`): what an open transaction
//! emitted, and how far a draining relay has got. Neither runs in production, so they favour
//! being exact over being index-driven.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, PgPool};
use uuid::Uuid;

use super::{micros, LeasePlan, LeaseTypes, Rows, Scalar};

/// A row the open transaction wrote, as stored.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct EmittedRow {
    pub(crate) event_id: Uuid,
    pub(crate) aggregate_id: String,
    pub(crate) event_type: String,
    pub(crate) event_version: i32,
    pub(crate) payload: String,
    pub(crate) headers: serde_json::Value,
    pub(crate) available_at: DateTime<Utc>,
    pub(crate) idempotency_key: Option<String>,
}

/// The rows of `aggregate_type` and `event_types` that the transaction on `conn` wrote, in the
/// order it wrote them.
pub(crate) async fn emitted(
    conn: &mut PgConnection,
    aggregate_type: &str,
    event_types: &[&str],
) -> Result<Vec<EmittedRow>, sqlx::Error> {
    emitted_query(aggregate_type, event_types).fetch_all(conn).await
}

/// `$1` aggregate type, `$2` event types.
///
/// A row was written by this transaction if it is visible here while its `xmin` (the id of the
/// transaction that wrote it) is still in progress: another transaction's rows are visible only
/// once committed. Comparing `xmin` with this transaction's own id would miss rows written
/// inside a savepoint (sqlx's nested transactions), which carry the savepoint's id, and rows of
/// a rolled-back savepoint are invisible anyway.
///
/// `xmin` is 32 bits and `pg_xact_status` takes a 64-bit id, so the full id is rebuilt from this
/// transaction's own (`top`): this transaction's ids, savepoints included, are `top` and the ids
/// handed out after it, so `ahead`, the distance from `top` modulo 2^32, is below 2^31 for them
/// and `top + ahead` is their full id. Rows of older transactions are 2^31 or more ahead (they
/// are behind) and are never looked up; rows of transactions newer than `top` that committed
/// meanwhile resolve to their true full id and read `committed`. With no id assigned yet
/// (`top` is NULL) the transaction wrote nothing, and every condition is NULL. (Only a row
/// frozen more than 2^31 transactions ago could wrap around and resolve to a wrong id; a test
/// database holds none.)
pub(super) fn emitted_query<'q>(
    aggregate_type: &'q str,
    event_types: &'q [&'q str],
) -> Rows<'q, EmittedRow> {
    sqlx::query_as(
        "WITH mine AS (SELECT pg_current_xact_id_if_assigned()::text::bigint AS top) \
         SELECT e.event_id, e.aggregate_id, e.event_type, e.event_version, \
                e.payload::text AS payload, e.headers, e.available_at, e.idempotency_key \
         FROM mine CROSS JOIN outbox.events e \
         CROSS JOIN LATERAL ( \
             SELECT (e.xmin::text::bigint - mine.top % 4294967296 + 4294967296) % 4294967296 \
                    AS ahead \
         ) x \
         WHERE e.aggregate_type = $1 AND e.event_type = ANY ($2) \
           AND CASE WHEN x.ahead < 2147483648 \
                    THEN pg_xact_status((mine.top + x.ahead)::text::xid8) = 'in progress' END \
         ORDER BY e.seq",
    )
    .bind(aggregate_type)
    .bind(event_types)
}

/// The database's clock: when a drain starts.
pub(crate) async fn now(pool: &PgPool) -> Result<DateTime<Utc>, sqlx::Error> {
    now_query().fetch_one(pool).await
}

pub(super) fn now_query<'q>() -> Scalar<'q, DateTime<Utc>> {
    sqlx::query_scalar("SELECT now()")
}

/// One row of a relay's types in a drain's reading.
#[derive(Debug, sqlx::FromRow)]
pub(crate) struct DrainRow {
    pub(crate) event_id: Uuid,
    pub(crate) aggregate_type: String,
    pub(crate) aggregate_id: String,
    pub(crate) event_type: String,
    pub(crate) event_version: i32,
    pub(crate) attempts: i32,
    pub(crate) last_error: Option<String>,
    pub(crate) available_at: DateTime<Utc>,
    pub(crate) published: bool,
    pub(crate) dead: bool,
    /// Pending, and being delivered or deliverable within the horizon.
    pub(crate) due: bool,
}

/// What a relay leases, copied from its plan: a drain reads it while the relay runs.
#[derive(Debug, Clone)]
pub(crate) struct Relayed {
    aggregate_types: Vec<String>,
    event_types: Vec<String>,
    subscribers: Vec<String>,
    versions: Vec<i32>,
    every_type: bool,
    skip_dead_ordered: bool,
}

impl Relayed {
    pub(crate) fn of(plan: &LeasePlan) -> Self {
        let (types, every_type) = match &plan.types {
            LeaseTypes::Only(types) => (types, false),
            LeaseTypes::All(types) => (types, true),
        };
        Relayed {
            aggregate_types: types.aggregate_types.clone(),
            event_types: types.event_types.clone(),
            subscribers: types.subscribers.clone(),
            versions: types.versions.clone(),
            every_type,
            skip_dead_ordered: plan.skip_dead_ordered,
        }
    }
}

/// Every row the relay leases that was published or died since `since`, or is pending; each
/// says whether it is due (see [`drain_query`]). In `seq` order.
pub(crate) async fn drain_reading(
    pool: &PgPool,
    relayed: &Relayed,
    since: DateTime<Utc>,
    horizon: Duration,
) -> Result<Vec<DrainRow>, sqlx::Error> {
    drain_query(relayed, since, horizon).fetch_all(pool).await
}

/// `$1` to `$3` the relay's types and the newest version it reads of each, `$4` whether it
/// leases every other type too, `$5` whether dead ordered events are skipped, `$6` the horizon
/// in microseconds, `$7` the drain's start, `$8` the subscriber of each type in `$1` to `$3`
/// (empty for the events as emitted).
///
/// A pending row is due when it is leased (being delivered, or its relay died and the lease
/// will expire), or when the relay could lease it within the horizon: available by then, of a
/// type not paused, and not held back behind an earlier ordered event of its aggregate that will
/// not be published by then. That is one that is dead (unless the relay skips dead ones), or pending and either
/// of a type the relay does not lease or neither leased nor available within the horizon. An
/// earlier event held back itself is held back by one further up, which holds this one back
/// too: so no recursion is needed.
pub(super) fn drain_query(
    relayed: &Relayed,
    since: DateTime<Utc>,
    horizon: Duration,
) -> Rows<'_, DrainRow> {
    sqlx::query_as(
        "WITH relayed AS ( \
             SELECT e.*, e.published_at IS NULL AND e.dead_at IS NULL AS pending, \
                    (e.lease_token IS NOT NULL \
                     OR e.available_at <= now() + $6::bigint * interval '1 microsecond' \
                        AND NOT EXISTS (SELECT 1 FROM outbox.paused_types p \
                                        WHERE p.aggregate_type = e.aggregate_type \
                                          AND p.event_type = e.event_type)) AS soon \
             FROM outbox.events e \
             LEFT JOIN UNNEST($1::text[], $2::text[], $8::text[], $3::int4[]) \
                 AS t(aggregate_type, event_type, subscriber, newest) \
                 ON t.aggregate_type = e.aggregate_type AND t.event_type = e.event_type \
                    AND t.subscriber = e.subscriber \
             WHERE (t.event_type IS NOT NULL OR $4 AND e.subscriber = '') \
               AND e.event_version <= coalesce(t.newest, 2147483647) \
               AND (e.published_at IS NULL AND e.dead_at IS NULL \
                    OR e.published_at >= $7 OR e.dead_at >= $7) \
         ) \
         SELECT r.event_id, r.aggregate_type, r.aggregate_id, r.event_type, r.event_version, \
                r.attempts, r.last_error, r.available_at, \
                r.published_at IS NOT NULL AS published, r.dead_at IS NOT NULL AS dead, \
                r.pending AND (r.lease_token IS NOT NULL OR r.soon AND NOT (r.ordered AND EXISTS ( \
                    SELECT 1 FROM outbox.events p \
                    WHERE p.ordered AND p.published_at IS NULL \
                      AND p.aggregate_type = r.aggregate_type AND p.aggregate_id = r.aggregate_id \
                      AND p.seq < r.seq AND p.subscriber IN ('', r.subscriber) \
                      AND (p.dead_at IS NULL OR NOT $5) \
                      AND NOT EXISTS ( \
                          SELECT 1 FROM relayed q \
                          WHERE q.event_id = p.event_id AND q.pending AND q.soon) \
                ))) AS due \
         FROM relayed r \
         ORDER BY r.seq",
    )
    .bind(&relayed.aggregate_types)
    .bind(&relayed.event_types)
    .bind(&relayed.versions)
    .bind(relayed.every_type)
    .bind(relayed.skip_dead_ordered)
    .bind(micros(horizon))
    .bind(since)
    .bind(&relayed.subscribers)
}

#[cfg(test)]
mod tests {
    use super::super::tests::parameters;
    use super::*;
    use crate::store::TypeVersions;

    #[test]
    fn every_statement_binds_each_parameter_its_sql_names() {
        let plan = LeasePlan {
            types: LeaseTypes::All(TypeVersions::default()),
            lease_timeout: Duration::from_secs(1),
            max_expired_leases: 3,
            skip_dead_ordered: false,
        };
        let relayed = Relayed::of(&plan);
        let statements = [
            ("emitted", parameters(emitted_query("order", &["order.placed"]))),
            ("now", parameters(now_query())),
            ("drain", parameters(drain_query(&relayed, Utc::now(), Duration::from_secs(1)))),
        ];
        for (name, (named, bound)) in statements {
            assert_eq!(named, bound, "`{name}` names ${named} but binds {bound} values");
        }
    }
}
