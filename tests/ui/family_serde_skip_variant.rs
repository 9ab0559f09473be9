use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
enum OrderEvent {
    #[outbox(event_type = "order.cancelled")]
    #[serde(skip)]
    Cancelled {
        #[outbox(id)]
        order_id: u64,
    },
    #[outbox(event_type = "order.archived")]
    #[serde(rename = "archived", skip_deserializing)]
    Archived {
        #[outbox(id)]
        order_id: u64,
    },
    #[outbox(event_type = "order.noted")]
    #[serde(untagged)]
    Noted {
        #[outbox(id)]
        order_id: u64,
    },
}

fn main() {}
