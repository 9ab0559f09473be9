use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.paid", ordered)]
struct OrderPaid {
    #[outbox(id)]
    order_id: u64,
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", ordered)]
enum OrderedEvent {
    #[outbox(event_type = "order.placed")]
    Placed(OrderPlaced),
    #[outbox(event_type = "order.paid")]
    Paid(OrderPaid),
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order")]
enum UnorderedEvent {
    #[outbox(event_type = "order.placed")]
    Placed(OrderPlaced),
    #[outbox(event_type = "order.paid")]
    Paid(OrderPaid),
}

fn main() {}
