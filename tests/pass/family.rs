// Enum families: one Rust type for several event types of one aggregate. A newtype variant is
// its struct's event; a struct variant is an event type of the family's own.
use outbox_runtime::{EventType, OutboxEvent};
use serde::{Deserialize, Serialize};
use uuid::Uuid;

#[derive(Debug, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "order", event_type = "order.placed")]
struct OrderPlacedV1 {
    #[outbox(id)]
    order_id: Uuid,
    total: i64,
}

#[derive(Debug, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[outbox(
    aggregate = "order",
    event_type = "order.placed",
    version = 2,
    upcast_from = OrderPlacedV1
)]
struct OrderPlaced {
    #[outbox(id)]
    order_id: Uuid,
    total_cents: i64,
}

impl From<OrderPlacedV1> for OrderPlaced {
    fn from(v1: OrderPlacedV1) -> Self {
        OrderPlaced {
            order_id: v1.order_id,
            total_cents: v1.total * 100,
        }
    }
}

#[derive(Debug, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[serde(rename_all = "camelCase")]
#[outbox(aggregate = "order", event_type = "order.shipped")]
struct OrderShipped {
    #[outbox(id)]
    order_id: Uuid,
    carrier_name: String,
}

/// Serde renames of variants and fields change the JSON, not the event types.
#[derive(Debug, PartialEq, Serialize, Deserialize, OutboxEvent)]
#[serde(rename_all = "snake_case")]
#[outbox(aggregate = "order")]
enum OrderEvent {
    #[outbox(event_type = "order.placed")]
    Placed(OrderPlaced),
    #[outbox(event_type = "order.cancelled", version = 2)]
    #[serde(rename = "gone")]
    Cancelled {
        #[serde(rename = "why")]
        reason: String,
        // The id need not be the first field.
        #[outbox(id)]
        #[serde(rename = "id")]
        order_id: Uuid,
    },
    #[outbox(event_type = "order.shipped")]
    Shipped(OrderShipped),
    #[outbox(event_type = "order.noted")]
    Noted {
        #[outbox(id)]
        order: Uuid,
        r#type: String,
    },
}

#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(aggregate = "account", event_type = "account.posted", ordered)]
struct Posted {
    #[outbox(id)]
    account: u64,
    cents: i64,
}

/// `ordered` on the enum is every variant's: a newtype variant's struct says so too.
#[derive(Serialize, Deserialize, OutboxEvent)]
#[outbox(ordered, aggregate = "account")]
enum AccountEvent {
    #[outbox(event_type = "account.posted")]
    Posted(Posted),
    #[outbox(event_type = "account.closed")]
    Closed {
        #[outbox(id)]
        account: u64,
    },
}

/// Every event type of a family, through the trait only.
fn names<E: OutboxEvent>() -> Vec<&'static str> {
    E::EVENT_TYPES.iter().map(EventType::name).collect()
}

fn main() {
    let id = Uuid::from_u128(7);

    // Declaration order; a newtype variant's entry is its struct's, chain included.
    assert_eq!(OrderEvent::AGGREGATE_TYPE, "order");
    assert_eq!(
        names::<OrderEvent>(),
        [
            "order.placed",
            "order.cancelled",
            "order.shipped",
            "order.noted"
        ]
    );
    assert_eq!(OrderEvent::EVENT_TYPES[0], OrderPlaced::EVENT_TYPES[0]);
    assert_eq!(OrderEvent::EVENT_TYPES[0].oldest_version(), 1);
    assert_eq!(
        OrderEvent::EVENT_TYPES[1],
        EventType::new("order.cancelled", 2, 2, false)
    );
    assert_eq!(
        OrderEvent::EVENT_TYPES[3],
        EventType::new("order.noted", 1, 1, false)
    );

    let placed = OrderEvent::Placed(OrderPlaced {
        order_id: id,
        total_cents: 1250,
    });
    assert_eq!(placed.event_type().name(), "order.placed");
    assert_eq!(placed.event_type().version(), 2);
    assert_eq!(placed.aggregate_id(), id.to_string());

    let cancelled = OrderEvent::Cancelled {
        reason: "out of stock".to_owned(),
        order_id: id,
    };
    assert_eq!(cancelled.event_type(), &OrderEvent::EVENT_TYPES[1]);
    assert_eq!(cancelled.aggregate_id(), id.to_string());

    let shipped = OrderEvent::Shipped(OrderShipped {
        order_id: id,
        carrier_name: "post".to_owned(),
    });
    assert_eq!(shipped.event_type().name(), "order.shipped");

    let noted = OrderEvent::Noted {
        order: Uuid::from_u128(8),
        r#type: "gift".to_owned(),
    };
    assert_eq!(noted.event_type().name(), "order.noted");
    assert_eq!(noted.aggregate_id(), Uuid::from_u128(8).to_string());

    // The derive leaves serde alone: the enum serializes as serde's externally tagged enum.
    let json = serde_json::to_value(&cancelled).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"gone": {"why": "out of stock", "id": id}})
    );
    let back: OrderEvent = serde_json::from_value(json).unwrap();
    assert_eq!(back, cancelled);
    let json = serde_json::to_value(&shipped).unwrap();
    assert_eq!(
        json,
        serde_json::json!({"shipped": {"orderId": id, "carrierName": "post"}})
    );

    assert_eq!(
        names::<AccountEvent>(),
        ["account.posted", "account.closed"]
    );
    assert!(AccountEvent::EVENT_TYPES.iter().all(EventType::ordered));
    let closed = AccountEvent::Closed { account: 3 };
    assert_eq!(closed.aggregate_id(), "3");
    assert_eq!(closed.event_type().name(), "account.closed");
    let posted = AccountEvent::Posted(Posted {
        account: 4,
        cents: 10,
    });
    assert_eq!(posted.aggregate_id(), "4");
    assert!(posted.event_type().ordered());
}
