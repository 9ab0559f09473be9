//! The quickstart's events, shared with the `event_schemas` example.

use outbox_runtime::OutboxEvent;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

/// An order was placed.
#[derive(Debug, Serialize, Deserialize, OutboxEvent, JsonSchema)]
#[outbox(aggregate = "order", event_type = "order.placed", ordered)]
pub struct OrderPlaced {
    /// The order.
    #[outbox(id)]
    pub order_id: Uuid,
    /// What the customer pays, in cents.
    pub total_cents: i64,
}

/// An order was cancelled before it shipped.
#[derive(Debug, Serialize, Deserialize, OutboxEvent, JsonSchema)]
#[outbox(aggregate = "order", event_type = "order.cancelled", ordered)]
pub struct OrderCancelled {
    /// The order.
    #[outbox(id)]
    pub order_id: Uuid,
    /// Why, in the customer's words.
    pub reason: String,
}
