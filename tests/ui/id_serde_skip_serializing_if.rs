use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    #[serde(rename = "id", skip_serializing_if = "String::is_empty")]
    order_id: String,
    total_cents: u64,
}

fn main() {}
