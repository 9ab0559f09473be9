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
enum OrderEvent {
    Placed(OrderPlaced),
    #[outbox(event_type = "order.cancelled")]
    Cancelled {
        #[outbox(id)]
        order_id: u64,
    },
}

// Only the missing `event_type` is reported: the stub impl keeps these uses quiet.
fn store<E: OutboxEvent>(event: &E) -> (String, &'static str) {
    (event.aggregate_id(), event.event_type().name())
}

fn main() {
    let _ = store(&OrderEvent::Cancelled { order_id: 7 });
    let _ = OrderEvent::EVENT_TYPES;
}
