use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: u64,
}

// Only the missing `event_type` above is reported: the stub impl keeps these uses quiet.
fn store<E: OutboxEvent>(event: &E) -> (String, &'static str) {
    (event.aggregate_id(), E::EVENT_TYPES[0].name())
}

fn main() {
    let event = OrderPlaced { order_id: 7 };
    let _ = store(&event);
    let _ = OrderPlaced::AGGREGATE_TYPE;
    let _ = (OrderPlaced::EVENT_TYPE, OrderPlaced::VERSION);
}
