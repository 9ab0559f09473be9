use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
enum OrderEvent {
    #[outbox(event_type = "order.cancelled")]
    Cancelled { order_id: u64, reason: String },
    #[outbox(event_type = "order.archived")]
    Archived {},
}

fn main() {}
