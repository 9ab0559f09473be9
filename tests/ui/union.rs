use outbox_runtime::OutboxEvent;

#[derive(OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
union OrderPlaced {
    order_id: u64,
    total_cents: i64,
}

fn main() {}
