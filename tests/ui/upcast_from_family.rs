use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
enum OrderEventV1 {
    #[outbox(event_type = "order.placed")]
    Placed {
        #[outbox(id)]
        order_id: u64,
    },
    #[outbox(event_type = "order.cancelled")]
    Cancelled {
        #[outbox(id)]
        order_id: u64,
    },
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed", version = 2, upcast_from = OrderEventV1)]
struct OrderPlaced {
    #[outbox(id)]
    order_id: u64,
}

impl From<OrderEventV1> for OrderPlaced {
    fn from(v1: OrderEventV1) -> Self {
        match v1 {
            OrderEventV1::Placed { order_id } | OrderEventV1::Cancelled { order_id } => {
                OrderPlaced { order_id }
            }
        }
    }
}

fn main() {}
