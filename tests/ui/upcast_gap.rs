use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlacedV1 {
    #[outbox(id)]
    order_id: u64,
}

// Version 2 is missing: a predecessor is exactly one version lower.
#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed", version = 3, upcast_from = crate::OrderPlacedV1)]
struct OrderPlaced {
    #[outbox(id)]
    order_id: u64,
}

impl From<OrderPlacedV1> for OrderPlaced {
    fn from(v1: OrderPlacedV1) -> Self {
        OrderPlaced { order_id: v1.order_id }
    }
}

fn main() {}
