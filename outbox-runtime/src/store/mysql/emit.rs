//! Writing events on MySQL and MariaDB.

use chrono::{DateTime, Utc};
use sqlx::mysql::MySqlArguments;
use sqlx::query::Query;
use sqlx::{MySql, MySqlConnection};
use uuid::Uuid;

use crate::store::{built, multi_row, InsertShared, NewEvents};

/// The longest aggregate id and idempotency key the schema's `VARCHAR(255)` columns hold.
pub(super) const MAX_ID_CHARS: usize = 255;

/// Rows per insert statement: each binds 11 values, and a statement takes at most 65,535.
const ROWS_PER_INSERT: usize = 1000;
const _: () = assert!(ROWS_PER_INSERT * 11 <= 65_535);

/// The start of the insert; each row follows as [`ROW`].
const INSERT: &str = "\
    INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, event_type, \
                               event_version, payload, headers, available_at, ordered, \
                               idempotency_key) VALUES ";

/// One row's values: an instant, or a delay in microseconds after now.
const ROW: &str =
    "(?, ?, ?, ?, ?, ?, ?, COALESCE(?, UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND), ?, ?)";

/// Inserts the rows; returns the ids inserted (an idempotency key stored already inserts
/// nothing).
///
/// Ordered events first take their aggregates' rows in `outbox_aggregate_locks`, in key order,
/// until the transaction ends: two transactions writing ordered events of one aggregate then
/// draw their `seq` in the order they commit, as PostgreSQL's advisory lock makes them.
pub(super) async fn insert_events(
    conn: &mut MySqlConnection,
    shared: InsertShared<'_>,
    rows: &NewEvents,
) -> Result<Vec<Uuid>, sqlx::Error> {
    lock_ordered_aggregates(conn, shared.aggregate_type, rows).await?;
    let (at, delay) = shared.available.at_or_delay();
    let count = rows.event_ids.len();
    for start in (0..count).step_by(ROWS_PER_INSERT) {
        let chunk = start..count.min(start + ROWS_PER_INSERT);
        let sql = multi_row(INSERT, ROW, chunk.len(), "");
        let mut query = sqlx::query(built(&sql));
        for i in chunk {
            query = bind_row(query, &shared, rows, i, at, delay);
        }
        match query.execute(&mut *conn).await {
            Ok(_) => {}
            // A keyed event (one row) whose key is stored already: nothing written. MySQL undoes
            // the statement alone, not the transaction. Neither `INSERT IGNORE` (which would turn
            // a refused value into a warning too) nor `ON DUPLICATE KEY UPDATE` (which needs the
            // UPDATE privilege on every column inserted).
            Err(sqlx::Error::Database(error))
                if shared.idempotency_key.is_some() && error.is_unique_violation() =>
            {
                return Ok(Vec::new());
            }
            Err(error) => return Err(error),
        }
    }
    Ok(rows.event_ids.clone())
}

fn bind_row<'q>(
    query: Query<'q, MySql, MySqlArguments>,
    shared: &InsertShared<'q>,
    rows: &'q NewEvents,
    i: usize,
    at: Option<DateTime<Utc>>,
    delay: i64,
) -> Query<'q, MySql, MySqlArguments> {
    query
        .bind(rows.event_ids[i])
        .bind(shared.aggregate_type)
        .bind(&rows.aggregate_ids[i])
        .bind(rows.event_types[i])
        .bind(rows.versions[i])
        .bind(&rows.payloads[i])
        .bind(shared.headers)
        .bind(at)
        .bind(delay)
        .bind(rows.ordered[i])
        .bind(shared.idempotency_key)
}

/// Takes the lock rows of the aggregates of `rows`' ordered events, in key order (so two
/// batches cannot deadlock each other), inserting those that are new.
async fn lock_ordered_aggregates(
    conn: &mut MySqlConnection,
    aggregate_type: &str,
    rows: &NewEvents,
) -> Result<(), sqlx::Error> {
    let mut ids: Vec<&str> = (rows.ordered.iter().zip(&rows.aggregate_ids))
        .filter(|(ordered, _)| **ordered)
        .map(|(_, id)| id.as_str())
        .collect();
    if ids.is_empty() {
        return Ok(());
    }
    ids.sort_unstable();
    ids.dedup();
    // A duplicate key takes the existing row's exclusive lock.
    let sql = multi_row(
        "INSERT INTO outbox_aggregate_locks (aggregate_type, aggregate_id) VALUES ",
        "(?, ?)",
        ids.len(),
        " ON DUPLICATE KEY UPDATE aggregate_id = aggregate_id",
    );
    let mut query = sqlx::query(built(&sql));
    for id in ids {
        query = query.bind(aggregate_type).bind(id);
    }
    query.execute(conn).await?;
    Ok(())
}

/// The event stored under an idempotency key, read with a shared lock: the newest committed row,
/// not the transaction's snapshot, which may predate the commit the insert waited for. (`LOCK IN
/// SHARE MODE` needs only SELECT, where MySQL 8's `FOR UPDATE` needs UPDATE or DELETE too.)
pub(super) async fn event_for_key(
    conn: &mut MySqlConnection,
    aggregate_type: &str,
    idempotency_key: &str,
) -> Result<Option<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT event_id FROM outbox_events WHERE aggregate_type = ? AND idempotency_key = ? \
         LOCK IN SHARE MODE",
    )
    .bind(aggregate_type)
    .bind(idempotency_key)
    .fetch_optional(conn)
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_row_binds_the_values_its_placeholders_name() {
        assert_eq!(ROW.matches('?').count(), 11);
        assert_eq!(multi_row(INSERT, ROW, 3, "").matches('?').count(), 3 * 11);
    }
}
