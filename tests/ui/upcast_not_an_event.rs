use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct OrderPlacedV1 {
    order_id: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed", version = 2, upcast_from = OrderPlacedV1)]
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
