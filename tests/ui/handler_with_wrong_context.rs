// A handler's first argument is its context: `EventContext<S>`, or `TransactionContext<S>` to
// write in the acknowledgement's transaction. A bare transaction is neither.
use outbox_runtime::{OutboxEvent, Relay};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: u64,
}

async fn project(
    _tx: sqlx::Transaction<'static, sqlx::Postgres>,
    _event: OrderPlaced,
) -> Result<(), sqlx::Error> {
    Ok(())
}

fn main() {
    let pool = sqlx::PgPool::connect_lazy("postgres://localhost").unwrap();
    let _ = Relay::builder(pool).handler(project).build();
}
