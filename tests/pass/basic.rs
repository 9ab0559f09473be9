use outbox_runtime::OutboxEvent;
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Debug, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlaced {
    #[outbox(id)]
    order_id: Uuid,
    total_cents: i64,
}

/// serde's field attributes are serde's, on the id (a rename) and off it (a skip): only a skip
/// of the id is an error.
#[derive(Debug, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.noted")]
struct OrderNoted {
    #[outbox(id)]
    #[serde(rename = "id")]
    order_id: Uuid,
    #[serde(skip)]
    draft: String,
}

fn routing_key<E: OutboxEvent>(event: &E) -> (&'static str, &'static str, String) {
    (
        E::AGGREGATE_TYPE,
        E::EVENT_TYPES[0].name(),
        event.aggregate_id(),
    )
}

fn main() {
    let order_id = Uuid::from_u128(0x0192_5f2b_8c1d_7a3e_9f00_1234_5678_9abc);
    let event = OrderPlaced {
        order_id,
        total_cents: 1250,
    };

    assert_eq!(OrderPlaced::AGGREGATE_TYPE, "order");
    assert_eq!(OrderPlaced::EVENT_TYPE, "order.placed");
    assert_eq!(event.aggregate_id(), "01925f2b-8c1d-7a3e-9f00-123456789abc");
    assert_eq!(
        routing_key(&event),
        ("order", "order.placed", order_id.to_string())
    );

    // The derive leaves serde alone: the payload is the struct as serde sees it.
    let json = serde_json::to_string(&event).unwrap();
    let back: OrderPlaced = serde_json::from_str(&json).unwrap();
    assert_eq!(back, event);

    let noted = OrderNoted { order_id, draft: "unsent".to_owned() };
    let json = serde_json::to_value(&noted).unwrap();
    assert_eq!(json, serde_json::json!({ "id": order_id }));
    let back: OrderNoted = serde_json::from_value(json).unwrap();
    assert_eq!(back.aggregate_id(), noted.aggregate_id());
}
