// Handlers run on the relay's tasks, so their futures must be Send.
use std::rc::Rc;

use outbox_runtime::{EventContext, OutboxEvent, Relay};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: u64,
}

async fn on_placed(_ctx: EventContext, _event: OrderPlaced) -> Result<(), std::io::Error> {
    let local = Rc::new(1);
    std::future::ready(()).await;
    drop(local);
    Ok(())
}

fn main() {
    let pool = sqlx::PgPool::connect_lazy("postgres://localhost").unwrap();
    let _ = Relay::builder(pool).handler(on_placed).build();
}
