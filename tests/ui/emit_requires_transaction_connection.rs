// `emit` takes only an open transaction: a bare connection would autocommit the event alone.
use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: u64,
}

async fn place(conn: &mut sqlx::PgConnection) {
    let _ = outbox_runtime::emit(conn, &OrderPlaced { order_id: 1 }).await;
}

fn main() {
    let _ = place;
}
