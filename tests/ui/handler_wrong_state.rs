// A handler's context carries the relay's state type.
use outbox_runtime::{EventContext, OutboxEvent, Relay};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: u64,
}

#[derive(Clone)]
struct AppState;

async fn on_placed(_ctx: EventContext<u32>, _event: OrderPlaced) -> Result<(), std::io::Error> {
    Ok(())
}

fn main() {
    let pool = sqlx::PgPool::connect_lazy("postgres://localhost").unwrap();
    let _ = Relay::builder(pool).state(AppState).handler(on_placed).build();
}
