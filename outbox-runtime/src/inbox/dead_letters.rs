//! An inbox's dead letters: messages whose handler rejected them or ran out of attempts, kept
//! with their payload, headers and last error. List, count and discard them from anywhere (the
//! CLI, an operations job); run one again with [`Inbox::requeue_dead`](super::Inbox::requeue_dead)
//! in the service that has its handler.
//!
//! ```no_run
//! # use outbox_runtime::sqlx;
//! use outbox_runtime::inbox::dead_letters;
//! # async fn ops(pool: sqlx::PgPool) -> Result<(), outbox_runtime::inbox::InboxError> {
//! for message in dead_letters::list(&pool, "billing", 50).await? {
//!     println!("{} failed {} times: {:?}", message.event_id, message.attempts, message.last_error);
//! }
//! # Ok(()) }
//! ```

use chrono::{DateTime, Utc};
use sqlx::PgPool;
use uuid::Uuid;

use super::{InboundMessage, InboxError};
use crate::store::inbox::{self as store, InboxDeadRow};

/// A message that died in a consumer's inbox.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
#[non_exhaustive]
pub struct DeadMessage {
    /// The event's id.
    pub event_id: Uuid,
    /// The aggregate type.
    pub aggregate_type: String,
    /// The aggregate id.
    pub aggregate_id: String,
    /// The event type.
    pub event_type: String,
    /// The version the payload was written at.
    #[serde(rename = "event_version")]
    pub version: u32,
    /// The payload as it arrived.
    pub payload: String,
    /// The message's headers other than the outbox's own.
    pub headers: serde_json::Value,
    /// When the message first arrived.
    #[serde(serialize_with = "crate::serialize::instant")]
    pub received_at: DateTime<Utc>,
    /// When it died.
    #[serde(serialize_with = "crate::serialize::instant")]
    pub dead_at: DateTime<Utc>,
    /// Failed handler calls.
    pub attempts: u32,
    /// The last failure's text, with its causes.
    pub last_error: Option<String>,
}

impl DeadMessage {
    fn from_row(row: InboxDeadRow) -> Self {
        let (event_id, aggregate_type, aggregate_id, event_type, version, payload, headers) =
            (row.0, row.1, row.2, row.3, row.4, row.5, row.6);
        DeadMessage {
            event_id,
            aggregate_type,
            aggregate_id,
            event_type,
            // The column's check keeps it positive; attempts only count up from 0.
            version: u32::try_from(version).unwrap_or(1),
            payload: payload.unwrap_or_default(),
            headers: headers.unwrap_or_else(|| serde_json::json!({})),
            received_at: row.7,
            dead_at: row.8.unwrap_or(row.7),
            attempts: u32::try_from(row.9).unwrap_or(0),
            last_error: row.10,
        }
    }
}

/// The message a revived row stands for, as it arrived.
pub(super) fn message_of(row: InboxDeadRow) -> InboundMessage {
    let dead = DeadMessage::from_row(row);
    InboundMessage {
        event_id: dead.event_id,
        aggregate_type: dead.aggregate_type,
        aggregate_id: dead.aggregate_id,
        event_type: dead.event_type,
        version: dead.version,
        created_at: None,
        headers: dead.headers,
        payload: dead.payload,
    }
}

/// Up to `limit` of `consumer`'s dead messages, the longest dead first.
pub async fn list(
    pool: &PgPool,
    consumer: &str,
    limit: i64,
) -> Result<Vec<DeadMessage>, InboxError> {
    let rows = store::dead(pool, consumer, limit).await.map_err(InboxError::Database)?;
    Ok(rows.into_iter().map(DeadMessage::from_row).collect())
}

/// How many of `consumer`'s messages are dead.
pub async fn count(pool: &PgPool, consumer: &str) -> Result<i64, InboxError> {
    store::count_dead(pool, consumer).await.map_err(InboxError::Database)
}

/// Deletes one of `consumer`'s dead messages for good; returns whether it was there. A later
/// delivery of the same message by the broker is then handled as new.
pub async fn discard(pool: &PgPool, consumer: &str, event_id: Uuid) -> Result<bool, InboxError> {
    store::discard(pool, consumer, event_id).await.map_err(InboxError::Database)
}
