use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize)]
struct OrderId(u64);

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
enum OrderEvent {
    #[outbox(event_type = "order.cancelled")]
    Cancelled {
        #[outbox(id)]
        order_id: OrderId,
    },
}

fn main() {}
