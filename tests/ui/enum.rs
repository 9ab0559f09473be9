use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.changed")]
enum OrderChanged {
    Placed { order_id: u64 },
    Cancelled { order_id: u64 },
}

fn main() {}
