use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[serde(tag = "type", rename_all = "snake_case")]
#[outbox(aggregate = "order")]
enum Internally {
    #[outbox(event_type = "order.cancelled")]
    Cancelled {
        #[outbox(id)]
        order_id: u64,
    },
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[serde(tag = "t", content = "c")]
#[outbox(aggregate = "order")]
enum Adjacently {
    #[outbox(event_type = "order.cancelled")]
    Cancelled {
        #[outbox(id)]
        order_id: u64,
    },
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[serde(untagged)]
#[outbox(aggregate = "order")]
enum Untagged {
    #[outbox(event_type = "order.cancelled")]
    Cancelled {
        #[outbox(id)]
        order_id: u64,
    },
}

fn main() {}
