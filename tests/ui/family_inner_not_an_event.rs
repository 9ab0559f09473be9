use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct OrderPlaced {
    order_id: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
enum OrderEvent {
    #[outbox(event_type = "order.placed")]
    Placed(OrderPlaced),
}

fn main() {}
