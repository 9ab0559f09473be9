//! Writing events on SQLite.

use sqlx::SqliteConnection;
use uuid::Uuid;

use super::INSTANT;
use crate::store::{built, multi_row, InsertShared, NewEvents};

/// Rows per insert statement: each binds 11 values, and SQLite takes at most 32,766.
const ROWS_PER_INSERT: usize = 1000;
const _: () = assert!(ROWS_PER_INSERT * 11 <= 32_766);

/// The start of the insert; each row follows as [`ROW`].
const INSERT: &str = "\
    INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, event_type, \
                               event_version, payload, headers, available_at, ordered, \
                               idempotency_key) VALUES ";

/// One row's values: an instant, or a `strftime` modifier that delays now.
const ROW: &str =
    "(?, ?, ?, ?, ?, ?, ?, COALESCE(?, strftime('%Y-%m-%d %H:%M:%f', 'now', ?)), ?, ?)";

/// With an idempotency key (one row), nothing when the key is stored already.
const ON_KEY: &str =
    " ON CONFLICT (aggregate_type, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING";

/// Inserts the rows, up to [`ROWS_PER_INSERT`] per statement (one row, the common case, takes a
/// statement of its own shape, prepared once per connection); returns the ids inserted.
pub(super) async fn insert_events(
    conn: &mut SqliteConnection,
    shared: InsertShared<'_>,
    rows: &NewEvents,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let (at, delay) = shared.available.at_or_delay();
    let (at, delay) = (at.map(|at| at.format(INSTANT).to_string()), delay_modifier(delay));
    let count = rows.event_ids.len();
    let mut inserted = 0;
    for start in (0..count).step_by(ROWS_PER_INSERT) {
        let chunk = start..count.min(start + ROWS_PER_INSERT);
        let keyed = if shared.idempotency_key.is_some() { ON_KEY } else { "" };
        let sql = multi_row(INSERT, ROW, chunk.len(), keyed);
        let mut query = sqlx::query(built(&sql));
        for i in chunk {
            query = query
                .bind(rows.event_ids[i])
                .bind(shared.aggregate_type)
                .bind(&rows.aggregate_ids[i])
                .bind(rows.event_types[i])
                .bind(rows.versions[i])
                .bind(&rows.payloads[i])
                .bind(shared.headers)
                .bind(&at)
                .bind(&delay)
                .bind(rows.ordered[i])
                .bind(shared.idempotency_key);
        }
        inserted += query.execute(&mut *conn).await?.rows_affected();
    }
    // Only a keyed row can be left out, and a key comes with one row.
    Ok(if inserted == count as u64 { rows.event_ids.clone() } else { Vec::new() })
}

/// A delay in microseconds (capped at a century by `micros`, within SQLite's last year, 9999)
/// as a `strftime` modifier.
pub(super) fn delay_modifier(micros: i64) -> String {
    format!("+{}.{:06} seconds", micros / 1_000_000, micros % 1_000_000)
}

/// The event stored earlier under an idempotency key.
pub(super) async fn event_for_key(
    conn: &mut SqliteConnection,
    aggregate_type: &str,
    idempotency_key: &str,
) -> Result<Option<Uuid>, sqlx::Error> {
    sqlx::query_scalar(
        "SELECT event_id FROM outbox_events WHERE aggregate_type = ?1 AND idempotency_key = ?2",
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
        assert_eq!(multi_row(INSERT, ROW, 3, ON_KEY).matches('?').count(), 3 * 11);
    }

    #[test]
    fn a_delay_is_a_modifier_to_the_microsecond() {
        assert_eq!(delay_modifier(0), "+0.000000 seconds");
        assert_eq!(delay_modifier(1_500_001), "+1.500001 seconds");
    }
}
