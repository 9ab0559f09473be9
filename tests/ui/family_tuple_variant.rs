use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
enum OrderEvent {
    #[outbox(event_type = "order.placed")]
    Placed(OrderPlaced, u64),
    #[outbox(event_type = "order.cancelled")]
    Cancelled(),
}

fn main() {}
