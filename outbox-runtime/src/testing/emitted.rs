//! What an open transaction emitted, read back as the events' Rust type.

use chrono::{DateTime, Utc};
use sqlx::{Postgres, Transaction};
use uuid::Uuid;

use crate::decode::{self, JsonUpcasters};
use crate::error::{BoxError, Error};
use crate::event::{EventType, OutboxEvent};
use crate::store::testing as store;

/// An event the open transaction emitted, with what was stored beside it.
#[derive(Debug, Clone, PartialEq)]
#[non_exhaustive]
pub struct Emitted<E> {
    /// The event's id, as `emit` returned it.
    pub event_id: Uuid,
    /// The aggregate id it was emitted with.
    pub aggregate_id: String,
    /// Its event type: one of `E::EVENT_TYPES`.
    pub event_type: &'static str,
    /// The version it was written at (`E`'s own, or an older one that `E` reads).
    pub version: u32,
    /// Its headers, as a JSON object.
    pub headers: serde_json::Value,
    /// When it becomes deliverable (later than now for a delayed emit).
    pub available_at: DateTime<Utc>,
    /// The idempotency key it was emitted with.
    pub idempotency_key: Option<String>,
    /// The event, read as `E`.
    pub event: E,
}

/// Why [`emitted`] or [`emitted_records`] could not read a transaction's events.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum EmittedError {
    /// The outbox could not be read (its schema missing, the connection broken).
    #[error(transparent)]
    Outbox(#[from] Error),
    /// A row of `E`'s event types does not read as `E`: written at a version newer than `E`
    /// reads, or at one older than its `upcast_from` chain reaches.
    #[error("cannot read emitted event {event_id} (`{event_type}` version {version})")]
    Decode {
        /// The event's id.
        event_id: Uuid,
        /// Its event type.
        event_type: String,
        /// The version it was written at.
        version: u32,
        /// What the relay would record as the failure.
        #[source]
        source: BoxError,
    },
}

/// The events of `E`'s types that the open transaction `tx` emitted so far, in the order it
/// emitted them, read as `E` the way the relay reads them (versions, `upcast_from` chains and
/// enum families included; JSON upcasters are the relay's, so older versions needing one fail).
///
/// Only this transaction's events, savepoints included: neither events other transactions
/// committed nor those of a savepoint rolled back. The rows are read through `tx`, so nothing
/// needs committing first.
///
/// # Errors
/// [`EmittedError::Decode`] for a row that does not read as `E`; [`EmittedError::Outbox`] when
/// the read fails.
pub async fn emitted<E: OutboxEvent>(
    tx: &mut Transaction<'_, Postgres>,
) -> Result<Vec<E>, EmittedError> {
    let records = emitted_records::<E>(tx).await?;
    Ok(records.into_iter().map(|record| record.event).collect())
}

/// [`emitted`], with each event's id, headers, version and the rest of what was stored.
pub async fn emitted_records<E: OutboxEvent>(
    tx: &mut Transaction<'_, Postgres>,
) -> Result<Vec<Emitted<E>>, EmittedError> {
    let names: Vec<&str> = E::EVENT_TYPES.iter().map(EventType::name).collect();
    let rows = store::emitted(tx, E::AGGREGATE_TYPE, &names).await.map_err(Error::from)?;
    // Nothing to upcast with: the relay's JSON upcasters are registered on its builder.
    let upcasters = JsonUpcasters::default();
    rows.into_iter()
        .map(|row| {
            // The column's check keeps it positive.
            let version = u32::try_from(row.event_version).unwrap_or(1);
            let event = decode::read::<E>(&row.event_type, version, &row.payload, &upcasters)
                .map_err(|source| EmittedError::Decode {
                    event_id: row.event_id,
                    event_type: row.event_type.clone(),
                    version,
                    source: source.into(),
                })?;
            // Reading checked that it is one of `E`'s.
            let event_type = E::EVENT_TYPES
                .iter()
                .map(EventType::name)
                .find(|name| *name == row.event_type)
                .unwrap_or_default();
            Ok(Emitted {
                event_id: row.event_id,
                aggregate_id: row.aggregate_id,
                event_type,
                version,
                headers: row.headers,
                available_at: row.available_at,
                idempotency_key: row.idempotency_key,
                event,
            })
        })
        .collect()
}
