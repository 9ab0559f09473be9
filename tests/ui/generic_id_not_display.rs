use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlaced<I> {
    #[outbox(id)]
    order_id: I,
}

#[derive(Serialize, Deserialize)]
struct OrderId(u64);

fn main() {
    let event = OrderPlaced {
        order_id: OrderId(7),
    };
    let _ = event.aggregate_id();
}
