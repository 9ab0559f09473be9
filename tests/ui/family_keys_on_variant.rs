use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
enum OrderEvent {
    #[outbox(aggregate = "order", event_type = "order.cancelled", ordered, id)]
    Cancelled {
        #[outbox(id, event_type = "order.cancelled")]
        order_id: u64,
    },
}

fn main() {}
