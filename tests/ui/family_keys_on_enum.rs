use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.changed", version = 2, upcast_from = OrderEventV1)]
enum OrderEvent {
    #[outbox(event_type = "order.cancelled")]
    Cancelled {
        #[outbox(id)]
        order_id: u64,
    },
}

fn main() {}
