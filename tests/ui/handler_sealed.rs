// Handler and HandlerContext are sealed: no type outside the crate implements them.
use outbox_runtime::{EventContext, Handler, HandlerContext, OutboxEvent};
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: i64,
}

#[derive(Clone)]
struct MyHandler;

impl Handler<(EventContext<()>, OrderPlaced), ()> for MyHandler {
    type Event = OrderPlaced;
}

struct MyContext;

impl HandlerContext<()> for MyContext {}

fn main() {}
