//! Writing events on SQLite.

use std::time::Duration;

use sqlx::SqliteConnection;
use uuid::Uuid;

use super::INSTANT;
use crate::store::{Available, InsertShared, NewEvents};

/// One row; with an idempotency key, nothing when the key is stored already. `?8` is an
/// instant, `?9` a `strftime` modifier that delays `now`.
const INSERT: &str = "\
    INSERT INTO outbox_events (event_id, aggregate_type, aggregate_id, event_type, \
                               event_version, payload, headers, available_at, ordered, \
                               idempotency_key) \
    VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, \
            COALESCE(?8, strftime('%Y-%m-%d %H:%M:%f', 'now', ?9)), ?10, ?11) \
    ON CONFLICT (aggregate_type, idempotency_key) WHERE idempotency_key IS NOT NULL DO NOTHING";

/// Inserts the rows one statement each (a call into SQLite, prepared once per connection);
/// returns the ids inserted.
pub(super) async fn insert_events(
    conn: &mut SqliteConnection,
    shared: InsertShared<'_>,
    rows: &NewEvents,
) -> Result<Vec<Uuid>, sqlx::Error> {
    let (at, delay) = match shared.available {
        Available::Now => (None, delay_modifier(Duration::ZERO)),
        Available::After(delay) => (None, delay_modifier(delay)),
        Available::At(at) => (Some(at.format(INSTANT).to_string()), delay_modifier(Duration::ZERO)),
    };
    let mut inserted = Vec::with_capacity(rows.event_ids.len());
    for (i, event_id) in rows.event_ids.iter().enumerate() {
        let done = sqlx::query(INSERT)
            .bind(event_id)
            .bind(shared.aggregate_type)
            .bind(&rows.aggregate_ids[i])
            .bind(rows.event_types[i])
            .bind(rows.versions[i])
            .bind(&rows.payloads[i])
            .bind(shared.headers)
            .bind(&at)
            .bind(&delay)
            .bind(rows.ordered[i])
            .bind(shared.idempotency_key)
            .execute(&mut *conn)
            .await?;
        if done.rows_affected() == 1 {
            inserted.push(*event_id);
        }
    }
    Ok(inserted)
}

/// `delay` as a `strftime` modifier, to the microsecond; past SQLite's last year (9999) the
/// result is NULL, which the NOT NULL column refuses, so it is capped at a century.
fn delay_modifier(delay: Duration) -> String {
    let delay = delay.min(Duration::from_secs(100 * 366 * 24 * 3600));
    format!("+{}.{:06} seconds", delay.as_secs(), delay.subsec_micros())
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
    fn a_delay_is_a_modifier_to_the_microsecond() {
        assert_eq!(delay_modifier(Duration::ZERO), "+0.000000 seconds");
        assert_eq!(delay_modifier(Duration::from_micros(1_500_001)), "+1.500001 seconds");
    }
}
