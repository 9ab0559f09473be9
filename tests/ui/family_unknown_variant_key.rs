use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
enum OrderEvent {
    #[outbox(event_typ = "order.cancelled")]
    Cancelled {
        #[outbox(id)]
        order_id: u64,
    },
    #[outbox(event_type = "order.archived", topic = "orders")]
    Archived {
        #[outbox(id)]
        order_id: u64,
    },
}

fn main() {}
