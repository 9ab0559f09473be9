use outbox_runtime::OutboxEvent;
use serde::Deserialize;

// A generic struct's serde impls depend on its parameters, so the derive bounds the impl on
// them (`Self: Serialize + DeserializeOwned`) and the error shows where the type is used.
#[derive(Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlaced<T> {
    #[outbox(id)]
    order_id: u64,
    detail: T,
}

fn main() {
    let event = OrderPlaced {
        order_id: 7,
        detail: 1_u8,
    };
    let _ = event.aggregate_id();
}
