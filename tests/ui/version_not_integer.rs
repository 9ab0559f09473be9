use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed", version = "2")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.cancelled", version = 1.5)]
struct OrderCancelled {
    #[outbox(id)]
    order_id: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.shipped", version)]
struct OrderShipped {
    #[outbox(id)]
    order_id: u64,
}

fn main() {}
