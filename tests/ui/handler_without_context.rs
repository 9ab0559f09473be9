// A handler takes the context first, then the event.
use outbox_runtime::{OutboxEvent, Relay};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: u64,
}

async fn on_placed(_event: OrderPlaced) -> Result<(), std::io::Error> {
    Ok(())
}

fn main() {
    let pool = sqlx::PgPool::connect_lazy("postgres://localhost").unwrap();
    let _ = Relay::builder(pool).handler(on_placed).build();
}
