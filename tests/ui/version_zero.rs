use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed", version = 0)]
struct OrderPlaced {
    #[outbox(id)]
    order_id: u64,
}

fn main() {}
