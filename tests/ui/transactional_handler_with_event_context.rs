// A transactional handler takes a `TransactionContext`, which owns the transaction.
use outbox_runtime::{EventContext, OutboxEvent, Relay};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: u64,
}

async fn project(_ctx: EventContext, _event: OrderPlaced) -> Result<(), sqlx::Error> {
    Ok(())
}

fn main() {
    let pool = sqlx::PgPool::connect_lazy("postgres://localhost").unwrap();
    let _ = Relay::builder(pool).transactional_handler(project).build();
}
