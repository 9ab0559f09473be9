use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
enum OrderEvent {
    #[outbox(event_type = "order.cancelled")]
    Cancelled {
        #[serde(skip)]
        #[outbox(id)]
        order_id: u64,
        reason: String,
    },
}

fn main() {}
