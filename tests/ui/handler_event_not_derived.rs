// The handler's event type must be an outbox event.
use outbox_runtime::{EventContext, Relay};
use serde::Deserialize;

#[derive(Deserialize)]
struct OrderPlaced {
    order_id: u64,
}

async fn on_placed(_ctx: EventContext, event: OrderPlaced) -> Result<(), std::io::Error> {
    let _ = event.order_id;
    Ok(())
}

fn main() {
    let pool = sqlx::PgPool::connect_lazy("postgres://localhost").unwrap();
    let _ = Relay::builder(pool).handler(on_placed).build();
}
