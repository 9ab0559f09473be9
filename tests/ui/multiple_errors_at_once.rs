use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(
    agregate = "order",
    event_type = "Order.Placed",
    event_type = "order.placed",
    crate
)]
struct OrderPlaced {
    #[outbox(id = 1)]
    order_id: u64,
    #[outbox(id)]
    customer_id: u64,
    #[outbox(event_type = "x")]
    total_cents: i64,
}

fn main() {}
