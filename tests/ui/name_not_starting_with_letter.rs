use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "2fa", event_type = "_order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: u64,
}

fn main() {}
