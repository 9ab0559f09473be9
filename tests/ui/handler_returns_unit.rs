// A handler returns a Result, so a failure can be retried.
use outbox_runtime::{EventContext, OutboxEvent, Relay};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: u64,
}

async fn on_placed(_ctx: EventContext, _event: OrderPlaced) {}

fn main() {
    let pool = sqlx::PgPool::connect_lazy("postgres://localhost").unwrap();
    let _ = Relay::builder(pool).handler(on_placed).build();
}
