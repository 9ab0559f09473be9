use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
enum OrderEvent<T> {
    #[outbox(event_type = "order.placed")]
    Placed(OrderPlaced),
    #[outbox(event_type = "order.noted")]
    Noted {
        #[outbox(id)]
        order_id: u64,
        note: T,
    },
}

fn main() {}
