use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox = "order"]
struct OrderPlaced {
    #[outbox]
    order_id: u64,
}

fn main() {}
