// `emit` takes only an open transaction: a pool would write outside the caller's transaction.
use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: u64,
}

async fn place(pool: sqlx::PgPool) {
    let _ = outbox_runtime::emit(&mut pool.clone(), &OrderPlaced { order_id: 1 }).await;
}

fn main() {
    let _ = place;
}
